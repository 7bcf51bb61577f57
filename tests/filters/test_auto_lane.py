"""The `auto` lane at the ext_proc servers (issue 12): the routing stage marks an auto
tenant's requests (wire.META_AUTO_LANE, a Struct boolean), and the record of a request
Envoy admitted in the fast lane charges the tenant's and key's exact-lane windows
(charge.charge_fast_lane), so a tenant moved to the exact lane finds them already holding
what the fast lane let through. Real stores: memory, and Redis behind its failover."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.admission import (
    AdmissionController,
    AdmissionMetrics,
    AdmissionPolicy,
    ClientIdentity,
    StoreSettings,
    admission_policy,
    charge_fast_lane,
    charge_finished,
    charge_pending,
)
from sluicegate.filters.admission.charge import RUNNING_RECORD_MARGIN_MS
from sluicegate.filters.admission.recent import RecentIds
from sluicegate.filters.limiter import Decision, Limit, LimiterStore, MemoryStore, Usage
from sluicegate.model import Gateway
from sluicegate.records import decode
from sluicegate.testing import metadata_fields, usage_fields
from tests.redis_server import RedisServer

from ..records.helpers import export_of, log_record
from .admission_helpers import (
    HEAD,
    Stream,
    chat_body,
    hashed,
    immediate,
    model_of,
    sample,
    wait_until,
)
from .helpers import CHANNEL_OPTIONS

TEAM = "sk-auto-team-0001"
OTHER = "sk-auto-other-0002"
ROUTES = """\
routes:
  - name: chat
    models: [gpt-4o]
    rate_limits: {tokens: 1000000, per: 1m}
    backends: [{provider: alpha}, {provider: beta}]
"""
CONFIG = (
    HEAD
    + ROUTES
    + f"""\
tenants:
  - name: team
    rate_limits: {{requests: 5, tokens: 1000, per: 1m}}
    keys:
      - {{name: team-key, hash: "{hashed(TEAM)}", rate_limits: {{tokens: 500, per: 1m}}}}
  - name: second
    rate_limits: {{requests: 5, tokens: 1000, per: 1m}}
    keys: [{{name: second-key, hash: "{hashed(OTHER)}"}}]
"""
)
IDENTITY = ClientIdentity("team", "team-key")


def auto_gateway(text: str, *auto: str) -> Gateway:
    """The resolved model with the tenants `auto` declared auto (model.Tenant.auto)."""
    gateway = model_of(text)
    tenants = tuple(
        dataclasses.replace(tenant, auto=tenant.name in auto) for tenant in gateway.tenants
    )
    return dataclasses.replace(gateway, tenants=tenants)


def auto_policy(text: str = CONFIG, *, store: StoreSettings | None = None) -> AdmissionPolicy:
    policy = admission_policy(auto_gateway(text, "team"))
    return policy if store is None else dataclasses.replace(policy, store=store)


def fast_lane_fields(
    *,
    tenant: str = "team",
    key: str = "team-key",
    status: int = 200,
    usage: dict[str, Any] | None = None,
    auto: bool = True,
    reservation: str | None = None,
    fast_lane: bool = True,
    duration_ms: int | None = None,
) -> dict[str, str]:
    """A fast-lane request's record as Envoy sends it: the model reader's metadata (the
    estimate as decimal text, auto_lane a JSON boolean, the charged tenant; no
    reservation). `fast_lane` False: an exact-lane request's (no charged tenant)."""
    meta: dict[str, Any] = {
        wire.META_TENANT: tenant,
        wire.META_KEY_NAME: key,
        wire.META_MODEL: "gpt-4o",
        wire.META_STREAM: False,
        wire.META_ESTIMATE_INPUT: "20",
        wire.META_ESTIMATE_OUTPUT: "100",
    }
    if fast_lane:
        meta[wire.META_CHARGED_TENANT] = tenant
    if auto:
        meta[wire.META_AUTO_LANE] = True
    if reservation is not None:
        meta[wire.META_RESERVATION] = reservation
    fields = {wire.RECORD_STATUS: str(status), **metadata_fields(meta)}
    if usage is not None:
        fields.update(usage_fields(usage))
    if duration_ms is not None:
        fields[wire.RECORD_LAST_DOWNSTREAM_BYTE_US] = str(duration_ms * 1000)
    return fields


USAGE = {"prompt_tokens": 30, "completion_tokens": 10}


def fast_lane_record(**fields: Any) -> Any:
    return decode(log_record(fast_lane_fields(**fields)), {})


async def used(controller: AdmissionController, limits: tuple[Limit, ...]) -> list[int]:
    """What the token limits among `limits` hold now (read by a reservation of nothing)."""
    probe = [limit for limit in limits if limit.kind != "requests"]
    decision = await controller.store().reserve(uuid.uuid4().hex, probe, Usage(0, 0))
    return [state.used for state in decision.states]


def tenant_limit(policy: AdmissionPolicy, kind: str) -> Limit:
    return next(limit for limit in policy.tenants["team"].limits if limit.kind == kind)


@pytest.fixture
async def controller() -> AsyncIterator[AdmissionController]:
    held = AdmissionController(auto_policy())
    yield held
    await held.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[AdmissionController]:
    """A controller on the memory store, then on Redis behind its failover."""
    store = None
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        store = StoreSettings(kind="redis", url=server.url, key_prefix=uuid.uuid4().hex[:12])
    held = AdmissionController(auto_policy(store=store))
    yield held
    await held.close()


# ----- the policy --------------------------------------------------------------------------


def test_the_policy_knows_which_tenants_are_auto() -> None:
    policy = auto_policy()
    assert policy.tenants["team"].auto and not policy.tenants["second"].auto
    assert not admission_policy(model_of(CONFIG)).tenants["team"].auto
    # The client's own limits: the tenant's, then the key's; no route's.
    assert [(limit.scope, limit.kind) for limit in policy.client_limits(IDENTITY)] == [
        ("tenant", "requests"),
        ("tenant", "tokens"),
        ("key", "tokens"),
    ]


# ----- the fast lane's records charge the exact lane's windows ----------------------------


async def test_a_fast_lane_request_goes_over_a_full_window_and_the_next_is_refused(
    any_store: AdmissionController,
) -> None:
    """The tenant's token window full to its limit, a fast-lane request's record charges
    what it was billed on top (Envoy admitted it: nothing refuses it), a second one on a
    window already over; the exact lane's next reservation is refused, and `used` shows
    both charges. The key's limit is charged too; the route's per-model limit is not."""
    held = any_store
    policy = held.policy
    tokens = tenant_limit(policy, "tokens")
    fill = await held.store().reserve("fill", (tokens,), Usage(1000, 0))
    assert fill.admitted and fill.states[0].used == 1000
    assert charge_fast_lane(held, fast_lane_record(usage=USAGE))
    assert charge_fast_lane(
        held, fast_lane_record(usage={"prompt_tokens": 5, "completion_tokens": 0})
    )
    await held.settled()

    limits = policy.limits_for(IDENTITY, "chat", "gpt-4o")
    decision = await held.store().reserve("next", limits, Usage(1, 1))
    assert not decision.admitted and decision.refused_by == tokens and not decision.too_large
    by_scope = {(s.limit.scope, s.limit.kind): s.used for s in decision.states}
    assert by_scope == {
        ("tenant", "requests"): 2,
        ("tenant", "tokens"): 1045,
        ("key", "tokens"): 45,
        ("model", "tokens"): 0,
    }
    registry = held.metrics.registry
    assert sample(registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}) == 2
    labels = {"tenant": "team", "model": "gpt-4o"}
    assert sample(registry, "sluicegate_tokens_charged_total", {**labels, "type": "input"}) == 35
    assert sample(registry, "sluicegate_tokens_charged_total", {**labels, "type": "output"}) == 10
    # Nothing here is a reservation's report (sluicegate_usage_reports_total counts those).
    assert sample(registry, "sluicegate_usage_reports_total", {"source": "provider"}) == 0


async def test_without_usage_a_fast_lane_request_is_charged_its_estimate(
    controller: AdmissionController,
) -> None:
    assert charge_fast_lane(controller, fast_lane_record())
    await controller.settled()
    assert await used(controller, controller.policy.client_limits(IDENTITY)) == [120, 120]


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"tenant": "second", "key": "second-key"}, id="a tenant not auto"),
        pytest.param({"tenant": "stranger"}, id="a tenant the policy does not know"),
        pytest.param({"auto": False}, id="not marked auto"),
        pytest.param({"fast_lane": False}, id="the exact lane's own, requests only"),
        pytest.param(
            {"fast_lane": False, "reservation": "rid-1"}, id="the exact lane's own, reserved"
        ),
        pytest.param({"status": 429, "usage": None}, id="an error"),
        pytest.param({"status": 0, "usage": None}, id="no answer"),
        pytest.param({"status": 503, "usage": None}, id="a provider's error"),
    ],
)
async def test_what_is_not_a_billed_fast_lane_request_of_an_auto_tenant_charges_nothing(
    controller: AdmissionController, fields: dict[str, Any]
) -> None:
    record = fast_lane_record(**{"usage": USAGE, **fields})
    assert not charge_fast_lane(controller, record)
    await controller.settled()
    policy = controller.policy
    for name in ("team", "second"):
        limits = policy.client_limits(ClientIdentity(name, f"{name}-key"))
        assert await used(controller, limits) == [0] * (len(limits) - 1)
    assert (
        sample(
            controller.metrics.registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}
        )
        == 0
    )


async def test_an_exact_lane_request_of_an_auto_tenant_is_reconciled_not_charged_again(
    controller: AdmissionController,
) -> None:
    """Its reservation holds its charge: the record reconciles it (charge_record), and
    charge_finished does not charge it a second time."""
    limits = controller.policy.client_limits(IDENTITY)
    await controller.store().reserve("rid-1", limits, Usage(20, 100))
    charge_finished(controller, fast_lane_record(usage=USAGE, reservation="rid-1", fast_lane=False))
    await controller.settled()
    assert await used(controller, limits) == [40, 40]
    registry = controller.metrics.registry
    assert sample(registry, "sluicegate_usage_reports_total", {"source": "provider"}) == 1
    assert sample(registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}) == 0


async def test_the_server_charges_fast_lane_records_it_takes_over_grpc() -> None:
    """LogsService.Export on the ext_proc server, as Envoy calls it: a fast-lane record of
    an auto tenant fills its exact-lane window over the limit, so the routing stage's
    next request of that tenant is refused 429."""
    async with ExtProcServer() as server:
        server.load(auto_gateway(CONFIG, "team"))
        admission = server.admission
        tokens = tenant_limit(admission.policy, "tokens")
        assert (await admission.store().reserve("fill", (tokens,), Usage(990, 0))).admitted
        export = export_of(log_record(fast_lane_fields(usage=USAGE)))
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(
                "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            await call(export)
            registry = admission.metrics.registry
            labels = {"tenant": "team"}
            await wait_until(
                lambda: sample(registry, "sluicegate_fast_lane_charges_total", labels) == 1
            )
            await admission.settled()
            assert await used(admission, (tokens,)) == [1030]
            # The routing stage now refuses the tenant's smallest request.
            stream = Stream(channel)
            await stream.headers(TEAM)
            answer = await stream.body(chat_body("gpt-4o", max_tokens=1))
            status, error, _ = immediate(answer)
            assert (status, error["code"]) == (429, "rate_limit_exceeded")
            assert auto_lane_value(answer) is True
            await stream.close()


async def test_a_batchs_short_requests_are_charged_once_per_client(
    any_store: AdmissionController,
) -> None:
    """Requests that ended before Envoy logged them running have no record to settle
    with: a batch's are summed per client and charged once, at the batch's end
    (charge_pending); the windows hold the sum, requests counted one by one."""
    held = any_store
    short = {"usage": USAGE, "duration_ms": 40}
    for _ in range(3):
        assert charge_fast_lane(held, fast_lane_record(**short))
    assert not charge_fast_lane(held, fast_lane_record(**short, tenant="second", key="second-key"))
    assert not charge_fast_lane(held, fast_lane_record(status=429, duration_ms=2))
    assert len(held.fast_lane_pending) == 1  # one client; the other tenant is not auto
    await held.settled()
    assert await used(held, held.policy.client_limits(IDENTITY)) == [0, 0]  # not yet
    charge_pending(held)
    assert not held.fast_lane_pending
    await held.settled()
    limits = held.policy.client_limits(IDENTITY)
    decision = await held.store().reserve("probe", limits, Usage(0, 0, requests=0))
    assert [state.used for state in decision.states] == [3, 120, 120]
    if isinstance(held.store(), MemoryStore):
        assert held.store().tracked_reservations == 3  # two probes and one charge
    registry = held.metrics.registry
    assert sample(registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}) == 3


@pytest.mark.parametrize("duration_ms", [300, 420, 499])
@pytest.mark.parametrize("running_first", [True, False], ids=["running first", "end first"])
async def test_a_request_with_a_record_while_running_is_charged_once_near_the_flush(
    any_store: AdmissionController, duration_ms: int, running_first: bool
) -> None:
    """Envoy's flush timer runs on a coarse clock: a request measured just under 500 ms
    may have a record while running too. Whichever comes first, the request is charged
    once: its end is batched only when it surely ended before the flush (and its id was
    not seen), and its id then keeps a late running record from charging."""
    held = any_store
    ids = {wire.RECORD_STREAM_ID: "host/7/1764600000.000000000"}
    running_fields = {**fast_lane_fields(status=0), **ids,
                      wire.RECORD_LOG_TYPE: wire.LOG_TYPE_IN_FLIGHT}  # fmt: skip
    running = decode(log_record(running_fields, log_name=wire.LANE_LOG_NAME), {})
    end = decode(
        log_record({**fast_lane_fields(usage=USAGE, duration_ms=duration_ms), **ids}), {}
    )
    assert running.in_flight and not end.in_flight
    for record in (running, end) if running_first else (end, running):
        assert charge_fast_lane(held, record)
        charge_pending(held)
    await held.settled()
    limits = held.policy.client_limits(IDENTITY)
    decision = await held.store().reserve("probe", limits, Usage(0, 0, requests=0))
    assert [state.used for state in decision.states] == [1, 40, 40]


@pytest.mark.parametrize("duration_ms", [420, 499])
async def test_a_failed_request_with_a_record_while_running_is_charged_nothing(
    any_store: AdmissionController, duration_ms: int
) -> None:
    """The same near the flush for a request that failed: its running record charged
    the estimate; its end reconciles that to nothing (it is not dropped as a refusal
    that never ran would be)."""
    held = any_store
    ids = {wire.RECORD_STREAM_ID: "host/7/1764600000.000000001"}
    running_fields = {**fast_lane_fields(status=0), **ids,
                      wire.RECORD_LOG_TYPE: wire.LOG_TYPE_IN_FLIGHT}  # fmt: skip
    charge_fast_lane(held, decode(log_record(running_fields, log_name=wire.LANE_LOG_NAME), {}))
    await held.settled()
    limits = held.policy.client_limits(IDENTITY)
    assert await used(held, limits) == [120, 120]
    end = {**fast_lane_fields(status=503, duration_ms=duration_ms), **ids}
    assert not charge_fast_lane(held, decode(log_record(end), {}))
    await held.settled()
    assert await used(held, limits) == [0, 0]


async def test_the_server_charges_a_batch_of_short_requests_once() -> None:
    """One Export of three short fast-lane requests of one client, as Envoy batches its
    records: the ext_proc server's store keeps one charge holding all three."""
    async with ExtProcServer() as server:
        server.load(auto_gateway(CONFIG, "team"))
        admission = server.admission
        store = admission.store()
        assert isinstance(store, MemoryStore)
        fields = fast_lane_fields(usage=USAGE, duration_ms=40)
        export = export_of(*[log_record(fields) for _ in range(3)])
        assert server.records.on_export(export) == 3
        await admission.settled()
        assert store.tracked_reservations == 1
        assert await used(admission, admission.policy.client_limits(IDENTITY)) == [120, 120]


# ----- the routing stage marks an auto tenant's requests -----------------------------------


def auto_lane_value(answer: Any) -> bool | None:
    """wire.META_AUTO_LANE in the answer's metadata: True only for a Struct boolean."""
    fields = answer.dynamic_metadata.fields
    if wire.METADATA_NAMESPACE not in fields:
        return None
    inner = fields[wire.METADATA_NAMESPACE].struct_value.fields
    if wire.META_AUTO_LANE not in inner:
        return None
    value = inner[wire.META_AUTO_LANE]
    assert value.WhichOneof("kind") == "bool_value", value
    return bool(value.bool_value)


def metadata_text(answer: Any, key: str) -> str | None:
    inner = answer.dynamic_metadata.fields[wire.METADATA_NAMESPACE].struct_value.fields
    return inner[key].string_value if key in inner else None


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    async with ExtProcServer() as server:
        server.load(auto_gateway(CONFIG, "team"))
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as held:
            yield held


async def ask(channel: grpc.aio.Channel, key: str | None, model: str = "gpt-4o") -> Any:
    stream = Stream(channel)
    answer = await stream.headers(key)
    if answer.WhichOneof("response") == "request_headers":
        answer = await stream.body(chat_body(model, max_tokens=10))
    await stream.close()
    return answer


async def test_an_auto_tenant_s_requests_are_marked_admitted_or_refused(
    channel: grpc.aio.Channel,
) -> None:
    admitted = await ask(channel, TEAM)
    assert admitted.WhichOneof("response") == "request_body"
    assert auto_lane_value(admitted) is True
    refused = await ask(channel, TEAM, model="no-such-model")
    assert refused.immediate_response.status.code == 404
    assert auto_lane_value(refused) is True
    # Another tenant's, and a request without a key (no tenant), carry no mark.
    assert auto_lane_value(await ask(channel, OTHER)) is None
    unknown = await ask(channel, None)
    assert unknown.immediate_response.status.code == 401
    assert auto_lane_value(unknown) is None


# ----- a long request is charged while it runs ---------------------------------------------
# Envoy logs an auto tenant's request while it runs (wire.LOG_TYPE_IN_FLIGHT, on the lane
# log) and at its end (the record log), both naming it by its stream id: the first charges
# its estimate under `tenant/stream id`; the end reconciles that charge to what it was
# billed.

TOKENS_ONLY = (
    HEAD
    + ROUTES
    + f"""\
tenants:
  - name: team
    rate_limits: {{tokens: 1000, per: 1m}}
    keys:
      - {{name: team-key, hash: "{hashed(TEAM)}", rate_limits: {{tokens: 500, per: 1m}}}}
"""
)


def in_flight_record(stream_id: str, **fields: Any) -> Any:
    """A record Envoy sends while the request runs: the lane log's layout (no usage yet),
    its access-log type DownstreamPeriodic."""
    values = fast_lane_fields(**fields)
    values[wire.RECORD_STREAM_ID] = stream_id
    values[wire.RECORD_LOG_TYPE] = wire.LOG_TYPE_IN_FLIGHT
    return decode(log_record(values, log_name=wire.LANE_LOG_NAME), {})


def end_record(stream_id: str, *, duration_us: int | None = None, **fields: Any) -> Any:
    """The same request's record at its end (the record log, with its stream id), and
    its duration (its last byte to the client) when given."""
    values = fast_lane_fields(**fields)
    values[wire.RECORD_STREAM_ID] = stream_id
    if duration_us is not None:
        values[wire.RECORD_LAST_DOWNSTREAM_BYTE_US] = str(duration_us)
    return decode(log_record(values), {})


FLUSH_US = wire.IN_FLIGHT_FLUSH_MS * 1000  # Envoy's first record of a running request
# Shorter requests surely have no record while running (charge.RUNNING_RECORD_MARGIN_MS).
SURELY_UNLOGGED_US = FLUSH_US - RUNNING_RECORD_MARGIN_MS * 1000


async def window(controller: AdmissionController, limits: tuple[Limit, ...]) -> list[int]:
    """What every limit among `limits` holds now, requests too (a probe of nothing)."""
    probe = await controller.store().reserve(uuid.uuid4().hex, limits, Usage(0, 0, requests=0))
    return [state.used for state in probe.states]


def fast_lane_charges(controller: AdmissionController) -> float:
    return sample(
        controller.metrics.registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}
    )


def tokens_charged(controller: AdmissionController, kind: str) -> float:
    labels = {"tenant": "team", "model": "gpt-4o", "type": kind}
    return sample(controller.metrics.registry, "sluicegate_tokens_charged_total", labels)


@pytest.fixture(params=["memory", "redis"])
def store_settings(request: pytest.FixtureRequest) -> StoreSettings | None:
    """The memory store (None), then Redis behind its failover (a fresh key prefix)."""
    if request.param == "memory":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return StoreSettings(kind="redis", url=server.url, key_prefix=uuid.uuid4().hex[:12])


async def test_a_running_request_is_charged_its_estimate_once_then_reconciled_at_its_end(
    any_store: AdmissionController,
) -> None:
    """Its first in-flight record charges the estimate (20 + 100) at once; the next one,
    500 ms later, changes nothing; another stream is a charge of its own. The end record
    turns the charge into the usage (30 + 10) in place, and only then counts it."""
    held = any_store
    limits = held.policy.client_limits(IDENTITY)  # tenant requests, tokens; key tokens
    charge_finished(held, in_flight_record("stream-1"))
    await held.settled()
    assert await window(held, limits) == [1, 120, 120]
    charge_finished(held, in_flight_record("stream-1"))
    await held.settled()
    assert await window(held, limits) == [1, 120, 120]
    assert fast_lane_charges(held) == 0  # a request is counted at its end
    assert tokens_charged(held, "input") == 0

    charge_finished(held, in_flight_record("stream-2"))
    await held.settled()
    assert await window(held, limits) == [2, 240, 240]

    charge_finished(held, end_record("stream-1", usage=USAGE))
    await held.settled()
    assert await window(held, limits) == [2, 160, 160]
    assert fast_lane_charges(held) == 1
    assert (tokens_charged(held, "input"), tokens_charged(held, "output")) == (30, 10)
    # A late in-flight record of the ended stream (the two logs cross) charges nothing.
    charge_finished(held, in_flight_record("stream-1"))
    await held.settled()
    assert await window(held, limits) == [2, 160, 160]
    assert fast_lane_charges(held) == 1


@pytest.mark.parametrize("config", [CONFIG, TOKENS_ONLY], ids=["with requests", "tokens only"])
async def test_an_end_record_before_its_in_flight_record_charges_the_request_once(
    store_settings: StoreSettings | None, config: str
) -> None:
    """The two loggers' batches cross: the end comes first and charges the usage; the
    in-flight record after it finds the stream charged and charges nothing. With token
    limits alone no requests log holds a charge of the stream's to tell it by, and Redis
    cannot find it in a token log either (a member names its amount, the usage there, the
    estimate asked): the end's charge must leave the stream's record."""
    held = AdmissionController(auto_policy(config, store=store_settings))
    try:
        limits = held.policy.client_limits(IDENTITY)
        token_limits = len([limit for limit in limits if limit.kind != "requests"])
        charge_finished(held, end_record("stream-1", usage=USAGE))
        await held.settled()
        assert await used(held, limits) == [40] * token_limits
        charge_finished(held, in_flight_record("stream-1"))
        await held.settled()
        assert await used(held, limits) == [40] * token_limits
        assert fast_lane_charges(held) == 1
    finally:
        await held.close()


@pytest.mark.parametrize("duration_us", [None, FLUSH_US], ids=["duration unknown", "500 ms"])
@pytest.mark.parametrize("status", [429, 503, 0])
async def test_a_failed_end_gives_back_what_its_in_flight_record_charged(
    any_store: AdmissionController, status: int, duration_us: int | None
) -> None:
    """A request charged its estimate while it ran, then failed (an error, no answer):
    providers bill nothing, so its window holds what it held before it, the request
    included; nothing counts as a fast-lane charge. It ended as Envoy's first record of
    it running was due (wire.IN_FLIGHT_FLUSH_MS), or at a time its record does not say."""
    held = any_store
    limits = held.policy.client_limits(IDENTITY)
    assert (await held.store().reserve("earlier", limits, Usage(10, 0))).admitted
    charge_finished(held, in_flight_record("stream-1"))
    await held.settled()
    assert await window(held, limits) == [2, 130, 130]
    end = end_record("stream-1", status=status, duration_us=duration_us)
    assert not charge_fast_lane(held, end)
    await held.settled()
    assert await window(held, limits) == [1, 10, 10]
    assert fast_lane_charges(held) == 0
    assert tokens_charged(held, "input") == tokens_charged(held, "output") == 0


@pytest.mark.parametrize("status", [429, 0])
async def test_a_failed_end_before_its_in_flight_record_charges_nothing(
    any_store: AdmissionController, status: int
) -> None:
    held = any_store
    limits = held.policy.client_limits(IDENTITY)
    charge_finished(held, end_record("stream-1", status=status))
    await held.settled()
    charge_finished(held, in_flight_record("stream-1"))
    await held.settled()
    assert await window(held, limits) == [0, 0, 0]


@pytest.mark.parametrize("status", [0, 200])
async def test_an_exact_lane_request_s_in_flight_record_leaves_its_reservation_alone(
    any_store: AdmissionController, status: int
) -> None:
    """An auto tenant's request the routing stage reserved (no charged tenant): its
    in-flight record (no response yet, or one under way) charges nothing and does not
    reconcile the reservation, which holds its estimate until the end record replaces
    it by the usage."""
    held = any_store
    limits = held.policy.client_limits(IDENTITY)
    assert (await held.store().reserve("rid-1", limits, Usage(20, 100))).admitted
    exact: dict[str, Any] = {"reservation": "rid-1", "fast_lane": False}
    charge_finished(held, in_flight_record("stream-1", status=status, **exact))
    await held.settled()
    assert await window(held, limits) == [1, 120, 120]
    registry = held.metrics.registry
    for source in ("provider", "estimate", "error"):
        assert sample(registry, "sluicegate_usage_reports_total", {"source": source}) == 0
    assert fast_lane_charges(held) == 0

    charge_finished(held, end_record("stream-1", usage=USAGE, **exact))
    await held.settled()
    assert await window(held, limits) == [1, 40, 40]
    assert sample(registry, "sluicegate_usage_reports_total", {"source": "provider"}) == 1
    assert fast_lane_charges(held) == 0


# ----- review fixes: ids per tenant, refusals, the Redis race, repeats, drops ---------------


def both_auto(store: StoreSettings | None) -> AdmissionController:
    """A controller whose two tenants are both auto."""
    policy = admission_policy(auto_gateway(CONFIG, "team", "second"))
    return AdmissionController(
        policy if store is None else dataclasses.replace(policy, store=store)
    )


async def test_two_tenants_streams_of_one_id_are_charged_each(
    store_settings: StoreSettings | None,
) -> None:
    """Stream ids are unique per tenant only: one tenant's charge never takes another's."""
    held = both_auto(store_settings)
    try:
        other = ClientIdentity("second", "second-key")
        mine, theirs = held.policy.client_limits(IDENTITY), held.policy.client_limits(other)
        charge_finished(held, in_flight_record("stream-1"))
        charge_finished(held, in_flight_record("stream-1", tenant="second", key="second-key"))
        await held.settled()
        assert await window(held, mine) == [1, 120, 120]
        assert await window(held, theirs) == [1, 120]
        charge_finished(held, end_record("stream-1", usage=USAGE))
        end = end_record(
            "stream-1", tenant="second", key="second-key", usage={**USAGE, "completion_tokens": 1}
        )
        charge_finished(held, end)
        await held.settled()
        assert await window(held, mine) == [1, 40, 40]
        assert await window(held, theirs) == [1, 31]
    finally:
        await held.close()


@pytest.mark.parametrize("status", [429, 503, 0])
async def test_a_request_that_failed_before_it_could_be_logged_running_leaves_no_record(
    status: int,
) -> None:
    """A refusal (a bucket's 429) ends long before Envoy's first record of it running
    (wire.IN_FLIGHT_FLUSH_MS): no reconcile, no charge, so the store keeps no record of
    it for a window (thousands of refusals, thousands of records)."""
    held = AdmissionController(auto_policy())
    try:
        store = held.store()
        assert isinstance(store, MemoryStore)
        for n, duration_us in enumerate((0, 1_000, SURELY_UNLOGGED_US - 1)):
            end = end_record(f"stream-{n}", status=status, duration_us=duration_us)
            assert not charge_fast_lane(held, end)
        await held.settled()
        assert store.tracked_reservations == 0
        # One that lasted until its record running may have been due settles as before:
        # it holds its id (a record of it running, before or after, charges nothing).
        end = end_record("long", status=status, duration_us=SURELY_UNLOGGED_US)
        charge_fast_lane(held, end)
        await held.settled()
        assert store.tracked_reservations == 1
        assert await window(held, held.policy.client_limits(IDENTITY)) == [0, 0, 0]
    finally:
        await held.close()


class InFlightChargeLandsLate:
    """A real store where a running request's charge (its in-flight record's, sent by
    another task or replica) lands between the end record's reconcile and its charge,
    the race two Redis round trips leave open."""

    def __init__(self, store: LimiterStore, limits: tuple[Limit, ...], estimate: Usage) -> None:
        self.store = store
        self._late: tuple[tuple[Limit, ...], Usage] | None = (limits, estimate)

    async def reserve(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision:
        return await self.store.reserve(reservation_id, limits, estimate)

    async def reconcile(self, reservation_id: str, actual: Usage) -> bool:
        applied = await self.store.reconcile(reservation_id, actual)
        if self._late is not None:
            limits, estimate = self._late
            self._late = None
            assert await self.store.charge(reservation_id, limits, estimate)
        return applied

    async def charge(self, charge_id: str, limits: Sequence[Limit], usage: Usage) -> bool:
        return await self.store.charge(charge_id, limits, usage)

    async def close(self) -> None:
        await self.store.close()


async def test_an_in_flight_charge_landing_after_the_end_s_reconcile_is_reconciled(
    store_settings: StoreSettings | None,
) -> None:
    """The end record finds no charge to reconcile, the in-flight record's charge lands,
    and the end's own charge is refused as a duplicate: the end reconciles once more, so
    the window holds what the request was billed, not its estimate."""
    held = AdmissionController(auto_policy(store=store_settings))
    try:
        limits = held.policy.client_limits(IDENTITY)
        racing = InFlightChargeLandsLate(held.store(), limits, Usage(20, 100))
        held._store = racing  # the race, on the real store beneath
        assert charge_fast_lane(held, end_record("stream-1", usage=USAGE))
        await held.settled()
        assert await window(held, limits) == [1, 40, 40]
    finally:
        await held.close()


def store_calls(controller: AdmissionController, op: str) -> float:
    """Redis calls of `op` made so far (the store's latency histogram counts each)."""
    labels = {"op": op}
    return sample(controller.metrics.registry, "sluicegate_limiter_store_seconds_count", labels)


async def test_a_running_request_s_repeated_records_cost_one_store_call(
    redis_server: RedisServer,
) -> None:
    """Envoy logs a running request every 500 ms: only its first record asks Redis,
    across a reload of the policy too; its end reconciles, and a record of it running
    that arrives after its end asks nothing either."""
    store = StoreSettings(kind="redis", url=redis_server.url, key_prefix=uuid.uuid4().hex[:12])
    held = AdmissionController(auto_policy(store=store))
    try:
        limits = held.policy.client_limits(IDENTITY)
        for _ in range(5):
            charge_finished(held, in_flight_record("stream-1"))
            await held.settled()
        assert store_calls(held, "charge") == 1
        held.update(auto_policy(store=store))
        charge_finished(held, in_flight_record("stream-1"))
        await held.settled()
        assert store_calls(held, "charge") == 1
        charge_finished(held, end_record("stream-1", usage=USAGE))
        await held.settled()
        assert (store_calls(held, "charge"), store_calls(held, "reconcile")) == (1, 1)
        charge_finished(held, in_flight_record("stream-1"))
        await held.settled()
        assert (store_calls(held, "charge"), store_calls(held, "reconcile")) == (1, 1)
        assert await window(held, limits) == [1, 40, 40]
    finally:
        await held.close()


def test_the_ids_kept_are_bounded_oldest_first() -> None:
    ids = RecentIds(3)
    assert [ids.add(item) for item in ("a", "b", "c", "a")] == [True, True, True, False]
    assert ids.add("d")  # "b" was the oldest: "a" was seen again
    assert len(ids) == 3 and "b" not in ids and all(item in ids for item in "acd")
    assert ids.add("b")
    ids.discard("b")
    assert "b" not in ids


async def test_a_charge_dropped_while_redis_is_down_is_counted_and_tried_again() -> None:
    """fail_open, Redis gone: a running request's charge is counted nowhere
    (sluicegate_limiter_dropped_charges_total), and its next record tries again, which
    counts once Redis is back."""
    with RedisServer() as server:
        store = StoreSettings(
            kind="redis", url=server.url, key_prefix=uuid.uuid4().hex[:12], on_failure="fail_open"
        )
        held = AdmissionController(auto_policy(store=store))
        try:
            limits = held.policy.client_limits(IDENTITY)
            server.stop()
            for _ in range(2):
                charge_finished(held, in_flight_record("stream-1"))
                await held.settled()
            registry = held.metrics.registry
            assert sample(registry, "sluicegate_limiter_dropped_charges_total") == 2
            server.start()
            await wait_until(lambda: held.status()["store"]["state"] == "up")
            charge_finished(held, in_flight_record("stream-1"))
            await held.settled()
            assert await window(held, limits) == [1, 120, 120]
            assert sample(registry, "sluicegate_limiter_dropped_charges_total") == 2
        finally:
            await held.close()


def test_fast_lane_charges_are_an_admission_metric() -> None:
    metrics = AdmissionMetrics()
    metrics.fast_lane_charges.labels("team").inc()
    assert sample(metrics.registry, "sluicegate_fast_lane_charges_total", {"tenant": "team"}) == 1
