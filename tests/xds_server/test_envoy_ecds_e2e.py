"""A real Envoy takes an HTTP filter's config over ECDS from our ADS server, and a
changed filter config reaches it without the listener being updated."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sluicegate.xds.resource import EXTENSION_CONFIG, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot, SnapshotCache, bound_port, serve_ads
from tests.ports import free_port

from .helpers import ecds_listener, lua_config, route
from .test_envoy_e2e import NODE, eventually, http_answer, running_envoy

FILTER = "sluicegate.test_ecds"
ECDS_DUMP = "type.googleapis.com/envoy.admin.v3.EcdsConfigDump"
LISTENERS_DUMP = "type.googleapis.com/envoy.admin.v3.ListenersConfigDump"


def config(port: int, header_value: str) -> Snapshot:
    """One listener whose Lua filter (from ECDS) adds `x-ecds: header_value`.

    No clusters: Envoy's first (empty) CDS answer must still come, since it
    initializes its listeners only after it (rule 9)."""
    return Snapshot.from_resources({
        EXTENSION_CONFIG: [lua_config(FILTER, header_value)],
        LISTENER: [ecds_listener("ingress", "routes", [FILTER], port)],
        ROUTE: [route("routes", "hello")],
    })  # fmt: skip


async def ecds_header(port: int) -> str | None:
    """The `x-ecds` header of a 200 answer to GET / on `port` ("" without one), or None."""
    answer = await http_answer(port)
    return None if answer is None else answer[0].get("x-ecds", "")


def admin(tmp: Path, path: str) -> str:
    address = (tmp / "admin.txt").read_text().strip()
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
        text: str = response.read().decode()
    return text


def stat(tmp: Path, name: str) -> int:
    for line in admin(tmp, "/stats").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise AssertionError(f"no stat {name}")


def dumped(tmp: Path, dump_type: str) -> dict[str, Any]:
    configs = json.loads(admin(tmp, "/config_dump"))["configs"]
    found: dict[str, Any] = next(c for c in configs if c["@type"] == dump_type)
    return found


def listener_version(tmp: Path) -> str:
    listeners = dumped(tmp, LISTENERS_DUMP)["dynamic_listeners"]
    version: str = next(x for x in listeners if x["name"] == "ingress")["active_state"][
        "version_info"
    ]
    return version


def ecds_filter(tmp: Path) -> dict[str, Any]:
    """The ECDS section's entry for FILTER: version_info and the filter config."""
    filters = dumped(tmp, ECDS_DUMP)["ecds_filters"]
    found: dict[str, Any] = next(f for f in filters if f["ecds_filter"]["name"] == FILTER)
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("api_type", ["GRPC", "DELTA_GRPC"])
async def test_envoy_updates_an_ecds_filter_without_updating_its_listener(
    tmp_path: Path, api_type: str
) -> None:
    cache = SnapshotCache()
    port = free_port()
    first = config(port, "v1")
    cache.set_snapshot(first)
    server = await serve_ads(cache, "127.0.0.1:0", ack_timeout=3.0)

    def acked(snap: Snapshot, *types: str) -> bool:
        found = [s for s in cache.status() if s.node_id == NODE]
        return bool(found) and all(
            found[0].acked_versions().get(t) == snap.version(t) for t in types
        )

    async def header_is(value: str) -> bool:
        return await ecds_header(port) == value

    try:
        async with running_envoy(tmp_path, bound_port(server), api_type) as log:
            # The listener warms until its filter's config arrives over ECDS; then
            # every answer carries the header the filter adds.
            await eventually(lambda: header_is("v1"), "the ECDS filter's effect", log)
            await eventually(lambda: acked(first, EXTENSION_CONFIG, LISTENER, ROUTE),
                             "ACKs of every type", log)  # fmt: skip
            lds_updates = stat(tmp_path, "listener_manager.lds.update_success")
            version = listener_version(tmp_path)
            assert "'v1'" in json.dumps(ecds_filter(tmp_path))

            # Only the filter's config changes: Envoy applies it in place.
            second = config(port, "v2")
            assert second.version(LISTENER) == first.version(LISTENER)
            cache.set_snapshot(second)
            await eventually(lambda: header_is("v2"), "the changed filter config", log)
            await eventually(lambda: acked(second, EXTENSION_CONFIG), "the ECDS ACK", log)
            assert not cache.status()[0].current_nacks()
            # The listener was not updated (which would reset its filters' state).
            assert stat(tmp_path, "listener_manager.lds.update_success") == lds_updates
            assert listener_version(tmp_path) == version
            reloads = f"extension_config_discovery.http_filter.{FILTER}.config_reload"
            assert stat(tmp_path, reloads) == 2
            dumped_filter = ecds_filter(tmp_path)
            assert "'v2'" in json.dumps(dumped_filter) and "'v1'" not in json.dumps(dumped_filter)
    finally:
        await server.stop(None)
