"""The control plane with latency routing: records in over the ADS server's LogsService,
learned weights out over EDS alone, kept across reloads, shown on /status and /metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from prometheus_client import CollectorRegistry, generate_latest

from sluicegate import wire
from sluicegate.latency import LatencyRouter
from sluicegate.records import LOGS_METHOD_NAME, LOGS_SERVICE_NAME, logs_handler
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.status_http import ControlPlaneCollector, status_document
from sluicegate.xds.server import ENDPOINT, Snapshot, SnapshotCache, bound_port, serve_ads
from sluicegate.xds.translate import translate

from .helpers import Clock, document, record


def plane_on(tmp_path: Path, clock: Clock) -> ControlPlane:
    path = tmp_path / "sluicegate.yaml"
    path.write_text(yaml.safe_dump(document()))
    plane = ControlPlane(path, SnapshotCache(), latency=LatencyRouter(clock=clock))
    assert plane.load().ok
    return plane


def slow_down(plane: ControlPlane, clock: Clock, seconds: int = 10) -> None:
    """`seconds` of records where slow answers 5x later than fast, a tick a second."""
    for _ in range(seconds):
        for _ in range(20):
            plane.latency.observe(record("fast", ttft_s=0.05))
            plane.latency.observe(record("slow", ttft_s=0.25))
        clock.now += 1
        plane.tick_weights()


def test_a_weight_change_goes_out_over_eds_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    plane = plane_on(tmp_path, clock)
    assert plane.snapshot is not None
    before = plane.snapshot.versions()
    assert plane.tick_weights() == []  # nothing learned: nothing pushed
    with caplog.at_level(logging.INFO, logger="sluicegate.control_plane"):
        slow_down(plane, clock)
    after = plane.snapshot.versions()
    assert {t for t in before if before[t] != after[t]} == {ENDPOINT}
    assert plane.cache.get_snapshot() is plane.snapshot
    # The same as translating the weighted model whole: the resources no other way.
    assert plane.model is not None
    assert Snapshot.from_resources(translate(plane.model)).versions() == after
    pushed = [m for m in caplog.messages if "latency weights pushed" in m]
    assert pushed and all(m.startswith("route chat: ") for m in pushed)


def test_a_reload_keeps_the_learned_weights(tmp_path: Path) -> None:
    clock = Clock()
    plane = plane_on(tmp_path, clock)
    slow_down(plane, clock)
    assert plane.snapshot is not None
    learned = plane.snapshot.resources(ENDPOINT)["route-chat"].version
    doc = document()
    doc["routes"][1]["models"] = ["p", "q"]
    plane.path.write_text(yaml.safe_dump(doc))
    outcome = plane.load()
    assert outcome.ok and "type.googleapis.com/envoy.config.route.v3.RouteConfiguration" in (
        outcome.changed_types
    )
    assert plane.snapshot.resources(ENDPOINT)["route-chat"].version == learned
    # A drain is a reload too: the providers left keep theirs.
    assert plane.set_drained("spare", drained=True).ok
    assert plane.latency.weights()["chat"]["slow"] < plane.latency.weights()["chat"]["fast"]


def test_status_and_metrics_show_every_route_s_weights(tmp_path: Path) -> None:
    clock = Clock()
    plane = plane_on(tmp_path, clock)
    slow_down(plane, clock)
    routing = status_document(plane)["routing"]
    assert set(routing) == {"chat", "plain"}
    slow = routing["chat"]["slow"]
    assert slow["configured_weight"] == 1 and slow["weight"] < 0.4
    assert slow["ttft_s"] == pytest.approx(0.25) and slow["error_rate"] == 0
    assert slow["samples"] == 200 and slow["tpot_s"] is None
    assert routing["plain"]["fast"] == {
        "weight": 3,
        "configured_weight": 3,
        "share": 0.75,
        "ttft_s": None,
        "tpot_s": None,
        "error_rate": None,
        "samples": 0,
    }
    registry = CollectorRegistry()
    registry.register(ControlPlaneCollector(plane))
    text = generate_latest(registry).decode()
    assert 'sluicegate_provider_configured_weight{provider="fast",route="plain"} 3.0' in text
    assert 'sluicegate_provider_weight{provider="fast",route="plain"} 3.0' in text
    assert 'sluicegate_provider_ttft_smoothed_seconds{provider="slow",route="chat"} 0.25' in text
    assert 'sluicegate_provider_error_rate{provider="slow",route="chat"} 0.0' in text
    assert "sluicegate_provider_tpot_smoothed_seconds" in text  # no sample yet: no series
    assert 'ttft_smoothed_seconds{provider="fast",route="plain"}' not in text


def _log_record(route: str, provider: str, ttft_us: int) -> logs_pb2.LogRecord:
    attributes = {
        wire.RECORD_ROUTE: route,
        wire.RECORD_PROVIDER: provider,
        wire.RECORD_STATUS: "200",
        wire.RECORD_FLAGS: "-",
        wire.RECORD_ATTEMPTS: "1",
        wire.RECORD_FIRST_UPSTREAM_BODY_US: str(ttft_us + 40_000),  # queued 40 ms
        wire.RECORD_LAST_DOWNSTREAM_BYTE_US: str(ttft_us + 41_000),
        wire.RECORD_PROVIDER_TTFT_US: str(ttft_us),
    }
    body = wire.record_body(wire.LATENCY_LOG_NAME, attributes)
    return logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=body))


async def test_the_ads_server_takes_the_latency_records(tmp_path: Path) -> None:
    """Envoy's latency record log reaches the control plane on the xDS cluster: its gRPC
    server answers LogsService.Export beside ADS, and the router counts the records."""
    clock = Clock()
    plane = plane_on(tmp_path, clock)
    server = await serve_ads(plane.cache, "127.0.0.1:0", handlers=[logs_handler(plane.latency)])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{bound_port(server)}") as channel:
            export = channel.unary_unary(
                f"/{LOGS_SERVICE_NAME}/{LOGS_METHOD_NAME}",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            batch = logs_service_pb2.ExportLogsServiceRequest(
                resource_logs=[
                    logs_pb2.ResourceLogs(
                        instrumentation_library_logs=[
                            logs_pb2.InstrumentationLibraryLogs(
                                logs=[
                                    _log_record("chat", "fast", 50_000),
                                    _log_record("chat", "slow", 250_000),
                                    _log_record("plain", "fast", 50_000),  # static: ignored
                                ]
                            )
                        ]
                    )
                ]
            )
            await export(batch, timeout=5)
    finally:
        await server.stop(None)
    assert plane.latency.records_counted == 2
    report = plane.latency.report()["chat"]
    # The provider's own time, not the queue's.
    assert report["slow"].ttft_s == pytest.approx(0.25) and report["slow"].samples == 1
