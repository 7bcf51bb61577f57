"""Per-route fault injection for failover drills, switched by hot reload."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError, OpenAI

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import running_stack

pytestmark = pytest.mark.e2e

HELLO: Any = [{"role": "user", "content": "hello"}]
QUICK = {"x-mock-output-tokens": "1", "x-mock-ttft-ms": "0"}
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"


def test_abort_drill_on_one_route_leaves_listener_and_other_routes_alone(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    with running_stack(tmp_path, doc) as stack:
        sdk = OpenAI(base_url=stack.gateway + "/v1", api_key="sk-sluicegate-demo", max_retries=0)
        listener_version = stack.status()["versions"][LISTENER_TYPE]
        drill = copy.deepcopy(doc)
        for route in drill["routes"]:
            if route["name"] == "qwen":
                route["fault"] = {"abort": {"percent": 100, "status": 503}}
        stack.write(drill)

        deadline = time.monotonic() + 10
        while True:
            try:
                sdk.chat.completions.create(model="qwen-plus", messages=HELLO, extra_headers=QUICK)
            except APIStatusError as err:
                assert err.status_code == 503
                body: Any = err.body
                assert body["code"] == "fault_injected", body
                break
            assert time.monotonic() < deadline, "the drill never took effect"
            time.sleep(0.05)
        # Other routes are untouched, and the Listener was not replaced (no connection drain).
        reply = sdk.chat.completions.create(
            model="deepseek-chat", messages=HELLO, extra_headers=QUICK
        )
        assert reply.choices
        assert stack.status()["versions"][LISTENER_TYPE] == listener_version

        stack.write(doc)  # drill over
        deadline = time.monotonic() + 10
        while True:
            try:
                sdk.chat.completions.create(model="qwen-plus", messages=HELLO, extra_headers=QUICK)
                break
            except APIStatusError:
                assert time.monotonic() < deadline, "the drill did not end"
                time.sleep(0.05)
