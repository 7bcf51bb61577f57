"""Envoy ends the ext_proc streams of a request gracefully (half-close, then the server's
status), not by a reset: grpcio's aio server keeps native memory for every stream a
client resets (grpc/grpc#43360), so resets made the ext_proc servers grow without bound
(RESULTS.md, "Memory soak"; envoy/bootstrap.py, `_static_runtime`).

Not covered: the usage observer's streams (a streamed answer's). Envoy runs that filter
in observability mode, which never half-closes: it resets the stream when its deferred
close times out, or after the server ended the call (service.py ends it as soon as the
response is read, so it is not held open for 5 s); moving stream usage off the observer
removes those."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from sluicegate.envoy import flatten_stats
from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import running_stack

pytestmark = pytest.mark.e2e

HEADERS = {"authorization": "Bearer sk-sluicegate-demo", "content-type": "application/json"}


def chat(gateway: str, stream: bool) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
            "stream": stream}  # fmt: skip
    request = urllib.request.Request(
        gateway + "/v1/chat/completions", data=json.dumps(body).encode(), headers=HEADERS
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def test_no_ext_proc_stream_is_reset(tmp_path: Path) -> None:
    with running_stack(tmp_path, quickstart_on_free_ports(tmp_path)) as stack:
        before = flatten_stats(stack.admin_json("/stats?format=json"))
        for _ in range(20):
            chat(stack.gateway, stream=False)
        after = flatten_stats(stack.admin_json("/stats?format=json"))

    def grew(name: str) -> int:
        return int(after.get(name, 0)) - int(before.get(name, 0))

    # The routing stage: one stream per request, each ended without a reset (20 before).
    assert grew("cluster.sluicegate_ext_proc.upstream_rq_completed") >= 20
    assert grew("cluster.sluicegate_ext_proc.upstream_rq_tx_reset") == 0
    # The side cluster: the attempt stage's 20 streams (20 resets before) and the record
    # exports; now and then one export is reset by the server (rx_reset) and counted
    # here too, so the bound is not 0.
    assert grew("cluster.sluicegate_ext_proc_side.upstream_rq_completed") >= 20
    assert grew("cluster.sluicegate_ext_proc_side.upstream_rq_tx_reset") <= 2
