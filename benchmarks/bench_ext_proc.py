"""Micro-benchmark: ext_proc messages per second and server CPU per message.

Not collected by pytest. Run:  python -m benchmarks.bench_ext_proc [--requests N]

The server runs in its own process (uvloop, as in production); this process drives
it over a real gRPC channel with many concurrent Process streams, one per simulated
HTTP request, exactly as Envoy would: headers message, then body message. Reported:
requests/s and messages/s at saturation, and the server's CPU time per message
(read from /proc, so the client's own cost does not count).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from benchmarks.harness.cli import benchmark_parser
from benchmarks.harness.ext_proc_child import ExtProcChild
from sluicegate import wire
from sluicegate.filters import ExtProcServer, RouteInfo, RoutingTable
from sluicegate.filters.attempt import ROUTE_METADATA_ATTRIBUTE
from sluicegate.testing import (
    GRPC_EOF,
    HOST_METADATA_A,
    ROUTE_METADATA_V1,
    body_message,
    cpu_seconds,
    headers_message,
)

CHAT_BODY = json.dumps(
    {
        "model": "m1",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 4},
            {"role": "user", "content": "Summarize the following text please. " * 20},
        ],
        "temperature": 0.2,
        "max_tokens": 256,
        "stream": True,
    }
).encode()


def build_server() -> ExtProcServer:
    """The server under test (runs in the child process): routes m1 and m2."""
    return ExtProcServer(RoutingTable({"m1": RouteInfo("r1"), "m2": RouteInfo("r2")}))


async def drive(
    address: str, stage: str, messages: list[Any], requests: int, streams: int
) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ep_grpc.ExternalProcessorStub(channel)
        metadata = ((wire.STAGE_METADATA_KEY, stage),)
        remaining = requests

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                call = stub.Process(metadata=metadata)
                for message in messages:
                    await call.write(message)
                    answer = await call.read()
                    assert answer is not GRPC_EOF
                await call.done_writing()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--streams", type=int, default=64)
    args = parser.parse_args(argv)

    attempt_attributes = {
        wire.UPSTREAM_HOST_METADATA_ATTRIBUTE: HOST_METADATA_A,
        ROUTE_METADATA_ATTRIBUTE: ROUTE_METADATA_V1,
    }
    scenarios = {
        "routing (headers + body, routed)": (
            wire.STAGE_ROUTING,
            [headers_message(content_length=len(CHAT_BODY)), body_message(CHAT_BODY)],
        ),
        "routing (headers + body, 404)": (
            wire.STAGE_ROUTING,
            [headers_message(), body_message(CHAT_BODY.replace(b'"m1"', b'"zz"'))],
        ),
        "attempt (headers + body, model+path rewrite)": (
            wire.STAGE_ATTEMPT,
            [
                headers_message(content_length=len(CHAT_BODY), attributes=attempt_attributes),
                body_message(CHAT_BODY),
            ],
        ),
        "routing (body only, 1 message)": (wire.STAGE_ROUTING, [body_message(CHAT_BODY)]),
    }
    with ExtProcChild(build_server) as server:
        print(f"body {len(CHAT_BODY)} bytes, {args.streams} concurrent streams, uvloop server")
        for name, (stage, messages) in scenarios.items():
            asyncio.run(drive(server.address, stage, messages, 500, args.streams))  # warm up
            cpu_before = cpu_seconds(server.pid)
            elapsed = asyncio.run(
                drive(server.address, stage, messages, args.requests, args.streams)
            )
            cpu = cpu_seconds(server.pid) - cpu_before
            total = args.requests * len(messages)
            print(
                f"{name:46s} {args.requests / elapsed:8.0f} req/s {total / elapsed:8.0f} msg/s"
                f"  server CPU {cpu / total * 1e6:6.1f} us/msg {cpu / args.requests * 1e6:6.1f}"
                " us/req"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
