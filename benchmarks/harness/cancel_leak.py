"""Native memory an ext_proc server keeps per stream, by how the client ends the stream.

Envoy ends every ext_proc stream by half-closing it and resetting it at once
(`ExternalProcessorStreamImpl::close()`: closeStream, then resetStream), so the server
sees each call cancelled. This probe runs sluicegate's ExtProcServer (the routing stage,
on the quickstart, uvloop) in a process of its own and drives routing streams (headers,
body, answers read, half-close) ended either as Envoy does (then cancel) or by waiting
for the server's status; the server reports glibc's in-use bytes (mallinfo2) after each
batch. Python objects are not counted there unless they are large (obmalloc keeps small
ones in its own arenas), so what grows is native: gRPC's.

    python -m benchmarks.harness.cancel_leak [--streams N]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import multiprocessing
from typing import Any, Final

import grpc

from sluicegate import wire
from sluicegate.testing import EXAMPLES, body_message, headers_message

PROCESS: Final = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
STATS: Final = "/soak.Probe/InUse"
BODY: Final = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
KEY: Final = "sk-sluicegate-demo"
CONCURRENT: Final = 25
WARM_UP: Final = 2_000


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (heap and mmapped chunks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _identity(data: bytes) -> bytes:
    return data


def _serve(ready: Any) -> None:
    import uvloop

    from sluicegate.config import load_config_text
    from sluicegate.filters import ExtProcServer
    from sluicegate.model import build_model

    async def in_use(_request: bytes, _context: Any) -> bytes:
        return str(_in_use()).encode()

    async def main() -> None:
        path = EXAMPLES / "quickstart.yaml"
        ext_proc = ExtProcServer()
        ext_proc.load(build_model(load_config_text(path.read_text(), str(path)), {}))
        probe = grpc.unary_unary_rpc_method_handler(
            in_use, request_deserializer=_identity, response_serializer=_identity
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                ext_proc.service.generic_handler(),
                grpc.method_handlers_generic_handler("soak.Probe", {"InUse": probe}),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


async def _drive(port: int, cancel: bool, streams: int) -> tuple[float, float]:
    """Bytes per stream the server kept over two runs of `streams` after a warm-up."""
    messages = [
        headers_message(
            extra=[("authorization", f"Bearer {KEY}")], content_length=len(BODY)
        ).SerializeToString(),
        body_message(BODY).SerializeToString(),
    ]
    stage = ((wire.STAGE_METADATA_KEY, wire.STAGE_ROUTING),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        process = channel.stream_stream(
            PROCESS, request_serializer=_identity, response_deserializer=_identity
        )
        stats = channel.unary_unary(
            STATS, request_serializer=_identity, response_deserializer=_identity
        )

        async def one() -> None:
            call = process(None, metadata=stage)
            for message in messages:
                await call.write(message)
                await call.read()
            await call.done_writing()
            if cancel:
                call.cancel()  # what Envoy does right after its half-close
            else:
                await call.read()  # the end of the stream, then its status
                await call.code()

        async def run(count: int) -> int:
            for _ in range(count // CONCURRENT):
                await asyncio.gather(*(one() for _ in range(CONCURRENT)))
            await asyncio.sleep(1.0)  # the last cancellations reach the server
            return int(await stats(b""))

        start = await run(WARM_UP)
        middle = await run(streams)
        end = await run(streams)
    return (middle - start) / streams, (end - middle) / streams


def kept_per_stream(cancel: bool, streams: int) -> tuple[float, float]:
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    server = context.Process(target=_serve, args=(ready,), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=60)
        return asyncio.run(_drive(port, cancel, streams))
    finally:
        server.kill()
        server.join()


def report(streams: int) -> str:
    lines = [
        "| routing stream ended by | native bytes kept per stream (1st run) | (2nd run) |",
        "|---|---:|---:|",
    ]
    for cancel, label in (
        (False, "half-close, status awaited"),
        (True, "half-close, then cancel (Envoy)"),
    ):
        first, second = kept_per_stream(cancel, streams)
        lines.append(f"| {label} | {first:.0f} | {second:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4_000, help="per run (two runs)")
    args = parser.parse_args(argv)
    print(report(args.streams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
