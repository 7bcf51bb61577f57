"""Benchmark: what putting each provider's key on each upstream attempt costs, three ways.

Not collected by pytest. Run:

    python -m benchmarks.credentials [--rounds 15] [--requests 1000] [--latency-requests 200]
                                     [--concurrency 16] [--no-write]

One route, two mock providers (each requiring its own key), one cluster with both as
hosts, so every attempt needs the key of whichever provider Envoy picked. Three Envoys
(one worker each) run the same translated config and differ only in how the key is set:

  today    header_mutation sets `Authorization: %UPSTREAM_METADATA(sluicegate:authorization)%`
           from endpoint metadata (the key is in config_dump);
  ext_proc (a) an upstream ext_proc stage, request headers only, sets it from a table in
           the sluicegate process. A lower bound for (a): the handler only looks up the
           provider header that header_mutation set; the real stage would do more;
  sds      (c) what sluicegate ships: header_mutation sets the provider header, a composite
           filter matched on it runs that provider's credential_injector, keys from SDS.
           (Here the secrets are static in the bootstrap; over ADS the request path is
           the same, secrets only arrive differently.)

Every request also passes the real routing stage (the ext_proc server in its own uvloop
process, shared by all three), as in production. Each round runs each variant in a
rotated order: a throughput phase (`--requests` at `--concurrency`) and a latency phase
(`--latency-requests` one at a time). Reported: median req/s over rounds, p50/p99 latency
over all sequential samples, ratios and added p50 against `today`, and CPU per request of
Envoy and of the ext_proc process. Every answer must be a 200 from a mock that checked its
own key, so a variant that sent a wrong key fails the run. Everything (mocks, ext_proc
server, Envoys, load generator) shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import struct_pb2
from google.protobuf.message import Message

from benchmarks.harness.cli import benchmark_parser
from benchmarks.harness.ext_proc_child import ExtProcChild
from benchmarks.harness.results import machine, today, update_section
from benchmarks.harness.stack import MockProvider
from benchmarks.harness.stats import median, percentile
from sluicegate import wire
from sluicegate.config import load_config, resolve_api_keys
from sluicegate.envoy import EnvoyProcess
from sluicegate.filters import ExtProcServer
from sluicegate.model import Gateway, build_model
from sluicegate.testing import cpu_seconds, free_ports, static_bootstrap
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS
from sluicegate.xds.translate import (
    CLUSTER,
    CREDENTIALS_FILTER,
    ENDPOINT,
    LISTENER,
    SECRET,
    translate,
)
from sluicegate.xds.translate._ext_proc import EXT_PROC_FILTER, ext_proc_config

# The mock provider's own entry point: it takes --log-level (kept at WARNING while measured).
PROVIDER_MODULE = (sys.executable, "-m", "sluicegate.provider")
CREDENTIALS_STAGE = "credentials"  # the bench-only ext_proc stage of variant (a)
PROVIDERS = ("alpha", "beta")
MODEL = "bench-model"
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
).encode()

TODAY, EXT_PROC, SDS = "today", "ext_proc", "sds"
VARIANTS = (TODAY, EXT_PROC, SDS)
LABELS = {
    TODAY: "today: header_mutation, key in endpoint metadata",
    EXT_PROC: "(a) attempt ext_proc sets the key (headers only)",
    SDS: "(c) composite + credential_injector, SDS keys",
}


# ----- the config and its three variants ---------------------------------------------------


def resolved_gateway(work: Path, ports: dict[str, int]) -> Gateway:
    providers = []
    for name in PROVIDERS:
        (work / f"{name}.key").write_text(f"sk-bench-{name}\n")
        providers.append(
            f"  - {{name: {name}, base_url: 'http://127.0.0.1:{ports[name]}/v1',"
            f" api_key: {{file: {name}.key}}}}"
        )
    path = work / "bench.yaml"
    path.write_text(
        "version: 1\nadmission: {lane: exact}\n"
        "listeners: [{name: main, address: 127.0.0.1, port: 10000}]\nproviders:\n"
        + "\n".join(providers)
        + f"\nroutes:\n  - name: bench\n    models: [{MODEL}]\n    backends:\n"
        + "".join(f"      - {{provider: {name}}}\n" for name in PROVIDERS)
    )
    config = load_config(path)
    return build_model(config, resolve_api_keys(config, path))


def _copy(message: Message) -> Any:
    clone = type(message)()
    clone.CopyFrom(message)
    return clone


def variant_resources(ir: Gateway, variant: str) -> dict[str, list[Any]]:
    """The shipped translation (sds), or it rewritten to today's or (a)'s key handling."""
    resources = {type_url: [_copy(m) for m in items] for type_url, items in translate(ir).items()}
    for listener in resources[LISTENER]:
        listener.address.socket_address.port_value = 0  # Envoy picks; read back from admin
    if variant == SDS:
        return resources
    resources[SECRET] = []
    keys = {p.name: p.authorization or "" for p in ir.providers}
    for cluster in resources[CLUSTER]:
        options = http_protocol_options_pb2.HttpProtocolOptions()
        assert cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Unpack(options)
        kept = [f for f in options.http_filters if f.name != CREDENTIALS_FILTER]
        if variant == TODAY:
            kept[0] = _header_mutation_with_key(kept[0])
        else:
            kept.insert(len(kept) - 1, _credentials_ext_proc(ir))
        del options.http_filters[:]
        options.http_filters.extend(kept)
        cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Pack(options)
    if variant == TODAY:
        for assignment in resources[ENDPOINT]:
            assert isinstance(assignment, endpoint_pb2.ClusterLoadAssignment)
            for locality in assignment.endpoints:
                for endpoint in locality.lb_endpoints:
                    meta = endpoint.metadata.filter_metadata[wire.METADATA_NAMESPACE]
                    provider = meta.fields[wire.META_PROVIDER].string_value
                    meta.fields["authorization"].CopyFrom(
                        struct_pb2.Value(string_value=keys[provider])
                    )
    return resources


def _header_mutation_with_key(item: hcm_pb2.HttpFilter) -> hcm_pb2.HttpFilter:
    """Today's filter: after removing the client's key, set the provider's from metadata."""
    config = header_mutation_pb2.HeaderMutation()
    assert item.typed_config.Unpack(config)
    mutations = list(config.mutations.request_mutations)
    key = type(mutations[0])(
        append=base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(
                key="authorization",
                value=f"%UPSTREAM_METADATA({wire.METADATA_NAMESPACE}:authorization)%",
            ),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    )
    mutations.insert(1, key)
    del config.mutations.request_mutations[:]
    config.mutations.request_mutations.extend(mutations)
    result = hcm_pb2.HttpFilter(name=item.name)
    result.typed_config.Pack(config)
    return result


def _credentials_ext_proc(ir: Gateway) -> hcm_pb2.HttpFilter:
    """(a): the attempt-stage ext_proc as sluicegate configures it, request headers only."""
    config = ext_proc_config(CREDENTIALS_STAGE, ir.limits)
    config.processing_mode.request_body_mode = processing_mode_pb2.ProcessingMode.NONE
    result = hcm_pb2.HttpFilter(name=EXT_PROC_FILTER)
    result.typed_config.Pack(config)
    return result


# ----- the ext_proc server process ---------------------------------------------------------


def build_server(ir: Gateway) -> ExtProcServer:
    """Routing stage (sluicegate's own) plus the bench-only credentials stage of (a)."""
    from sluicegate.filters import ExtProcService, RoutingTable
    from sluicegate.filters.responses import (
        CONTINUE_REQUEST_HEADERS,
        PASS_THROUGH,
        common,
        request_headers_answer,
        set_header,
    )
    from sluicegate.filters.service import stage_of

    answers = {
        p.name.encode(): request_headers_answer(
            common([set_header("authorization", p.authorization.encode())])
        )
        for p in ir.providers
        if p.authorization
    }

    class Service(ExtProcService):
        async def _process(self, requests: Any, context: Any) -> AsyncIterator[bytes]:
            if stage_of(context.invocation_metadata()) != CREDENTIALS_STAGE:
                async for answer in super()._process(requests, context):
                    yield answer
                return
            async for request in requests:
                kind = request.WhichOneof("request")
                if kind != "request_headers":
                    yield PASS_THROUGH.get(kind or "", CONTINUE_REQUEST_HEADERS)
                    continue
                answer = CONTINUE_REQUEST_HEADERS
                for header in request.request_headers.headers.headers:
                    if header.key == wire.PROVIDER_HEADER:
                        answer = answers.get(header.raw_value, CONTINUE_REQUEST_HEADERS)
                        break
                yield answer

    server = ExtProcServer()
    server.service = Service(RoutingTable.from_model(ir))
    return server


# ----- processes ---------------------------------------------------------------------------


@contextlib.contextmanager
def mock_providers(ir: Gateway, ports: dict[str, int], work: Path) -> Iterator[list[int]]:
    """One mock per provider, each requiring that provider's key."""
    mocks: list[MockProvider] = []
    try:
        for provider in ir.providers:
            assert provider.authorization is not None
            env = {"BENCH_KEY": provider.authorization.removeprefix("Bearer ")}
            args = ["--name", provider.name, "--api-key-env", "BENCH_KEY", "--ttft-ms", "0",
                    "--itl-ms", "0", "--jitter-ms", "0", "--output-tokens", "4",
                    "--log-level", "WARNING"]  # fmt: skip
            port = ports[provider.name]
            mock = MockProvider(provider.name, port, work, args, env=env, command=PROVIDER_MODULE)
            mocks.append(mock)
        for mock in mocks:
            mock.wait_ready()
        yield [mock.process.pid for mock in mocks]
    finally:
        for mock in mocks:
            mock.stop(grace_s=10)


# ----- load --------------------------------------------------------------------------------


@dataclass
class Sample:
    rps: list[float] = field(default_factory=list)  # one per round
    p50_ms: list[float] = field(default_factory=list)  # one per round
    latencies_ms: list[float] = field(default_factory=list)  # all rounds
    envoy_cpu_us: list[float] = field(default_factory=list)
    ext_proc_cpu_us: list[float] = field(default_factory=list)
    providers: Counter[str] = field(default_factory=Counter)


async def _one(session: aiohttp.ClientSession, url: str, seen: Counter[str]) -> None:
    headers = {"content-type": "application/json", "authorization": "Bearer sk-client-key"}
    async with session.post(url, data=BODY, headers=headers) as response:
        text = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {text[:300]!r}")
        seen[response.headers.get("x-mock-provider", "?")] += 1


async def throughput(url: str, requests: int, concurrency: int, seen: Counter[str]) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _one(session, url, seen)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests / (time.perf_counter() - started)


async def latencies(url: str, requests: int, seen: Counter[str]) -> list[float]:
    result = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(requests):
            started = time.perf_counter()
            await _one(session, url, seen)
            result.append((time.perf_counter() - started) * 1000)
    return result


# ----- main --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Sample]:
    work = Path(tempfile.mkdtemp(prefix="sluicegate-bench-credentials-"))
    ports = dict(zip(PROVIDERS, free_ports(len(PROVIDERS)), strict=True))
    ir = resolved_gateway(work, ports)
    samples = {variant: Sample() for variant in VARIANTS}
    with (
        mock_providers(ir, ports, work) as mock_pids,
        ExtProcChild(build_server, ir) as ext_proc,
        contextlib.ExitStack() as stack,
    ):
        urls: dict[str, str] = {}
        envoy_pids: dict[str, int] = {}
        for variant in VARIANTS:
            bootstrap = static_bootstrap(
                variant_resources(ir, variant), ext_proc_port=ext_proc.port
            )
            envoy = stack.enter_context(
                EnvoyProcess(bootstrap, work_dir=work / f"envoy-{variant}", concurrency=1)
            )
            host, port = next(iter(envoy.listeners().values()))
            urls[variant] = f"http://{host}:{port}/v1/chat/completions"
            assert envoy.pid is not None
            envoy_pids[variant] = envoy.pid
        ext_proc_pid = ext_proc.pid
        print(f"mocks {mock_pids}, ext_proc pid {ext_proc_pid}, Envoys {envoy_pids}")
        for variant in VARIANTS:  # warm up: pools, caches, JIT-free but still worth it
            asyncio.run(throughput(urls[variant], 300, args.concurrency, Counter()))
        for round_no in range(args.rounds):
            order = VARIANTS[round_no % 3 :] + VARIANTS[: round_no % 3]
            for variant in order:
                sample = samples[variant]
                envoy_before = cpu_seconds(envoy_pids[variant])
                ext_before = cpu_seconds(ext_proc_pid)
                rps = asyncio.run(
                    throughput(urls[variant], args.requests, args.concurrency, sample.providers)
                )
                sample.rps.append(rps)
                sample.envoy_cpu_us.append(
                    (cpu_seconds(envoy_pids[variant]) - envoy_before) / args.requests * 1e6
                )
                sample.ext_proc_cpu_us.append(
                    (cpu_seconds(ext_proc_pid) - ext_before) / args.requests * 1e6
                )
                times = asyncio.run(
                    latencies(urls[variant], args.latency_requests, sample.providers)
                )
                sample.latencies_ms += times
                sample.p50_ms.append(median(times))
            print(
                f"round {round_no + 1}/{args.rounds}: "
                + ", ".join(f"{v} {samples[v].rps[-1]:.0f} req/s" for v in VARIANTS)
            )
    return samples


def report(samples: dict[str, Sample], args: argparse.Namespace) -> str:
    # Ratios and added latency are paired per round (same minute, same background load),
    # then the median over rounds is taken.
    base = samples[TODAY]
    rows = [
        "| variant | req/s | req/s ratio to today | p50 ms | p50 added vs today | p99 ms | "
        "Envoy CPU µs/req (added vs today) | ext_proc CPU µs/req (added vs today) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def paired(values: list[float], baseline: list[float]) -> float:
        return median([v - b for v, b in zip(values, baseline, strict=True)])

    for variant in VARIANTS:
        sample = samples[variant]
        ratio = median([v / b for v, b in zip(sample.rps, base.rps, strict=True)])
        added = paired(sample.p50_ms, base.p50_ms)
        envoy_added = paired(sample.envoy_cpu_us, base.envoy_cpu_us)
        ext_added = paired(sample.ext_proc_cpu_us, base.ext_proc_cpu_us)
        rows.append(
            f"| {LABELS[variant]} | {median(sample.rps):.0f} | {ratio:.2f} | "
            f"{median(sample.latencies_ms):.2f} | {added * 1000:+.0f} µs | "
            f"{percentile(sample.latencies_ms, 99):.2f} | "
            f"{median(sample.envoy_cpu_us):.0f} ({envoy_added:+.0f}) | "
            f"{median(sample.ext_proc_cpu_us):.0f} ({ext_added:+.0f}) |"
        )
    served = {v: dict(sorted(samples[v].providers.items())) for v in VARIANTS}
    return "\n".join(
        [
            f"Run {today()} on {machine()}; Envoy 1.40, 1 worker per Envoy.",
            "",
            "Command: `python -m benchmarks.credentials "
            f"--rounds {args.rounds} --requests {args.requests} "
            f"--latency-requests {args.latency_requests} --concurrency {args.concurrency}`",
            "",
            "One route whose cluster has two mock providers as hosts (each checks its own "
            "key); every request passes the routing stage. Throughput at concurrency "
            f"{args.concurrency}, latency one request at a time; three Envoys, one per variant, "
            "measured in rotated order in the same session. req/s, CPU: median over rounds; "
            "ratio and every 'added': per-round pairs against today, median over rounds; "
            "p50/p99: all sequential samples. CPU is read from /proc (10 ms ticks).",
            "",
            *rows,
            "",
            f"Answers by provider (all 200, each with that provider's key): {served}.",
            "",
            f"Load average (1 min) at start and end: {args.load_before:.2f}, "
            f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: other work shared the "
            "machine, so single rounds vary widely; the per-round pairing is what to read.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)  # records unless --no-write
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--latency-requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = parser.parse_args(argv)
    args.load_before = os.getloadavg()[0]
    samples = run(args)
    text = report(samples, args)
    print(text)
    if not args.no_write:
        update_section("Upstream credentials", text + "\n\n" + CONCLUSION)
    return 0


CONCLUSION = """\
Chosen: (c), for every route with a keyed provider. It keeps the keys out of Envoy's
config (SDS secrets show as `[redacted]` in `/config_dump`, also with `?include_eds`), a
retry to another provider carries that provider's key, and no Python runs per request for
keys, so it costs what `today` costs within this machine's noise (one C++ header match
and a delegated filter per attempt). (a) puts an ext_proc round trip on every attempt of
every keyed route, paid in Envoy and in Python CPU as the (a) row shows, and that row is
a lower bound (its handler reads one header and nothing else).
(b), a plain credential_injector for routes with one keyed provider, would save only the
header match, so one mechanism serves all routes. No per-host header or credential
setting in Envoy 1.40 does better: transport_socket_matches choose TLS only, endpoint
metadata formatters show their values in config_dump, and the `%SECRET(name)%` formatter
(`envoy.formatter.generic_secret`) takes a fixed secret name, not one per host.

Checked with Envoy 1.40 and sluicegate's ADS server (SotW and delta;
tests/credentials/test_e2e.py): a reload adding a keyed provider pushes a cluster naming
a new secret; Envoy subscribes to it on seeing the cluster and keeps the cluster warming
until it arrives, so the new route answered 200 with the key from its first request
(404 before the route existed, never a 401 or a keyless request). With the secret
deliberately withheld (a one-off experiment, not a test: the snapshot cannot be made
that way by `translate`), the cluster stayed warming until the SDS initial fetch timeout
(15 s), after which Envoy answered `401 Failed to inject credential.` rather than send a
request without a key. A rotated key (key file rewritten, no YAML edit) was in use
within the watcher's 100 ms poll plus a few ms of push, with no restart and no cluster
change. Proofs: tests/credentials/."""


if __name__ == "__main__":
    raise SystemExit(main())
