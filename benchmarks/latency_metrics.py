"""Are the request records' latencies right, and what does a record cost in Python?

Accuracy: a mock provider with a fixed time to first token and inter-token latency
(default 300 ms and 20 ms, 20 output tokens) behind the translated gateway in a real Envoy
(one worker, static bootstrap) and an ExtProcServer in this process. Streamed requests
are sent one at a time. The records' TTFT and time per output token, p50 and p95, are
compared with the configured values. Streamed records carry no usage yet
(docs/metrics.md, "What is not there yet"), so TPOT here divides by the mock's
configured token count: that checks Envoy's time points, not the usage path.

`--decode-only`: CPU time (process time) per record to decode it, and to decode and
count it, over batches of 100 records like the ones Envoy sends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from prometheus_client import CollectorRegistry

from sluicegate import wire
from sluicegate.config import load_config
from sluicegate.envoy import find_envoy_binary
from sluicegate.filters import ExtProcServer
from sluicegate.model import build_model
from sluicegate.records import RecordSink, RequestRecord, decode, log_records
from sluicegate.testing import free_ports, static_bootstrap
from sluicegate.xds.translate import translate

from .harness.cli import benchmark_parser
from .harness.processes import stop_tree, wait_listening
from .harness.stack import MockProvider
from .harness.stats import percentile

MODEL = "bench-model"


def _document(listener: int, provider: int) -> dict[str, Any]:
    return {
        "version": 1,
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listener}],
        "providers": [{"name": "mock", "base_url": f"http://127.0.0.1:{provider}/v1"}],
        "routes": [{"name": "bench", "models": [MODEL], "backends": [{"provider": "mock"}]}],
    }


def _stream(listener: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    request = urllib.request.Request(
        f"http://127.0.0.1:{listener}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


async def _accuracy(requests: int, ttft_ms: int, itl_ms: int, tokens: int) -> str:
    listener, provider, ext_proc, admin = free_ports(4)
    work = Path(tempfile.mkdtemp(prefix="latency-metrics-"))
    (work / "sluicegate.yaml").write_text(yaml.safe_dump(_document(listener, provider)))
    gateway = build_model(load_config(work / "sluicegate.yaml"), {})
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
    ttft = [r.ttft_s for r in records if r.ttft_s is not None and r.status == 200]
    tpot = [
        (r.duration_s - r.ttft_s) / (tokens - 1)
        for r in records
        if r.duration_s is not None and r.ttft_s is not None and r.status == 200
    ]
    lines = [
        f"{len(records)} streamed records of {requests} requests (concurrency 1); "
        f"mock TTFT {ttft_ms} ms, ITL {itl_ms} ms, {tokens} tokens",
        "| | configured | p50 | p95 | p50 error |",
        "|---|---|---|---|---|",
    ]
    for name, values, configured in (("TTFT", ttft, ttft_ms), ("TPOT", tpot, itl_ms)):
        p50, p95 = percentile(values, 50) * 1000, percentile(values, 95) * 1000
        error = (p50 - configured) / configured * 100
        lines.append(f"| {name} | {configured} ms | {p50:.1f} ms | {p95:.1f} ms | {error:+.1f} % |")
    return "\n".join(lines)


def _log_record() -> Any:
    """A streamed request's record, with the metadata the routing stage writes."""
    metadata = {
        "tenant": "acme", "key_name": "ci", "model": MODEL, "priority": "standard",
        "scenario": "default", "queue_ms": 0, "stream": "true", "reservation": "abc-1",
        "estimate_input_tokens": "9", "estimate_output_tokens": "1024",
        "ratelimit_limit_requests": "600", "ratelimit_remaining_requests": "599",
        "ratelimit_reset_requests": "1m0s", "ratelimit_limit_tokens": "100000",
        "ratelimit_remaining_tokens": "98967", "ratelimit_reset_tokens": "1m0s",
    }  # fmt: skip
    attributes = {
        wire.RECORD_ROUTE: "bench", wire.RECORD_PROVIDER: "mock",
        wire.RECORD_FLAGS: "-", wire.RECORD_DETAILS: "via_upstream",
        wire.RECORD_ATTEMPTS: "1", wire.RECORD_CONTENT_TYPE: "text/event-stream",
        wire.RECORD_FIRST_UPSTREAM_BYTE_US: "303512",
        wire.RECORD_FIRST_UPSTREAM_BODY_US: "304101",
        wire.RECORD_FIRST_DOWNSTREAM_BYTE_US: "303700",
        wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "682004",
        wire.RECORD_METADATA: json.dumps(metadata, separators=(",", ":")),
        wire.RECORD_USAGE: '{"completion_tokens":20,"prompt_tokens":2}',
    }  # fmt: skip
    return logs_pb2.LogRecord(
        time_unix_nano=time.time_ns(),
        attributes=[
            common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))
            for key, value in attributes.items()
        ],
    )


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
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--ttft-ms", type=int, default=300)
    parser.add_argument("--itl-ms", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=20)
    args = parser.parse_args(argv)
    print(_decode_cost())
    if not args.decode_only:
        print(asyncio.run(_accuracy(args.requests, args.ttft_ms, args.itl_ms,
                                    args.output_tokens)))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
