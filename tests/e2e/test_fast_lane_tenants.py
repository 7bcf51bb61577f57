"""Tenants in the fast lane (docs/fast-lane.md): `sluicegate up` on the quickstart with
`admission.lane: fast`, requests through a real Envoy.

Envoy checks the client key itself (keys from secret files), names the tenant, refuses
a model the tenant may not use, and counts each limited tenant's requests and tokens in
its own token buckets; no request opens a stream to the routing stage, and every answer
is OpenAI's JSON.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate import wire
from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Answer, Stack, keyed_tenant, post_chat, running_stack

pytestmark = pytest.mark.e2e

REQUESTS = "sluicegate_requests_total"
MODEL = "qwen-plus"  # served by alpha alone
OTHER_MODEL = "deepseek-chat"
KEYS = {
    "open": "sk-sg-e2e-open-000000000000000000000",
    "tight": "sk-sg-e2e-tight-00000000000000000000",
    "tokens": "sk-sg-e2e-tokens-0000000000000000000",
    "intern": "sk-sg-e2e-intern-0000000000000000000",
    "steady": "sk-sg-e2e-steady-0000000000000000000",
    "late": "sk-sg-e2e-late-000000000000000000000",
}
TIGHT_REQUESTS = 3
# A model with a per-model limit of its route's (no other test here asks for it).
MINI, MINI_REQUESTS = "gpt-4o-mini", 2
TOKENS_LIMIT = 100


def _tenant(tmp: Path, name: str, **extra: Any) -> dict[str, Any]:
    return keyed_tenant(tmp, name, KEYS[name], **extra)


def fast_lane_tenants(tmp: Path) -> dict[str, Any]:
    """The quickstart without gates, `lane: fast`, and four tenants: one unlimited, one
    with a requests limit, one with a tokens limit, one limited to one model. Alpha
    takes no key of its own, so the mock shows whether a client's key reached it."""
    doc = quickstart_on_free_ports(tmp)
    for route in doc["routes"]:
        route.pop("concurrency", None)
        if MINI in route["models"]:
            route["rate_limits"] = {"requests": MINI_REQUESTS, "per": "1h"}
    for provider in doc["providers"]:
        if provider["name"] == "alpha":
            provider.pop("api_key")
    doc["admission"]["lane"] = "fast"
    doc["tenants"] = [
        _tenant(tmp, "open"),
        _tenant(tmp, "tight", rate_limits={"requests": TIGHT_REQUESTS, "per": "1m"}),
        _tenant(tmp, "tokens", rate_limits={"tokens": TOKENS_LIMIT, "per": "1m"}),
        _tenant(tmp, "intern", models=[MODEL]),
        # Two requests an hour: its bucket refills long after this module ends.
        _tenant(tmp, "steady", rate_limits={"requests": 2, "per": "1h"}),
    ]
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("fast_lane_tenants")
    with running_stack(tmp_path, fast_lane_tenants(tmp_path)) as running:
        yield running


def _post(stack: Stack, body: dict[str, Any], **headers: str) -> Answer:
    return post_chat(stack, body, headers)


def _chat(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def _bearer(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def test_a_tenant_key_is_checked_by_envoy_alone_and_goes_no_further(stack: Stack) -> None:
    for headers in (_bearer("open"), {"x-api-key": KEYS["open"]}):
        answer = _post(stack, _chat(), **headers)
        assert answer.status == 200, answer.text
    assert stack.routing_stage_streams() == 0
    last = stack.last_request_to("alpha")
    assert not last["authorization_present"]
    assert wire.CLIENT_HEADER not in last["headers"]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"authorization": "Bearer sk-sg-wrong"}, "invalid_api_key"),
        # The client header is the gateway's: a client cannot name itself with it.
        ({wire.CLIENT_HEADER: "open/open-key"}, "missing_api_key"),
    ],
)
def test_a_missing_or_unknown_key_is_a_401_in_openai_form(
    stack: Stack, headers: dict[str, str], code: str
) -> None:
    answer = _post(stack, _chat(), **headers)
    assert answer.status == 401
    assert answer.error["code"] == code
    assert answer.headers["www-authenticate"] == "Bearer"


def test_a_model_outside_the_tenants_list_is_a_403(stack: Stack) -> None:
    assert _post(stack, _chat(), **_bearer("intern")).status == 200
    answer = _post(stack, _chat(OTHER_MODEL), **_bearer("intern"))
    assert answer.status == 403
    assert answer.error["code"] == "model_not_allowed"
    assert _post(stack, _chat(OTHER_MODEL), **_bearer("open")).status == 200


def test_a_client_may_ask_for_its_tenants_class_or_a_lower_one(stack: Stack) -> None:
    """As the routing stage lets it (docs/admission.md): tenant open's class is the
    quickstart's default, standard; batch is below it, interactive above."""
    # Read as the routing stage reads it: the last comma-separated value, any case.
    asked = "interactive, Batch"
    lower = _post(stack, _chat(), **_bearer("open"), **{wire.PRIORITY_HEADER: asked})
    assert lower.status == 200
    for asked in ("interactive", "nonsense"):
        refused = _post(stack, _chat(), **_bearer("open"), **{wire.PRIORITY_HEADER: asked})
        assert refused.status == 400, refused.text
        assert (refused.error["code"], refused.error["param"]) == (
            "invalid_priority",
            wire.PRIORITY_HEADER,
        )

    def counted() -> tuple[float, float]:
        return (
            stack.metric_sum(REQUESTS, tenant="open", priority="batch", status_class="2xx"),
            stack.metric_sum(REQUESTS, tenant="open", error_code="invalid_priority"),
        )

    deadline = time.monotonic() + 15
    while counted() != (1, 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted() == (1, 2)


def test_a_requests_limit_refuses_at_its_count_and_only_its_tenant(stack: Stack) -> None:
    statuses = [_post(stack, _chat(), **_bearer("tight")).status for _ in range(TIGHT_REQUESTS)]
    assert statuses == [200] * TIGHT_REQUESTS
    refused = _post(stack, _chat(), **_bearer("tight"))
    assert refused.status == 429
    assert refused.error["code"] == "rate_limit_exceeded"
    assert "tight" in refused.error["message"]
    # 3 per minute refill one every 20 s.
    assert refused.headers["retry-after"] == "20"
    assert refused.headers[wire.REFUSAL_HEADER] == "rate_limit_exceeded"
    assert _post(stack, _chat(), **_bearer("open")).status == 200


def test_a_tokens_limit_charges_the_estimate(stack: Stack) -> None:
    """The prompt's estimate (a few tokens) plus the allowance: two requests allowed 40
    tokens out fit 100, a third does not; a request allowed 200 never fits."""
    small = _chat(max_tokens=40)
    assert [_post(stack, small, **_bearer("tokens")).status for _ in range(2)] == [200, 200]
    refused = _post(stack, small, **_bearer("tokens"))
    assert refused.status == 429, refused.text
    assert refused.error["code"] == "rate_limit_exceeded"


def test_the_records_name_the_tenant_and_the_refusals(stack: Stack) -> None:
    """/metrics counts the fast lane's answers under their tenant and error code."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        limited = stack.metric_sum(REQUESTS, tenant="tight", error_code="rate_limit_exceeded")
        missing = stack.metric_sum(REQUESTS, error_code="missing_api_key")
        forbidden = stack.metric_sum(REQUESTS, tenant="intern", error_code="model_not_allowed")
        if limited and missing and forbidden:
            break
        time.sleep(0.1)
    assert limited >= 1 and missing >= 1 and forbidden >= 1
    assert stack.metric_sum(REQUESTS, tenant="open") >= 2


def test_envoy_shows_no_client_key(stack: Stack) -> None:
    with urllib.request.urlopen(stack.admin + "/config_dump", timeout=5) as response:
        dump = response.read().decode()
    assert "api_key_auth" in dump
    assert not any(key in dump for key in KEYS.values())


def test_no_log_holds_a_client_key(stack: Stack) -> None:
    """`up`'s output and every log in its work directory (Envoy's, the mocks')."""
    work = stack.config_path.parent / "work"
    logs = [stack.log(), *(path.read_text(errors="replace") for path in work.glob("*.log"))]
    assert len(logs) > 1
    assert not any(key in log for key in KEYS.values() for log in logs)


def test_a_routes_per_model_limit_counts_every_tenant(stack: Stack) -> None:
    """The route's limit on a model is Envoy's buckets too; a request the reader refused
    (a model the tenant may not use) is not counted. (Before the reloads below.)"""
    asked = [("open", 200), ("intern", 403), ("open", 200), ("open", 429)]
    for tenant, status in asked:
        answer = _post(stack, _chat(MINI), **_bearer(tenant))
        assert answer.status == status, (tenant, answer.text)
    assert answer.error["code"] == "rate_limit_exceeded"
    assert _post(stack, _chat(), **_bearer("open")).status == 200  # another model


def _ecds_dump(stack: Stack) -> str:
    with urllib.request.urlopen(stack.admin + "/config_dump", timeout=5) as response:
        return response.read().decode()


def _wait_for(stack: Stack, text: str) -> None:
    """Until Envoy's config_dump shows `text` (a reload reached Envoy)."""
    deadline = time.monotonic() + 30
    while text not in _ecds_dump(stack):
        assert time.monotonic() < deadline, f"{text!r} never reached Envoy"
        time.sleep(0.2)


def test_changing_adding_or_removing_a_tenant_leaves_the_others_buckets_alone(
    stack: Stack,
) -> None:
    """Each tenant's buckets are their own limiter slot's (ECDS, model/limit_slots.py): a
    reload that changes, adds or removes another tenant pushes only that tenant's slot,
    and the listener, whose update would refill every bucket, stays as it is."""
    assert [_post(stack, _chat(), **_bearer("steady")).status for _ in range(3)] == [200, 200, 429]
    listener_updates = _listener_updates(stack)
    doc = stack.doc
    (tokens,) = [t for t in doc["tenants"] if t["name"] == "tokens"]
    tokens["rate_limits"] = {"tokens": 4321, "per": "1m"}
    stack.write(doc)
    _wait_for(stack, '"max_tokens": 4321')
    assert _post(stack, _chat(), **_bearer("steady")).status == 429
    doc["tenants"].append(
        _tenant(stack.config_path.parent, "late", rate_limits={"requests": 1, "per": "1h"})
    )
    stack.write(doc)
    _wait_for(stack, "sluicegate_limits_late")
    assert [_post(stack, _chat(), **_bearer("late")).status for _ in range(2)] == [200, 429]
    assert _post(stack, _chat(), **_bearer("steady")).status == 429
    doc["tenants"] = [t for t in doc["tenants"] if t["name"] != "tokens"]
    stack.write(doc)
    _wait_until_gone(stack, '"max_tokens": 4321')
    assert _post(stack, _chat(), **_bearer("steady")).status == 429
    assert _listener_updates(stack) == listener_updates


def _listener_updates(stack: Stack) -> int:
    stats = stack.admin_json("/stats?format=json&filter=lds.update_success")["stats"]
    (value,) = [s["value"] for s in stats if s["name"] == "listener_manager.lds.update_success"]
    return int(value)


def _wait_until_gone(stack: Stack, text: str) -> None:
    deadline = time.monotonic() + 30
    while text in _ecds_dump(stack):
        assert time.monotonic() < deadline, f"{text!r} never left Envoy"
        time.sleep(0.2)
