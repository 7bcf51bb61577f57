"""Benchmark: the floor any Python ext_proc server puts under the gateway, against sluicegate.

    python -m benchmarks.ext_proc_floor [--write] [--rounds 3] [--seconds 5]

Needs `wrk` (Debian: `apt-get install wrk`): a C load generator, so the client costs
little CPU. The provider is a second Envoy answering every request with a fixed
16-token chat completion (with `usage`) from a direct response, so it costs little
too; what remains is the gateway. Every gateway is a real Envoy with one worker:

- plain: Envoy alone, routing on the path;
- floor, 2 messages: an ext_proc filter sending the request headers and the buffered
  body (sluicegate's routing stage sends exactly these), served by a do-nothing
  grpc.aio server on uvloop that answers each message with prebuilt bytes (the answer
  to the body sets the model header the route matches and clears the route cache);
- floor, 1 message: the least an ext_proc filter can send for a request (its headers
  only), the model read from the body by Envoy's json_to_metadata filter and forwarded
  as metadata; the do-nothing server answers the headers with the model header;
- floor, streamed body: STREAMED body with send_body_without_waiting_for_header_response,
  so headers and body go out back to back and the server answers both once the body
  has come (one round trip instead of two);
- sluicegate routing: `sluicegate up` with no tenants (routing stage only);
- sluicegate admission: `sluicegate up` with a key, a tokens and a requests limit
  (memory store) and so usage accounting (the access log for these small JSON
  answers, the usage observer for streams): the full admission path.

Per round, gateways in rotated order: latency at concurrency 1 (wrk, 1 connection:
p50, p99, p99.9), then requests/s at concurrency 32 and the CPU each process spent
per request (from /proc). The floor rows bound what any server built on grpc.aio can
reach here; the gap from them to sluicegate's rows is sluicegate's own cost.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.admission_path import CHAT, KEY, MODEL, Gateway, up_doc
from benchmarks.harness.bootstraps import bootstrap, cluster, plain_gateway, typed
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.processes import stop_tree, wait_listening
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import UpStack, probe_headers
from benchmarks.harness.stats import median
from sluicegate.envoy import EnvoyProcess
from sluicegate.process import die_with_parent
from sluicegate.testing import cpu_by_role, free_ports

PLAIN: Final = "plain"
FLOORS: Final = ("floor, 2 messages", "floor, 1 message", "floor, streamed body")
STACKS: Final = ("sluicegate routing", "sluicegate admission")
GATEWAYS: Final = (PLAIN, *FLOORS, *STACKS)
SERVER_MODES: Final = dict(zip(FLOORS, ("buffered", "headers", "streamed"), strict=True))
MODEL_HEADER: Final = "x-floor-model"
COMPLETION: Final = json.dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "sixteen tokens of a fixed answer"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 16, "total_tokens": 25},
    }
)
# wrk: POST the chat body with the bench key; print the tail wrk's summary leaves out.
WRK_SCRIPT: Final = f"""
wrk.method = "POST"
wrk.body = '{CHAT.decode()}'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer {KEY}"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %.1f %.1f %.1f\\n", summary.requests,
    summary.errors.status, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout, latency:percentile(50),
    latency:percentile(99), latency:percentile(99.9)))
end
"""


# ----- the do-nothing ext_proc server ----------------------------------------------------------


def serve_floor(mode: str, port: int) -> None:
    """A grpc.aio ext_proc server (uvloop) that answers with prebuilt bytes and no work."""
    import grpc
    import uvloop
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    routed = ep.CommonResponse(clear_route_cache=True)
    routed.header_mutation.set_headers.append(
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=MODEL_HEADER, raw_value=MODEL.encode())
        )
    )
    continue_headers = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
    route_headers = ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=routed))
    route_body = ep.ProcessingResponse(request_body=ep.BodyResponse(response=routed))
    continue_body = ep.ProcessingResponse(request_body=ep.BodyResponse())
    answers = {
        name: message.SerializeToString()
        for name, message in (
            ("continue_headers", continue_headers),
            ("route_headers", route_headers),
            ("route_body", route_body),
            ("continue_body", continue_body),
        )
    }

    async def process(requests: Any, _context: Any) -> Any:
        held_chunks = 0
        async for request in requests:
            kind = request.WhichOneof("request")
            if mode == "headers":
                yield answers["route_headers"]
            elif mode == "buffered":
                yield answers["continue_headers" if kind == "request_headers" else "route_body"]
            elif kind == "request_body":  # streamed: hold everything until the body ends
                held_chunks += 1
                if request.request_body.end_of_stream:
                    yield answers["route_headers"]
                    for _ in range(held_chunks):
                        yield answers["continue_body"]
                    held_chunks = 0

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(
            process,
            request_deserializer=ep.ProcessingRequest.FromString,
            response_serializer=lambda data: data,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": handler}
                ),
            )
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


# ----- the Envoys ------------------------------------------------------------------------------


def provider_bootstrap() -> dict[str, Any]:
    answer = {"status": 200, "body": {"inline_string": COMPLETION}}
    return bootstrap([{"match": {"prefix": "/"}, "direct_response": answer}], [], [])


def _ext_proc_filter(mode: str) -> dict[str, Any]:
    body_mode = {"buffered": "BUFFERED", "headers": "NONE", "streamed": "STREAMED"}[mode]
    config = typed(
        "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        grpc_service={"envoy_grpc": {"cluster_name": "ext_proc"}},
        processing_mode={
            "request_header_mode": "SEND",
            "response_header_mode": "SKIP",
            "request_body_mode": body_mode,
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        },
        message_timeout="2s",
        failure_mode_allow=False,
    )
    if mode == "streamed":
        config["send_body_without_waiting_for_header_response"] = True
    if mode == "headers":
        config["metadata_options"] = {"forwarding_namespaces": {"untyped": ["floor"]}}
    return {"name": "envoy.filters.http.ext_proc", "typed_config": config}


def _json_to_metadata_filter() -> dict[str, Any]:
    """The model from the body into metadata, before ext_proc sends the headers."""
    to_model = {"metadata_namespace": "floor", "key": "model"}
    rule = {
        "selectors": [{"key": "model"}],
        "on_present": {**to_model, "type": "STRING"},
        "on_missing": {**to_model, "value": {"string_value": ""}},
        "on_error": {**to_model, "value": {"string_value": ""}},
    }
    config = typed(
        "envoy.extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
        request_rules={"rules": [rule]},
    )
    return {"name": "envoy.filters.http.json_to_metadata", "typed_config": config}


def gateway_bootstrap(
    provider_port: int, mode: str | None, ext_proc_port: int = 0
) -> dict[str, Any]:
    """plain (mode None) or a floor gateway whose route needs the model header."""
    if mode is None:
        return plain_gateway(provider_port)
    to_provider = {"cluster": "provider", "timeout": "60s"}
    model = {"name": MODEL_HEADER, "string_match": {"exact": MODEL}}
    routes = [
        {"match": {"prefix": "/v1/", "headers": [model]}, "route": to_provider},
        {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
    ]
    filters = [_json_to_metadata_filter()] if mode == "headers" else []
    filters.append(_ext_proc_filter(mode))
    clusters = [cluster("provider", provider_port), cluster("ext_proc", ext_proc_port, http2=True)]
    return bootstrap(routes, filters, clusters)


# ----- the gateways ----------------------------------------------------------------------------


def _envoy_gateway(work: Path, name: str, config: dict[str, Any]) -> EnvoyProcess:
    envoy = EnvoyProcess(config, work_dir=work / name.replace(" ", "-").replace(",", ""),
                         concurrency=1)  # fmt: skip
    envoy.start_blocking()
    return envoy


def start_gateways(work: Path, provider_port: int, gateways: dict[str, Gateway]) -> None:
    """Into `gateways` as each starts, so the caller stops those that did."""
    plain = _envoy_gateway(work, PLAIN, gateway_bootstrap(provider_port, None))
    gateways[PLAIN] = _gateway_of(plain, [])
    for name in FLOORS:
        (port,) = free_ports(1)
        argv = [sys.executable, "-m", "benchmarks.ext_proc_floor", "--serve",
                SERVER_MODES[name], str(port)]  # fmt: skip
        server = subprocess.Popen(die_with_parent(argv))
        try:
            wait_listening(port, 20)
            envoy = _envoy_gateway(
                work, name, gateway_bootstrap(provider_port, SERVER_MODES[name], port)
            )
        except BaseException:
            stop_tree(server, grace_s=2)
            raise
        gateways[name] = _gateway_of(envoy, [server])
    stacks = []
    for name, variant in zip(STACKS, ("routing", "admission"), strict=True):
        stack = UpStack(work / variant, up_doc(variant, provider_port))
        gateways[name] = Gateway(stack.url, stack.pids, stack.stop)
        stacks.append(stack)
    for stack in stacks:
        stack.wait_serving(MODEL, probe_headers(KEY))


def _gateway_of(envoy: EnvoyProcess, servers: list[subprocess.Popen[bytes]]) -> Gateway:
    host, port = envoy.listeners()["gateway"]
    envoy_pid = envoy.pid
    assert envoy_pid is not None

    def stop() -> None:
        envoy.stop_blocking()
        for server in servers:
            stop_tree(server, grace_s=2)

    return Gateway(
        f"http://{host}:{port}",
        lambda: {"envoy": [envoy_pid], "ext_proc": [s.pid for s in servers]},
        stop,
    )


# ----- the measurement -------------------------------------------------------------------------


@dataclass
class WrkRun:
    requests: int
    bad: int  # non-2xx answers and socket errors
    p50_ms: float
    p99_ms: float
    p999_ms: float


def run_wrk(url: str, script: Path, connections: int, seconds: float) -> WrkRun:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=True)
    found = re.search(r"^RESULT (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+)$", out.stdout, re.M)
    if found is None:
        raise RuntimeError(f"wrk printed no result:\n{out.stdout}\n{out.stderr}")
    requests, status, errors = (int(found.group(i)) for i in (1, 2, 3))
    p50, p99, p999 = (float(found.group(i)) / 1e3 for i in (4, 5, 6))
    return WrkRun(requests, status + errors, p50, p99, p999)


@dataclass
class Results:
    p50_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    p99_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    p999_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu_us: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    bad: int = 0


def _cpu_by_role(gateway: Gateway) -> dict[str, float]:
    """CPU seconds per role; `up` and `replica` processes count as ext_proc."""
    return cpu_by_role(gateway.pids(), merge={"up": "ext_proc", "replica": "ext_proc"})


def measure(gateways: dict[str, Gateway], script: Path, rounds: int, seconds: float) -> Results:
    results = Results()
    path = "/v1/chat/completions"
    for name in GATEWAYS:  # warm pools and caches
        run_wrk(gateways[name].url + path, script, 8, 1.0)
    for index in range(rounds):
        order = GATEWAYS[index % len(GATEWAYS) :] + GATEWAYS[: index % len(GATEWAYS)]
        for name in order:
            gateway = gateways[name]
            url = gateway.url + path
            single = run_wrk(url, script, 1, seconds)
            before = _cpu_by_role(gateway)
            loaded = run_wrk(url, script, 32, seconds)
            after = _cpu_by_role(gateway)
            results.bad += single.bad + loaded.bad
            results.p50_ms[name].append(single.p50_ms)
            results.p99_ms[name].append(single.p99_ms)
            results.p999_ms[name].append(single.p999_ms)
            results.rps[name].append(loaded.requests / seconds)
            for role, spent in after.items():
                used = (spent - before.get(role, 0.0)) / max(loaded.requests, 1) * 1e6
                results.cpu_us[name][role].append(used)
            print(
                f"round {index + 1} {name:22s} c=1 p50 {single.p50_ms:.2f} p99 "
                f"{single.p99_ms:.2f} p99.9 {single.p999_ms:.2f} ms; c=32 "
                f"{loaded.requests / seconds:.0f} req/s; bad {single.bad + loaded.bad}",
                flush=True,
            )
    return results


# ----- the report ------------------------------------------------------------------------------


def report(results: Results, command: str, header: str) -> str:
    out = [f"`{command}` — {header}", "", (__doc__ or "").split("\n\n", 2)[2].strip(), ""]
    out += [
        "| gateway | p50 ms (c=1) | added p50 ms | p99 ms | p99.9 ms | req/s (c=32) "
        "| x plain | CPU µs/req: Envoy | ext_proc | gateway total |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    plain_p50 = results.p50_ms[PLAIN]
    plain_rps = results.rps[PLAIN]
    totals: dict[str, float] = {}
    for name in GATEWAYS:
        added = [a - b for a, b in zip(results.p50_ms[name], plain_p50, strict=True)]
        ratio = [a / b for a, b in zip(results.rps[name], plain_rps, strict=True)]
        cpu = results.cpu_us[name]
        envoy = median(cpu["envoy"])
        ext_proc = median(cpu["ext_proc"]) if cpu.get("ext_proc") else 0.0
        totals[name] = envoy + ext_proc
        out.append(
            f"| {name} | {median(results.p50_ms[name]):.2f} | "
            f"{'—' if name == PLAIN else f'{median(added):+.2f}'} | "
            f"{median(results.p99_ms[name]):.2f} | {median(results.p999_ms[name]):.2f} | "
            f"{median(results.rps[name]):.0f} | {median(ratio):.2f}x | {envoy:.0f} | "
            f"{f'{ext_proc:.0f}' if ext_proc else '—'} | {totals[name]:.0f} |"
        )
    out += [
        "",
        "Per round against plain, median of rounds (p50/p99/p99.9: medians of the rounds' "
        "percentiles). CPU from /proc over the c=32 part; `up` (control plane + ext_proc) "
        f"counts as ext_proc. Non-2xx answers or socket errors in the whole run: {results.bad}.",
        "",
        "### Reading",
        "",
    ]
    floor_added = min(
        median([a - b for a, b in zip(results.p50_ms[n], plain_p50, strict=True)]) for n in FLOORS
    )
    floor_total = min(totals[n] for n in FLOORS)
    best_floor_rps = max(median(results.rps[n]) for n in FLOORS)
    out.append(
        f"- **The floor.** With a server that does nothing, the cheapest ext_proc shape adds "
        f"{floor_added:+.2f} ms p50 at concurrency 1, and Envoy plus that server spend "
        f"{floor_total:.0f} µs of CPU per request (plain Envoy: {totals[PLAIN]:.0f}); the "
        f"best floor row serves {best_floor_rps:.0f} requests/s. Issue 4's aims (full "
        "admission within +1 ms p50; 2,000 admitted requests/s on these 2 cores) sit at or "
        "below this floor: no admission logic, however fast, reaches them through a "
        "grpc.aio ext_proc server here."
    )
    for name in STACKS:
        own = median([a - b for a, b in zip(results.p50_ms[name], plain_p50, strict=True)])
        floor_two = median(
            [a - b for a, b in zip(results.p50_ms[FLOORS[0]], plain_p50, strict=True)]
        )
        out.append(
            f"- **{name}** adds {own:+.2f} ms p50, {own - floor_two:+.2f} ms over the "
            f"2-message floor it shares the transport with; {totals[name]:.0f} µs CPU per "
            f"request, {totals[name] - totals[FLOORS[0]]:+.0f} over that floor."
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per wrk run")
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_floor(args.serve[0], int(args.serve[1]))
        return 0
    if shutil.which("wrk") is None:
        parser.error("needs wrk on PATH (Debian: apt-get install wrk)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluicegate-floor-") as tmp:
        work = Path(tmp)
        script = work / "chat.lua"
        script.write_text(WRK_SCRIPT)
        provider = EnvoyProcess(provider_bootstrap(), work_dir=work / "provider", concurrency=1)
        provider.start_blocking()
        gateways: dict[str, Gateway] = {}
        try:
            start_gateways(work, provider.listeners()["gateway"][1], gateways)
            results = measure(gateways, script, args.rounds, args.seconds)
        finally:
            for gateway in gateways.values():
                gateway.stop()
            provider.stop_blocking()
    command = command_line("benchmarks.ext_proc_floor", argv)
    header = (
        f"{today()}; {machine()}; Envoy with 1 worker per gateway, wrk with 1 thread; "
        f"whole run {time.monotonic() - started:.0f} s."
    )
    record("The ext_proc floor", report(results, command, header), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
