"""Would a native model reader (an Envoy dynamic module in C) be cheaper than the Lua one?

Not collected by pytest. Run:  python -m benchmarks.native_filter_cost [--rounds N] [--seconds S]
[--prompt-bytes B] [--only TEXTS]

Builds benchmarks/native_filter (libsluicegate_native.so: the filter `pass`, which does
nothing; until session 20 also `model`, the routing subset of the model reader) and the
product's library (sluicegate.native) with gcc, then runs one Envoy (one worker) per arm
with ENVOY_DYNAMIC_MODULES_SEARCH_PATH naming the experiment's build directory, in front
of the fixed-answer upstream of `sluicegate bench`, pinned as benchmarks/fast_lane_cost.py
pins them (Envoy on one core, wrk and the upstream on the other) and sent the same request
(fast_lane_cost's body and headers). The arms:

- plain: Envoy's router only (fast_lane_cost's plain);
- plain + Lua no-op: the same with a Lua filter whose envoy_on_request does nothing;
- plain + C pass: the same with the dynamic module's `pass` filter;
- envoy peer (for context: fast_lane_cost's, sluicegate's translation with the router
  alone: its route, cluster and header allowlist; no model reader, no metadata routes);
- Lua model reader: fast_lane_cost's "without both, the fault and the error-body filters"
  (the translated fast lane with the model reader, its model limits filter and its routes,
  no access log, no usage readers);
- C model reader: the same with the Lua model reader's configuration replaced by the
  product's native model reader's (same name, same place in the chain, same routes;
  session 16's runs in RESULTS.md measured the experiment's `model` filter instead);
- the envoy peer's upstream header allowlist (session 21): the peer without it, with the
  product's native allowlist in its place (fast_lane_cost's NATIVE_PEER), and with the
  `pass` filter in its place (what a dynamic module costs as an upstream filter alone).

First a correctness check: the same requests through both model reader arms (routed: 200
from the upstream; refused bodies: the routes' 400 answers), with the dynamic metadata
each wrote, from a file access log added for the check alone.

Per arm and round: p50 at concurrency 1, requests/s at concurrency 32, and Envoy's CPU
time per request during the concurrency-32 run (utime + stime of the Envoy process from
/proc, over the requests wrk counted), the arms in turn, the order rotating; reported as
medians of rounds and, per round, against plain.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

import yaml
from google.protobuf.json_format import MessageToDict

from benchmarks.harness.bootstraps import bootstrap, cluster, typed
from benchmarks.harness.cli import wanted_arms
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
from sluicegate.config import load_config, resolve_client_keys
from sluicegate.envoy import EnvoyProcess
from sluicegate.model import build_model
from sluicegate.native import MODULE as LIBRARY
from sluicegate.native import build as build_library
from sluicegate.testing import free_ports
from sluicegate.xds.translate._proto import pack
from sluicegate.xds.translate.envoy_routing import reader_facts
from sluicegate.xds.translate.forwarded_headers import FORWARDED_HEADERS_FILTER
from sluicegate.xds.translate.model_reader import MODEL_READER_FILTER
from sluicegate.xds.translate.native import native_model_reader

from .fast_lane_cost import (
    ARMS,
    MODEL,
    NATIVE_PEER,
    _body,
    _bootstrap,
    _document,
    arms_main,
    cost_tables,
    upstream_filters,
    wrk_run,
    wrk_script,
)

HERE: Final = Path(__file__).parent / "native_filter"
MODULE: Final = "sluicegate_native"
SEARCH_PATH: Final = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"
FAST_LANE_ARM: Final = "without both, the fault and the error-body filters"
LUA: Final = "envoy.extensions.filters.http.lua.v3.Lua"
DYNAMIC_MODULE: Final = "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
STRING_VALUE: Final = "google.protobuf.StringValue"
PASS_PEER: Final = "envoy peer, the C pass filter for its allowlist"
ARM_NAMES: Final = (
    "plain", "plain + Lua no-op", "plain + C pass", "envoy peer", "Lua model reader",
    "C model reader", "envoy peer without the allowlist filter", NATIVE_PEER, PASS_PEER,
)  # fmt: skip
# What the correctness check's access log writes per request.
CHECK_LOG_LINE: Final = "%DYNAMIC_METADATA(sluicegate)% %DYNAMIC_METADATA(check)%\n"
COPY_USAGE: Final = f"""
function envoy_on_request(handle)
  local meta = handle:streamInfo():dynamicMetadata()
  local usage = handle:headers():get("{wire.USAGE_HEADER}")
  if usage ~= nil then meta:set("check", "usage", usage) end
  local length = handle:headers():get("content-length")
  local body = handle:body()
  meta = handle:streamInfo():dynamicMetadata()  -- the wrapper is void after body()
  meta:set("check", "length", length or "-")
  meta:set("check", "body", body and body:length() or 0)
end
"""
# Bodies sent through both model reader arms by the correctness check.
CHECKED_BODIES: Final = (
    ("the benchmark's request", None),
    ("no model", '{"messages":[{"role":"user","content":"hi"}]}'),
    ("a stream", f'{{"model":"{MODEL}","stream":true,"messages":[]}}'),
    ("logprobs asked", f'{{"model":"{MODEL}","logprobs":true}}'),
    ("a large output cap", f'{{"model":"{MODEL}","max_tokens":5000}}'),
    ("model not served", '{"model":"other","messages":[]}'),
    ("model not a string", '{"model":7}'),
    ("stream not a boolean", f'{{"model":"{MODEL}","stream":"yes"}}'),
    ("model twice", f'{{"model":"{MODEL}","model":"{MODEL}"}}'),
    ("max_tokens 0", f'{{"model":"{MODEL}","max_tokens":0}}'),
    ("n 500", f'{{"model":"{MODEL}","n":500}}'),
    ("Model (case)", f'{{"Model":"{MODEL}"}}'),
    ("escaped key", f'{{"mod\\u0065l":"{MODEL}"}}'),
    ("an array", "[1, 2]"),
    ("not JSON", '{"model": "fixed", '),
    ("a 200 KB stream", f'{{"model":"{MODEL}","stream":true,"input":"{"x" * 200_000}"}}'),
    ("nested, escapes", f'{{"a":{{"b":["}}\\"",[{{}}]]}},"model":"{MODEL}","x":"\\\\"}}'),
)


def build(out: Path) -> Path:
    """The module built by gcc into `out`; its path."""
    subprocess.run(["sh", str(HERE / "build.sh"), str(out)], check=True)
    return out / f"lib{MODULE}.so"


def _module_filter(filter_name: str, config: str = "") -> dict[str, Any]:
    return typed(
        DYNAMIC_MODULE,
        dynamic_module_config={"name": MODULE},
        filter_name=filter_name,
        filter_config=typed(STRING_VALUE, value=config),
    )


def _plain(upstream: int, port: int, filters: list[dict[str, Any]]) -> dict[str, Any]:
    """fast_lane_cost's plain gateway (harness.bootstraps.plain_gateway) with `filters`."""
    route = {"match": {"prefix": "/v1/"}, "route": {"cluster": "provider", "timeout": "60s"}}
    result = bootstrap([route], filters, [cluster("provider", upstream)])
    listener = result["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = port
    return result


def _http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    listener = config["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][-1]["typed_config"]
    filters: list[dict[str, Any]] = hcm["http_filters"]
    return filters


def arm_bootstrap(name: str, work: Path, upstream: int, port: int, unused: int) -> dict[str, Any]:
    """The bootstrap of arm `name` (ARM_NAMES) listening on `port` (its gateway file in
    `work`); `unused` is the port the translation's ext_proc clusters name (nothing
    listens: no filter left calls it)."""
    if name == "plain":
        return _plain(upstream, port, [])
    if name == "plain + Lua no-op":
        code = {"inline_string": "function envoy_on_request(handle) end"}
        lua = {
            "name": "envoy.filters.http.lua",
            "typed_config": typed(LUA, default_source_code=code),
        }
        return _plain(upstream, port, [lua])
    if name == "plain + C pass":
        native = {"name": "sluicegate.pass", "typed_config": _module_filter("pass")}
        return _plain(upstream, port, [native])
    doc = work / f"sluicegate-{port}.yaml"
    doc.write_text(yaml.safe_dump(_document(port, upstream, None, work)))
    if name == PASS_PEER:
        config = _bootstrap("envoy peer", doc, upstream, port, unused)
        for upstream_filter in upstream_filters(config):
            if upstream_filter["name"] == FORWARDED_HEADERS_FILTER:
                upstream_filter["typed_config"] = _module_filter("pass")
        return config
    if name.startswith("envoy peer"):
        return _bootstrap(name, doc, upstream, port, unused)
    arm = ARMS[FAST_LANE_ARM]
    config = _bootstrap(arm, doc, upstream, port, unused)
    if name == "C model reader":
        # The product's native model reader (sluicegate.native, docs/native-filters.md),
        # configured from the same facts as the Lua one, in its place.
        loaded = load_config(doc)
        gateway = build_model(loaded, {}, client_keys=resolve_client_keys(loaded, doc, env={}))
        native = native_model_reader(str(build_library(LIBRARY)), reader_facts(gateway))
        (reader,) = [f for f in _http_filters(config) if f["name"] == MODEL_READER_FILTER]
        reader["typed_config"] = MessageToDict(pack(native))
    return config


def _post(url: str, body: str) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def check(work: Path, upstream: int, prompt_bytes: int) -> tuple[str, bool]:
    """Both model reader arms, each given a file access log of its dynamic metadata, sent
    CHECKED_BODIES: the report's lines, and whether every answer was the same."""
    arms = ("Lua model reader", "C model reader")
    ports = free_ports(3)
    envoys: dict[str, EnvoyProcess] = {}
    logs: dict[str, Path] = {}
    lines = [
        "| body | Lua: status | C: status | same answer | C's metadata |",
        "|---|---:|---:|:---:|---|",
    ]
    same_everywhere = True
    try:
        for index, name in enumerate(arms):
            config = arm_bootstrap(name, work, upstream, ports[index], ports[2])
            listener = config["static_resources"]["listeners"][0]
            hcm = listener["filter_chains"][0]["filters"][-1]["typed_config"]
            logs[name] = work / f"check-{index}.log"
            hcm["access_log"] = [{
                "name": "envoy.access_loggers.file",
                "typed_config": typed(
                    "envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    path=str(logs[name]),
                    log_format={"text_format_source": {
                        "inline_string": CHECK_LOG_LINE
                    }},
                ),
            }]  # fmt: skip
            # For the check alone: x-sluicegate-usage copied into metadata the access log
            # writes (the routes strip the header before the provider), by a Lua filter
            # after the reader.
            (at,) = [
                i for i, f in enumerate(hcm["http_filters"]) if f["name"] == MODEL_READER_FILTER
            ]
            hcm["http_filters"].insert(at + 1, {
                "name": "check.usage_header",
                "typed_config": typed(LUA, default_source_code={"inline_string": COPY_USAGE}),
            })  # fmt: skip
            envoys[name] = EnvoyProcess(
                config,
                work_dir=work / f"check-{index}",
                concurrency=1,
                log_level="info",  # which logs the module's ABI version
                extra_args=["--file-flush-interval-msec", "100"],
            )
            envoys[name].start_blocking()
            wait_listening(ports[index], 30.0)
        rows = []
        for label, given in CHECKED_BODIES:
            body = _body(prompt_bytes) if given is None else given
            answers = {
                name: _post(f"http://127.0.0.1:{ports[i]}/v1/chat/completions", body)
                for i, name in enumerate(arms)
            }
            (lua_status, lua_body), (c_status, c_body) = answers.values()
            same = lua_status == c_status and (lua_status == 200 or lua_body == c_body)
            same_everywhere &= same
            rows.append((label, lua_status, c_status, same))
        # The file access log is flushed every second: wait for a line per request.
        metadata: dict[str, list[str]] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            metadata = {
                name: (log.read_text().splitlines() if log.exists() else [])
                for name, log in logs.items()
            }
            if all(len(got) >= len(rows) for got in metadata.values()):
                break
            time.sleep(0.2)
        lua_meta, c_meta = metadata["Lua model reader"], metadata["C model reader"]
        for index, (label, lua_status, c_status, same) in enumerate(rows):
            meta = c_meta[index] if index < len(c_meta) else "(no line)"
            lines.append(f"| {label} | {lua_status} | {c_status} | {'yes' if same else 'NO'} | "
                         f"`{meta}` |")  # fmt: skip
        lines.append("")
        whole = len(lua_meta) == len(c_meta) == len(rows)
        alike = "yes" if whole and lua_meta == c_meta else "NO" if whole else "NOT ALL LOGGED"
        lines.append(
            "Dynamic metadata, x-sluicegate-usage and the body passed on (its content-length "
            f"and length) the same for every body: {alike}"
        )
        if alike != "yes":
            same_everywhere = False
            lines += [f"- Lua `{a}` / C `{b}`" for a, b in zip(lua_meta, c_meta, strict=False)
                      if a != b]  # fmt: skip
        example = _post(
            f"http://127.0.0.1:{ports[1]}/v1/chat/completions", CHECKED_BODIES[1][1] or ""
        )
        lines.append(f"The C arm's answer to a body without model: {example[0]} `{example[1]}`")
        abi = [
            line.split("]", 3)[-1].strip()
            for line in envoys["C model reader"].log_path.read_text().splitlines()
            if "ABI version" in line
        ]
        lines.append(f"Envoy's log on loading the module: {abi or 'nothing'}")
    finally:
        for envoy in envoys.values():
            envoy.stop_blocking()
    return "\n".join(lines), same_everywhere


def run(rounds: int, seconds: int, prompt_bytes: int, only: str | None = None) -> str:
    """`only`: the arms whose name has any of these comma-separated texts (and plain)."""
    wanted = wanted_arms(only)
    arms = [n for n in ARM_NAMES if n == "plain" or wanted is None or any(w in n for w in wanted)]
    work = Path(tempfile.mkdtemp(prefix="native-filter-cost-"))
    built = build(work)
    os.environ[SEARCH_PATH] = str(built.parent)
    upstream, unused, *ports = free_ports(2 + len(arms))
    script = wrk_script(work, prompt_bytes)
    fixed = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, sys.executable, "-m", "sluicegate.bench.fixed_upstream",
         "--port", str(upstream), "--model", MODEL, "--output-tokens", "20", "--workers", "1"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    envoys: dict[str, EnvoyProcess] = {}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in arms}
    loads = [os.getloadavg()[0]]
    started = time.time()
    try:
        wait_listening(upstream, 30.0)
        checked, same = check(work, upstream, prompt_bytes)
        for index, name in enumerate(arms):
            config = arm_bootstrap(name, work, upstream, ports[index], unused)
            envoy = EnvoyProcess(config, work_dir=work / f"envoy-{index}", concurrency=1)
            envoys[name] = envoy
            envoy.start_blocking()
            assert envoy.pid is not None
            pin(envoy.pid, ENVOY_CORE)
        urls = {name: f"http://127.0.0.1:{port}/v1/chat/completions"
                for name, port in zip(arms, ports, strict=True)}  # fmt: skip
        for name, url in urls.items():
            wait_listening(ports[arms.index(name)], 30.0)
            wrk_run(url, 4, 1, script)  # warm
        names = list(arms)
        for index in range(rounds):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                pid = envoys[name].pid
                assert pid is not None
                p50, _, _ = wrk_run(urls[name], 1, seconds, script)
                before = cpu_seconds(pid)
                _, rate, count = wrk_run(urls[name], 32, seconds, script)
                cpu = (cpu_seconds(pid) - before) / count
                results[name].append((p50, rate, cpu))
                loads.append(os.getloadavg()[0])
    finally:
        for envoy in envoys.values():
            envoy.stop_blocking()
        stop_tree(fixed)
    minutes = (time.time() - started) / 60
    lines = [
        f"{today()}; {machine()}; Envoy with 1 worker per arm; a {prompt_bytes:,}-byte prompt; "
        f"wrk -t1 -c1 and -c32 for {seconds} s each per arm and round, {rounds} rounds (the "
        f"arms in turn, the order rotating); {minutes:.1f} minutes; 1-minute load average "
        f"{min(loads):.2f} to {max(loads):.2f} (median {median(loads):.2f})",
        "",
        *cost_tables(results),
        "",
        "Correctness (before the runs): the same requests through both model reader arms",
        "",
        checked,
    ]
    if not same:
        lines.append("\nTHE TWO READERS ANSWERED DIFFERENTLY (above).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return arms_main(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
