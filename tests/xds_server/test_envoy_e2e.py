"""A real Envoy on our ADS server, in SotW and in delta mode."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2

from sluicegate.envoy import find_envoy_binary
from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot, SnapshotCache, bound_port, serve_ads
from tests.ports import free_port

from .helpers import cla, cluster, listener, route

NODE = "e2e-envoy"


def envoy_binary() -> str:
    return find_envoy_binary()


def bootstrap(ads_port: int, api_type: str) -> dict[str, Any]:
    ads = {"ads": {}, "resource_api_version": "V3"}
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ads_port}}}
    http2 = {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
    return {
        "node": {"id": NODE, "cluster": "e2e"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": api_type,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}],
            },
            "lds_config": ads,
            "cds_config": ads,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": "xds",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "xds",
                        "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
                    },
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http2
                    },
                }
            ]
        },
    }


@asynccontextmanager
async def running_envoy(tmp: Path, ads_port: int, api_type: str) -> AsyncIterator[Path]:
    config = tmp / "bootstrap.json"
    config.write_text(json.dumps(bootstrap(ads_port, api_type)))
    log = tmp / "envoy.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [envoy_binary(), "-c", str(config), "--concurrency", "1", "--use-dynamic-base-id",
             "--admin-address-path", str(tmp / "admin.txt"), "-l", "warning"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


async def http_answer(port: int) -> tuple[dict[str, str], str] | None:
    """The headers (names lower case) and body of a 200 answer to GET / on `port`, or
    None if Envoy does not answer so (yet)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        await writer.drain()
        # Read by Content-Length: Envoy delays closing (delayed_close_timeout, 1 s).
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            headers[key.strip().lower().decode()] = value.strip().decode()
        body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), 2)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
    return (headers, body.decode()) if head.startswith(b"HTTP/1.1 200") else None


async def http_get(port: int) -> str | None:
    """The body of a 200 answer on `port`, or None."""
    answer = await http_answer(port)
    return None if answer is None else answer[1]


async def eventually(check: Callable[[], Any], what: str, log: Path, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; envoy log:\n{log.read_text()[-3000:]}")


def config(port: int, body: str, bad_cluster: bool = False, timeout_s: int = 1) -> Snapshot:
    backend = cluster("backend", timeout_s)
    if bad_cluster:
        # Valid proto, refused by Envoy: an EDS cluster cannot provide its own LB.
        backend.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
    return Snapshot.from_resources({
        CLUSTER: [backend],
        ENDPOINT: [cla("backend")],
        LISTENER: [listener("ingress", "routes", port)],
        ROUTE: [route("routes", body)],
    })  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("api_type", ["GRPC", "DELTA_GRPC"])
async def test_envoy_applies_pushes_and_nack_is_not_resent(tmp_path: Path, api_type: str) -> None:
    cache = SnapshotCache()
    port = free_port()
    first = config(port, "v1")
    cache.set_snapshot(first)
    server = await serve_ads(cache, "127.0.0.1:0", ack_timeout=3.0)

    def node() -> Any:
        found = [s for s in cache.status() if s.node_id == NODE]
        return found[0] if found else None

    def acked(snap: Snapshot, *types: str) -> bool:
        status = node()
        return status is not None and all(
            status.acked_versions().get(t) == snap.version(t) for t in types
        )

    try:
        async with running_envoy(tmp_path, bound_port(server), api_type) as log:
            # Cluster (EDS) + endpoints + listener (RDS over ADS) + routes reach Envoy.
            await eventually(lambda: http_get(port), "the first config to serve", log)
            assert await http_get(port) == "v1"
            await eventually(lambda: acked(first, CLUSTER, ENDPOINT, LISTENER, ROUTE),
                             "ACKs of every type", log)  # fmt: skip
            status = node().to_dict()
            assert status["stream_kind"] == ("delta" if api_type == "DELTA_GRPC" else "sotw")
            assert status["connected"] and status["nacks"] == {}

            # A changed route is applied.
            second = config(port, "v2")
            cache.set_snapshot(second)
            await eventually(lambda: http_get_is(port, "v2"), "the changed route", log)
            await eventually(lambda: acked(second, ROUTE), "the route ACK", log)

            # A cluster Envoy refuses: NACK recorded, not resent, old config kept.
            bad = config(port, "v2", bad_cluster=True)
            cache.set_snapshot(bad)
            await eventually(lambda: CLUSTER in node().current_nacks(), "the NACK", log)
            nack = node().current_nacks()[CLUSTER]
            assert nack.version == bad.version(CLUSTER)
            assert "CLUSTER_PROVIDED" in nack.message or "cluster provided" in nack.message
            cache.set_snapshot(config(port, "v2", bad_cluster=True))  # same content again
            await asyncio.sleep(1.0)
            types = node().types[CLUSTER]
            assert types.nack_count == 1, "the rejected version was sent again"
            assert types.acked_version == second.version(CLUSTER)
            assert await http_get(port) == "v2"

            # A fixed config goes through and clears the error.
            fixed = config(port, "v3", timeout_s=2)
            cache.set_snapshot(fixed)
            await eventually(lambda: http_get_is(port, "v3"), "the fixed config", log)
            await eventually(lambda: acked(fixed, CLUSTER, ROUTE), "ACK of the fix", log)
            assert node().current_nacks() == {}
    finally:
        await server.stop(None)


async def http_get_is(port: int, body: str) -> bool:
    return await http_get(port) == body
