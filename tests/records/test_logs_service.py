"""LogsService.Export over real gRPC, as Envoy's OpenTelemetry access log calls it."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from prometheus_client import CollectorRegistry

from sluicegate.records import (
    LOGS_METHOD_NAME,
    LOGS_SERVICE_NAME,
    SLICE,
    RecordSink,
    logs_handler,
)

from .helpers import export_of, gateway, log_record, streamed


async def test_export_feeds_the_sink_and_answers_empty() -> None:
    registry = CollectorRegistry()
    sink = RecordSink(registry)
    sink.load(gateway())
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((logs_handler(sink),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(
                f"/{LOGS_SERVICE_NAME}/{LOGS_METHOD_NAME}",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            answer = await export(export_of(log_record(streamed()), log_record({})), timeout=5)
            assert answer == logs_service_pb2.ExportLogsServiceResponse()
            # A batch that is not what Envoy sends still gets an answer.
            await export(logs_service_pb2.ExportLogsServiceRequest(), timeout=5)
    finally:
        await server.stop(None)
    total = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "sluicegate_requests"
        for sample in metric.samples
        if sample.name == "sluicegate_requests_total"
    )
    assert total == 2


async def test_a_large_batch_is_counted_whole_and_lets_the_loop_run_between_slices() -> None:
    """Handled in slices of SLICE records with a yield between them, so a batch never
    holds the ext_proc event loop for its whole length; every record still counts."""
    registry = CollectorRegistry()
    sink = RecordSink(registry)
    sink.load(gateway())
    handler = logs_handler(sink)
    method = handler.service(  # type: ignore[attr-defined]
        type("Details", (), {"method": f"/{LOGS_SERVICE_NAME}/{LOGS_METHOD_NAME}"})()
    )
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    batch = export_of(*[log_record(streamed()) for _ in range(3 * SLICE + 1)])
    await method.unary_unary(batch, None)
    task.cancel()
    assert ticks - before >= 3  # the loop ran between the 4 slices
    total = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "sluicegate_requests"
        for sample in metric.samples
        if sample.name == "sluicegate_requests_total"
    )
    assert total == 3 * SLICE + 1
