"""The auto lane (docs/fast-lane.md, "The auto lane"): `sluicegate up` on the quickstart,
its demo tenant `auto`, through a real Envoy.

The tenant starts in the fast lane (no routing-stage stream). A client pushing three times
its limit is moved by the control plane into the exact lane, whose windows already count
what the fast lane admitted (the ext_proc servers charge them from the records), so no
window of the limit's length admits more than 1.1 times the limit; the move is a push of
the key check alone (no listener update, so no bucket refilled) and drops no request.
Once the client stops and the window empties, the tenant is moved back.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import DEMO_KEY, Stack, quickstart_with_envoy_keys, running_stack

pytestmark = pytest.mark.e2e

MODEL = "qwen-plus"
LIMIT = 30  # requests
WINDOW_S = 10
RATE = 3 * LIMIT / WINDOW_S  # three times the limit
PUSH_S = 14  # longer than a window, so some window lies wholly in the exact lane
LDS_UPDATES = "listener_manager.lds.update_success"


def auto_lane(tmp: Path) -> dict[str, Any]:
    doc = quickstart_with_envoy_keys(tmp)
    (demo,) = doc["tenants"]
    demo["rate_limits"] = {"requests": LIMIT, "per": f"{WINDOW_S}s"}
    demo["lane"] = "auto"
    doc.setdefault("admission", {})["auto_lane"] = {"hold": "2s"}
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("auto_lane")
    with running_stack(tmp_path, auto_lane(tmp_path)) as running:
        yield running


@dataclass(frozen=True)
class Answer:
    sent_s: float  # since the push began
    status: int
    code: str | None  # the OpenAI error code of a refusal


def _post(stack: Stack, started: float) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {DEMO_KEY}"},
    )
    sent = time.monotonic() - started
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            json.loads(response.read())
            return Answer(sent, response.status, None)
    except urllib.error.HTTPError as err:
        return Answer(sent, err.code, json.loads(err.read())["error"]["code"])


def _lds_updates(stack: Stack) -> int:
    stats = stack.admin_json(f"/stats?format=json&filter={LDS_UPDATES}")["stats"]
    return int(next(s["value"] for s in stats if s["name"] == LDS_UPDATES))


def _lane(stack: Stack) -> str:
    return str(stack.status()["lanes"]["demo"]["lane"])


def _wait_lane(stack: Stack, lane: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _lane(stack) != lane and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lane(stack) == lane


def _push(stack: Stack) -> list[Answer]:
    """RATE requests a second for PUSH_S, each sent on time whatever the answers take."""
    started = time.monotonic()
    futures = []
    with ThreadPoolExecutor(max_workers=16) as pool:
        for n in range(int(RATE * PUSH_S)):
            time.sleep(max(0.0, started + n / RATE - time.monotonic()))
            futures.append(pool.submit(_post, stack, started))
    return [future.result() for future in futures]


def test_a_tenant_pushing_three_times_its_limit_moves_to_the_exact_lane_and_back(
    stack: Stack,
) -> None:
    assert _lane(stack) == "fast"
    listeners = _lds_updates(stack)
    streams = stack.routing_stage_streams()

    answers = _push(stack)

    # No request dropped: each was answered, admitted or refused in OpenAI's words.
    assert {a.status for a in answers} <= {200, 429}
    assert {a.code for a in answers if a.status == 429} == {"rate_limit_exceeded"}
    # Moved: the routing stage decided requests, and the status says so.
    assert _lane(stack) == "exact"
    assert stack.routing_stage_streams() > streams
    # The move pushed the key check alone: no listener update, so no bucket refilled.
    assert _lds_updates(stack) == listeners
    # No window of the limit's length admitted more than 1.1 times the limit.
    admitted = sorted(a.sent_s for a in answers if a.status == 200)
    most = max(sum(1 for t in admitted if start <= t < start + WINDOW_S) for start in admitted)
    assert LIMIT <= most <= 1.1 * LIMIT, (most, len(admitted))

    # Quiet for a window (and the hold): back in the fast lane, no routing stage.
    _wait_lane(stack, "fast", timeout_s=WINDOW_S + 15)
    streams = stack.routing_stage_streams()
    assert _post(stack, time.monotonic()).status == 200
    assert stack.routing_stage_streams() == streams
    assert _lds_updates(stack) == listeners
