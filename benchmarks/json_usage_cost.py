"""Benchmark: what reading a JSON answer's usage in Envoy (json_to_metadata) costs, by size.

    python -m benchmarks.json_usage_cost [--write]

A provider (a threaded Python HTTP server) answers every POST with an embeddings-style
JSON document of a given size whose `usage` comes last, as OpenAI's do. Two Envoys with
one worker each forward to it: plain, and with the json_to_metadata response rules
sluicegate's usage accounting uses (`usage.<member>` for wire.USAGE_MEMBERS). The
median time of 15 sequential requests (after 3 untimed) through each, per size, and
the difference: time Envoy's worker spends parsing, serving nothing else. It decides
which answers the admission stage lets Envoy read (filters/admission/stream.py,
`small_json_answer`).
"""

from __future__ import annotations

import http.server
import json
import socketserver
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from benchmarks.harness.bootstraps import bootstrap, cluster, typed
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.harness.stats import median
from sluicegate import wire
from sluicegate.envoy import EnvoyProcess
from sluicegate.testing import free_ports

SIZES: Final = (2_000, 20_000, 200_000, 2_000_000, 8_000_000)
REQUESTS: Final = 15
WARMUP: Final = 3  # not timed: connections, buffers


def answer_of(size: int) -> bytes:
    """An embeddings answer of about `size` bytes, usage last."""
    floats = [0.0123456789] * max(1, size // 14)
    document = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": floats}],
        "model": "bench",
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }
    return json.dumps(document).encode()


class _Provider(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without this, Nagle holds the body for the
    # client's delayed ACK (40 ms) on small answers.
    disable_nagle_algorithm = True
    answer = b"{}"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *_args: Any) -> None:
        return


def _usage_rules() -> dict[str, Any]:
    rules = [
        {
            "selectors": [{"key": "usage"}, {"key": member}],
            "on_present": {"metadata_namespace": wire.USAGE_METADATA_NAMESPACE, "key": member},
        }
        for member in wire.USAGE_MEMBERS
    ]
    return {
        "name": "envoy.filters.http.json_to_metadata",
        "typed_config": typed(
            "envoy.extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
            response_rules={"rules": rules},
        ),
    }


def _median_ms(url: str) -> float:
    times = []
    for index in range(WARMUP + REQUESTS):
        started = time.perf_counter()
        request = urllib.request.Request(url, data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{url}: HTTP {response.status}")
        if index >= WARMUP:
            times.append((time.perf_counter() - started) * 1e3)
    return median(times)


def measure(work: Path) -> list[tuple[int, float, float]]:
    (port,) = free_ports(1)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", port), _Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    route = [{"match": {"prefix": "/"}, "route": {"cluster": "provider", "timeout": "120s"}}]
    envoys: dict[str, EnvoyProcess] = {}
    try:
        for name, filters in (("plain", []), ("usage", [_usage_rules()])):
            config = bootstrap(route, filters, [cluster("provider", port)])
            # As the gateway's listener: room for the largest answer to be buffered.
            listener = config["static_resources"]["listeners"][0]
            listener["per_connection_buffer_limit_bytes"] = 64 * 1024 * 1024
            envoys[name] = EnvoyProcess(config, work_dir=work / name, concurrency=1)
            envoys[name].start_blocking()
        rows = []
        for size in SIZES:
            _Provider.answer = answer_of(size)
            timed = {
                name: _median_ms(f"http://127.0.0.1:{e.listeners()['gateway'][1]}/v1/x")
                for name, e in envoys.items()
            }
            rows.append((len(_Provider.answer), timed["plain"], timed["usage"]))
            print(f"{len(_Provider.answer):>10,} bytes: plain {timed['plain']:.1f} ms, "
                  f"usage read {timed['usage']:.1f} ms", flush=True)  # fmt: skip
        return rows
    finally:
        for envoy in envoys.values():
            envoy.stop_blocking()
        server.shutdown()
        server.server_close()


def report(rows: list[tuple[int, float, float]], command: str) -> str:
    out = [f"`{command}` — {today()}; {machine()}; Envoy with 1 worker.", ""]
    out.append((__doc__ or "").split("\n\n", 2)[2].strip())
    out += ["", "| answer bytes | plain ms | with json_to_metadata ms | added ms | ms per MB |"]
    out.append("|---:|---:|---:|---:|---:|")
    for size, plain, usage in rows:
        added = usage - plain
        out.append(
            f"| {size:,} | {plain:.1f} | {usage:.1f} | {added:+.1f} | {added / size * 1e6:.0f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sluicegate-json-usage-") as tmp:
        rows = measure(Path(tmp))
    command = command_line("benchmarks.json_usage_cost", argv)
    record("Reading usage in Envoy, by answer size", report(rows, command), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
