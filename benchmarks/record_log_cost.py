"""What the request record's access log and the usage readers cost Envoy, alone.

Not collected by pytest. Run:  python -m benchmarks.record_log_cost [--rounds N] [--seconds S]

No Python on the request path: `wrk -c1` (one connection, one request at a time) through
a front Envoy (one worker) to an upstream Envoy that answers a chat completion itself
(direct_response). The front Envoy's `set_metadata` filter writes a routed request's
`sluicegate` metadata (what the routing stage writes), and a generic gRPC server takes
the OpenTelemetry logs. The arms differ in one thing each:

- base: set_metadata and the router only;
- record log, as translated: the record's fields in one body (`record_log.py`);
- record log as one attribute a field: the same format strings, one OTel attribute each (how it
  was sent before the body);
- record log, each namespace as JSON (before session 18): the two whole namespaces as two
  fields of JSON instead of a field a key; the usage as JSON: the usage namespace alone;
  record log without the metadata: the body without any metadata field (these arms and
  the ones before them have set_metadata write a usage namespace too, as a reader would);
- usage readers, as translated: json_to_metadata, the stream usage Lua filter and
  sse_to_metadata behind their matchers, the request marked for json_to_metadata
  (`x-sluicegate-usage: log`), so the Lua and SSE filters are skipped;
- usage readers and the record log: what "metrics on" adds to a JSON answer in Envoy;
- the native usage reader (sluicegate.native, built with gcc) in their place, on the
  JSON answer and on both streams below;
- a stream's answer (16 content events and the usage event, in one body), through no
  reader, and through the usage readers marked `x-sluicegate-usage: stream`: once as a
  routing-only stream whose client asked for usage (the Lua filter reads no chunk), once
  as a reserved stream whose usage the gateway asked for (the Lua filter counts the text
  events and cuts the usage event out; checked before measuring);
- the cut stream through the native reader with the record log, with an OpenTelemetry
  log whose body is the log name alone, and with the record's body in Envoy's file logger
  (to /dev/null): what the logger costs against what its fields cost; and with two
  native access loggers of an experiment (native_filter/record_logger.c, Envoy's
  `envoy.access_loggers.dynamic_modules`): one that reads and formats what the record
  reads and drops it (no transport), one that does nothing.

`--idle-ms N` has wrk wait N ms before each request, so Envoy idles between requests as
it does between a paced stream's events, and meets each request with cold caches.

Reported per arm: p50 latency (wrk's), the mean time per request and the front Envoy's
CPU per request (the kernel's CPU clock of the process), medians of rounds (the arms in
turn, the order rotating), and each minus base.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from google.protobuf.json_format import MessageToDict

from sluicegate import wire
from sluicegate.envoy import EnvoyProcess
from sluicegate.native import MODULE, build
from sluicegate.testing import exact_cpu_seconds, free_ports
from sluicegate.xds.translate import LISTENER, translate
from sluicegate.xds.translate.native import NATIVE_USAGE_READER_FILTER, native_usage_reader
from sluicegate.xds.translate.record_log import RECORD_FORMATS, record_access_log
from sluicegate.xds.translate.stream_usage import SSE_TO_METADATA_FILTER
from sluicegate.xds.translate.usage import STREAM_USAGE_FILTER

from .harness.cli import benchmark_parser, wanted_arms
from .harness.processes import ENVOY_CORE, LOAD_CORE, pin, stop_tree, wait_listening
from .harness.results import machine, today
from .harness.stats import median
from .latency_metrics import gateway_model

ANSWER: Final = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "tok1 tok2 tok3 tok4 "}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
})  # fmt: skip
# What the routing stage writes for a routed request with a reservation.
METADATA: Final = {
    wire.META_TENANT: "team", wire.META_KEY_NAME: "team-key", wire.META_PRIORITY: "standard",
    wire.META_SCENARIO: "chat", wire.META_QUEUE_MS: 0, wire.META_MODEL: "chat",
    wire.META_STREAM: "false", wire.META_RESERVATION: "r-123456",
    wire.META_ESTIMATE_INPUT: "12", wire.META_ESTIMATE_OUTPUT: "16",
}  # fmt: skip
COPIES: Final = 10
# The usage json_to_metadata writes of ANSWER.
USAGE: Final = {"prompt_tokens": 3, "completion_tokens": 4}
# A stream's answer in one body: 16 content events, then the usage event the gateway asked
# for (choices empty), then [DONE].
STREAM_ANSWER: Final = "".join(
    "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}) + "\n\n"
    for i in range(1, 17)
) + "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 16,
                                     "total_tokens": 19}}) + "\n\ndata: [DONE]\n\n"  # fmt: skip
STREAM_PATH: Final = "/v1/stream"
SINK_CLUSTER: Final = "sink"
# A LogsService that takes every Export and answers empty, in its own process.
SINK: Final = """
import asyncio, sys, grpc
async def main(port):
    server = grpc.aio.server()
    async def export(request, context): return b""
    handler = grpc.unary_unary_rpc_method_handler(
        export, request_deserializer=lambda b: b, response_serializer=lambda b: b)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.logs.v1.LogsService", {"Export": handler})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main(int(sys.argv[1])))
"""


def _typed(type_name: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _cluster(name: str, port: int, *, http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name, "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": _address(port)},
            "metadata": {"filter_metadata": {wire.METADATA_NAMESPACE: {wire.META_PROVIDER: "up"}}},
        }]}]},
    }  # fmt: skip
    if http2:
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {
            options: _typed(options, explicit_http_config={"http2_protocol_options": {}})
        }
    return cluster


def _listener(
    port: int,
    filters: list[dict[str, Any]],
    logs: list[dict[str, Any]],
    route: dict[str, Any],
    headers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    router = {"name": "envoy.filters.http.router",
              "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router")}  # fmt: skip
    hcm = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="h", access_log=logs, http_filters=[*filters, router],
        route_config={"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [route],
                                          "response_headers_to_add": headers or []}]},
    )  # fmt: skip
    manager = {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
    return {"name": "l", "address": _address(port), "filter_chains": [{"filters": [manager]}]}


def _bootstrap(listener: dict[str, Any], clusters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "admin": {"address": _address(0)},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def _upstream(port: int) -> dict[str, Any]:
    """Answers a chat completion at every path, and a stream's events at STREAM_PATH."""

    def answer(body: str, content_type: str) -> dict[str, Any]:
        header = {"header": {"key": "content-type", "value": content_type},
                  "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}  # fmt: skip
        return {"direct_response": {"status": 200, "body": {"inline_string": body}},
                "response_headers_to_add": [header]}  # fmt: skip

    stream = {"match": {"prefix": STREAM_PATH}, **answer(STREAM_ANSWER, "text/event-stream")}
    json_answer = {"match": {"prefix": "/"}, **answer(ANSWER, "application/json")}
    listener = _listener(port, [], [], stream)
    listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
        "virtual_hosts"][0]["routes"].append(json_answer)  # fmt: skip
    return _bootstrap(listener, [])


def _record_log(body: str | None = None, attributes: bool = False) -> dict[str, Any]:
    """The translated record log to the sink; `body` replaces its body, `attributes`
    sends the same fields as one OpenTelemetry attribute each instead."""
    log = MessageToDict(record_access_log(), preserving_proto_field_name=True)
    value = log["typed_config"]["value"]
    value["common_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = SINK_CLUSTER
    if body is not None:
        value["body"] = {"string_value": body}
    if attributes:
        del value["body"]
        value["attributes"] = {"values": [
            {"key": key, "value": {"string_value": RECORD_FORMATS[key]}}
            for key in wire.RECORD_LAYOUT
        ]}  # fmt: skip
    return log


def file_record_log() -> dict[str, Any]:
    """The record's body as Envoy's file access log writes it, to /dev/null."""
    body = MessageToDict(record_access_log(), preserving_proto_field_name=True)[
        "typed_config"]["value"]["body"]["string_value"]  # fmt: skip
    return {"name": "envoy.access_loggers.file", "typed_config": _typed(
        "envoy.extensions.access_loggers.file.v3.FileAccessLog", path="/dev/null",
        log_format={"text_format_source": {"inline_string": body + "\n"}})}  # fmt: skip


NATIVE_LOGGER_SOURCE: Final = Path(__file__).parent / "native_filter" / "record_logger.c"


def native_record_logger(name: str) -> dict[str, Any]:
    """An experiment's native access logger (native_filter/record_logger.c, built here
    with gcc): `read` reads and formats the record's fields and drops them (no
    transport); `empty` does nothing."""
    out = Path(tempfile.gettempdir()) / "sluicegate-record-logger"
    out.mkdir(exist_ok=True)
    library = out / "librecord_logger.so"
    if not library.exists() or library.stat().st_mtime < NATIVE_LOGGER_SOURCE.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared",
                        "-fPIC", "-fvisibility=hidden", "-o", str(library),
                        str(NATIVE_LOGGER_SOURCE)], check=True)  # fmt: skip
    return {"name": "envoy.access_loggers.dynamic_modules", "typed_config": _typed(
        "envoy.extensions.access_loggers.dynamic_modules.v3.DynamicModuleAccessLog",
        dynamic_module_config={"module": {"local": {"filename": str(library)}}},
        logger_name=name,
        logger_config={"@type": "type.googleapis.com/google.protobuf.StringValue",
                       "value": "\n".join(wire.RECORD_METADATA_FIELDS)},
    )}  # fmt: skip


def _usage_readers(work: Path) -> list[dict[str, Any]]:
    """The translated listener's usage readers (json_to_metadata, the stream usage Lua
    filter, sse_to_metadata), each behind its matcher, as the translator writes them."""
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    from .latency_metrics import USAGE_READERS

    listener: Any = translate(gateway_model(work, 10000, 10001))[LISTENER][0]
    hcm = hcm_pb2.HttpConnectionManager()
    (manager,) = (f for f in listener.filter_chains[0].filters if f.typed_config.Is(hcm.DESCRIPTOR))
    manager.typed_config.Unpack(hcm)
    readers = [MessageToDict(f, preserving_proto_field_name=True) for f in hcm.http_filters
               if f.name in USAGE_READERS]  # fmt: skip
    if len(readers) != 3:  # json_to_metadata, the Lua filter, sse_to_metadata
        raise RuntimeError(f"not the usage readers: {[f['name'] for f in readers]}")
    return readers


@dataclass(frozen=True)
class Arm:
    """One front Envoy: its filters and logs, the metadata set_metadata writes, and what
    it is asked for: a JSON answer (read by json_to_metadata) or a stream."""

    filters: Callable[[Path], list[dict[str, Any]]] = lambda work: []
    logs: Callable[[], list[dict[str, Any]]] = lambda: []
    stream: bool = False
    metadata: Mapping[str, Any] = field(default_factory=lambda: METADATA)
    reader: str = wire.USAGE_BY_LOG  # what the routing stage names (usage_reader.py)
    # The usage namespace as a reader would have written it (arms without a reader).
    usage: Mapping[str, Any] | None = None


def _native_reader(work: Path) -> list[dict[str, Any]]:
    """The native usage reader (docs/native-filters.md), built with gcc, as translated."""
    native = native_usage_reader(str(build(MODULE)))
    return [MessageToDict(native, preserving_proto_field_name=True)]


def _only(*names: str) -> Callable[[Path], list[dict[str, Any]]]:
    """The usage readers named, as translated."""
    return lambda work: [f for f in _usage_readers(work) if f["name"] in names]


def _arms() -> dict[str, Arm]:
    fixed = [RECORD_FORMATS[k] for k in wire.RECORD_LAYOUT if k not in wire.RECORD_METADATA_FIELDS]
    meta_by_key = [RECORD_FORMATS[k] for k in wire.RECORD_METADATA_FIELDS
                   if k not in wire.RECORD_USAGE_FIELDS]  # fmt: skip
    usage_json = f"%DYNAMIC_METADATA({wire.USAGE_METADATA_NAMESPACE})%"
    meta_json = f"%DYNAMIC_METADATA({wire.METADATA_NAMESPACE})%"

    def body(*lines: str) -> str:
        return "\n".join((wire.RECORD_LOG_NAME, *lines))

    # A stream of a routing-only route (no reservation): Lua reads no chunk.
    unreserved = {k: v for k, v in METADATA.items() if k != wire.META_RESERVATION}
    # A reserved stream whose usage event the gateway asked for: Lua counts and cuts.
    cut = {**METADATA, wire.META_USAGE_INJECTED: wire.USAGE_INJECTED_TRUE}

    def native_cut(log: Callable[[], dict[str, Any]]) -> Arm:
        """A reserved stream, cut and counted by the native reader, with `log`."""
        return Arm(filters=_native_reader, stream=True, metadata=cut,
                   reader=wire.USAGE_BY_STREAM_CHUNKS, logs=lambda: [log()])  # fmt: skip

    return {
        "base": Arm(),
        "record log, as translated": Arm(logs=lambda: [_record_log()], usage=USAGE),
        "record log as one attribute a field": Arm(
            logs=lambda: [_record_log(attributes=True)], usage=USAGE
        ),
        "record log, each namespace as JSON (before session 18)": Arm(
            logs=lambda: [_record_log(body=body(*fixed, usage_json, meta_json))], usage=USAGE
        ),
        "record log, the usage as JSON": Arm(
            logs=lambda: [_record_log(body=body(*fixed, *meta_by_key, usage_json))], usage=USAGE
        ),
        "record log without the metadata": Arm(
            logs=lambda: [_record_log(body=body(*fixed))], usage=USAGE
        ),
        # Ten of the same log on each request, so that the difference stands out of this
        # machine's noise (about ±20 µs a request from round to round).
        f"{COPIES} record logs, as translated": Arm(
            logs=lambda: [_record_log()] * COPIES, usage=USAGE
        ),
        f"{COPIES} record logs, each namespace as JSON (before session 18)": Arm(
            logs=lambda: [_record_log(body=body(*fixed, usage_json, meta_json))] * COPIES,
            usage=USAGE,
        ),
        f"{COPIES} record logs without the metadata": Arm(
            logs=lambda: [_record_log(body=body(*fixed))] * COPIES, usage=USAGE
        ),
        "usage readers, as translated": Arm(filters=_usage_readers),
        "usage readers and the record log": Arm(
            filters=_usage_readers, logs=lambda: [_record_log()]
        ),
        "stream: base": Arm(stream=True, reader=wire.USAGE_BY_STREAM),
        "stream: usage readers, the client asked for usage, no reservation": Arm(
            filters=_usage_readers, stream=True, metadata=unreserved, reader=wire.USAGE_BY_STREAM
        ),
        "stream: usage readers, usage asked by the gateway (cut), reserved (count)": Arm(
            filters=_usage_readers, stream=True, metadata=cut, reader=wire.USAGE_BY_STREAM_CHUNKS
        ),
        "stream: sse_to_metadata alone": Arm(
            filters=_only(SSE_TO_METADATA_FILTER),
            stream=True,
            metadata=unreserved,
            reader=wire.USAGE_BY_STREAM,
        ),
        "usage readers, native": Arm(filters=_native_reader),
        "usage readers, native, and the record log": Arm(
            filters=_native_reader, logs=lambda: [_record_log()]
        ),
        "stream: native usage reader, the client asked for usage, no reservation": Arm(
            filters=_native_reader, stream=True, metadata=unreserved, reader=wire.USAGE_BY_STREAM
        ),
        "stream: native usage reader, usage asked by the gateway (cut), reserved (count)": Arm(
            filters=_native_reader, stream=True, metadata=cut, reader=wire.USAGE_BY_STREAM_CHUNKS
        ),
        "stream: native usage reader, cut, and the record log": native_cut(_record_log),
        "stream: native usage reader, cut, and an OTel log of the name alone": native_cut(
            lambda: _record_log(body=body())
        ),
        "stream: native usage reader, cut, and the record as a file log": native_cut(
            file_record_log
        ),
        "stream: native usage reader, cut, and a native logger reading the record": native_cut(
            lambda: native_record_logger("read")
        ),
        "stream: native usage reader, cut, and an empty native logger": native_cut(
            lambda: native_record_logger("empty")
        ),
        "stream: the Lua filter alone, cut and count": Arm(
            filters=_only(STREAM_USAGE_FILTER),
            stream=True,
            metadata=cut,
            reader=wire.USAGE_BY_STREAM_CHUNKS,
        ),
    }


def _front(port: int, upstream: int, sink: int, arm: Arm, work: Path) -> dict[str, Any]:
    set_metadata = {"name": "envoy.filters.http.set_metadata", "typed_config": _typed(
        "envoy.extensions.filters.http.set_metadata.v3.Config",
        metadata=[{"metadata_namespace": wire.METADATA_NAMESPACE, "value": dict(arm.metadata)},
                  *([{"metadata_namespace": wire.USAGE_METADATA_NAMESPACE,
                      "value": dict(arm.usage)}] if arm.usage else [])],
    )}  # fmt: skip
    route = {"name": "chat", "match": {"prefix": "/"}, "route": {"cluster": "up"}}
    return _bootstrap(
        _listener(port, [set_metadata, *arm.filters(work)], arm.logs(), route),
        [_cluster("up", upstream), _cluster(SINK_CLUSTER, sink, http2=True)],
    )


def _wrk(
    url: str, seconds: int, reader: str, envoy: int, idle_ms: int
) -> tuple[float, float, float]:
    """wrk -c1, the request marked for `reader`, `idle_ms` between requests: (p50 µs,
    mean µs per request, CPU µs per request of the front Envoy `envoy`, every thread).
    With an idle time the mean is of the requests' latencies, not of the round's time."""
    script = Path(tempfile.gettempdir()) / f"sluicegate-wrk-idle-{idle_ms}.lua"
    if idle_ms and not script.exists():
        script.write_text(f"function delay() return {idle_ms} end\n")
    cpu = exact_cpu_seconds(envoy)
    out = subprocess.run(
        ["taskset", "-c", LOAD_CORE, "wrk", "-c1", "-t1", f"-d{seconds}s", "--latency",
         "-H", f"{wire.USAGE_HEADER}: {reader}", *(["-s", str(script)] if idle_ms else []),
         url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    cpu = exact_cpu_seconds(envoy) - cpu
    found = re.search(r"50%\s+([\d.]+)(us|ms)", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if found is None or rate is None or count is None:
        raise RuntimeError(f"wrk said:\n{out}")
    p50 = float(found.group(1)) * (1 if found.group(2) == "us" else 1000)
    mean = 1e6 / float(rate.group(1))
    if idle_ms:
        average = re.search(r"Latency\s+([\d.]+)(us|ms)", out)
        if average is None:
            raise RuntimeError(f"wrk said:\n{out}")
        mean = float(average.group(1)) * (1 if average.group(2) == "us" else 1000)
    return p50, mean, 1e6 * cpu / int(count.group(1))


def _check_the_cut(urls: dict[str, str], arms: dict[str, Arm]) -> None:
    """A stream arm whose metadata says the gateway asked for usage must cut the usage
    event; every other stream arm passes it: else the arms would measure the wrong thing."""
    for name, arm in arms.items():
        if not arm.stream:
            continue
        request = urllib.request.Request(urls[name], headers={wire.USAGE_HEADER: arm.reader})
        with urllib.request.urlopen(request, timeout=5) as response:
            text = response.read().decode()
        cutters = (STREAM_USAGE_FILTER, NATIVE_USAGE_READER_FILTER)
        cut = wire.META_USAGE_INJECTED in arm.metadata and any(
            f["name"] in cutters for f in arm.filters(Path(tempfile.mkdtemp()))
        )
        if ('"usage"' in text) == cut or text.count('"content"') != 16:
            raise RuntimeError(f"{name}: the stream was not read as meant:\n{text}")


def run(rounds: int, seconds: int, only: str | None = None, idle_ms: int = 0) -> str:
    work = Path(tempfile.mkdtemp(prefix="record-log-cost-"))
    wanted = wanted_arms(only)
    arms = {name: arm for name, arm in _arms().items()
            if wanted is None or any(part in name for part in wanted)
            or name in ("base", "stream: base")}  # fmt: skip
    upstream, sink, *ports = free_ports(2 + len(arms))
    sink_process = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, sys.executable, "-c", SINK, str(sink)]
    )
    envoys = [EnvoyProcess(_upstream(upstream), work_dir=work / "upstream", concurrency=1)]
    urls: dict[str, str] = {}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in arms}
    try:
        for index, ((name, arm), port) in enumerate(zip(arms.items(), ports, strict=True)):
            envoys.append(EnvoyProcess(_front(port, upstream, sink, arm, work),
                                       work_dir=work / f"arm-{index}", concurrency=1))  # fmt: skip
            path = STREAM_PATH if arm.stream else "/v1/chat/completions"
            urls[name] = f"http://127.0.0.1:{port}{path}"
        for index, envoy in enumerate(envoys):
            envoy.start_blocking()
            assert envoy.pid is not None
            # The upstream (the first) with the load, every front Envoy on the other core.
            pin(envoy.pid, int(LOAD_CORE) if index == 0 else ENVOY_CORE)
        pids = {name: envoy.pid or 0 for name, envoy in zip(arms, envoys[1:], strict=True)}
        for port in (upstream, *ports):
            wait_listening(port, 30.0)
        names = list(arms)
        _check_the_cut(urls, arms)
        for name in names:
            # Warm: connections, the first Lua state.
            _wrk(urls[name], 1, arms[name].reader, pids[name], idle_ms)
        for index in range(rounds):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                measured = _wrk(urls[name], seconds, arms[name].reader, pids[name], idle_ms)
                results[name].append(measured)
    finally:
        for envoy in envoys:
            envoy.stop_blocking()
        stop_tree(sink_process)

    def base(name: str) -> list[tuple[float, float, float]]:
        return results["stream: base" if arms[name].stream else "base"]

    lines = [
        f"{today()}; {machine()}; Envoy with 1 worker; wrk -c1 -t1 for {seconds} s per arm "
        f"and round, {rounds} rounds (the arms in turn, the order rotating); the front "
        "Envoys on one core, the upstream Envoy, the log sink and wrk on the other"
        + (f"; wrk waits {idle_ms} ms before each request" if idle_ms else ""),
        "",
        "| arm | p50 µs | added p50 µs | mean µs per request | added mean µs "
        "| Envoy CPU µs per request | added CPU µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in arms:
        cells = []
        for column in range(3):
            values = [row[column] for row in results[name]]
            added = median([a[column] - b[column]
                            for a, b in zip(results[name], base(name), strict=True)])  # fmt: skip
            cells += [f"{median(values):.1f}", f"{added:+.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Medians of the rounds; the added figures are per round (a stream's against "
        "`stream: base`), then their median. Envoy's CPU is the front Envoy's, every "
        "thread, over the round's requests.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4, help="wrk's run per arm and round")
    parser.add_argument(
        "--only",
        help="the arms whose name has one of these texts, separated by commas (or by `|`"
        " when a name holds a comma), and their base",
    )
    parser.add_argument(
        "--idle-ms",
        type=int,
        default=0,
        help="wrk waits this long before each request, so Envoy idles between requests as "
        "between a paced stream's events (its caches go cold)",
    )
    args = parser.parse_args(argv)
    print(run(args.rounds, args.seconds, args.only, args.idle_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
