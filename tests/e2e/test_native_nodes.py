"""Each Envoy its own native filters library, end to end (docs/native-filters.md,
"Turning it on"): `sluicegate up` builds the library and names it in its Envoy's
bootstrap, and the control plane (native_filters.module: node, the default) serves that
Envoy listeners that load it; a second Envoy whose bootstrap names a library it cannot
load is moved to Envoy's own filters after one NACK, and serves."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sluicegate.envoy import EnvoyProcess, make_bootstrap
from sluicegate.stack.native_nodes import CRASH_STARTS
from sluicegate.testing import quickstart_on_free_ports
from sluicegate.xds.resource import CLUSTER
from sluicegate.xds.translate import NATIVE_TYPES
from sluicegate.xds.translate.native import NATIVE_USAGE_READER_FILTER
from sluicegate.xds.translate.usage import JSON_TO_METADATA_FILTER
from tests.e2e.stack import post_chat, running_stack

pytestmark = pytest.mark.e2e

MISSING = "/nonexistent/sluicegate/libsluicegate_native.so"


def _http_filters(dump: dict[str, Any]) -> list[str]:
    """The HTTP filters' names in a listeners config_dump, as text (enough to find)."""
    return [name for name in (NATIVE_USAGE_READER_FILTER, JSON_TO_METADATA_FILTER)
            if name in json.dumps(dump)]  # fmt: skip


def _until(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_up_serves_its_envoy_its_library_and_an_envoy_that_cannot_load_one_falls_back(
    tmp_path: Path,
) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    with running_stack(tmp_path, doc) as stack:
        dump = stack.admin_json("/config_dump?resource=dynamic_listeners")
        assert _http_filters(dump) == [NATIVE_USAGE_READER_FILTER]
        node = stack.admin_json("/server_info")["node"]
        library = node["metadata"]["sluicegate"]["native_module"]
        assert library in json.dumps(dump)
        chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        answer = post_chat(stack, chat, {"authorization": "Bearer sk-sluicegate-demo"})
        assert answer.status == 200, answer.text

        bootstrap = make_bootstrap(
            "second", "sluicegate", doc["sluicegate"]["xds"], doc["sluicegate"]["ext_proc"],
            "127.0.0.1:0", native_module=MISSING,
        )  # fmt: skip
        with EnvoyProcess(bootstrap, concurrency=1, work_dir=tmp_path / "second") as second:
            second_dump = _until(lambda: _http_filters(
                second.config_dump("dynamic_listeners")) == [JSON_TO_METADATA_FILTER]
                and second.config_dump("dynamic_listeners"))  # fmt: skip
            assert second_dump, second.log_tail()
            status = stack.status()
            refused = status["native_filters"]["refused"]
            assert [(r["node_id"], r["path"]) for r in refused] == [("second", MISSING)]
            nodes = {n["node_id"]: n for n in status["nodes"]}
            assert nodes["second"]["class"] is None
            # One NACK of its clusters (CDS comes first), and of the listeners if they
            # were sent before the fallback: each refused type once.
            nacks = {key: nack["count"] for key, nack in nodes["second"]["last_nacks"].items()}
            assert nacks[CLUSTER] == 1 and set(nacks) <= set(NATIVE_TYPES), nacks
            assert set(nacks.values()) == {1}, nacks
            assert not nodes["second"]["nacks"]  # its Envoy's filters were taken
            assert nodes[node["id"]]["class"] == library
        # up's Envoy kept its own all along.
        dump = stack.admin_json("/config_dump?resource=dynamic_listeners")
        assert _http_filters(dump) == [NATIVE_USAGE_READER_FILTER]


def test_an_envoy_that_dies_again_and_again_is_given_envoys_own_filters(tmp_path: Path) -> None:
    """A crash in the library takes Envoy down, and `up` starts it again on the same
    config; CRASH_STARTS starts within CRASH_WINDOW_S and the control plane serves it
    Envoy's own filters (here the Envoy is killed: the control plane cannot tell)."""
    doc = quickstart_on_free_ports(tmp_path)
    with running_stack(tmp_path, doc) as stack:
        node_id = stack.admin_json("/server_info")["node"]["id"]

        def connected_since() -> float:
            nodes = {n["node_id"]: n for n in stack.status()["nodes"]}
            node = nodes.get(node_id, {})
            return float(node.get("connected_since") or 0) if node.get("connected") else 0.0

        for _ in range(CRASH_STARTS - 1):
            before = connected_since()
            assert before
            (envoy,) = [p for p in stack.status()["processes"] if p["kind"] == "envoy"]
            os.kill(envoy["pid"], signal.SIGKILL)
            assert _until(lambda since=before: connected_since() > since), stack.log()[-3000:]

        def envoys_own() -> bool:
            dump = stack.admin_json("/config_dump?resource=dynamic_listeners")
            return _http_filters(dump) == [JSON_TO_METADATA_FILTER]

        assert _until(envoys_own), stack.log()[-3000:]
        [refused] = stack.status()["native_filters"]["refused"]
        assert refused["node_id"] == node_id and "connected anew" in refused["message"]
        chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        answer = post_chat(stack, chat, {"authorization": "Bearer sk-sluicegate-demo"})
        assert answer.status == 200, answer.text
