"""Are the request records' latencies right, and what do records cost a request?

Accuracy (the default): a mock provider with a fixed time to first token and inter-token
latency (default 300 ms and 20 ms, 20 output tokens) behind the translated gateway in a
real Envoy (one worker, static bootstrap) and an ExtProcServer in this process. Streamed
requests, one at a time, that do not ask for usage (the OpenAI SDKs' default): the
routing stage asks for it, Envoy reads it (sse_to_metadata) and cuts it out before the
client. Each record's TTFT, and its time per output token as /metrics computes it
(`records.time_per_output_token`: (duration - TTFT) / (the record's output tokens - 1),
the tokens from the provider's usage), p50 and p95, are compared with the configured
values; the report counts the records whose usage carried the mock's token count.

`--cost`: metrics on against metrics off. Two Envoys (one worker each) from the same
translation and one ExtProcServer in a process of its own behind both: "on" as
translated; "off" with the request record access log and the usage reader filters
(json_to_metadata, the stream usage Lua filter, sse_to_metadata, the usage observer)
removed from the listener. The routing stage is the same, so "off" still asks for a
stream's usage: its clients receive that event, which no filter cuts. Per round:
non-streamed completions at concurrency 1 (the mock answers at once, 16 tokens), the
gateways in turn request by request (the order rotating), p50 latency of each; then
streams at concurrency 8 through each gateway, all at the same time (50 tokens 10 ms
apart after 50 ms), TPOT p50 as the client sees it ((last token - first token) / 49).
Reported: the added p50 (on - off) and the TPOT ratio (on / off), median of rounds.
`--cost --split` adds three gateways, "on" without json_to_metadata (which buffers and
parses a JSON answer), "on" without the record access log and "on" without the stream
usage readers (the Lua filter and sse_to_metadata), to see which part a JSON answer's and
a stream's added latency comes from. `--cost --native` adds "on" with sluicegate's native
usage reader (sluicegate.native, built with gcc) in place of Envoy's three readers (and
with --split, that gateway without the record access log too). `--cost --pin` puts every
Envoy thread on core 0 and the Python processes (this client, the mock, the ext_proc
server) on core 1, as a gateway's machine is apart from its clients and providers.

`--decode-only`: CPU time (process time) per record to decode it, and to decode and
count it, over batches of 100 records like the ones Envoy sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from prometheus_client import CollectorRegistry

from sluicegate import wire
from sluicegate.config import load_config
from sluicegate.envoy import EnvoyProcess, find_envoy_binary
from sluicegate.filters import ExtProcServer
from sluicegate.model import Gateway, build_model
from sluicegate.native import MODULE, build
from sluicegate.records import (
    RecordSink,
    RequestRecord,
    decode,
    log_records,
    time_per_output_token,
)
from sluicegate.testing import (
    edited_listeners,
    free_ports,
    metadata_fields,
    static_bootstrap,
    usage_fields,
)
from sluicegate.xds.translate import LISTENER, translate
from sluicegate.xds.translate.native import NATIVE_USAGE_READER_FILTER
from sluicegate.xds.translate.stream_usage import SSE_TO_METADATA_FILTER
from sluicegate.xds.translate.usage import (
    JSON_TO_METADATA_FILTER,
    STREAM_USAGE_FILTER,
    USAGE_FILTER,
)

from .harness.cli import benchmark_parser
from .harness.ext_proc_child import ExtProcChild
from .harness.processes import ENVOY_CORE, LOAD_CORE, pin, stop_tree, wait_listening
from .harness.stack import MockProvider
from .harness.stats import median, percentile

MODEL: Final = "bench-model"
# What "metrics off" removes from the listener besides its access log: every usage reader
# (with the native library, its usage reader).
USAGE_READERS: Final = frozenset(
    {USAGE_FILTER, JSON_TO_METADATA_FILTER, STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER}
)
NATIVE_USAGE_READERS: Final = frozenset({USAGE_FILTER, NATIVE_USAGE_READER_FILTER})
ACCURACY_AIM: Final = 0.05  # within 5 % of the configured value
TPOT_AIM: Final = 0.02  # streamed TPOT on within 2 % of off
ADDED_P50_AIM_S: Final = 0.0001  # added p50 at concurrency 1 within 0.1 ms of off
# --cost: a paced stream and an instant answer, chosen per request by the mock's knobs.
COST_STREAM_TOKENS: Final = 50
PACED: Final = {"x-mock-ttft-ms": "50", "x-mock-itl-ms": "10",
                "x-mock-output-tokens": str(COST_STREAM_TOKENS)}  # fmt: skip
INSTANT: Final = {"x-mock-ttft-ms": "0", "x-mock-itl-ms": "0", "x-mock-output-tokens": "16"}
# --cost: the streams at concurrency 1, one after another: short, so a round stays short.
# The pause before the stream's end lets the client time the end (the usage event, [DONE]
# and the gateway's work there) apart from the tokens: the mock writes them back to back.
END_PAUSE_MS: Final = 5
QUICK_STREAM: Final = {"x-mock-ttft-ms": "0", "x-mock-itl-ms": "1", "x-mock-output-tokens": "16",
                       "x-mock-end-pause-ms": str(END_PAUSE_MS)}  # fmt: skip
STREAM_CLIENTS: Final = 8


def _document(listener: int, provider: int, lane: str = "exact") -> dict[str, Any]:
    """The gateway's YAML; `lane: fast` routes without the routing stage (no tenants:
    Envoy reads the model itself, docs/fast-lane.md)."""
    return {
        "version": 1,
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listener}],
        "providers": [
            {
                "name": "mock",
                "base_url": f"http://127.0.0.1:{provider}/v1",
                "forward_headers": ["x-mock-*"],  # a plain mock process: its knobs pass
            }
        ],
        "routes": [{"name": "bench", "models": [MODEL], "backends": [{"provider": "mock"}]}],
        "admission": {"lane": lane},
    }


def gateway_model(work: Path, listener: int, provider: int, lane: str = "exact") -> Gateway:
    """A routing-only gateway on `listener` in front of a mock on `provider` (its file is
    work/sluicegate-LISTENER.yaml)."""
    path = work / f"sluicegate-{listener}.yaml"
    path.write_text(yaml.safe_dump(_document(listener, provider, lane)))
    return build_model(load_config(path), {})


def _stream(listener: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    request = urllib.request.Request(
        f"http://127.0.0.1:{listener}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def _within(measured: float, configured: float, aim: float) -> str:
    return "met" if abs(measured - configured) <= aim * configured else "missed"


async def _accuracy(requests: int, ttft_ms: int, itl_ms: int, tokens: int) -> str:
    listener, provider, ext_proc, admin = free_ports(4)
    work = Path(tempfile.mkdtemp(prefix="latency-metrics-"))
    gateway = gateway_model(work, listener, provider)
    bootstrap = static_bootstrap(translate(gateway), ext_proc_port=ext_proc, admin_port=admin)
    (work / "envoy.json").write_text(json.dumps(bootstrap))
    mock = MockProvider(
        "mock", provider, work,
        ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--output-tokens", str(tokens)],
    )  # fmt: skip
    server = ExtProcServer()
    server.load(gateway)
    records: list[RequestRecord] = []

    class Keep:
        destination = "memory"

        def write(self, batch: Iterable[RequestRecord]) -> None:
            records.extend(batch)

        def close(self) -> None:
            pass

    server.records.set_access_log(Keep())
    await server.start(f"127.0.0.1:{ext_proc}")
    with (work / "envoy.log").open("wb") as log:
        envoy = subprocess.Popen(
            [find_envoy_binary(), "-c", str(work / "envoy.json"), "--concurrency", "1",
             "--use-dynamic-base-id", "-l", "warning"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        mock.wait_ready()
        await loop.run_in_executor(None, wait_listening, listener, 30.0)
        await loop.run_in_executor(None, _stream, listener)  # warm: connections, caches
        await asyncio.sleep(0.3)
        records.clear()
        for _ in range(requests):
            await loop.run_in_executor(None, _stream, listener)
        deadline = time.monotonic() + 5
        while len(records) < requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop_tree(envoy)
        mock.stop()
        await server.stop()
    answered = [r for r in records if r.status == 200]
    ttft = [r.ttft_s for r in answered if r.ttft_s is not None]
    provider_ttft = [r.provider_ttft_s for r in answered if r.provider_ttft_s is not None]
    tpot = [t for r in answered if (t := time_per_output_token(r)) is not None]
    with_usage = sum(1 for r in answered if r.output_tokens == tokens)
    lines = [
        f"{len(records)} streamed records of {requests} requests (concurrency 1, the client "
        f"not asking for usage); mock TTFT {ttft_ms} ms, ITL {itl_ms} ms, {tokens} tokens; "
        f"records whose usage said {tokens} output tokens: {with_usage} of {len(answered)}; "
        f"TPOT from {len(tpot)} records",
        "",
        "| | configured | p50 | p95 | p50 error | p95 error | within 5 % |",
        "|---|---|---|---|---|---|---|",
    ]
    figures = (
        ("TTFT (the client's: from the request's first byte)", ttft, ttft_ms),
        ("TTFT (the provider's own: from its attempt sent)", provider_ttft, ttft_ms),
        ("TPOT", tpot, itl_ms),
    )
    for name, values, configured in figures:
        p50, p95 = percentile(values, 50) * 1000, percentile(values, 95) * 1000
        errors = [(p - configured) / configured * 100 for p in (p50, p95)]
        aims = [_within(p, configured, ACCURACY_AIM) for p in (p50, p95)]
        lines.append(
            f"| {name} | {configured} ms | {p50:.1f} ms | {p95:.1f} ms | {errors[0]:+.1f} % | "
            f"{errors[1]:+.1f} % | p50 {aims[0]}, p95 {aims[1]} |"
        )
    return "\n".join(lines)


# ----- --cost: metrics on against metrics off --------------------------------------------------


def without(
    resources: dict[str, list[Message]], filters: Collection[str], *, drop_access_log: bool
) -> dict[str, list[Message]]:
    """The translation with the HTTP filters named `filters` (and, with drop_access_log,
    the access logs) removed from every listener. RuntimeError when a named filter is in
    no listener, so a renamed filter cannot leave a measurement measuring nothing."""
    found: set[str] = set()

    def strip(hcm: hcm_pb2.HttpConnectionManager) -> None:
        if drop_access_log:
            hcm.ClearField("access_log")
        found.update(f.name for f in hcm.http_filters if f.name in filters)
        kept = [f for f in hcm.http_filters if f.name not in filters]
        del hcm.http_filters[:]
        hcm.http_filters.extend(kept)

    listeners = edited_listeners(resources, strip)
    if missing := set(filters) - found:
        raise RuntimeError(f"not in the translated listeners: {sorted(missing)}")
    return {**resources, LISTENER: listeners}


def metrics_off(gateway: Gateway) -> dict[str, list[Message]]:
    """The gateway's translation without its request record access log and usage readers
    (the usage observer only exists with token limits)."""
    readers = USAGE_READERS if gateway.native_module is None else NATIVE_USAGE_READERS
    if not gateway.admission.counts_tokens:
        readers -= {USAGE_FILTER}
    return without(translate(gateway), readers, drop_access_log=True)


def serve_ext_proc(config: str) -> ExtProcServer:
    """The ext_proc server of the gateways, on the file `config` (in an ExtProcChild)."""
    server = ExtProcServer()
    server.load(build_model(load_config(Path(config)), {}))
    return server


async def _sequential_in_turn(
    session: aiohttp.ClientSession, urls: dict[str, str], turns: int
) -> dict[str, list[float]]:
    """Seconds per non-streamed completion, one at a time, the gateways in turn request by
    request (the order rotating each turn), so every gateway sees the same machine."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 16}).encode()  # fmt: skip
    headers = {"content-type": "application/json", **INSTANT}
    latencies: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for index in range(turns):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            started = time.perf_counter()
            async with session.post(urls[name], data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{urls[name]}: HTTP {response.status}")
            latencies[name].append(time.perf_counter() - started)
    return latencies


async def _streams_in_turn(
    session: aiohttp.ClientSession, urls: dict[str, str], turns: int, ask_usage: bool = False
) -> dict[str, list[tuple[float, float, float, float]]]:
    """(TTFT, E2E, tokens, end) in seconds of streams one at a time, the gateways in turn
    as in _sequential_in_turn. Clients that do not ask for usage (the SDKs' default), so
    "on" asks for it and cuts it out, unless `ask_usage`. TTFT: to the first event with
    content; tokens: from it to the last; end: from the last to the stream's end, which
    the mock sends END_PAUSE_MS after its last token."""
    document: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 16, "stream": True}  # fmt: skip
    if ask_usage:
        document["stream_options"] = {"include_usage": True}
    body = json.dumps(document).encode()
    headers = {"content-type": "application/json", **QUICK_STREAM}
    found: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in urls}
    names = list(urls)
    for index in range(turns):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            started = time.perf_counter()
            first = last = None
            async with session.post(urls[name], data=body, headers=headers) as response:
                if response.status != 200:
                    raise RuntimeError(f"{urls[name]}: HTTP {response.status}")
                async for line in response.content:
                    if line.startswith(b"data:") and b'"content"' in line:
                        last = time.perf_counter()
                        if first is None:
                            first = last
            ended = time.perf_counter()
            if first is None or last is None:
                raise RuntimeError(f"{urls[name]}: a stream without content")
            found[name].append((first - started, ended - started, last - first, ended - last))
    return found


async def _tpots(session: aiohttp.ClientSession, url: str, per_client: int) -> list[float]:
    """Each stream's (last token - first token) / (tokens - 1), as its client sees it."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 64, "stream": True}).encode()  # fmt: skip
    headers = {"content-type": "application/json", **PACED}
    found: list[float] = []

    async def client() -> None:
        for _ in range(per_client):
            times = []
            async with session.post(url, data=body, headers=headers) as response:
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}")
                async for line in response.content:
                    if line.startswith(b"data:") and b'"content"' in line:
                        times.append(time.perf_counter())
            if len(times) != COST_STREAM_TOKENS:
                raise RuntimeError(f"{url}: {len(times)} content events, not {COST_STREAM_TOKENS}")
            found.append((times[-1] - times[0]) / (len(times) - 1))

    await asyncio.gather(*(client() for _ in range(STREAM_CLIENTS)))
    return found


Figures = dict[str, dict[str, list[float]]]  # figure -> gateway -> one value per round


async def _measure_cost(
    urls: dict[str, str], rounds: int, sequential: int, per_client: int
) -> Figures:
    """Per round and gateway: p50 latency at concurrency 1 (the gateways in turn), p50
    TTFT and E2E of streams at concurrency 1 (in turn too) and TPOT p50 (every gateway's
    streams at the same time)."""
    streamed_figures = tuple(
        figure + suffix for suffix in ("", " asked") for figure in ("ttft", "e2e", "tokens", "end")
    )
    figures: Figures = {
        figure: {name: [] for name in urls} for figure in ("p50", *streamed_figures, "tpot")
    }
    p50s, tpots = figures["p50"], figures["tpot"]
    connector = aiohttp.TCPConnector(limit=len(urls) * STREAM_CLIENTS)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        await _sequential_in_turn(session, urls, 50)  # warm every gateway: connections, caches
        await asyncio.gather(*(_tpots(session, url, 1) for url in urls.values()))
        for index in range(rounds):
            latencies = await _sequential_in_turn(session, urls, sequential)
            streamed = await _streams_in_turn(session, urls, sequential // 2)
            asked = await _streams_in_turn(session, urls, sequential // 2, ask_usage=True)
            streams = await asyncio.gather(
                *(_tpots(session, url, per_client) for url in urls.values())
            )
            for name, found in zip(urls, streams, strict=True):
                p50s[name].append(percentile(latencies[name], 50))
                for suffix, found_streams in (("", streamed[name]), (" asked", asked[name])):
                    for column, figure in enumerate(("ttft", "e2e", "tokens", "end")):
                        values = [stream[column] for stream in found_streams]
                        figures[figure + suffix][name].append(percentile(values, 50))
                tpots[name].append(percentile(found, 50))
            print(
                f"round {index + 1}: "
                + ", ".join(
                    f"metrics {name} p50 {p50s[name][-1] * 1e3:.3f} ms (c=1), "
                    f"TPOT p50 {tpots[name][-1] * 1e3:.3f} ms"
                    for name in urls
                ),
                flush=True,
            )
    return figures


# --cost's gateways: the filters removed from the listener (None: every usage reader, as
# metrics_off), whether its access logs go too, and whether the usage readers are the
# native library's (sluicegate.native: the usage reader and, in the fast lane, the model
# reader). With --split, three more: what "on" costs without one of its parts. With
# --native, "on" with the native readers, and its baseline "off" with the native model
# reader (which routes: it is no part of the metrics), which the native arms' added
# figures are taken against.
Arm = tuple[tuple[str, ...] | None, bool, bool]
COST_ARMS: Final[dict[str, Arm]] = {
    "on": ((), False, False),
    "off": (None, True, False),
}
SPLIT_ARMS: Final[dict[str, Arm]] = {
    "on without json_to_metadata": ((JSON_TO_METADATA_FILTER,), False, False),
    "on without the record access log": ((), True, False),
    "on without the stream usage readers": (
        (STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER), False, False
    ),
}  # fmt: skip
NATIVE_OFF: Final = "off, native model reader"
NATIVE_ARMS: Final[dict[str, Arm]] = {
    "on, native readers": ((), False, True),
    NATIVE_OFF: (None, True, True),
}
# With --native --split: what the native readers' "on" costs without its record log.
NATIVE_SPLIT_ARMS: Final[dict[str, Arm]] = {
    "on, native readers, without the record access log": ((), True, True)
}


def _resources(gateway: Gateway, arm: Arm) -> Any:
    filters, drop_log, native = arm
    if native:
        gateway = replace(gateway, native_module=str(build(MODULE)))
    if filters is None:
        return metrics_off(gateway)
    return without(translate(gateway), filters, drop_access_log=drop_log)


def _cost(
    rounds: int,
    sequential: int,
    per_client: int,
    split: bool,
    lane: str,
    native: bool = False,
    pinned: bool = False,
) -> str:
    work = Path(tempfile.mkdtemp(prefix="latency-metrics-cost-"))
    arms = {**COST_ARMS, **(NATIVE_ARMS if native else {}), **(SPLIT_ARMS if split else {})}
    if native and split:
        arms.update(NATIVE_SPLIT_ARMS)
    provider, *ports = free_ports(1 + len(arms))
    port_of = dict(zip(arms, ports, strict=True))
    # Written before the ext_proc server starts: it reads the first one's file.
    gateways = {name: gateway_model(work, port, provider, lane) for name, port in port_of.items()}
    mock = MockProvider("mock", provider, work)
    envoys: list[EnvoyProcess] = []
    with ExtProcChild(serve_ext_proc, str(work / f"sluicegate-{ports[0]}.yaml")) as ext_proc:
        try:
            for index, (name, arm) in enumerate(arms.items()):
                resources = _resources(gateways[name], arm)
                bootstrap = static_bootstrap(resources, ext_proc_port=ext_proc.port)
                envoy = EnvoyProcess(bootstrap, work_dir=work / f"envoy-{index}", concurrency=1)
                envoys.append(envoy)
                envoy.start_blocking()
                if pinned and envoy.pid is not None:
                    pin(envoy.pid, ENVOY_CORE)
            mock.wait_ready()
            if pinned:
                for pid in (os.getpid(), ext_proc.pid, mock.process.pid):
                    pin(pid, int(LOAD_CORE))
            for port in ports:
                wait_listening(port, 30.0)
            urls = {name: f"http://127.0.0.1:{port}/v1/chat/completions"
                    for name, port in port_of.items()}  # fmt: skip
            figures = asyncio.run(_measure_cost(urls, rounds, sequential, per_client))
        finally:
            for envoy in envoys:
                envoy.stop_blocking()
            mock.stop()

    def baseline(name: str) -> str:
        return NATIVE_OFF if arms[name][2] else "off"

    def added(figure: str, name: str = "on") -> list[float]:
        values = figures[figure]
        return [a - b for a, b in zip(values[name], values[baseline(name)], strict=True)]

    def ratios(name: str = "on") -> list[float]:
        tpots = figures["tpot"]
        return [a / b for a, b in zip(tpots[name], tpots[baseline(name)], strict=True)]

    def ms(values: list[float]) -> str:
        return f"{median(values) * 1e3:.3f}"

    def plus_ms(values: list[float]) -> str:
        return f"{median(values) * 1e3:+.3f}"

    routed_by = "the routing stage" if lane == "exact" else "Envoy alone, no routing stage"
    placed = (
        "; every Envoy thread on core 0, the client, the mock and the ext_proc server on core 1"
        if pinned
        else ""
    )
    lines = [
        f"`lane: {lane}` (routed by {routed_by}); {rounds} rounds; per round and gateway "
        f"{sequential} non-streamed requests and "
        f"{sequential // 2} short streams (16 tokens, 1 ms apart, then a {END_PAUSE_MS} ms "
        "pause before the end; the client not asking for "
        "usage) at concurrency 1, the gateways in turn request by request (the order "
        f"rotating), then {STREAM_CLIENTS} x {per_client} streams ({COST_STREAM_TOKENS} "
        f"tokens, ITL 10 ms) through each, every gateway at the same time{placed}",
        "",
        "| gateway | JSON p50 ms (c=1) | added | stream TTFT p50 ms (c=1) | added | "
        "stream E2E p50 ms (c=1) | added | E2E, usage asked | added | "
        "added: the end, cut / asked | TPOT p50 ms | TPOT x off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in arms:
        lines.append(
            f"| metrics {name} | {ms(figures['p50'][name])} | {plus_ms(added('p50', name))} | "
            f"{ms(figures['ttft'][name])} | {plus_ms(added('ttft', name))} | "
            f"{ms(figures['e2e'][name])} | {plus_ms(added('e2e', name))} | "
            f"{ms(figures['e2e asked'][name])} | {plus_ms(added('e2e asked', name))} | "
            f"{plus_ms(added('end', name))} / {plus_ms(added('end asked', name))} | "
            f"{ms(figures['tpot'][name])} | {median(ratios(name)):.4f}x |"
        )

    def aim(values: list[float]) -> str:
        met = abs(median(values)) <= ADDED_P50_AIM_S
        per_round = ", ".join(f"{a * 1e3:+.3f}" for a in values)
        verdict = "met" if met else "missed"
        return f"{plus_ms(values)} ms (aim within 0.1 ms: {verdict}; per round {per_round} ms)"

    lines += [
        "",
        "Medians of the rounds (the differences and ratios per round, then their median); "
        f"the native arms' against `{NATIVE_OFF}`, the others' against `off`.",
    ]
    for name in ("on", *(NATIVE_ARMS if native else ())):
        if name == NATIVE_OFF:
            continue
        tpot_ratio = median(ratios(name))
        lines += [
            "",
            f"{name}:",
            f"- added p50 at concurrency 1, a stream's first token ({name} - {baseline(name)}): "
            f"{aim(added('ttft', name))}",
            f"- added p50 at concurrency 1, a stream's last byte ({name} - {baseline(name)}): "
            f"{aim(added('e2e', name))}",
            "- the same for streams whose client asks for usage (no cut): first token "
            f"{aim(added('ttft asked', name))}; last byte {aim(added('e2e asked', name))}",
            "- of the last byte, the first to the last token (the chunks between): "
            f"{plus_ms(added('tokens', name))} ms cut, {plus_ms(added('tokens asked', name))} "
            "ms asked; the last token to the end (the usage event, [DONE] and the "
            f"gateway's work at the end, after the mock's {END_PAUSE_MS} ms pause): "
            f"{plus_ms(added('end', name))} ms cut, {plus_ms(added('end asked', name))} ms "
            f"asked (per round {', '.join(f'{a * 1e3:+.3f}' for a in added('end', name))} "
            "ms cut)",
            f"- added p50 at concurrency 1, a JSON answer ({name} - {baseline(name)}): "
            f"{aim(added('p50', name))}",
            f"- streamed TPOT p50, {name} / {baseline(name)}: {tpot_ratio:.4f}x (aim within 2 %: "
            f"{'met' if abs(tpot_ratio - 1) <= TPOT_AIM else 'missed'}; per round "
            f"{', '.join(f'{r:.4f}' for r in ratios(name))})",
        ]
    return "\n".join(lines)


def _log_record() -> Any:
    """A streamed request's record (the client did not ask for usage), with the metadata
    the routing stage writes and the usage Envoy read: sse_to_metadata's members and the
    Lua filter's count of content events."""
    metadata = {
        "tenant": "acme", "key_name": "ci", "model": MODEL, "priority": "standard",
        "scenario": "default", "queue_ms": 0, "stream": "true", "reservation": "abc-1",
        "estimate_input_tokens": "9", "estimate_output_tokens": "1024",
        "ratelimit_limit_requests": "600", "ratelimit_remaining_requests": "599",
        "ratelimit_reset_requests": "1m0s", "ratelimit_limit_tokens": "100000",
        "ratelimit_remaining_tokens": "98967", "ratelimit_reset_tokens": "1m0s",
        wire.META_USAGE_INJECTED: wire.USAGE_INJECTED_TRUE,
    }  # fmt: skip
    usage = {"completion_tokens": 20, "prompt_tokens": 2, wire.USAGE_CONTENT_EVENTS: 20}
    attributes = {
        wire.RECORD_ROUTE: "bench", wire.RECORD_PROVIDER: "mock",
        wire.RECORD_FLAGS: "-", wire.RECORD_DETAILS: "via_upstream",
        wire.RECORD_ATTEMPTS: "1", wire.RECORD_CONTENT_TYPE: "text/event-stream",
        wire.RECORD_FIRST_UPSTREAM_BYTE_US: "303512",
        wire.RECORD_FIRST_UPSTREAM_BODY_US: "304101",
        wire.RECORD_FIRST_DOWNSTREAM_BYTE_US: "303700",
        wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "682004",
        **metadata_fields(metadata),
        **usage_fields(usage),
    }  # fmt: skip
    body = common_pb2.AnyValue(string_value=wire.record_body(wire.RECORD_LOG_NAME, attributes))
    return logs_pb2.LogRecord(time_unix_nano=time.time_ns(), body=body)


def _decode_cost(rounds: int = 200, batch: int = 100) -> str:
    document = _document(10000, 10001)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sluicegate.yaml").write_text(yaml.safe_dump(document))
        gateway = build_model(load_config(Path(tmp) / "sluicegate.yaml"), {})
    sink = RecordSink(CollectorRegistry())
    sink.load(gateway)
    export = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                instrumentation_library_logs=[
                    logs_pb2.InstrumentationLibraryLogs(logs=[_log_record()] * batch)
                ]
            )
        ]
    )
    raw = export.SerializeToString()
    model_maps = sink.declared.model_maps

    def parse() -> None:
        logs_service_pb2.ExportLogsServiceRequest.FromString(raw)

    def decode_all() -> None:
        for item in log_records(export):
            decode(item, model_maps)

    def whole() -> None:
        sink.on_export(logs_service_pb2.ExportLogsServiceRequest.FromString(raw))

    lines = [
        f"CPU µs per record ({len(raw) / batch:.0f} bytes on the wire), "
        f"median of 7 runs of {rounds} batches of {batch}:",
    ]
    for name, step in (("parse the batch", parse), ("decode", decode_all),
                       ("parse + decode + label + count", whole)):  # fmt: skip
        runs = []
        for _ in range(7):
            start = time.process_time()
            for _ in range(rounds):
                step()
            runs.append((time.process_time() - start) / (rounds * batch) * 1e6)
        runs.sort()
        lines.append(f"- {name}: {runs[3]:.1f} (min {runs[0]:.1f}, max {runs[-1]:.1f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)
    parser.add_argument("--decode-only", action="store_true")
    parser.add_argument("--cost", action="store_true", help="metrics on against off")
    parser.add_argument("--split", action="store_true", help="--cost: three partial gateways more")
    parser.add_argument(
        "--pin", action="store_true", help="--cost: Envoys on one core, the Python on the other"
    )
    parser.add_argument(
        "--native", action="store_true",
        help="--cost: and 'on' and 'off' with the native readers",
    )
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--ttft-ms", type=int, default=300)
    parser.add_argument("--itl-ms", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6, help="--cost: rounds")
    parser.add_argument("--sequential", type=int, default=400, help="--cost: requests a round")
    parser.add_argument("--streams", type=int, default=4, help="--cost: streams per client")
    parser.add_argument("--lane", choices=("exact", "fast"), default="exact",
                        help="--cost: the routing stage (exact) or Envoy alone (fast)")
    args = parser.parse_args(argv)
    if args.cost:
        print(_cost(args.rounds, args.sequential, args.streams, args.split, args.lane,
                    args.native, args.pin))  # fmt: skip
        return 0
    print(_decode_cost())
    if not args.decode_only:
        print(asyncio.run(_accuracy(args.requests, args.ttft_ms, args.itl_ms,
                                    args.output_tokens)))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
