"""Where routing without Python spends its time: Envoy alone, arm by arm.

Not collected by pytest. Run:  python -m benchmarks.fast_lane_cost [--rounds N] [--seconds S]

One Envoy (one worker) per arm, each the translation of the same gateway with
`admission.lane: fast` (docs/fast-lane.md) inlined into a static bootstrap, in front of the
fixed-answer upstream of `sluicegate bench` (its own process), with the real ext_proc
server taking the request records. wrk sends a chat completion (`--prompt-bytes` of text,
1,200 unless told; `model` after the messages, as the OpenAI SDKs write it). The arms:

- plain: Envoy's router only, to the upstream (the harness's plain gateway);
- plain with the record log: the same with the fast lane's record access log;
- envoy peer: the comparison's `envoy` (benchmarks/peers/plain_envoy.py): sluicegate's
  translation with the router alone (its route, cluster and header allowlist);
- fast lane, as translated;
- without the record access log;
- without the usage readers (json_to_metadata on the answer, the stream readers);
- without both: the model reader, the reader header and the routes, with the fault and
  error-body filters;
- without both, the fault and the error-body filters: the model reader, the reader
  header and the routes alone beside the envoy peer's;
- as translated without the fault filter, and without the error-body filter;
- with a tenant (docs/fast-lane.md, "Keys" and "Limits"): Envoy's key check and the
  model reader naming the tenant, without and with its token buckets (requests and
  tokens per minute, set far above what the run sends, so nothing is refused: the
  model reader then also estimates each request's tokens);
- with the same tenant `lane: auto` (far from its limits: in the fast lane; no control
  plane here, so it is never moved), and the same without the routing stage's filter
  (which an auto tenant's fast-lane requests skip, per request, by a matcher);
- with scenarios declared: the model reader also writes the scenario every request asks
  for (wrk sends x-sluicegate-scenario with every request, to every arm).

Per arm and round: p50 at concurrency 1 (wrk -c1) and requests/s at concurrency 32
(wrk -c32), the arms in turn, the order rotating; reported as medians of rounds and, per
round, against plain.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Final

import yaml

from benchmarks.harness.bootstraps import plain_gateway
from benchmarks.harness.cli import benchmark_parser, wanted_arms
from benchmarks.harness.ext_proc_child import ExtProcChild
from benchmarks.harness.processes import (
    ENVOY_CORE,
    LOAD_CORE,
    cpu_seconds,
    pin,
    stop_tree,
    wait_listening,
)
from benchmarks.harness.results import machine, today
from benchmarks.harness.stats import median
from sluicegate import wire
from sluicegate.config import hash_key, load_config, resolve_client_keys
from sluicegate.envoy import EnvoyProcess
from sluicegate.model import build_model
from sluicegate.native import MODULE, build, resolve_module
from sluicegate.testing import free_ports, static_bootstrap
from sluicegate.xds.translate import CLUSTER, translate
from sluicegate.xds.translate._ext_proc import EXT_PROC_FILTER as ROUTING_STAGE_FILTER
from sluicegate.xds.translate.error_bodies import ERROR_BODY_FILTER
from sluicegate.xds.translate.faults import FAULT_FILTER
from sluicegate.xds.translate.forwarded_headers import (
    FORWARDED_HEADERS_FILTER,
    HEADER_MUTATION_FILTER,
)
from sluicegate.xds.translate.listeners import HCM_FILTER
from sluicegate.xds.translate.stream_usage import SSE_TO_METADATA_FILTER
from sluicegate.xds.translate.usage import JSON_TO_METADATA_FILTER, STREAM_USAGE_FILTER

from .latency_metrics import serve_ext_proc, without
from .peers.plain_envoy import plain_bootstrap
from .record_log_cost import file_record_log, native_record_logger

MODEL: Final = "fixed"


def _body(prompt_bytes: int) -> str:
    """A chat completion whose one message is `prompt_bytes` of text, `model` after it (as
    the OpenAI SDKs write it)."""
    return json.dumps({
        "messages": [{"role": "user", "content": ("hello " * prompt_bytes)[:prompt_bytes]}],
        "model": MODEL, "max_tokens": 20,
    })  # fmt: skip


READERS: Final = frozenset({JSON_TO_METADATA_FILTER, STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER})
OTHERS: Final = frozenset({FAULT_FILTER, ERROR_BODY_FILTER})
# The tenant of the arms that have one, and its key (from a secret file).
TENANT_KEY: Final = "sk-sg-bench-0000000000000000000000000"


def _listener_manager(bootstrap: dict[str, Any]) -> dict[str, Any]:
    """The HTTP connection manager of the bootstrap's listener (every gateway here has one,
    its manager the chain's last filter)."""
    manager: dict[str, Any] = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"][-1]["typed_config"]  # fmt: skip
    return manager


def _without_connection_limit(bootstrap: dict[str, Any]) -> None:
    chain = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]
    chain["filters"] = [f for f in chain["filters"] if f["name"] == HCM_FILTER]


def upstream_filters(bootstrap: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every upstream HTTP filter of the bootstrap's clusters (their config dicts, to edit
    in place)."""
    for cluster in bootstrap["static_resources"]["clusters"]:
        for options in cluster.get("typed_extension_protocol_options", {}).values():
            yield from options.get("http_filters", ())


def _without_upstream_filters(names: tuple[str, ...], bootstrap: dict[str, Any]) -> None:
    """The upstream HTTP filters `names` taken out of every cluster (RuntimeError if none
    has one of them, so a renamed filter cannot leave an arm measuring nothing)."""
    found = {f["name"] for f in upstream_filters(bootstrap)}
    if not set(names) <= found:
        raise RuntimeError(f"no cluster has the upstream filters {set(names) - found}")
    for cluster in bootstrap["static_resources"]["clusters"]:
        for options in cluster.get("typed_extension_protocol_options", {}).values():
            filters = options.get("http_filters", ())
            options["http_filters"] = [f for f in filters if f["name"] not in names]


def _without_resilience(bootstrap: dict[str, Any]) -> None:
    for cluster in bootstrap["static_resources"]["clusters"]:
        cluster.pop("outlier_detection", None)
        cluster.pop("circuit_breakers", None)
    for host in _listener_manager(bootstrap)["route_config"]["virtual_hosts"]:
        for route in host["routes"]:
            route.get("route", {}).pop("retry_policy", None)


# The envoy peer's parts, each taken out of it alone by an arm of its own: what sluicegate's
# translation costs Envoy with no filter of ours (the floor under the fast lane).
PEER_PARTS: Final[dict[str, Callable[[dict[str, Any]], None]]] = {
    "the connection limit": _without_connection_limit,
    "the early header removal": lambda b: _listener_manager(b).pop(
        "early_header_mutation_extensions"
    ),
    "the local reply config": lambda b: _listener_manager(b).pop("local_reply_config"),
    # Both header_mutations (the name is session 20's, which RESULTS cites).
    "the upstream header filters (the allowlist)": partial(
        _without_upstream_filters, (HEADER_MUTATION_FILTER, FORWARDED_HEADERS_FILTER)
    ),
    "the provider header filter": partial(_without_upstream_filters, (HEADER_MUTATION_FILTER,)),
    "the allowlist filter": partial(_without_upstream_filters, (FORWARDED_HEADERS_FILTER,)),
    "retries, outlier detection and circuit breakers": _without_resilience,
}


# The envoy peer with the native library's header allowlist in place of header_mutation's.
NATIVE_PEER: Final = "envoy peer with the native header allowlist"
# The native arm's tenant field for its clusters translated without the library.
ENVOY_ALLOWLIST: Final = "native+Envoy's allowlist"

# name -> (HTTP filters removed, access log removed (True), kept (False) or the record
# log replaced by one of RECORD_LOGS, tenant: None, "key", "limits", "auto",
# or "scenarios": no tenant, scenarios declared; "native" before any of them, joined by
# "+", or alone: the native filters, the model reader, the usage reader and the header
# allowlist, docs/native-filters.md; ENVOY_ALLOWLIST: the same with Envoy's allowlist);
# a str: a baseline's bootstrap.
Arm = tuple[frozenset[str], bool | str, str | None]


def _otel(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The translated record log with `edit` applied to its config (a TypedStruct's value)."""

    def edited(log: dict[str, Any]) -> dict[str, Any]:
        edit(log["typed_config"]["value"])
        return log

    return edited


# In place of the translated record log (given to each): its body by Envoy's file logger
# to /dev/null; an experiment's native access logger that reads and formats the record's
# fields and drops them (no transport), or that does nothing (record_log_cost's arms of
# the same names); the OpenTelemetry log with the log's name alone for a body, or with
# its batches up to 1 MiB instead of Envoy's 16 KiB.
RECORD_LOGS: Final[dict[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "file": lambda _log: file_record_log(),
    "native read": lambda _log: native_record_logger("read"),
    "native empty": lambda _log: native_record_logger("empty"),
    "otel name alone": _otel(lambda value: value.update(body={"string_value": "record"})),
    "otel 1 MiB batches": _otel(
        lambda value: value["common_config"].update(buffer_size_bytes=1 << 20)
    ),
}
# Plain Envoy with the fast lane's record log (the same access log entry, to the same
# ext_proc server): what issue 10's record per request costs Envoy without anything else
# of sluicegate's (its metadata fields are then `-`).
PLAIN_RECORDED: Final = "plain with the record log"
ARMS: Final[dict[str, Arm | str]] = {
    "plain": "plain",
    PLAIN_RECORDED: PLAIN_RECORDED,
    "envoy peer": "envoy peer",
    **{f"envoy peer without {part}": f"envoy peer without {part}" for part in PEER_PARTS},
    NATIVE_PEER: NATIVE_PEER,
    "fast lane, as translated": (frozenset(), False, None),
    "without the record access log": (frozenset(), True, None),
    "without the usage readers": (READERS, False, None),
    "without both": (READERS, True, None),
    "without both, the fault and the error-body filters": (READERS | OTHERS, True, None),
    "without the fault filter": (frozenset({FAULT_FILTER}), False, None),
    "without the error-body filter": (frozenset({ERROR_BODY_FILTER}), False, None),
    "with a tenant: key check": (frozenset(), False, "key"),
    "with a tenant: key check and token buckets": (frozenset(), False, "limits"),
    "with an auto tenant": (frozenset(), False, "auto"),
    "with an auto tenant, without the routing stage's filter": (
        frozenset({ROUTING_STAGE_FILTER}),
        False,
        "auto",
    ),
    "with scenarios declared": (frozenset(), False, "scenarios"),
    "with the native readers": (frozenset(), False, "native"),
    "with the native readers, without the record access log": (frozenset(), True, "native"),
    "with the native readers, the record as a file log": (frozenset(), "file", "native"),
    "with the native readers, the record read by a native logger": (
        frozenset(),
        "native read",
        "native",
    ),
    "with the native readers, an empty native logger": (frozenset(), "native empty", "native"),
    "with the native readers, an OpenTelemetry log of the name alone": (
        frozenset(),
        "otel name alone",
        "native",
    ),
    "with the native readers, the record log in batches of up to 1 MiB": (
        frozenset(),
        "otel 1 MiB batches",
        "native",
    ),
    "with the native readers, without the fault filter": (
        frozenset({FAULT_FILTER}),
        False,
        "native",
    ),
    "with the native readers, without the error-body filter": (
        frozenset({ERROR_BODY_FILTER}),
        False,
        "native",
    ),
    # The native arms as they stood before the library had the header allowlist.
    "with the native readers, Envoy's header allowlist": (frozenset(), False, ENVOY_ALLOWLIST),
    "with the native readers and a tenant: key check and token buckets": (
        frozenset(),
        False,
        "native+limits",
    ),
}
SCENARIO: Final = "bench-scenario"
BASELINES: Final = ("plain", "envoy peer")  # in every run


def _document(listener: int, upstream: int, tenant: str | None, work: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listener}],
        "providers": [{"name": "upstream", "base_url": f"http://127.0.0.1:{upstream}/v1"}],
        "routes": [{"name": "bench", "models": [MODEL], "backends": [{"provider": "upstream"}]}],
        "admission": {"lane": "fast"},
    }
    if tenant == ENVOY_ALLOWLIST:  # its clusters are replaced in _bootstrap
        tenant = "native"
    if tenant is not None and tenant.startswith("native"):
        doc["native_filters"] = {"module": "auto"}
        tenant = tenant.partition("+")[2] or None
    else:
        doc["native_filters"] = {"module": "off"}
    if tenant == "scenarios":
        doc["scenarios"] = [SCENARIO]
    elif tenant is not None:
        (work / "bench.client").write_text(TENANT_KEY)
        key = {"name": "bench", "hash": hash_key(TENANT_KEY), "secret": {"file": "bench.client"}}
        doc["tenants"] = [{"name": "bench", "keys": [key]}]
        if tenant in ("limits", "auto"):
            doc["tenants"][0]["rate_limits"] = {"requests": 10**9, "tokens": 4 * 10**9}
        if tenant == "auto":
            doc["tenants"][0]["lane"] = "auto"
    return doc


def _bootstrap(
    arm: Arm | str, path: Path, upstream: int, port: int, ext_proc: int
) -> dict[str, Any]:
    if arm in ("plain", PLAIN_RECORDED):
        bootstrap = plain_gateway(upstream)
        listener = bootstrap["static_resources"]["listeners"][0]
        listener["address"]["socket_address"]["port_value"] = port
        if arm == PLAIN_RECORDED:
            translated = _bootstrap(ARMS["fast lane, as translated"], path, upstream, port,
                                    ext_proc)  # fmt: skip
            _add_record_log(bootstrap, translated)
        return bootstrap
    if isinstance(arm, str) and arm.startswith("envoy peer"):
        doc = yaml.safe_load(path.read_text())
        del doc["admission"]
        doc.pop("tenants", None)
        doc.pop("scenarios", None)
        doc.pop("native_filters", None)
        work = path.parent / f"peer-{port}"
        work.mkdir()
        if arm == NATIVE_PEER:
            return plain_bootstrap(doc, work, native_module=str(build(MODULE)))
        peer = plain_bootstrap(doc, work)
        if arm != "envoy peer":
            PEER_PARTS[arm.removeprefix("envoy peer without ")](peer)
        return peer
    assert not isinstance(arm, str)
    removed, log_off, tenant = arm
    config = load_config(path)
    gateway = build_model(
        config,
        {},
        client_keys=resolve_client_keys(config, path, env={}),
        native_module=resolve_module(config.native_filters.module).path,
    )
    # `node` names no library to Envoys at large; this bootstrap names none either.
    if config.native_filters.module not in ("off", "node") and gateway.native_module is None:
        raise RuntimeError("the native readers' arm: the library could not be built")
    resources = without(translate(gateway), removed, drop_access_log=log_off is True)
    if tenant == ENVOY_ALLOWLIST:
        resources[CLUSTER] = translate(replace(gateway, native_module=None))[CLUSTER]
    made = static_bootstrap(resources, ext_proc_port=ext_proc)
    if isinstance(log_off, str):
        manager = _listener_manager(made)
        (record_log,) = manager["access_log"]
        manager["access_log"] = [RECORD_LOGS[log_off](record_log)]
    return made


def _add_record_log(plain: dict[str, Any], translated: dict[str, Any]) -> None:
    """`translated`'s record log, and the cluster it sends to, added to `plain`."""
    (record_log,) = _listener_manager(translated)["access_log"]
    _listener_manager(plain)["access_log"] = [record_log]
    (side,) = [c for c in translated["static_resources"]["clusters"]
               if c["name"] == wire.EXT_PROC_SIDE_CLUSTER]  # fmt: skip
    plain["static_resources"]["clusters"].append(side)


def wrk_run(url: str, connections: int, seconds: int, script: Path) -> tuple[float, float, int]:
    """(p50 µs, requests/s, requests) of one wrk run from the load core."""
    out = subprocess.run(
        ["taskset", "-c", LOAD_CORE, "wrk", f"-c{connections}", "-t1", f"-d{seconds}s",
         "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = re.search(r"50%\s+([\d.]+)(us|ms)", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if found is None or rate is None or count is None or "Non-2xx" in out:
        raise RuntimeError(f"wrk said:\n{out}")
    p50 = float(found.group(1)) * (1 if found.group(2) == "us" else 1000)
    return p50, float(rate.group(1)), int(count.group(1))


def wrk_script(work: Path, prompt_bytes: int) -> Path:
    """wrk's script in `work`: every arm's request (the tenant's key, a scenario)."""
    script = work / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(_body(prompt_bytes))}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {TENANT_KEY}"\n'
        f'wrk.headers["{wire.SCENARIO_HEADER}"] = "{SCENARIO}"\n'
    )
    return script


def run(rounds: int, seconds: int, prompt_bytes: int, only: str | None) -> str:
    work = Path(tempfile.mkdtemp(prefix="fast-lane-cost-"))
    wanted = wanted_arms(only)
    arms = {
        name: arm
        for name, arm in ARMS.items()
        # A text that is an arm's whole name is that arm alone.
        if wanted is None
        or any(w == name if w in ARMS else w in name for w in wanted)
        or arm in BASELINES
    }
    upstream, *ports = free_ports(1 + len(arms))
    script = wrk_script(work, prompt_bytes)
    files = {}
    for name, port in zip(arms, ports, strict=True):
        files[name] = work / f"sluicegate-{port}.yaml"
        arm = arms[name]
        tenant = None if isinstance(arm, str) else arm[2]
        files[name].write_text(yaml.safe_dump(_document(port, upstream, tenant, work)))
    fixed = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, sys.executable, "-m", "sluicegate.bench.fixed_upstream",
         "--port", str(upstream), "--model", MODEL, "--output-tokens", "20", "--workers", "1"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    envoys: list[EnvoyProcess] = []
    # per arm and round: p50 s (c=1), requests/s and Envoy's CPU s per request (c=32)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in arms}
    pids: dict[str, int] = {}
    first = str(next(iter(files.values())))
    try:
        with ExtProcChild(serve_ext_proc, first) as ext_proc:
            pin(ext_proc.pid, int(LOAD_CORE))
            for index, (name, arm) in enumerate(arms.items()):
                bootstrap = _bootstrap(arm, files[name], upstream, ports[index], ext_proc.port)
                envoy = EnvoyProcess(bootstrap, work_dir=work / f"envoy-{index}", concurrency=1)
                envoys.append(envoy)
                envoy.start_blocking()
                assert envoy.pid is not None
                pin(envoy.pid, ENVOY_CORE)
                pids[name] = envoy.pid
            wait_listening(upstream, 30.0)
            urls = {name: f"http://127.0.0.1:{port}/v1/chat/completions"
                    for name, port in zip(arms, ports, strict=True)}  # fmt: skip
            for url in urls.values():
                wait_listening(int(url.split(":")[2].split("/")[0]), 30.0)
                wrk_run(url, 4, 1, script)  # warm
            names = list(arms)
            for index in range(rounds):
                for name in names[index % len(names) :] + names[: index % len(names)]:
                    pid = pids[name]
                    p50, _, _ = wrk_run(urls[name], 1, seconds, script)
                    before = cpu_seconds(pid)
                    _, rate, count = wrk_run(urls[name], 32, seconds, script)
                    results[name].append((p50, rate, (cpu_seconds(pid) - before) / count))
    finally:
        for envoy in envoys:
            envoy.stop_blocking()
        stop_tree(fixed)
    header = (
        f"{today()}; {machine()}; Envoy with 1 worker per arm; a {prompt_bytes:,}-byte prompt; "
        f"wrk -t1 -c1 and -c32 for {seconds} s each per arm and round, {rounds} rounds (the "
        "arms in turn, the order rotating)"
    )
    return "\n".join([header, "", *cost_tables(results)])


def cost_tables(results: dict[str, list[tuple[float, float, float]]]) -> list[str]:
    """The lines of a run's tables: per arm (in `results`' order, `plain` among them) the
    medians of its rounds and their differences from plain, then every round's figures.
    `results`: per arm and round, p50 µs (c=1), requests/s and Envoy's CPU s a request
    (c=32)."""
    rounds = len(results["plain"])
    lines = [
        "| arm | p50 µs (c=1) | added p50 µs | lowest p50 µs (added) | req/s (c=32) | x plain "
        "| Envoy CPU µs/req (c=32) | added CPU µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    plain = results["plain"]
    plain_lowest = min(p for p, _, _ in plain)
    for name, figures in results.items():
        p50s = [p for p, _, _ in figures]
        rates = [r for _, r, _ in figures]
        cpus = [c * 1e6 for _, _, c in figures]
        added = median([a - b for a, (b, _, _) in zip(p50s, plain, strict=True)])
        ratio = median([a / b for a, (_, b, _) in zip(rates, plain, strict=True)])
        added_cpu = median([a - b * 1e6 for a, (_, _, b) in zip(cpus, plain, strict=True)])
        lowest = min(p50s)
        lines.append(f"| {name} | {median(p50s):.1f} | {added:+.1f} | "
                     f"{lowest:.0f} ({lowest - plain_lowest:+.0f}) | {median(rates):,.0f} | "
                     f"{ratio:.2f}x | {median(cpus):.1f} | {added_cpu:+.1f} |")  # fmt: skip
    return [
        *lines,
        "",
        "Medians of the rounds; added and ratios per round against plain, then their median."
        " Lowest p50: the best round's (a c=1 p50 flips between two modes, about 0.4 and"
        " 0.9 ms, from run to run), against plain's best.",
        "",
        "Per round: p50 µs (c=1) / req/s (c=32) / Envoy CPU µs per request (c=32)",
        "",
        "| arm | " + " | ".join(f"round {r + 1}" for r in range(rounds)) + " |",
        "|---|" + "---:|" * rounds,
        *(
            f"| {name} | "
            + " | ".join(f"{p:.0f} / {r:,.0f} / {c * 1e6:.1f}" for p, r, c in figures)
            + " |"
            for name, figures in results.items()
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    return arms_main(__doc__, run, argv)


def arms_main(
    doc: str | None, run_arms: Callable[[int, int, int, str | None], str], argv: list[str] | None
) -> int:
    """The command line of a benchmark of Envoy arms (this one's, native_filter_cost's)."""
    parser = benchmark_parser(doc, write_help=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4, help="wrk's run per arm, load, round")
    parser.add_argument("--prompt-bytes", type=int, default=1200, help="the message's length")
    parser.add_argument(
        "--only",
        help="the arms whose name has any of these texts, separated by commas (or by `|` when"
        " a name holds a comma), and the baselines"
        " (plain; in fast_lane_cost also the envoy peer)",
    )
    args = parser.parse_args(argv)
    print(run_arms(args.rounds, args.seconds, args.prompt_bytes, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
