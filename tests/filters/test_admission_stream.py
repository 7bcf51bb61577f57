"""The routing stage with admission, over real gRPC streams to a real ExtProcServer:
keys, models, priority, reservations, gates (release, cancel, shed) and the open gateway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from sluicegate import wire
from sluicegate.filters import ExtProcServer, RoutingTable, admission_policy
from sluicegate.filters.counters import Counters
from sluicegate.filters.responses import CONTINUE_REQUEST_HEADERS
from sluicegate.filters.routing import decide
from sluicegate.filters.usage_reader import LOG_MAX_OUTPUT_TOKENS

from .admission_helpers import (
    HEAD,
    Stream,
    hashed,
    immediate,
    metadata_of,
    model_of,
    prompt_estimate,
    record_of,
    sample,
    serving,
    wait_until,
)
from .admission_helpers import chat_body as body_of
from .helpers import error_of, routed_model, streamed, usage_header

TEAM = "sk-test-team-0001"
NARROW = "sk-test-narrow-0002"
TIGHT = "sk-test-tight-0003"

CONFIG = (
    HEAD
    + f"""\
admission:
  priority_classes:
    - {{name: interactive, max_queue: 8, max_wait: 5s}}
    - {{name: standard, max_queue: 8, max_wait: 5s}}
    - {{name: batch, max_queue: 0, max_wait: 0}}
  default_priority: standard
  default_max_tokens: 100
routes:
  - name: chat
    models: [gpt-4o, small]
    backends: [{{provider: alpha}}]
  - name: gated
    models: [gated-model]
    backends: [{{provider: alpha}}]
    concurrency: {{max_requests: 1, headroom: 0}}
  - name: limited
    models: [limited-model]
    backends: [{{provider: beta}}]
    rate_limits: {{tokens: 5000, per: 1m}}
    default_max_tokens: 40
tenants:
  - name: team
    priority: interactive
    rate_limits: {{requests: 1000, tokens: 10000, per: 1m}}
    keys: [{{name: team-key, hash: "{hashed(TEAM)}"}}]
  - name: narrow
    models: [small]
    keys: [{{name: narrow-key, hash: "{hashed(NARROW)}"}}]
  - name: tight
    rate_limits: {{tokens: 300, per: 1m}}
    keys: [{{name: tight-key, hash: "{hashed(TIGHT)}"}}]
"""
)
OPEN = (
    HEAD
    + """\
routes:
  - name: chat
    models: [gpt-4o, small]
    backends: [{provider: alpha}]
"""
)
PROMPT = prompt_estimate()  # chat_body's prompt estimate ("hi")


@pytest.fixture
async def served() -> AsyncIterator[tuple[ExtProcServer, grpc.aio.Channel]]:
    async with serving(CONFIG) as pair:
        yield pair


@pytest.fixture
def server(served: tuple[ExtProcServer, grpc.aio.Channel]) -> ExtProcServer:
    return served[0]


@pytest.fixture
def channel(served: tuple[ExtProcServer, grpc.aio.Channel]) -> grpc.aio.Channel:
    return served[1]


def decisions(server: ExtProcServer, outcome: str, priority: str) -> float:
    return sample(
        server.admission.metrics.registry,
        "sluicegate_admission_decisions_total",
        {"outcome": outcome, "priority": priority},
    )


async def admit(
    channel: grpc.aio.Channel, key: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()
) -> tuple[Stream, object]:
    """Headers (key accepted) then body; returns the open stream and the body's answer."""
    stream = Stream(channel)
    headers_answer = await stream.headers(key, extra)
    assert headers_answer.WhichOneof("response") == "request_headers", headers_answer
    return stream, await stream.body(body)


# ----- the client key --------------------------------------------------------------------


async def test_no_key_is_401(channel: grpc.aio.Channel, server: ExtProcServer) -> None:
    stream = Stream(channel)
    status, err = error_of(await stream.headers())
    assert (status, err["code"]) == (401, "missing_api_key")
    await stream.close()
    assert decisions(server, "unauthenticated", "none") == 1


@pytest.mark.parametrize(
    "extra",
    [
        [("authorization", "Bearer sk-test-team-0002")],
        [("authorization", "Bearer " + TEAM[:-1])],
        [("x-api-key", "sk-nobody")],
    ],
)
async def test_wrong_key_is_401(channel: grpc.aio.Channel, extra: list[tuple[str, str]]) -> None:
    stream = Stream(channel)
    status, err = error_of(await stream.headers(extra=extra))
    assert (status, err["code"]) == (401, "invalid_api_key")
    await stream.close()


@pytest.mark.parametrize(
    "extra",
    [
        [("authorization", f"Bearer {TEAM}")],
        [("authorization", f"bearer {TEAM}"), ("x-api-key", "junk"), ("api-key", "junk")],
        [("x-api-key", TEAM)],
        [("api-key", TEAM)],
    ],
)
async def test_valid_key_is_removed_before_anything_goes_upstream(
    channel: grpc.aio.Channel, extra: list[tuple[str, str]]
) -> None:
    stream = Stream(channel)
    answer = await stream.headers(extra=extra)
    assert answer.WhichOneof("response") == "request_headers"
    common = answer.request_headers.response
    assert list(common.header_mutation.remove_headers) == ["authorization", "x-api-key", "api-key"]
    assert not common.header_mutation.set_headers
    assert not common.clear_route_cache
    assert routed_model(await stream.body(body_of("gpt-4o"))) == "gpt-4o"
    await stream.close()


# ----- requests without a body: listings and 404s ---------------------------------------


def listed(answer: object) -> list[str]:
    """The model ids of an immediate 200 listing."""
    assert answer.WhichOneof("response") == "immediate_response", answer  # type: ignore[attr-defined]
    immediate = answer.immediate_response  # type: ignore[attr-defined]
    assert immediate.status.code == 200
    document = json.loads(immediate.body)
    assert document["object"] == "list"
    return [entry["id"] for entry in document["data"]]


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/gpt-4o", "/v1/chat/completions"])
async def test_a_bodiless_request_needs_a_key_too(channel: grpc.aio.Channel, path: str) -> None:
    for key, code in ((None, "missing_api_key"), ("sk-nobody", "invalid_api_key")):
        stream = Stream(channel)
        status, err = error_of(await stream.headers(key, path=path, method="GET"))
        assert (status, err["code"]) == (401, code)
        await stream.close()


async def test_a_bodiless_request_with_a_key_loses_it_and_rematches_without_a_model(
    channel: grpc.aio.Channel,
) -> None:
    stream = Stream(channel)
    answer = await stream.headers(
        TEAM, extra=[(wire.MODEL_HEADER, "gpt-4o")], path="/v1/models", method="GET"
    )
    assert answer.WhichOneof("response") == "request_headers"
    common = answer.request_headers.response
    removed = list(common.header_mutation.remove_headers)
    assert {"authorization", "x-api-key", "api-key", wire.MODEL_HEADER} == set(removed)
    assert common.clear_route_cache  # Envoy's own listing answers a tenant with every model
    await stream.close()


async def test_a_tenant_limited_to_some_models_is_listed_only_those(
    channel: grpc.aio.Channel,
) -> None:
    stream = Stream(channel)
    assert listed(await stream.headers(NARROW, path="/v1/models?limit=5", method="GET")) == [
        "small"
    ]
    await stream.close()
    stream = Stream(channel)
    status, err = error_of(await stream.headers(NARROW, path="/v1/models/gpt-4o", method="GET"))
    assert (status, err["code"]) == (404, "model_not_found")
    await stream.close()
    # A model it may use, or a path that is no listing: Envoy's own answer serves.
    for path in ("/v1/models/small", "/v1/chat/completions", "/v2/models"):
        stream = Stream(channel)
        answer = await stream.headers(NARROW, path=path, method="GET")
        assert answer.WhichOneof("response") == "request_headers", path
        await stream.close()


# ----- model and priority ---------------------------------------------------------------


async def test_model_the_tenant_may_not_use_is_403(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    stream, answer = await admit(channel, NARROW, body_of("gpt-4o"))
    status, err = error_of(answer)
    assert (status, err["code"], err["param"]) == (403, "model_not_allowed", "model")
    assert "tenant narrow" in err["message"]
    await stream.close()
    assert decisions(server, "model_not_allowed", "standard") == 1
    stream, answer = await admit(channel, NARROW, body_of("small"))
    assert routed_model(answer) == "small"
    await stream.close()


async def test_unknown_model_is_404_even_for_a_narrow_tenant(channel: grpc.aio.Channel) -> None:
    stream, answer = await admit(channel, NARROW, body_of("gpt-5"))
    status, err = error_of(answer)
    assert (status, err["code"]) == (404, "model_not_found")
    await stream.close()


@pytest.mark.parametrize(
    "asked", ["interactive", "gold", "INTERACTIVE", "batch,interactive", "batch\u00a0"]
)
async def test_priority_above_the_tenant_or_unknown_is_400(
    channel: grpc.aio.Channel, server: ExtProcServer, asked: str
) -> None:
    stream, answer = await admit(
        channel, NARROW, body_of("small"), ((wire.PRIORITY_HEADER, asked),)
    )
    status, err = error_of(answer)
    assert (status, err["code"], err["param"]) == (400, "invalid_priority", wire.PRIORITY_HEADER)
    assert err["message"].endswith("your key may use: standard, batch.")
    await stream.close()
    assert decisions(server, "bad_request", "none") == 1


# As the fast lane's model reader reads it (model_reader.py): the last comma-separated
# value, trimmed of ASCII whitespace, any case; blank asks for none.
@pytest.mark.parametrize(
    "asked", ["standard", "batch", " Batch ", "", " \t", "interactive, batch", "batch,"]
)
async def test_priority_at_or_below_the_tenant_routes(
    channel: grpc.aio.Channel, asked: str
) -> None:
    stream, answer = await admit(
        channel, NARROW, body_of("small"), ((wire.PRIORITY_HEADER, asked),)
    )
    assert routed_model(answer) == "small"
    await stream.close()


async def test_bad_body_is_400_before_any_reservation(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    stream, answer = await admit(channel, TIGHT, b'{"model": "gpt-4o", "max_tokens": 0}')
    status, _ = error_of(answer)
    assert status == 400
    await stream.close()
    # Nothing was reserved: the whole tight budget is still there.
    stream, answer = await admit(channel, TIGHT, body_of("gpt-4o", max_tokens=10))
    assert metadata_of(answer)["ratelimit_remaining_tokens"] == str(300 - PROMPT - 10)
    await stream.close()


# ----- reservations -----------------------------------------------------------------------


async def test_admitted_body_routes_with_the_reservation_in_metadata(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    stream, answer = await admit(channel, TEAM, body_of("gpt-4o", max_tokens=50))
    assert routed_model(answer) == "gpt-4o"
    values = metadata_of(answer)
    reservation = values.pop(wire.META_RESERVATION)
    assert reservation
    assert values == {
        wire.META_TENANT: "team",
        wire.META_KEY_NAME: "team-key",
        wire.META_MODEL: "gpt-4o",
        wire.META_PRIORITY: "interactive",
        wire.META_SCENARIO: "default",
        wire.META_QUEUE_MS: 0,
        wire.META_STREAM: "false",
        wire.META_ESTIMATE_INPUT: str(PROMPT),
        wire.META_ESTIMATE_OUTPUT: "50",
        "ratelimit_limit_requests": "1000",
        "ratelimit_remaining_requests": "999",
        "ratelimit_reset_requests": "1m0s",
        "ratelimit_limit_tokens": "10000",
        "ratelimit_remaining_tokens": str(10000 - PROMPT - 50),
        "ratelimit_reset_tokens": "1m0s",
    }
    # Every x-ratelimit-* header the routes add finds its metadata key.
    assert {key for _, key in wire.RATELIMIT_HEADERS} <= set(metadata_of(answer))
    await stream.close()
    registry = server.admission.metrics.registry
    labels = {"tenant": "team", "model": "gpt-4o"}
    assert sample(registry, "sluicegate_tokens_reserved_total", labels) == PROMPT + 50
    assert decisions(server, "admitted", "interactive") == 1

    stream, answer = await admit(channel, TEAM, body_of("gpt-4o", max_tokens=50))
    again = metadata_of(answer)
    assert again[wire.META_RESERVATION] not in ("", reservation)
    assert again["ratelimit_remaining_requests"] == "998"
    assert again["ratelimit_remaining_tokens"] == str(10000 - 2 * (PROMPT + 50))
    await stream.close()


async def test_route_default_max_tokens_and_model_limit_apply(channel: grpc.aio.Channel) -> None:
    stream, answer = await admit(channel, TEAM, body_of("limited-model"))
    values = metadata_of(answer)
    assert values[wire.META_ESTIMATE_OUTPUT] == "40"  # the route's default_max_tokens
    # The model's 5000 is tighter than the tenant's 10000.
    assert values["ratelimit_limit_tokens"] == "5000"
    assert values["ratelimit_remaining_tokens"] == str(5000 - PROMPT - 40)
    await stream.close()
    stream, answer = await admit(channel, TEAM, body_of("gpt-4o"))
    assert metadata_of(answer)[wire.META_ESTIMATE_OUTPUT] == "100"  # admission's default
    await stream.close()


async def test_tenant_without_limits_routes_without_a_reservation(
    channel: grpc.aio.Channel,
) -> None:
    stream, answer = await admit(channel, NARROW, body_of("small", max_tokens=5))
    assert routed_model(answer) == "small"
    assert metadata_of(answer) == {
        wire.META_TENANT: "narrow",
        wire.META_KEY_NAME: "narrow-key",
        wire.META_MODEL: "small",
        wire.META_PRIORITY: "standard",  # admission.default_priority
        wire.META_SCENARIO: "default",
        wire.META_QUEUE_MS: 0,
        wire.META_STREAM: "false",
    }
    # Nothing to reconcile, but its usage still reaches the record (metrics) from Envoy.
    assert usage_header(answer) == b"log"
    await stream.close()


def body_sent(answer: Any) -> bytes | None:
    """The body a routing answer sends on instead of the client's (None: the client's)."""
    common = answer.request_body.response
    return common.body_mutation.body if common.HasField("body_mutation") else None


async def test_who_reads_the_usage_follows_the_stream_flag(channel: grpc.aio.Channel) -> None:
    """A stream's usage is read by Envoy (header "stream-chunks": its chunks read to cut
    and count), its usage event asked for the client that did not ask (the body spliced,
    its length set, the record marked); a JSON
    answer's by json_to_metadata (header "log"). Neither is the observer's (no usage_via):
    their records charge them."""
    body = body_of("gpt-4o", max_tokens=20, stream=True)
    stream, answer = await admit(channel, TEAM, body)
    assert routed_model(answer) == "gpt-4o"
    values = metadata_of(answer)
    assert values[wire.META_RESERVATION]
    assert wire.META_USAGE_VIA not in values
    assert values[wire.META_USAGE_INJECTED] == "true"
    assert usage_header(answer) == b"stream-chunks"
    assert streamed(answer)  # to the route's stream twin (timeouts.first_token)
    sent = body_sent(answer)
    assert sent is not None
    assert json.loads(sent) == {**json.loads(body), "stream_options": {"include_usage": True}}
    lengths = [
        h.header.raw_value
        for h in answer.request_body.response.header_mutation.set_headers
        if h.header.key == "content-length"
    ]
    assert lengths == [str(len(sent)).encode()]
    await stream.close()

    stream, answer = await admit(channel, TEAM, body_of("gpt-4o", max_tokens=20))
    assert wire.META_USAGE_VIA not in metadata_of(answer)
    assert wire.META_USAGE_INJECTED not in metadata_of(answer)
    assert usage_header(answer) == b"log"
    assert body_sent(answer) is None
    assert not streamed(answer)
    await stream.close()


@pytest.mark.parametrize(
    ("path", "options"),
    [
        ("/v1/chat/completions", {"include_usage": True}),  # the client asked itself
        ("/v1/chat/completions", {"include_obfuscation": False}),  # its options left alone
        ("/v1/chat/completions", None),  # `null`: a second member would be lost
        ("/v1/responses", "absent"),  # reports usage anyway, takes no stream_options
    ],
)
async def test_a_stream_is_sent_as_the_client_wrote_it_unless_usage_must_be_asked(
    channel: grpc.aio.Channel, path: str, options: object
) -> None:
    document = json.loads(body_of("gpt-4o", max_tokens=20, stream=True))
    if options != "absent":
        document["stream_options"] = options
    stream = Stream(channel)
    await stream.headers(TEAM, path=path)
    answer = await stream.body(json.dumps(document).encode())
    assert routed_model(answer) == "gpt-4o"
    assert usage_header(answer) == b"stream-chunks"  # reserved: its text events counted
    assert body_sent(answer) is None
    assert wire.META_USAGE_INJECTED not in metadata_of(answer)
    await stream.close()


@pytest.mark.parametrize(
    ("path", "extra", "max_tokens"),
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 5}, 20),  # many times text
        ("/v1/chat/completions", {}, LOG_MAX_OUTPUT_TOKENS + 1),  # a long answer
        ("/v1/embeddings", {}, 20),  # MBs of floats
    ],
)
async def test_large_json_answers_keep_the_observer(
    channel: grpc.aio.Channel, path: str, extra: dict[str, object], max_tokens: int
) -> None:
    """Envoy parses a logged JSON answer whole in its worker (about 40 ms a MB): answers
    that may be large are read by the observer in Python instead."""
    document = {**json.loads(body_of("gpt-4o", max_tokens=max_tokens)), **extra}
    stream = Stream(channel)
    await stream.headers(TEAM, path=path)
    answer = await stream.body(json.dumps(document).encode())
    assert routed_model(answer) == "gpt-4o"
    values = metadata_of(answer)
    assert values[wire.META_RESERVATION]
    assert values[wire.META_USAGE_VIA] == wire.USAGE_VIA_OBSERVER
    assert usage_header(answer) == b"observer"
    await stream.close()


async def test_over_the_tokens_limit_is_429(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    stream, answer = await admit(channel, TIGHT, body_of("gpt-4o", max_tokens=200))
    assert routed_model(answer) == "gpt-4o"
    await stream.close()
    stream, answer = await admit(channel, TIGHT, body_of("gpt-4o", max_tokens=200))
    status, err, headers = immediate(answer)
    assert (status, err["type"], err["code"]) == (429, "tokens", "rate_limit_exceeded")
    assert f"requested {PROMPT + 200}" in err["message"]
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-tokens"] == "300"
    assert headers["x-ratelimit-remaining-tokens"] == str(300 - PROMPT - 200)
    await stream.close()
    assert decisions(server, "rate_limited", "standard") == 1


async def test_a_request_that_can_never_fit_is_429_too_large(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    stream, answer = await admit(channel, TIGHT, body_of("gpt-4o", max_tokens=400))
    status, err, headers = immediate(answer)
    assert (status, err["code"]) == (429, "request_too_large")
    assert headers["x-should-retry"] == "false" and "retry-after" not in headers
    await stream.close()
    assert decisions(server, "too_large", "standard") == 1


# ----- gates ----------------------------------------------------------------------------


async def test_second_request_waits_until_the_first_stream_ends(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    gate = server.admission.gates["route:gated"]
    body = body_of("gated-model", max_tokens=10)
    first, answer = await admit(channel, TEAM, body)
    assert routed_model(answer) == "gated-model"
    assert (gate.in_flight, gate.in_flight_tokens) == (1, PROMPT + 10)
    assert first.overrides == []  # a gate with room: no timeout override, no extra message

    second = Stream(channel)
    await second.headers(TEAM)
    await second.write_body(body)
    pending = asyncio.ensure_future(second.read_answer())
    await wait_until(lambda: gate.depth("interactive") == 1)
    await asyncio.sleep(0.05)
    assert not pending.done()  # still queued behind the first
    # Before waiting it asked Envoy to wait: its class's max_wait (5 s) + 2 s.
    assert [o.total_seconds() for o in second.overrides] == [7.0]

    await first.close()  # the request is over: its slot is released
    answer = await asyncio.wait_for(pending, 5)
    assert routed_model(answer) == "gated-model"
    assert (gate.in_flight, gate.depth("interactive")) == (1, 0)
    await second.close()
    await wait_until(lambda: gate.in_flight == 0)
    assert gate.in_flight_tokens == 0


async def test_queued_request_cancelled_by_the_client_holds_nothing(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    gate = server.admission.gates["route:gated"]
    body = body_of("gated-model", max_tokens=10)
    estimate = PROMPT + 10
    first, answer = await admit(channel, TEAM, body)
    assert metadata_of(answer)["ratelimit_remaining_tokens"] == str(10000 - estimate)

    queued = Stream(channel)
    await queued.headers(TEAM)
    await queued.write_body(body)
    await wait_until(lambda: gate.depth("interactive") == 1)
    queued.cancel()  # the client went away while waiting
    await wait_until(lambda: gate.depth("interactive") == 0 and gate.queued == 0)
    assert gate.in_flight == 1  # only the first request

    await first.close()
    await wait_until(lambda: gate.in_flight == 0)
    # The cancelled request's tokens were given back: only the first one is still charged.
    third, answer = await admit(channel, TEAM, body)
    assert metadata_of(answer)["ratelimit_remaining_tokens"] == str(10000 - 2 * estimate)
    await third.close()
    await wait_until(lambda: gate.in_flight == 0)


async def test_shed_request_is_503_and_its_reservation_refunded(
    channel: grpc.aio.Channel, server: ExtProcServer
) -> None:
    gate = server.admission.gates["route:gated"]
    body = body_of("gated-model", max_tokens=10)
    estimate = PROMPT + 10
    first, answer = await admit(channel, TEAM, body)
    assert metadata_of(answer)["ratelimit_remaining_tokens"] == str(10000 - estimate)

    # The batch class never queues: with the one slot taken it is shed at once.
    shed, answer = await admit(channel, TEAM, body, ((wire.PRIORITY_HEADER, "batch"),))
    status, err, headers = immediate(answer)
    assert (status, err["type"], err["code"]) == (503, "server_error", "queue_full")
    assert int(headers["retry-after"]) >= 1
    await shed.close()
    assert decisions(server, "shed_queue_full", "batch") == 1
    assert (gate.in_flight, gate.queued) == (1, 0)

    await first.close()
    await wait_until(lambda: gate.in_flight == 0)
    third, answer = await admit(channel, TEAM, body)
    assert routed_model(answer) == "gated-model"
    # Without the refund this would be 10000 - 3 * estimate.
    assert metadata_of(answer)["ratelimit_remaining_tokens"] == str(10000 - 2 * estimate)
    await third.close()
    await wait_until(lambda: gate.in_flight == 0)


@pytest.mark.parametrize(("max_tokens", "status"), [(10**6, 429), (10**6 + 1, 400)])
async def test_refused_request_never_takes_a_slot(
    channel: grpc.aio.Channel, server: ExtProcServer, max_tokens: int, status: int
) -> None:
    gate = server.admission.gates["route:gated"]
    # 10**6 is admission.max_output_tokens: far over the team's tokens; one more is a 400.
    stream, answer = await admit(channel, TEAM, body_of("gated-model", max_tokens=max_tokens))
    assert error_of(answer)[0] == status
    assert (gate.in_flight, gate.queued) == (0, 0)
    await stream.close()


# ----- the open gateway -----------------------------------------------------------------

OPEN_BODIES = [
    body_of("gpt-4o"),
    body_of("small", max_tokens=5),
    b'{"model": "gpt-4o", "max_tokens": 0, "n": 100000}',  # not read without admission
    b'{"model": "unknown"}',
    b"not json",
    b'{"messages": []}',
]


async def test_open_gateway_routes_exactly_as_without_admission() -> None:
    """Without tenants, limits or gates, every answer is the routing stage's own
    (`routing.decide`, the path from before admission existed)."""
    assert not admission_policy(model_of(OPEN)).enabled
    table = RoutingTable.from_model(model_of(OPEN))
    async with serving(OPEN) as (_, open_channel):
        for body in OPEN_BODIES:
            stream = Stream(open_channel)
            headers = await stream.headers(extra=[("authorization", "Bearer sk-client")])
            assert headers.SerializeToString() == CONTINUE_REQUEST_HEADERS  # key kept
            answer = await stream.body(body)
            await stream.close()
            # The routing stage's answer, with the request record (record.py) and the word
            # on who reads the usage (usage_reader.py) added.
            record = record_of(answer)
            answer.ClearField("dynamic_metadata")
            if answer.WhichOneof("response") == "request_body":
                mutation = answer.request_body.response.header_mutation.set_headers
                kept = [h for h in mutation if h.header.key != wire.USAGE_HEADER]
                del mutation[:]
                mutation.extend(kept)
            assert answer.SerializeToString() == decide(body, table, Counters()), body
            assert record[wire.META_TENANT] == "anonymous"
            assert wire.META_KEY_NAME not in record  # no key is checked
            if body == OPEN_BODIES[2]:
                assert routed_model(answer) == "gpt-4o"  # forwarded as before


async def test_open_gateway_with_a_gate_only_admits_anonymously() -> None:
    text = OPEN.replace("    backends:", "    concurrency: {max_requests: 1}\n    backends:")
    async with serving(text) as (server, channel):
        stream = Stream(channel)
        headers = await stream.headers(extra=[("authorization", "Bearer sk-client")])
        assert headers.SerializeToString() == CONTINUE_REQUEST_HEADERS  # nothing to check
        answer = await stream.body(body_of("gpt-4o"))
        assert routed_model(answer) == "gpt-4o"
        assert metadata_of(answer) == {
            wire.META_TENANT: "anonymous",
            wire.META_MODEL: "gpt-4o",
            wire.META_PRIORITY: "standard",
            wire.META_SCENARIO: "default",
            wire.META_QUEUE_MS: 0,
            wire.META_STREAM: "false",
        }
        assert server.admission.gates["route:chat"].in_flight == 1
        await stream.close()
        await wait_until(lambda: server.admission.gates["route:chat"].in_flight == 0)


# ----- a model served under two path prefixes -------------------------------------------

TWO_PREFIXES = (
    HEAD
    + """\
admission:
  priority_classes:
    - {name: standard, max_queue: 0, max_wait: 0}
routes:
  - name: main
    models: [m]
    backends: [{provider: alpha}]
    concurrency: {max_requests: 1, headroom: 0}
  - name: team
    path_prefix: /team/v1/
    models: [m]
    backends: [{provider: beta}]
"""
)


async def test_gate_of_the_route_the_path_selects() -> None:
    async with serving(TWO_PREFIXES) as (server, channel):
        first = Stream(channel)
        await first.headers()
        assert routed_model(await first.body(body_of("m"))) == "m"
        assert server.admission.gates["route:main"].in_flight == 1
        # Route `team` has no gate: Envoy sends this one to beta whatever main is doing.
        other = Stream(channel)
        await other.headers(path="/team/v1/chat/completions")
        answer = await other.body(body_of("m"))
        await other.close()
        await first.close()
        assert answer.WhichOneof("response") == "request_body", immediate(answer)


# ----- provider rate limits -------------------------------------------------------------

PROVIDER_LIMITED = OPEN.replace(
    "    base_url: http://127.0.0.1:18081/v1\n",
    "    base_url: http://127.0.0.1:18081/v1\n    rate_limits: {requests: 1, per: 1m}\n",
)
WITH_TENANT = (
    PROVIDER_LIMITED
    + f"""\
tenants:
  - name: team
    keys: [{{name: team-key, hash: "{hashed(TEAM)}"}}]
"""
)


async def two_requests(channel: grpc.aio.Channel, key: str | None) -> list[object]:
    answers = []
    for _ in range(2):
        stream = Stream(channel)
        await stream.headers(key)
        answers.append(await stream.body(body_of("gpt-4o")))
        await stream.close()
    return answers


async def test_provider_limit_applies_to_a_tenant() -> None:
    async with serving(WITH_TENANT) as (_, channel):
        first, second = await two_requests(channel, TEAM)
        assert routed_model(first) == "gpt-4o"
        assert metadata_of(first)["ratelimit_remaining_requests"] == "0"
        status, err, headers = immediate(second)
        assert (status, err["type"], err["code"]) == (429, "requests", "rate_limit_exceeded")
        assert "provider alpha on requests per min" in err["message"]
        assert headers["x-ratelimit-limit-requests"] == "1"


async def test_provider_limit_applies_without_tenants() -> None:
    async with serving(PROVIDER_LIMITED) as (_, channel):
        first, second = await two_requests(channel, None)
        assert routed_model(first) == "gpt-4o"
        assert metadata_of(first)["ratelimit_remaining_requests"] == "0"
        status, err, _ = immediate(second)
        assert (status, err["code"]) == (429, "rate_limit_exceeded")


OPTED_OUT = HEAD.replace(
    "    base_url: http://127.0.0.1:18082/v1\n",
    "    base_url: http://127.0.0.1:18082/v1\n    ask_stream_usage: false\n",
)
OPTED_OUT_ROUTES = """\
routes:
  - {name: asks, models: [a], backends: [{provider: alpha}]}
  - {name: mixed, models: [m], backends: [{provider: alpha}, {provider: beta}]}
"""


@pytest.mark.parametrize("tenants", [False, True])
async def test_a_route_asks_for_usage_only_if_every_provider_allows_it(tenants: bool) -> None:
    """`ask_stream_usage: false` on one provider: its routes send streams as written (a
    retry could take them there), with admission or without."""
    text = OPTED_OUT + OPTED_OUT_ROUTES
    if tenants:
        text += f'tenants: [{{name: team, keys: [{{name: k, hash: "{hashed(TEAM)}"}}]}}]\n'
    async with serving(text) as (_, channel):
        for model, asked in (("a", True), ("m", False)):
            stream = Stream(channel)
            await stream.headers(TEAM if tenants else None)
            answer = await stream.body(body_of(model, max_tokens=5, stream=True))
            await stream.close()
            assert routed_model(answer) == model
            # Chunks are read to cut the usage event asked for the client (nothing here
            # reserves tokens, so none to count).
            assert usage_header(answer) == (b"stream-chunks" if asked else b"stream"), model
            assert (body_sent(answer) is not None) is asked, model
            assert (wire.META_USAGE_INJECTED in metadata_of(answer)) is asked, model


async def test_with_request_limits_only_nobody_is_given_a_reservation_to_charge() -> None:
    """A request counted against a requests limit costs 1 whatever its usage: its
    reservation stays out of the metadata, so neither its record nor the observer (not
    installed without token limits) is handed one to reconcile."""
    text = OPEN + f"""\
tenants:
  - name: team
    rate_limits: {{requests: 100, per: 1m}}
    keys: [{{name: k, hash: "{hashed(TEAM)}"}}]
"""
    async with serving(text) as (_, channel):
        for model_body in (
            body_of("gpt-4o", max_tokens=5, stream=True),
            body_of("gpt-4o", max_tokens=5000),  # a large JSON answer
        ):
            stream = Stream(channel)
            await stream.headers(TEAM)
            answer = await stream.body(model_body)
            await stream.close()
            values = metadata_of(answer)
            assert values["ratelimit_limit_requests"] == "100"
            assert wire.META_RESERVATION not in values
            assert wire.META_USAGE_VIA not in values
            # The stream's chunks are read for the usage event asked for it (cut), not
            # to count: that is the Lua filter's business (no reservation in the metadata).
            assert usage_header(answer) in (b"stream-chunks", b"none")
