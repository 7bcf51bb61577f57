"""Slow and abusive clients (`limits:`): what each listener gets in Envoy."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.connection_limit.v3 import connection_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from sluicegate import wire
from sluicegate.model import build_model
from sluicegate.xds.translate import LISTENER, translate
from sluicegate.xds.translate.listeners import (
    CONNECTION_LIMIT_FILTER,
    HCM_FILTER,
    request_timeout_ms,
)

from .cases import config_of

BASE = """\
version: 1
listeners: [{name: main, port: 8080}, {name: side, port: 8081, role: sidecar}]
providers: [{name: p, base_url: "http://127.0.0.1:8001/v1"}]
routes: [{name: r, models: [m], backends: [{provider: p}]%s}]
"""
QUEUED = """\
admission:
  priority_classes: [{name: batch, max_queue: 8, max_wait: 20s}]
  default_priority: batch
"""


def listeners_of(document: str) -> list[listener_pb2.Listener]:
    resources = translate(build_model(config_of(document), {"p": None}))
    return [r for r in resources[LISTENER] if isinstance(r, listener_pb2.Listener)]


def chain_of(listener: listener_pb2.Listener) -> tuple[int, hcm_pb2.HttpConnectionManager]:
    """The connection limit and the HCM, which must come in that order."""
    filters = listener.filter_chains[0].filters
    assert [f.name for f in filters] == [CONNECTION_LIMIT_FILTER, HCM_FILTER]
    limit = connection_limit_pb2.ConnectionLimit()
    assert filters[0].typed_config.Unpack(limit)
    assert limit.stat_prefix == listener.name.removeprefix("listener-")
    hcm = hcm_pb2.HttpConnectionManager()
    assert filters[1].typed_config.Unpack(hcm)
    return limit.max_connections.value, hcm


def test_every_listener_gets_the_limits() -> None:
    limits = (
        "limits: {request_headers_timeout: 2s, request_timeout: 5s,"
        " max_connections_per_listener: 64, ext_proc_message_timeout_ms: 3000}\n"
    )
    listeners = listeners_of(limits + BASE % "")
    assert len(listeners) == 2
    for listener in listeners:
        max_connections, hcm = chain_of(listener)
        assert max_connections == 64
        assert hcm.request_headers_timeout.ToMilliseconds() == 2_000
        # The client's 5 s plus what the routing stage may take: no queue here.
        assert hcm.request_timeout.ToMilliseconds() == 5_000 + wire.QUEUE_MARGIN_MS + 3_000


def test_defaults() -> None:
    max_connections, hcm = chain_of(listeners_of(BASE % "")[0])
    assert max_connections == 10_000
    assert hcm.request_headers_timeout.ToMilliseconds() == 10_000
    assert hcm.request_timeout.ToMilliseconds() == 60_000 + wire.QUEUE_MARGIN_MS + 5_000


def test_a_queued_request_is_not_cut_by_the_body_timeout() -> None:
    """A request may wait at a route gate and a provider gate before its body is
    answered: the timer covers both waits on top of the client's time."""
    document = (
        "limits: {request_timeout: 5s}\n" + QUEUED + BASE % ", concurrency: {max_requests: 4}"
    )
    gateway = build_model(config_of(document), {"p": None})
    assert gateway.admission.longest_queue_wait_ms == 20_000
    _, hcm = chain_of(listeners_of(document)[0])
    expected = 5_000 + 2 * 20_000 + wire.QUEUE_MARGIN_MS + 5_000
    assert hcm.request_timeout.ToMilliseconds() == expected
    assert request_timeout_ms(gateway.limits, gateway.admission) == expected


def test_zero_turns_both_timers_off() -> None:
    document = "limits: {request_headers_timeout: 0, request_timeout: 0}\n" + QUEUED
    _, hcm = chain_of(listeners_of(document + BASE % ", concurrency: {max_requests: 4}")[0])
    assert hcm.request_headers_timeout.ToMilliseconds() == 0
    assert hcm.request_timeout.ToMilliseconds() == 0


def test_overload_shedding_is_an_openai_503_with_retry_after() -> None:
    _, hcm = chain_of(listeners_of(BASE % "")[0])
    [mapper] = [
        m for m in hcm.local_reply_config.mappers
        if list(m.filter.response_flag_filter.flags) == ["OM"]
    ]  # fmt: skip
    assert mapper.status_code.value == 503
    body = mapper.body_format_override.json_format
    assert body["error"]["code"] == "gateway_overloaded"
    assert [(h.header.key, h.header.value) for h in mapper.headers_to_add] == [
        ("retry-after", "1"),
        ("x-sluicegate-refusal", "gateway_overloaded"),
    ]
