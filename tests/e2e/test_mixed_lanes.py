"""A lane per tenant (docs/fast-lane.md): `sluicegate up` on the quickstart, its demo
tenant in the exact lane and a second tenant in the fast lane, through a real Envoy.

Envoy checks both tenants' keys. The fast tenant's requests open no stream to the
routing stage and meet Envoy's token buckets; the exact tenant's go through the routing
stage, which trusts the client Envoy named (the key is gone by then) and limits it with
its sliding windows and OpenAI's x-ratelimit-* headers.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate import wire
from sluicegate.config import hash_key
from tests.e2e.stack import DEMO_KEY, Stack, quickstart_with_envoy_keys, running_stack

pytestmark = pytest.mark.e2e

REQUESTS = "sluicegate_requests_total"
MODEL = "qwen-plus"
QUICK_KEY = "sk-sg-e2e-quick-00000000000000000000"


def mixed_lanes(tmp: Path) -> dict[str, Any]:
    doc = quickstart_with_envoy_keys(tmp)
    (demo,) = doc["tenants"]
    demo["lane"] = "exact"  # the quickstart's is auto
    demo["rate_limits"] = {"requests": 3, "per": "1h"}
    (tmp / "keys" / "quick.client").write_text(QUICK_KEY)
    doc["tenants"].append(
        {
            "name": "quick",
            "lane": "fast",
            "rate_limits": {"requests": 2, "per": "1h"},
            "keys": [
                {
                    "name": "quick-key",
                    "hash": hash_key(QUICK_KEY),
                    "secret": {"file": "keys/quick.client"},
                }
            ],
        }
    )
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("mixed_lanes")
    with running_stack(tmp_path, mixed_lanes(tmp_path)) as running:
        yield running


def _post(stack: Stack, key: str | None) -> tuple[int, Any, dict[str, Any]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def _get_models(stack: Stack, key: str) -> int:
    request = urllib.request.Request(
        stack.gateway + "/v1/models", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return response.status


def test_the_fast_tenant_skips_the_routing_stage_and_the_exact_one_takes_it(
    stack: Stack,
) -> None:
    before = stack.routing_stage_streams()
    status, _, _ = _post(stack, QUICK_KEY)
    assert status == 200
    assert stack.routing_stage_streams() == before
    status, headers, _ = _post(stack, DEMO_KEY)
    assert status == 200
    assert stack.routing_stage_streams() == before + 1
    # The routing stage admitted it by the client Envoy named, under its own limits.
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert wire.CLIENT_HEADER not in stack.last_request_to("alpha")["headers"]


def test_each_lane_enforces_its_own_tenants_limits(stack: Stack) -> None:
    # The first test spent one request of each tenant's.
    assert _post(stack, QUICK_KEY)[0] == 200
    status, headers, body = _post(stack, QUICK_KEY)
    assert (status, body["error"]["code"]) == (429, "rate_limit_exceeded")
    assert headers["x-sluicegate-refusal"] == "rate_limit_exceeded"
    assert [_post(stack, DEMO_KEY)[0] for _ in range(2)] == [200, 200]
    status, headers, body = _post(stack, DEMO_KEY)
    assert (status, body["error"]["code"]) == (429, "rate_limit_exceeded")
    assert headers["x-ratelimit-remaining-requests"] == "0"  # the routing stage's answer


def test_keys_are_checked_for_both_lanes_and_listings_answer_both(stack: Stack) -> None:
    status, _, body = _post(stack, None)
    assert (status, body["error"]["code"]) == (401, "missing_api_key")
    assert _post(stack, "sk-sg-nobody")[2]["error"]["code"] == "invalid_api_key"
    assert _get_models(stack, DEMO_KEY) == 200
    assert _get_models(stack, QUICK_KEY) == 200


def test_the_records_name_both_tenants(stack: Stack) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        demo = stack.metric_sum(REQUESTS, tenant="demo")
        quick = stack.metric_sum(REQUESTS, tenant="quick")
        if demo >= 4 and quick >= 3:
            break
        time.sleep(0.1)
    assert demo >= 4 and quick >= 3


def test_a_path_outside_the_gateway_is_envoys_404_for_every_client(stack: Stack) -> None:
    """The route for paths outside /v1/ disables the routing stage per route: it still
    does now that, beside a fast lane, Envoy's composite filter makes that stage's filter
    (listeners.py): no client's request there opens a routing-stage stream."""
    before = stack.routing_stage_streams()
    for key, status, code in ((DEMO_KEY, 404, "unknown_url"), (QUICK_KEY, 404, "unknown_url"),
                              (None, 401, "missing_api_key")):  # fmt: skip
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        request = urllib.request.Request(stack.gateway + "/elsewhere", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=20)
        error = json.loads(raised.value.read())["error"]
        assert (raised.value.code, error["code"]) == (status, code), error
    assert stack.routing_stage_streams() == before
