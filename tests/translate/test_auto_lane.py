"""The auto lane's translation (docs/fast-lane.md, "The auto lane"): an `auto` tenant has
both lanes' filters (a limiter slot, the routing stage, the lane log), so moving it is the
key check's configuration alone, and Envoy refills no bucket and updates no listener."""

from __future__ import annotations

from envoy.config.core.v3 import extension_pb2
from envoy.extensions.filters.http.api_key_auth.v3 import api_key_auth_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from google.protobuf.message import Message

from sluicegate.config import hash_key, load_config_text, validate_text
from sluicegate.model import build_model
from sluicegate.xds.resource import EXTENSION_CONFIG
from sluicegate.xds.translate import translate
from sluicegate.xds.translate.client_keys import CLIENT_KEYS_FILTER
from sluicegate.xds.translate.tenant_limits import limits_filter_name

from .cases import CASES, case_path, model_of


def _extensions(
    resources: dict[str, list[Message]],
) -> dict[str, extension_pb2.TypedExtensionConfig]:
    found = {}
    for resource in resources[EXTENSION_CONFIG]:
        assert isinstance(resource, extension_pb2.TypedExtensionConfig)
        found[resource.name] = resource
    return found


def _clients(resources: dict[str, list[Message]]) -> list[str]:
    config = api_key_auth_pb2.ApiKeyAuth()
    _extensions(resources)[CLIENT_KEYS_FILTER].typed_config.Unpack(config)
    return [credential.client for credential in config.credentials]


def test_an_auto_tenant_starts_fast_and_keeps_its_slot_in_either_lane() -> None:
    gateway = model_of("auto_lane")
    (acme,) = gateway.tenants
    assert (acme.auto, acme.lane) == (True, "fast")
    exact = gateway.with_lanes({"acme": "exact"})
    assert exact.tenants[0].lane == "exact"
    assert exact.limit_slots == gateway.limit_slots
    assert gateway.with_lanes({"acme": "fast", "nobody": "exact"}) is gateway


def test_a_move_changes_the_key_check_alone() -> None:
    gateway = model_of("auto_lane")
    before = translate(gateway)
    after = translate(gateway.with_lanes({"acme": "exact"}))
    changed = [
        type_url
        for type_url in before
        if [r.SerializeToString(deterministic=True) for r in before[type_url]]
        != [r.SerializeToString(deterministic=True) for r in after[type_url]]
    ]
    assert changed == [EXTENSION_CONFIG]
    old, new = _extensions(before), _extensions(after)
    assert [name for name in old if old[name] != new[name]] == [CLIENT_KEYS_FILTER]
    assert (_clients(before), _clients(after)) == (["fast/acme/acme-ci"], ["exact/acme/acme-ci"])


def test_an_auto_tenant_s_buckets_hold_its_limit_less_fast_below() -> None:
    """It comes back to the fast lane with up to fast_below of a window used: a bucket of
    the whole limit could then admit 1.25 times the limit in one window. The refill rate
    stays the limit's."""
    gateway = model_of("auto_lane")
    slot = gateway.limit_slots.of["acme"]
    limiter = local_rate_limit_pb2.LocalRateLimit()
    _extensions(translate(gateway))[limits_filter_name(slot)].typed_config.Unpack(limiter)
    buckets = {d.entries[0].value: d.token_bucket for d in limiter.descriptors}
    # requests: 90 a minute, tokens: 100,000 a minute; fast_below 0.25 (the default).
    assert {kind: b.max_tokens for kind, b in buckets.items()} == {
        "requests": 67,
        "tokens": 75000,
    }
    requests = buckets["requests"]
    fill_ns = requests.fill_interval.seconds * 10**9 + requests.fill_interval.nanos
    assert round(requests.tokens_per_fill.value * 60 * 10**9 / fill_ns) == 90


def test_models_under_what_only_the_routing_stage_enforces_are_held() -> None:
    """Route.held_in_exact_lane: a gate (the route's or its sole provider's), a route's or
    its sole provider's limits; the model reader gets the held models alone."""
    gateway = model_of("auto_lane_held_models")
    assert gateway.held_models == {"gpt-4o": "route gated's concurrency gate"}
    assert model_of("auto_lane").held_models == {}
    text = CASES["auto_lane_held_models"][0]
    for edit, why in (
        ("    concurrency: {max_requests: 4, headroom: 0.25}\n",
         "route gated's concurrency gate"),
        ("    rate_limits: {requests: 10, per: 1m}\n", "route gated's rate limits"),
    ):  # fmt: skip
        edited = text.replace("    concurrency: {max_requests: 4, headroom: 0.25}\n", edit)
        assert _held(edited) == {"gpt-4o": why}
    provider = text.replace("    concurrency: {max_requests: 4, headroom: 0.25}\n", "").replace(
        "    base_url: http://127.0.0.1:8001/v1\n",
        "    base_url: http://127.0.0.1:8001/v1\n    rate_limits: {tokens: 1000, per: 1m}\n",
    )
    # The provider is both routes' sole one: both models are held.
    assert _held(provider) == {
        "gpt-4o": "provider local's rate limits",
        "gpt-4o-mini": "provider local's rate limits",
    }


def test_a_gate_both_lanes_reach_is_refused_at_the_gate() -> None:
    quick = (
        "  - name: quick\n"
        "    lane: fast\n"
        "    keys:\n"
        f'      - {{name: quick-ci, hash: "{hash_key("sk-sg-quick-0000000000000000")}", '
        "secret: {file: keys/acme-ci.key}}\n"
    )
    text = CASES["auto_lane_held_models"][0] + quick
    problems = validate_text(text, str(case_path("auto_lane_held_models")), check_secrets=False)
    (problem,) = [p for p in problems if p.severity == "error"]
    assert problem.key_path == "routes[1].concurrency"
    assert "reached by fast-lane requests and by exact-lane ones" in problem.message
    # Kept from the gated model, the fast tenant leaves the gate to the routing stage.
    kept = text + "    models: [gpt-4o-mini]\n"
    problems = validate_text(kept, str(case_path("auto_lane_held_models")), check_secrets=False)
    assert [p for p in problems if p.severity == "error"] == []
    assert _held(kept) == {"gpt-4o": "route gated's concurrency gate"}


def _held(text: str) -> dict[str, str]:
    config = load_config_text(text, str(case_path("auto_lane_held_models")))
    return dict(build_model(config, {}).held_models)
