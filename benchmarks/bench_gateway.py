"""Benchmark: the routing stage's cost with a real Envoy as its client.

Not collected by pytest. Run:  python -m benchmarks.bench_gateway [--requests N]

Envoy (1 worker) runs the routing-stage ext_proc filter in front of a route it
answers itself (direct_response), so no provider is involved; the ext_proc
server runs in its own uvloop process. Reported: requests/s through Envoy and
the ext_proc server's CPU per request (2 ext_proc messages: headers, body),
next to a baseline without the filter. The load generator shares the machine.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from benchmarks.bench_ext_proc import CHAT_BODY, build_server
from benchmarks.harness.cli import benchmark_parser
from benchmarks.harness.ext_proc_child import ExtProcChild
from sluicegate.envoy import EnvoyProcess
from sluicegate.testing import cpu_seconds, static_gateway


async def load(url: str, requests: int, concurrency: int) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                async with session.post(url, data=CHAT_BODY) as response:
                    await response.read()
                    assert response.status == 200, response.status

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def without_filter(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = hcm["http_filters"][1:]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    routes.insert(0, {"match": {"prefix": "/"}, "direct_response": {"status": 200}})
    return config


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    with ExtProcChild(build_server) as server:
        print(f"body {len(CHAT_BODY)} bytes, concurrency {args.concurrency}, Envoy 1 worker")
        for name, config in (
            ("no ext_proc (baseline)", without_filter(static_gateway(server.port, [], ["m1"]))),
            ("routing stage (headers + body)", static_gateway(server.port, [], ["m1"])),
        ):
            with EnvoyProcess(config, concurrency=1) as envoy:
                host, listen = envoy.listeners()["gateway"]
                url = f"http://{host}:{listen}/v1/chat/completions"
                asyncio.run(load(url, 500, args.concurrency))
                before = cpu_seconds(server.pid)
                elapsed = asyncio.run(load(url, args.requests, args.concurrency))
                cpu = cpu_seconds(server.pid) - before
                print(
                    f"{name:34s} {args.requests / elapsed:7.0f} req/s"
                    f"  ext_proc CPU {cpu / args.requests * 1e6:6.1f} us/req"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
