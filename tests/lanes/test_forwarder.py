"""The ext_proc servers' usage notes reach the control plane's lane steering: a real
gRPC LogsService (records.logs_handler, as the control plane serves it) and the
NoteForwarder the ext_proc servers run (docs/fast-lane.md, "The auto lane")."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from sluicegate import wire
from sluicegate.filters.server import ExtProcServer
from sluicegate.lanes import LaneSteering, NoteForwarder, UsageNote
from sluicegate.lanes.notes import note_body, note_from_fields
from sluicegate.records import fields_of, logs_handler
from sluicegate.testing import metadata_fields
from tests.latency.helpers import Clock
from tests.records.helpers import log_record, streamed

from .helpers import document, gateway

NOTE = UsageNote("acme", "ci", "host/1/1.0", "ended", 300, 200)


def test_a_note_comes_back_from_its_body_whole() -> None:
    for note in (NOTE, UsageNote("acme", "", "", "refused", 0, 0)):
        body = logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=note_body(note)))
        assert note_from_fields(fields_of(body)) == note
    assert note_from_fields({"tenant": "acme", "kind": "sideways"}) is None
    assert note_from_fields({"tenant": "acme", "kind": "ended", "input_tokens": "-1",
                             "output_tokens": "0"}) is None  # fmt: skip


async def _serving(steering: LaneSteering) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((logs_handler(steering),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_notes_reach_the_steering_and_move_the_tenant() -> None:
    steering = LaneSteering(clock=Clock())
    steering.load(gateway())
    server, address = await _serving(steering)
    forwarder = NoteForwarder()
    try:
        forwarder.target(address)
        forwarder.add(NOTE)  # 500 tokens of key ci's 1,000 per 10 s: half
        for _ in range(100):
            if forwarder.sent:
                break
            await asyncio.sleep(0.02)
        assert (forwarder.sent, forwarder.dropped, steering.records_counted) == (1, 0, 1)
        [move] = steering.tick()
        assert (move.tenant, move.to_lane) == ("acme", "exact")
    finally:
        await forwarder.close()
        await server.stop(None)


async def test_notes_the_control_plane_cannot_take_are_dropped_and_counted() -> None:
    steering = LaneSteering(clock=Clock())
    steering.load(gateway())
    server, address = await _serving(steering)
    await server.stop(None)  # nobody listens there now
    forwarder = NoteForwarder()
    try:
        forwarder.target(address)
        forwarder.add(NOTE)
        forwarder.add(NOTE)
        for _ in range(200):
            if forwarder.dropped:
                break
            await asyncio.sleep(0.02)
        assert (forwarder.sent, forwarder.dropped) == (0, 2)
        forwarder.target(None)  # no auto tenant any more: nothing is kept
        forwarder.add(NOTE)
        assert (forwarder.pending, forwarder.dropped) == (0, 3)
    finally:
        await forwarder.close()


async def test_the_ext_proc_server_notes_an_auto_tenants_records_for_its_control_plane() -> None:
    """ExtProcServer.load: notes go to `--control-plane` when given, else to the config's
    sluicegate.xds as dialled here (a wildcard host is the loopback's); an auto tenant's
    record is noted, another's is not."""
    doc = document()
    doc["sluicegate"] = {"xds": "0.0.0.0:18000"}
    model = gateway(doc)
    assert model.control_plane == "127.0.0.1:18000"
    server = ExtProcServer(control_plane="127.0.0.1:1")
    server.load(model)
    notes = server.service.lane_notes
    auto = log_record(streamed(**metadata_fields(_meta("acme", True))))
    other = log_record(streamed(**metadata_fields(_meta("fixed", False))))
    server.records.on_records([auto, other])
    assert notes.pending == 1
    await notes.close()


def _meta(tenant: str, auto: bool) -> dict[str, object]:
    return {wire.META_TENANT: tenant, wire.META_KEY_NAME: "ci", wire.META_MODEL: "m",
            wire.META_AUTO_LANE: auto}  # fmt: skip
