"""Parts 1 and 2a of benchmarks/admission.py: the ext_proc server driven directly over gRPC.

Each configuration's ExtProcServer runs in its own process (uvloop, as in production),
built from a YAML document exactly as `sluicegate ext-proc` builds it (load_config_text,
build_model, ExtProcServer.load). This process plays Envoy: many
concurrent Process streams, each the headers message, then the body message, reading
each answer, then half-closing and waiting for the server to end the stream (when the
routing stage frees its gate slot). Requests are serialized once and answers are read as
raw bytes, so the client spends as little CPU as it can; the server's CPU comes from
/proc and does not include the client's.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from benchmarks.harness.ext_proc_child import ExtProcChild, stop_all
from benchmarks.harness.stats import median
from sluicegate import wire
from sluicegate.config import hash_key
from sluicegate.filters import ExtProcServer
from sluicegate.provider.sse import DONE, ChunkEncoder
from sluicegate.testing import body_message, cpu_seconds, headers_message, sys_seconds

# Called as raw bytes in and out: no (de)serializers, no request iterator (the None
# arguments are grpc.aio's defaults, spelled out for its type stubs).
PROCESS_METHOD: Final = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
CLIENT_KEY: Final = "sk-sluicegate-bench-0123456789abcdef"
TENANT: Final = "bench"
MODEL: Final = "chat"

# The chat request of bench_ext_proc.py (about 1 KB, 256 max_tokens, streamed).
CHAT_BODY: Final = json.dumps(
    {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 4},
            {"role": "user", "content": "Summarize the following text please. " * 20},
        ],
        "temperature": 0.2,
        "max_tokens": 256,
        "stream": True,
    }
).encode()

# What Envoy forwards for a request from the official OpenAI Python SDK (its x-stainless-*
# headers included): every variant gets the same set, the admission stage reads them all.
SDK_HEADERS: Final = (
    (":authority", "127.0.0.1:10000"),
    (":scheme", "http"),
    ("accept", "application/json"),
    ("accept-encoding", "gzip, deflate"),
    ("content-type", "application/json"),
    ("user-agent", "OpenAI/Python 1.54.0"),
    ("x-stainless-lang", "python"),
    ("x-stainless-package-version", "1.54.0"),
    ("x-stainless-os", "Linux"),
    ("x-stainless-arch", "x64"),
    ("x-stainless-runtime", "CPython"),
    ("x-stainless-runtime-version", "3.11.7"),
    ("x-stainless-async", "false"),
    ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
    ("x-forwarded-proto", "http"),
    ("x-request-id", "7d9a4b1e-2f4c-4e0a-9b7e-3c1d2e5f6a70"),
    ("authorization", f"Bearer {CLIENT_KEY}"),
)

# Variants of part 1, in table order; the first is the baseline.
VARIANTS: Final = ("routing", "memory", "redis", "gate")
VARIANT_LABELS: Final = {
    "routing": "(a) routing only (no tenants: the pre-admission path)",
    "memory": "(b) tenant key + tokens + requests limits, memory store",
    "redis": "(c) as (b), Redis store (redis-server on 127.0.0.1)",
    "gate": "(d) as (b) + a route concurrency gate that never blocks",
}
# Limits that never refuse during the run (so every request takes the full admitted path).
NEVER_REFUSE: Final[dict[str, Any]] = {
    "requests": 1_000_000_000,
    "tokens": 1_000_000_000_000,
    "per": "1m",
}
GATE_NEVER_BLOCKS: Final = {"max_requests": 100_000}


# Part 1's Redis store: fail_closed, so a Redis failure shows as an answer that did not
# route; the timeout is raised from the default 100 ms to 1 s so that event-loop lag on a
# loaded 2-core machine cannot flip the store to its fallback mid-measurement (the stress
# probe below keeps the default and shows what happens then).
REDIS_COST_STORE: Final = {"on_failure": "fail_closed", "timeout": "1s"}
REDIS_STRESS_STORE: Final = {"on_failure": "fail_closed"}  # timeout: the default 100 ms


def cost_document(
    variant: str, redis_url: str | None, store: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The YAML document of one variant (ports are never bound: only the filter runs)."""
    route: dict[str, Any] = {"name": "chat", "models": [MODEL], "backends": [{"provider": "p"}]}
    doc: dict[str, Any] = {
        "version": 1,
        "admission": {"lane": "exact"},  # the routing stage (the default is lane_rules.py's)
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": 10000}],
        "providers": [{"name": "p", "base_url": "http://127.0.0.1:18081/v1"}],
        "routes": [route],
    }
    if variant == "routing":
        return doc
    doc["tenants"] = [
        {
            "name": TENANT,
            "rate_limits": dict(NEVER_REFUSE),
            "keys": [{"name": "bench-key", "hash": hash_key(CLIENT_KEY)}],
        }
    ]
    if variant == "redis":
        assert redis_url is not None
        settings = REDIS_COST_STORE if store is None else store
        doc["admission"]["store"] = {"kind": "redis", "url": redis_url, **settings}
    if variant == "gate":
        route["concurrency"] = dict(GATE_NEVER_BLOCKS)
    return doc


# ----- the server process --------------------------------------------------------------------


def build_server(text: str, log_path: str) -> ExtProcServer:
    """In the server's process: one ExtProcServer built from the YAML text; warnings (the
    limiter store going down) go to log_path."""
    import logging

    from sluicegate.config import load_config_text
    from sluicegate.model import build_model

    logging.basicConfig(filename=log_path, level=logging.WARNING, format="%(message)s")
    server = ExtProcServer()
    server.load(build_model(load_config_text(text, "admission-bench.yaml"), {}))
    return server


@dataclass
class ServerProcess:
    name: str
    child: ExtProcChild
    log_path: Path

    @property
    def address(self) -> str:
        return self.child.address

    @property
    def pid(self) -> int:
        return self.child.pid

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []


def start_servers(docs: dict[str, dict[str, Any]], work: Path) -> dict[str, ServerProcess]:
    """Every server started at once (they boot in parallel), then each waited for."""
    started: dict[str, ServerProcess] = {}
    for name, doc in docs.items():
        log_path = work / f"ext-proc-{name}.log"
        text = yaml.safe_dump(doc, sort_keys=False)
        child = ExtProcChild(build_server, text, str(log_path))
        started[name] = ServerProcess(name, child, log_path)
    try:
        for server in started.values():
            server.child.wait_ready(60)
    except BaseException:
        stop_servers(list(started.values()))
        raise
    return started


def stop_servers(servers: Sequence[ServerProcess]) -> list[int]:
    return stop_all([server.child for server in servers])


# ----- part 1: the routing stage -------------------------------------------------------------

# First byte of a serialized ProcessingResponse: field number << 3 | 2 (length-delimited).
_ANSWER_REQUEST_HEADERS: Final = 0x0A  # field 1
_ANSWER_REQUEST_BODY: Final = 0x1A  # field 3
_ANSWER_IMMEDIATE: Final = 0x3A  # field 7


def routing_messages() -> tuple[bytes, bytes]:
    headers = headers_message(extra=SDK_HEADERS, content_length=len(CHAT_BODY))
    return headers.SerializeToString(), body_message(CHAT_BODY).SerializeToString()


@dataclass
class Drive:
    requests: int
    elapsed_s: float
    not_routed: int  # answers that were not header + body answers (must be 0)


async def drive_routing(
    channel: grpc.aio.Channel, messages: tuple[bytes, bytes], requests: int, streams: int
) -> Drive:
    process = channel.stream_stream(PROCESS_METHOD, None, None)  # bytes in, bytes out
    metadata = ((wire.STAGE_METADATA_KEY, wire.STAGE_ROUTING),)
    headers, body = messages
    remaining = requests
    not_routed = 0

    async def worker() -> None:
        nonlocal remaining, not_routed
        while remaining > 0:
            remaining -= 1
            call = process(None, metadata=metadata)
            await call.write(headers)
            first = await call.read()
            await call.write(body)
            second = await call.read()
            await call.done_writing()
            await call.read()  # EOF: the server ended the stream (slot released)
            if (
                not isinstance(first, bytes)
                or not isinstance(second, bytes)
                or first[:1] != bytes([_ANSWER_REQUEST_HEADERS])
                or second[:1] != bytes([_ANSWER_REQUEST_BODY])
            ):
                not_routed += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return Drive(requests, time.perf_counter() - started, not_routed)


@dataclass
class CostRound:
    variant: str
    requests: int
    elapsed_s: float
    server_cpu_s: float
    server_sys_s: float  # of which in the kernel
    redis_cpu_s: float
    client_cpu_s: float
    not_routed: int

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s

    @property
    def server_us(self) -> float:
        return self.server_cpu_s / self.requests * 1e6

    @property
    def server_sys_us(self) -> float:
        return self.server_sys_s / self.requests * 1e6

    @property
    def redis_us(self) -> float:
        return self.redis_cpu_s / self.requests * 1e6

    @property
    def server_busy(self) -> float:
        """Share of one core the server used while driven."""
        return self.server_cpu_s / self.elapsed_s


@dataclass
class Stress:
    """The Redis variant with the default store settings, past redis-py's pool of 100."""

    streams: int
    requests: int
    rps: float
    not_routed: int
    store_down_lines: list[str]


@dataclass
class CostResult:
    streams: int
    requests_per_round: int
    rounds: list[list[CostRound]] = field(default_factory=list)  # per round, per variant
    body_bytes: int = len(CHAT_BODY)
    header_count: int = len(SDK_HEADERS) + 3  # + :path, :method, content-length
    store_down_lines: dict[str, list[str]] = field(default_factory=dict)
    stress: Stress | None = None
    breakdown: dict[str, float] = field(default_factory=dict)  # µs per call, in-process

    def of(self, variant: str) -> list[CostRound]:
        return [r for round_ in self.rounds for r in round_ if r.variant == variant]

    def ratio(self, variant: str, attribute: str) -> float:
        """Per-round ratio to the baseline (a) of the same round, median over rounds."""
        ratios = []
        for round_ in self.rounds:
            base = next(r for r in round_ if r.variant == VARIANTS[0])
            this = next(r for r in round_ if r.variant == variant)
            ratios.append(getattr(this, attribute) / getattr(base, attribute))
        return median(ratios)

    def added_us(self, variant: str) -> float:
        """Per-round server CPU µs/request minus the baseline's, median over rounds."""
        added = []
        for round_ in self.rounds:
            base = next(r for r in round_ if r.variant == VARIANTS[0])
            this = next(r for r in round_ if r.variant == variant)
            added.append(this.server_us - base.server_us)
        return median(added)


def _self_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _redis_cpu(pid: int | None) -> float:
    return cpu_seconds(pid) if pid is not None else 0.0


async def _cost_rounds(
    servers: dict[str, ServerProcess],
    redis_pid: int | None,
    rounds: int,
    requests: int,
    streams: int,
    result: CostResult,
) -> None:
    messages = routing_messages()
    channels = {name: grpc.aio.insecure_channel(s.address) for name, s in servers.items()}
    try:
        for name in servers:  # warm up: connections, caches, the key's hash, Lua script
            await drive_routing(channels[name], messages, 600, streams)
        for index in range(rounds):
            order = VARIANTS[index % len(VARIANTS) :] + VARIANTS[: index % len(VARIANTS)]
            measured = []
            for name in order:
                pid = servers[name].pid
                cpu0, redis0, self0 = cpu_seconds(pid), _redis_cpu(redis_pid), _self_cpu()
                sys0 = sys_seconds(pid)
                drive = await drive_routing(channels[name], messages, requests, streams)
                measured.append(
                    CostRound(
                        variant=name,
                        requests=drive.requests,
                        elapsed_s=drive.elapsed_s,
                        server_cpu_s=cpu_seconds(pid) - cpu0,
                        server_sys_s=sys_seconds(pid) - sys0,
                        redis_cpu_s=(_redis_cpu(redis_pid) - redis0) if name == "redis" else 0.0,
                        client_cpu_s=_self_cpu() - self0,
                        not_routed=drive.not_routed,
                    )
                )
                row = measured[-1]
                print(
                    f"  round {index + 1} {name:8s} {row.rps:6.0f} req/s, server "
                    f"{row.server_us:5.0f} us/req, busy {row.server_busy:.2f}, "
                    f"not routed {row.not_routed}",
                    flush=True,
                )
            result.rounds.append(sorted(measured, key=lambda r: VARIANTS.index(r.variant)))
        if "stress" in servers:
            stress_streams, stress_requests = STRESS_STREAMS, STRESS_REQUESTS
            drive = await drive_routing(
                channels["stress"], messages, stress_requests, stress_streams
            )
            result.stress = Stress(
                stress_streams,
                drive.requests,
                drive.requests / drive.elapsed_s,
                drive.not_routed,
                [],
            )
            print(f"  stress: {drive.not_routed} of {drive.requests} not routed", flush=True)
    finally:
        for channel in channels.values():
            await channel.close(None)


# The stress probe: more concurrent requests in one replica than redis-py's asyncio pool
# holds by default (100 connections; one per reserve in flight).
STRESS_STREAMS: Final = 256
STRESS_REQUESTS: Final = 3_000


def run_cost(
    redis_url: str,
    redis_pid: int | None,
    rounds: int,
    requests: int,
    streams: int,
    work: Path,
    stress: bool = True,
) -> CostResult:
    """Part 1: every variant's server up at once, driven in rotated order per round; then
    the stress probe; then the in-process breakdown."""
    import uvloop

    docs = {name: cost_document(name, redis_url) for name in VARIANTS}
    if stress:
        docs["stress"] = cost_document("redis", redis_url, REDIS_STRESS_STORE)
    result = CostResult(streams=streams, requests_per_round=requests)
    servers = start_servers(docs, work)
    try:
        uvloop.run(_cost_rounds(servers, redis_pid, rounds, requests, streams, result))
    finally:
        stop_servers(list(servers.values()))
    for name, server in servers.items():
        lines = [line for line in server.log_lines() if "limiter store" in line]
        if name == "stress" and result.stress is not None:
            result.stress.store_down_lines = lines
        else:
            result.store_down_lines[name] = lines
    result.breakdown = uvloop.run(breakdown(redis_url))
    return result


# ----- part 1: where the time goes (in this process, no gRPC) -------------------------------


# In-process timings count this process's CPU (time.process_time), not wall time, so
# other load on the machine and waits on Redis do not count.


async def _per_call_us(call: Any, count: int) -> float:
    started = time.process_time()
    for _ in range(count):
        await call()
    return (time.process_time() - started) / count * 1e6


def _per_call_sync_us(call: Any, count: int) -> float:
    started = time.process_time()
    for _ in range(count):
        call()
    return (time.process_time() - started) / count * 1e6


async def breakdown(redis_url: str, count: int = 1_000) -> dict[str, float]:
    """CPU µs per call of the pieces of the routing stage, timed in this process on the
    real objects (best of 3 runs): the whole stage per request, and its parts."""
    from sluicegate.config import load_config_text
    from sluicegate.filters import AdmissionController, Counters, RoutingTable, admission_policy
    from sluicegate.filters.admission import AdmissionMetrics, AdmissionStream, presented_key
    from sluicegate.filters.headers import header_text
    from sluicegate.filters.limiter import Limit, MemoryStore, RedisStore, Usage
    from sluicegate.filters.request_facts import inspect_request
    from sluicegate.filters.responses import namespace_struct
    from sluicegate.model import build_model

    headers_msg = ep.ProcessingRequest.FromString(routing_messages()[0])
    body_msg = ep.ProcessingRequest.FromString(routing_messages()[1])
    wire_headers, wire_body = routing_messages()
    figures: dict[str, float] = {}

    def best(values: list[float]) -> float:
        return min(values)

    async def whole(variant: str) -> float:
        config = load_config_text(
            yaml.safe_dump(cost_document(variant, redis_url)), "admission-bench.yaml"
        )
        model = build_model(config, {})
        controller = AdmissionController(admission_policy(model))
        table = RoutingTable.from_model(model)
        counters = Counters()

        async def one() -> None:
            stream = AdmissionStream(controller, table, counters)
            await stream.on_message(headers_msg)
            await stream.on_message(body_msg)
            stream.close()

        try:
            return best([await _per_call_us(one, count) for _ in range(3)])
        finally:
            await controller.close()

    for variant in VARIANTS:
        figures[f"stage:{variant}"] = await whole(variant)
    figures["parse: ProcessingRequest.FromString, headers + body"] = best(
        [
            _per_call_sync_us(
                lambda: (
                    ep.ProcessingRequest.FromString(wire_headers),
                    ep.ProcessingRequest.FromString(wire_body),
                ),
                count,
            )
            for _ in range(3)
        ]
    )
    entries = headers_msg.request_headers.headers.headers

    def read_headers() -> None:
        headers = {h.key: header_text(h) for h in entries}
        presented_key(headers)

    figures["headers: dict of all headers + presented_key"] = best(
        [_per_call_sync_us(read_headers, count) for _ in range(3)]
    )
    config = load_config_text(yaml.safe_dump(cost_document("memory", None)), "x.yaml")
    policy = admission_policy(build_model(config, {}))
    assert policy.keyring is not None
    keyring = policy.keyring
    figures["keyring.identify (known key: one SHA-256)"] = best(
        [_per_call_sync_us(lambda: keyring.identify(CLIENT_KEY), count) for _ in range(3)]
    )
    figures["inspect_request (scan the body, estimate prompt tokens)"] = best(
        [
            _per_call_sync_us(
                lambda: inspect_request(CHAT_BODY, max_output_tokens=1_000_000), count
            )
            for _ in range(3)
        ]
    )
    limits = [
        Limit("tenant", TENANT, "requests", NEVER_REFUSE["requests"], 60.0),
        Limit("tenant", TENANT, "tokens", NEVER_REFUSE["tokens"], 60.0),
    ]
    estimate = Usage(300, 256)
    sequence = iter(range(10**9))
    memory = MemoryStore()
    figures["MemoryStore.reserve (2 limits)"] = best(
        [
            await _per_call_us(
                lambda: memory.reserve(f"m{next(sequence)}", limits, estimate), count
            )
            for _ in range(3)
        ]
    )
    values = {
        wire.META_TENANT: TENANT,
        wire.META_MODEL: MODEL,
        wire.META_RESERVATION: "0123456789ab-1",
        wire.META_ESTIMATE_INPUT: "300",
        wire.META_ESTIMATE_OUTPUT: "256",
        **{f"ratelimit_{i}": "1000000000" for i in range(6)},
    }
    figures["metadata answer: Struct of 11 values, serialized"] = best(
        [
            _per_call_sync_us(
                lambda: ep.ProcessingResponse(
                    dynamic_metadata=namespace_struct(wire.METADATA_NAMESPACE, values)
                ).SerializeToString(),
                count,
            )
            for _ in range(3)
        ]
    )
    metrics = AdmissionMetrics()

    def count_admitted() -> None:
        metrics.decisions.labels("admitted", "standard").inc()
        metrics.tokens_reserved.labels(TENANT, MODEL).inc(556)

    figures["metrics: 2 labels().inc() (decision, tokens reserved)"] = best(
        [
            _per_call_sync_us(
                count_admitted,
                count,
            )
            for _ in range(3)
        ]
    )
    redis = RedisStore(redis_url, key_prefix="breakdown", timeout_s=1.0)
    try:
        runs = []
        for _ in range(3):
            before = os.times()
            for _ in range(count):
                await redis.reserve(f"r{next(sequence)}", limits, estimate)
            after = os.times()
            runs.append(
                (
                    (after.user - before.user) / count * 1e6,
                    (after.system - before.system) / count * 1e6,
                )
            )
        user, system = min(runs, key=sum)
        figures["RedisStore.reserve (2 limits), one at a time: user CPU"] = user
        figures["RedisStore.reserve (2 limits), one at a time: kernel CPU"] = system
    finally:
        await redis.close()
    return figures


# ----- part 2a: the usage observer, per streamed chunk ------------------------------------


def sse_chunks(tokens: int) -> list[bytes]:
    """What the mock provider streams for `tokens` tokens with include_usage: one event per
    token (~250 bytes), the finish event, the usage event, [DONE]."""
    encoder = ChunkEncoder(
        completion_id="chatcmpl-0123456789abcdef0123456789abcdef",
        object_type="chat.completion.chunk",
        created=1_764_000_000,
        model="gpt-4o-mini-2024-07-18",
        include_usage=True,
    )
    chunks = []
    for index in range(1, tokens + 1):
        delta = {"role": "assistant", "content": " word"} if index == 1 else {"content": " word"}
        chunks.append(
            encoder.choices([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
        )
    chunks.append(
        encoder.choices([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
    )
    chunks.append(
        encoder.usage(
            {"prompt_tokens": 212, "completion_tokens": tokens, "total_tokens": 212 + tokens}
        )
    )
    chunks.append(DONE)
    return chunks


# Response headers as Envoy forwards them from the mock provider through the gateway.
RESPONSE_HEADERS: Final = (
    (":status", "200"),
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
    ("x-request-id", "7d9a4b1e-2f4c-4e0a-9b7e-3c1d2e5f6a70"),
    ("openai-processing-ms", "50"),
    ("x-ratelimit-limit-requests", "10000"),
    ("x-ratelimit-remaining-requests", "9999"),
    ("x-ratelimit-reset-requests", "6ms"),
    ("date", "Sun, 30 Nov 2026 12:00:00 GMT"),
    ("server", "envoy"),
    ("x-envoy-upstream-service-time", "51"),
    ("transfer-encoding", "chunked"),
)


def _metadata_bytes(reservation: str | None) -> bytes:
    """The `sluicegate` dynamic metadata the routing stage leaves (forwarded by Envoy with
    every message of the usage stage), serialized as a ProcessingRequest fragment."""
    values = {
        wire.META_TENANT: TENANT,
        wire.META_MODEL: MODEL,
        wire.META_ESTIMATE_INPUT: "212",
        wire.META_ESTIMATE_OUTPUT: "256",
        "ratelimit_limit_requests": "1000000000",
        "ratelimit_remaining_requests": "999999000",
        "ratelimit_reset_requests": "59.9s",
        "ratelimit_limit_tokens": "1000000000000",
        "ratelimit_remaining_tokens": "999999000000",
        "ratelimit_reset_tokens": "59.9s",
    }
    if reservation is not None:
        values[wire.META_RESERVATION] = reservation
    struct = struct_pb2.Struct()
    for key, value in values.items():
        struct.fields[key].string_value = value
    request = ep.ProcessingRequest(
        metadata_context=base_pb2.Metadata(filter_metadata={wire.METADATA_NAMESPACE: struct})
    )
    data: bytes = request.SerializeToString()
    return data


def usage_stream_messages(chunks: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """(response headers message, body messages) without metadata; the caller appends the
    metadata fragment (protobuf concatenation merges the fields)."""
    headers = ep.ProcessingRequest()
    for key, value in RESPONSE_HEADERS:
        headers.response_headers.headers.headers.add(key=key, raw_value=value.encode())
    bodies = [
        ep.ProcessingRequest(
            response_body=ep.HttpBody(body=chunk, end_of_stream=index == len(chunks) - 1)
        ).SerializeToString()
        for index, chunk in enumerate(chunks)
    ]
    return headers.SerializeToString(), bodies


async def drive_usage(
    channel: grpc.aio.Channel,
    chunks: Sequence[bytes],
    with_reservation: bool,
    streams_total: int,
    concurrency: int,
    tag: str,
) -> float:
    process = channel.stream_stream(PROCESS_METHOD, None, None)
    metadata = ((wire.STAGE_METADATA_KEY, wire.STAGE_USAGE),)
    headers, bodies = usage_stream_messages(chunks)
    counter = 0

    async def worker() -> None:
        nonlocal counter
        while counter < streams_total:
            counter += 1
            meta = _metadata_bytes(f"{tag}-{counter}" if with_reservation else None)
            call = process(None, metadata=metadata)
            await call.write(headers + meta)
            for body in bodies:
                await call.write(body + meta)
            await call.done_writing()
            await call.read()  # EOF: observability mode, the server never answers

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


@dataclass
class ObserverRow:
    label: str
    streams: int
    body_messages: int
    elapsed_s: float
    server_cpu_s: float

    @property
    def us_per_body_message(self) -> float:
        return self.server_cpu_s / self.body_messages * 1e6

    @property
    def messages_per_s(self) -> float:
        return self.body_messages / self.elapsed_s


@dataclass
class ObserverMicro:
    tokens: int
    chunk_bytes: int
    usage_chunk_bytes: int
    concurrency: int
    rounds: list[list[ObserverRow]] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)  # µs per body message
    # One routing request at a time (headers + body round trips), idle vs beside the
    # observer of BESIDE_STREAMS paced streams.
    routing_idle: list[float] = field(default_factory=list)
    routing_observing: list[float] = field(default_factory=list)
    beside_chunks_per_s: list[float] = field(default_factory=list)

    def rows(self, label: str) -> list[ObserverRow]:
        return [row for round_ in self.rounds for row in round_ if row.label == label]


OBSERVER_VARIANTS: Final = ("parsing", "transport")
OBSERVER_LABELS: Final = {
    "parsing": "usage stage, reservation in the metadata (every chunk parsed)",
    "transport": "same messages, no reservation (observer ignores the body: gRPC only)",
}


async def _observer_rounds(
    server: ServerProcess, result: ObserverMicro, streams: int, rounds: int, tokens: int
) -> None:
    chunks = sse_chunks(tokens)
    channel = grpc.aio.insecure_channel(server.address)
    try:
        for variant in OBSERVER_VARIANTS:  # warm up
            await drive_usage(channel, chunks, variant == "parsing", 50, 16, f"w{variant}")
        for index in range(rounds):
            order = OBSERVER_VARIANTS if index % 2 == 0 else OBSERVER_VARIANTS[::-1]
            measured = []
            for variant in order:
                cpu0 = cpu_seconds(server.pid)
                elapsed = await drive_usage(
                    channel,
                    chunks,
                    variant == "parsing",
                    streams,
                    result.concurrency,
                    f"r{index}{variant}",
                )
                cpu = cpu_seconds(server.pid) - cpu0
                row = ObserverRow(variant, streams, streams * len(chunks), elapsed, cpu)
                measured.append(row)
                print(
                    f"  round {index + 1} {variant:9s} {row.messages_per_s:7.0f} msg/s "
                    f"server {row.us_per_body_message:5.1f} us/body message",
                    flush=True,
                )
            result.rounds.append(measured)
        await _routing_beside_observer(channel, chunks, result)
    finally:
        await channel.close(None)


# Routing latency beside the observer: the e2e part's load (16 streams, a chunk every
# 10 ms each) observed by the same server while one request at a time is routed.
BESIDE_STREAMS: Final = 16
BESIDE_ITL_S: Final = 0.010
BESIDE_SLICE_S: Final = 2.5


async def _routing_latencies(channel: grpc.aio.Channel, seconds: float) -> list[float]:
    process = channel.stream_stream(PROCESS_METHOD, None, None)
    metadata = ((wire.STAGE_METADATA_KEY, wire.STAGE_ROUTING),)
    headers, body = routing_messages()
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        call = process(None, metadata=metadata)
        await call.write(headers)
        await call.read()
        await call.write(body)
        await call.read()
        latencies.append(time.perf_counter() - started)
        await call.done_writing()
        await call.read()
        await asyncio.sleep(0.005)
    return latencies


async def _paced_usage(
    channel: grpc.aio.Channel, chunks: Sequence[bytes], stop: asyncio.Event
) -> int:
    process = channel.stream_stream(PROCESS_METHOD, None, None)
    metadata = ((wire.STAGE_METADATA_KEY, wire.STAGE_USAGE),)
    headers, bodies = usage_stream_messages(chunks)
    sent = 0
    counter = 0

    async def stream() -> None:
        nonlocal sent, counter
        while not stop.is_set():
            counter += 1
            meta = _metadata_bytes(f"beside-{counter}")
            call = process(None, metadata=metadata)
            await call.write(headers + meta)
            for body in bodies:
                await asyncio.sleep(BESIDE_ITL_S)
                await call.write(body + meta)
                sent += 1
            await call.done_writing()
            await call.read()

    await asyncio.gather(*(stream() for _ in range(BESIDE_STREAMS)))
    return sent


async def _routing_beside_observer(
    channel: grpc.aio.Channel, chunks: Sequence[bytes], result: ObserverMicro
) -> None:
    for _ in range(2):
        result.routing_idle += await _routing_latencies(channel, BESIDE_SLICE_S)
        stop = asyncio.Event()
        started = time.perf_counter()
        pacer = asyncio.create_task(_paced_usage(channel, chunks, stop))
        await asyncio.sleep(0.3)  # the streams are under way
        result.routing_observing += await _routing_latencies(channel, BESIDE_SLICE_S)
        stop.set()
        sent = await pacer
        result.beside_chunks_per_s.append(sent / (time.perf_counter() - started))


def run_observer_micro(
    rounds: int, streams: int, concurrency: int, tokens: int, work: Path
) -> ObserverMicro:
    """Part 2a: CPU per response_body message in the usage stage (server (b): memory store)."""
    import uvloop

    chunks = sse_chunks(tokens)
    result = ObserverMicro(tokens, len(chunks[0]), len(chunks[-2]), concurrency)
    servers = start_servers({"memory": cost_document("memory", None)}, work)
    try:
        uvloop.run(_observer_rounds(servers["memory"], result, streams, rounds, tokens))
    finally:
        stop_servers(list(servers.values()))
    result.breakdown = observer_breakdown(tokens)
    return result


def observer_breakdown(tokens: int, streams: int = 300) -> dict[str, float]:
    """µs per body message of the usage stage's pieces, in this process (best of 3)."""
    from sluicegate.filters import AdmissionController
    from sluicegate.filters.admission import UsageStream
    from sluicegate.filters.usage import SseUsageParser

    chunks = sse_chunks(tokens)
    headers, bodies = usage_stream_messages(chunks)
    meta = _metadata_bytes("rid-1")
    wire_bodies = [body + meta for body in bodies]
    parsed_headers = ep.ProcessingRequest.FromString(headers + meta)
    parsed_bodies = [ep.ProcessingRequest.FromString(body) for body in wire_bodies]
    per_stream = len(chunks)
    figures: dict[str, float] = {}

    def timed(work: Any) -> float:
        runs = []
        for _ in range(3):
            started = time.process_time()
            for _ in range(streams):
                work()
            runs.append((time.process_time() - started) / (streams * per_stream) * 1e6)
        return min(runs)

    def parse_all() -> None:
        for body in wire_bodies:
            ep.ProcessingRequest.FromString(body)

    def feed_all() -> None:
        parser = SseUsageParser()
        for chunk in chunks:
            parser.feed(chunk)
        parser.finish()

    async def observe() -> float:
        controller = AdmissionController()

        def observe_all() -> None:
            usage = UsageStream(controller)
            usage.on_message(parsed_headers)
            for message in parsed_bodies:
                usage.on_message(message)

        try:
            return timed(observe_all)
        finally:
            await controller.close()

    import uvloop

    figures["ProcessingRequest.FromString (chunk + metadata)"] = timed(parse_all)
    figures["SseUsageParser.feed alone"] = timed(feed_all)
    figures["UsageStream.on_message (parser, metadata read once, reconcile spawned)"] = uvloop.run(
        observe()
    )
    return figures
