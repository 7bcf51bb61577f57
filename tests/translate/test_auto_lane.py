"""The auto lane's translation (docs/fast-lane.md, "The auto lane"): an `auto` tenant has
both lanes' filters (a limiter slot, the routing stage, the lane log), so moving it is the
key check's configuration alone, and Envoy refills no bucket and updates no listener."""

from __future__ import annotations

from envoy.config.core.v3 import extension_pb2
from envoy.extensions.filters.http.api_key_auth.v3 import api_key_auth_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from google.protobuf.message import Message

from sluicegate.xds.resource import EXTENSION_CONFIG
from sluicegate.xds.translate import translate
from sluicegate.xds.translate.client_keys import CLIENT_KEYS_FILTER
from sluicegate.xds.translate.tenant_limits import limits_filter_name

from .cases import model_of


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
