"""The auto lane (docs/fast-lane.md, "The auto lane"): `sluicegate up` on the quickstart,
its demo tenant `auto`, through a real Envoy.

The tenant starts in the fast lane (no routing-stage stream). A client pushing three times
its limit is moved by the control plane into the exact lane, whose windows already count
what the fast lane admitted (the ext_proc servers charge them from the records), so no
window of the limit's length admits more than 1.1 times the limit; the move is a push of
the key check alone (no listener update, so no bucket refilled) and drops no request.
Once the client stops and the window empties, the tenant is moved back.

A second auto tenant's client pushes three times its limit in streams that each last
about 3 s: Envoy logs each while it runs (every 0.5 s), so the exact lane counts it long
before its end, and the excess stays within what arrives in that delay.
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

from sluicegate.config import hash_key
from sluicegate.wire import IN_FLIGHT_FLUSH_MS
from sluicegate.xds.translate.record_log import LOG_FLUSH_MS
from tests.e2e.stack import DEMO_KEY, Stack, quickstart_with_envoy_keys, running_stack

pytestmark = pytest.mark.e2e

MODEL = "qwen-plus"
LIMIT = 30  # requests
WINDOW_S = 10
RATE = 3 * LIMIT / WINDOW_S  # three times the limit
PUSH_S = 14  # longer than a window, so some window lies wholly in the exact lane
LDS_UPDATES = "listener_manager.lds.update_success"
LONG_KEY = "sk-sg-e2e-long-streams-000000000000"
# Streams of 30 events 100 ms apart: about 3 s each, about 27 in flight at once.
LONG_STREAM = {"x-mock-output-tokens": "30", "x-mock-itl-ms": "100"}


def auto_lane(tmp: Path) -> dict[str, Any]:
    doc = quickstart_with_envoy_keys(tmp)
    (demo,) = doc["tenants"]
    demo["rate_limits"] = {"requests": LIMIT, "per": f"{WINDOW_S}s"}
    demo["lane"] = "auto"
    doc.setdefault("admission", {})["auto_lane"] = {"hold": "2s"}
    (tmp / "keys" / "long.client").write_text(LONG_KEY)
    doc["tenants"].append(
        {
            "name": "long",
            "lane": "auto",
            "rate_limits": {"requests": LIMIT, "per": f"{WINDOW_S}s"},
            "keys": [
                {
                    "name": "long-key",
                    "hash": hash_key(LONG_KEY),
                    "secret": {"file": "keys/long.client"},
                }
            ],
        }
    )
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


def _post(stack: Stack, started: float, key: str = DEMO_KEY, *, stream: bool = False) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={**headers, **(LONG_STREAM if stream else {})},
    )
    sent = time.monotonic() - started
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            if stream:
                assert text.rstrip().endswith(b"data: [DONE]")  # the whole stream
            else:
                json.loads(text)
            return Answer(sent, response.status, None)
    except urllib.error.HTTPError as err:
        return Answer(sent, err.code, json.loads(err.read())["error"]["code"])


def _lds_updates(stack: Stack) -> int:
    stats = stack.admin_json(f"/stats?format=json&filter={LDS_UPDATES}")["stats"]
    return int(next(s["value"] for s in stats if s["name"] == LDS_UPDATES))


def _lane(stack: Stack, tenant: str = "demo") -> str:
    return str(stack.status()["lanes"][tenant]["lane"])


def _wait_lane(stack: Stack, lane: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _lane(stack) != lane and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lane(stack) == lane


def _push(stack: Stack, key: str = DEMO_KEY, *, stream: bool = False) -> list[Answer]:
    """RATE requests a second for PUSH_S, each sent on time whatever the answers take."""
    started = time.monotonic()
    futures = []
    with ThreadPoolExecutor(max_workers=48) as pool:
        for n in range(int(RATE * PUSH_S)):
            time.sleep(max(0.0, started + n / RATE - time.monotonic()))
            futures.append(pool.submit(_post, stack, started, key, stream=stream))
    return [future.result() for future in futures]


def _most_in_a_window(answers: list[Answer]) -> int:
    """The most requests admitted in any WINDOW_S, by when they were sent."""
    admitted = sorted(a.sent_s for a in answers if a.status == 200)
    return max(sum(1 for t in admitted if start <= t < start + WINDOW_S) for start in admitted)


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
    most = _most_in_a_window(answers)
    assert LIMIT <= most <= 1.1 * LIMIT, most

    # Quiet for a window (and the hold): back in the fast lane, no routing stage.
    _wait_lane(stack, "fast", timeout_s=WINDOW_S + 15)
    streams = stack.routing_stage_streams()
    assert _post(stack, time.monotonic()).status == 200
    assert stack.routing_stage_streams() == streams
    assert _lds_updates(stack) == listeners


def test_long_streams_are_counted_while_they_run(stack: Stack) -> None:
    """Without the records sent while a request runs, the exact lane would learn of each
    stream admitted in the fast lane about 3 s late, and admit about RATE * 3 more."""
    answers = _push(stack, LONG_KEY, stream=True)
    assert {a.status for a in answers} <= {200, 429}
    assert _lane(stack, "long") == "exact"
    # The bound (docs/fast-lane.md, "The auto lane"): the limit, plus what the fast lane
    # admitted in the time a running request takes to be counted.
    delay_s = (IN_FLIGHT_FLUSH_MS + LOG_FLUSH_MS) / 1000
    most = _most_in_a_window(answers)
    assert LIMIT <= most <= LIMIT + RATE * delay_s + 2, most
