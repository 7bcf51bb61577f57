"""Micro-benchmark: ext_proc messages per second and server CPU per message.

Not collected by pytest. Run:  python -m benchmarks.bench_ext_proc [--requests N]

The server runs in its own process (uvloop, as in production); this process drives
it over a real gRPC channel with many concurrent Process streams, one per simulated
HTTP request, exactly as Envoy would: headers message, then body message. Reported:
requests/s and messages/s at saturation, and the server's CPU time per message
(read from /proc, so the client's own cost does not count).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from sluicegate import wire
from sluicegate.filters import ExtProcServer, RouteInfo, RoutingTable
from sluicegate.filters.attempt import ROUTE_METADATA_ATTRIBUTE
from tests.filters.helpers import HOST_METADATA_A, ROUTE_METADATA_V1, body_message, headers_message

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


def _serve(ready: Any, stop: Any) -> None:
    import uvloop

    async def main() -> None:
        server = ExtProcServer(RoutingTable({"m1": RouteInfo("r1"), "m2": RouteInfo("r2")}))
        address = await server.start("127.0.0.1:0")
        ready.put((address, os.getpid()))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    uvloop.run(main())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
                    assert answer is not grpc.aio.EOF
                await call.done_writing()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--streams", type=int, default=64)
    args = parser.parse_args()

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
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve, args=(ready, stop), daemon=True)
    process.start()
    try:
        address, pid = ready.get(timeout=20)
        print(f"body {len(CHAT_BODY)} bytes, {args.streams} concurrent streams, uvloop server")
        for name, (stage, messages) in scenarios.items():
            asyncio.run(drive(address, stage, messages, 500, args.streams))  # warm up
            cpu_before = cpu_seconds(pid)
            elapsed = asyncio.run(drive(address, stage, messages, args.requests, args.streams))
            cpu = cpu_seconds(pid) - cpu_before
            total = args.requests * len(messages)
            print(
                f"{name:46s} {args.requests / elapsed:8.0f} req/s {total / elapsed:8.0f} msg/s"
                f"  server CPU {cpu / total * 1e6:6.1f} us/msg {cpu / args.requests * 1e6:6.1f}"
                " us/req"
            )
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


if __name__ == "__main__":
    main()
