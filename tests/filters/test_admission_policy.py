"""The admission policy resolved from YAML: tenants, limits, gates, classes, store."""

from __future__ import annotations

import pytest

from sluicegate.filters.admission import (
    AdmissionPolicy,
    ClientIdentity,
    StoreSettings,
    admission_policy,
)
from sluicegate.filters.limiter import Limit
from sluicegate.filters.queueing import ClassPolicy, GatePolicy
from sluicegate.model import gate_name

from .admission_helpers import HEAD, hashed, model_of

FULL = (
    (
        HEAD
        + """\
  - name: gamma
    base_url: http://127.0.0.1:18083/v1
    concurrency: {max_requests: 2, headroom: 0}
    rate_limits: {requests: 30, per: 1m}
  - name: delta
    base_url: http://127.0.0.1:18084/v1
    concurrency: {max_tokens: 5000}
    rate_limits: {tokens: 7000, output_tokens: 3000, per: 10s}
admission:
  priority_classes:
    - {name: interactive, max_queue: 8, max_wait: 2s}
    - {name: standard, max_queue: 16, max_wait: 30s}
    - {name: bulk, max_queue: 5, max_wait: 0}
  default_priority: standard
  max_queued: 20
  default_max_tokens: 256
  max_output_tokens: 4096
  store:
    kind: redis
    url: redis://127.0.0.1:6379/3
    key_prefix: sg-test
    timeout: 50ms
    on_failure: fail_closed
    replicas: 3
routes:
  - name: chat
    models: [gpt-4o, llama]
    backends: [{provider: gamma}]
    rate_limits: {requests: 10, tokens: 1000, per: 1m}
    default_max_tokens: 512
    concurrency: {max_requests: 4, headroom: 0.5}
  - name: mixed
    models: [mix]
    backends: [{provider: gamma}, {provider: delta}]
    concurrency: {max_requests: 3}
  - name: mixed-open
    models: [mix-open]
    backends: [{provider: gamma}, {provider: delta}]
  - name: tokens-only
    models: [tok]
    backends: [{provider: delta}]
  - name: plain
    models: [plain]
    backends: [{provider: alpha}, {provider: beta}]
tenants:
  - name: demo
    priority: interactive
    models: [gpt-4o, plain]
    rate_limits: {requests: 60, tokens: 20000, input_tokens: 15000, per: 10s}
    keys:
      - name: demo-laptop
        hash: "{H1}"
        rate_limits: {output_tokens: 500, per: 1s}
      - name: demo-ci
        hash: "{H2}"
  - name: second
    keys:
      - name: other-key
        hash: "{H3}"
"""
    )
    .replace("{H1}", hashed("sk-demo-laptop"))
    .replace("{H2}", hashed("sk-demo-ci"))
    .replace("{H3}", hashed("sk-other"))
)

OPEN = (
    HEAD
    + """\
routes:
  - name: chat
    models: [m]
    backends: [{provider: alpha}]
"""
)


@pytest.fixture(scope="module")
def policy() -> AdmissionPolicy:
    return admission_policy(model_of(FULL))


def test_tenants_with_priority_models_and_limits(policy: AdmissionPolicy) -> None:
    assert set(policy.tenants) == {"demo", "second"}
    demo, other = policy.tenants["demo"], policy.tenants["second"]
    assert (demo.name, demo.priority) == ("demo", "interactive")
    assert demo.allowed_models == frozenset({"gpt-4o", "plain"})
    assert demo.limits == (
        Limit("tenant", "demo", "requests", 60, 10.0),
        Limit("tenant", "demo", "tokens", 20000, 10.0),
        Limit("tenant", "demo", "input_tokens", 15000, 10.0),
    )
    # No priority of its own: admission.default_priority. No models: every model.
    assert (other.priority, other.allowed_models, other.limits) == ("standard", None, ())


def test_default_priority_follows_admission_default() -> None:
    text = FULL.replace("default_priority: standard", "default_priority: bulk")
    policy = admission_policy(model_of(text))
    assert policy.default_priority == "bulk"
    assert policy.tenants["second"].priority == "bulk"
    assert policy.tenants["demo"].priority == "interactive"


def test_key_limits_only_for_keys_that_have_them(policy: AdmissionPolicy) -> None:
    assert dict(policy.key_limits) == {
        "demo-laptop": (Limit("key", "demo-laptop", "output_tokens", 500, 1.0),)
    }


def test_route_limits_are_one_set_per_model(policy: AdmissionPolicy) -> None:
    chat = policy.routes["chat"]
    assert set(chat.model_limits) == {"gpt-4o", "llama"}
    for model in ("gpt-4o", "llama"):
        assert chat.model_limits[model] == (
            Limit("model", model, "requests", 10, 60.0),
            Limit("model", model, "tokens", 1000, 60.0),
        )
    # Each model counts on its own counters.
    assert {limit.key for limit in chat.model_limits["gpt-4o"]}.isdisjoint(
        limit.key for limit in chat.model_limits["llama"]
    )
    assert dict(policy.routes["plain"].model_limits) == {}


def test_route_gate_then_provider_gate(policy: AdmissionPolicy) -> None:
    assert gate_name("route", "chat") == "route:chat"
    assert policy.routes["chat"].gates == ("route:chat", "provider:gamma")
    assert policy.routes["tokens-only"].gates == ("provider:delta",)
    assert policy.routes["plain"].gates == ()


def test_provider_gate_not_taken_by_a_route_mixing_providers(policy: AdmissionPolicy) -> None:
    assert policy.routes["mixed"].gates == ("route:mixed",)
    assert policy.routes["mixed-open"].gates == ()
    assert set(policy.gates) == {"provider:gamma", "provider:delta", "route:chat", "route:mixed"}


def test_gate_policies_carry_capacities_and_classes(policy: AdmissionPolicy) -> None:
    classes = (
        ClassPolicy("interactive", 8, 2.0),
        ClassPolicy("standard", 16, 30.0),
        ClassPolicy("bulk", 0, 0.001),  # max_wait 0: never queues
    )
    # store.replicas is 3: each replica enforces its share of every capacity.
    assert policy.gates["route:chat"] == GatePolicy(
        classes=classes, max_requests=1, max_tokens=None, headroom=0.5, max_queued=20
    )  # 4 // 3
    assert policy.gates["provider:gamma"] == GatePolicy(
        classes=classes, max_requests=1, max_tokens=None, headroom=0.0, max_queued=20
    )  # 2 // 3, at least 1
    assert policy.gates["provider:delta"] == GatePolicy(
        classes=classes, max_requests=None, max_tokens=1666, headroom=0.25, max_queued=20
    )  # 5000 // 3


def test_limits_for_combines_tenant_key_model_and_provider(policy: AdmissionPolicy) -> None:
    demo = policy.tenants["demo"].limits
    laptop = policy.key_limits["demo-laptop"]
    model = policy.routes["chat"].model_limits["gpt-4o"]
    gamma = policy.routes["chat"].provider_limits
    assert gamma
    laptop_id = ClientIdentity("demo", "demo-laptop")
    assert policy.limits_for(laptop_id, "chat", "gpt-4o") == demo + laptop + model + gamma
    ci = ClientIdentity("demo", "demo-ci")
    assert policy.limits_for(ci, "chat", "gpt-4o") == demo + model + gamma
    assert policy.limits_for(ClientIdentity("second", "other-key"), "chat", "llama") == (
        policy.routes["chat"].model_limits["llama"] + gamma
    )
    assert policy.limits_for(None, "chat", "gpt-4o") == model + gamma
    assert policy.limits_for(laptop_id, "plain", "plain") == demo + laptop
    assert policy.limits_for(laptop_id, "no-such-route", "gpt-4o") == demo + laptop
    assert policy.limits_for(None, "plain", "plain") == ()
    # An identity of a tenant a reload removed keeps no tenant limits.
    assert policy.limits_for(ClientIdentity("gone", "gone-key"), "plain", "plain") == ()


def test_provider_limits_only_on_routes_that_send_to_it_alone(policy: AdmissionPolicy) -> None:
    assert policy.routes["chat"].provider_limits == (
        Limit("provider", "gamma", "requests", 30, 60.0),
    )
    assert policy.routes["tokens-only"].provider_limits == (
        Limit("provider", "delta", "tokens", 7000, 10.0),
        Limit("provider", "delta", "output_tokens", 3000, 10.0),
    )
    for mixed in ("mixed", "mixed-open", "plain"):
        assert policy.routes[mixed].provider_limits == ()
    assert policy.limits_for(None, "mixed", "mix") == ()


def test_limit_keys_of_one_request_never_collide(policy: AdmissionPolicy) -> None:
    limits = policy.limits_for(ClientIdentity("demo", "demo-laptop"), "chat", "gpt-4o")
    assert len({limit.key for limit in limits}) == len(limits)


def test_token_estimates_per_route(policy: AdmissionPolicy) -> None:
    assert policy.routes["chat"].default_max_tokens == 512
    assert policy.routes["plain"].default_max_tokens == 256
    assert (policy.default_max_tokens, policy.max_output_tokens) == (256, 4096)


def test_classes_and_class_rank(policy: AdmissionPolicy) -> None:
    assert policy.classes == ("interactive", "standard", "bulk")
    assert [policy.class_rank(name) for name in policy.classes] == [0, 1, 2]
    assert policy.class_rank("batch") is None
    assert policy.class_rank("") is None
    assert policy.class_rank("Interactive") is None


def test_store_settings_from_yaml(policy: AdmissionPolicy) -> None:
    assert policy.store == StoreSettings(
        kind="redis",
        url="redis://127.0.0.1:6379/3",
        key_prefix="sg-test",
        timeout_s=0.05,
        on_failure="fail_closed",
        replicas=3,
    )


def test_store_defaults() -> None:
    store = admission_policy(model_of(OPEN)).store
    assert store == StoreSettings()
    assert (store.kind, store.url, store.timeout_s, store.on_failure) == (
        "memory",
        None,
        0.1,
        "local",
    )


def test_replicas_count_at_least_the_ext_proc_servers_up_starts() -> None:
    """The local fallback divides by the replicas; those listed in the file are known."""
    listed = OPEN.replace(
        "version: 1\n",
        "version: 1\nsluicegate: {ext_proc_replicas: [127.0.0.1:18101, 127.0.0.1:18102]}\n",
    )
    assert admission_policy(model_of(listed)).store.replicas == 3
    more = listed + "admission: {store: {replicas: 5}}\n"
    assert admission_policy(model_of(more)).store.replicas == 5


def test_each_replica_takes_its_share_of_a_gate() -> None:
    """Gate capacities are totals: three replicas on a gate of 7 requests take 2 each."""
    text = OPEN.replace(
        "version: 1\n",
        "version: 1\nsluicegate: {ext_proc_replicas: [127.0.0.1:18101, 127.0.0.1:18102]}\n",
    ).replace(
        "    backends:", "    concurrency: {max_requests: 7, max_tokens: 30000}\n    backends:"
    )
    gate = admission_policy(model_of(text)).gates["route:chat"]
    assert (gate.max_requests, gate.max_tokens) == (2, 10000)
    tiny = text.replace("max_requests: 7", "max_requests: 2")
    assert admission_policy(model_of(tiny)).gates["route:chat"].max_requests == 1


def test_keyring_holds_every_key(policy: AdmissionPolicy) -> None:
    assert policy.keyring is not None and len(policy.keyring) == 3
    assert policy.keyring.identify("sk-demo-ci") == ClientIdentity("demo", "demo-ci")
    assert policy.keyring.identify("sk-other") == ClientIdentity("second", "other-key")
    assert policy.keyring.identify("sk-nobody") is None


def test_open_gateway_is_not_enabled() -> None:
    policy = admission_policy(model_of(OPEN))
    assert policy.keyring is None
    assert dict(policy.tenants) == {} and dict(policy.gates) == {}
    assert policy.routes["chat"].gates == ()
    assert not policy.enabled


def test_enabled_by_tenants_by_a_gate_or_by_a_limit(policy: AdmissionPolicy) -> None:
    assert policy.enabled
    gate = OPEN.replace("    backends:", "    concurrency: {max_requests: 1}\n    backends:")
    assert admission_policy(model_of(gate)).enabled
    limit = OPEN.replace("    backends:", "    rate_limits: {requests: 5}\n    backends:")
    assert admission_policy(model_of(limit)).enabled
    provider_gate = OPEN.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    concurrency: {max_requests: 1}\n",
    )
    gated = admission_policy(model_of(provider_gate))
    assert gated.routes["chat"].gates == ("provider:alpha",)
    assert gated.enabled
    provider_limit = OPEN.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    rate_limits: {requests: 1}\n",
    )
    limited = admission_policy(model_of(provider_limit))
    assert limited.routes["chat"].provider_limits
    tenant = OPEN + f"tenants:\n  - name: t\n    keys: [{{name: k, hash: '{hashed('sk-t')}'}}]\n"
    assert admission_policy(model_of(tenant)).enabled


def test_all_null_route_limits_do_not_enable_admission() -> None:
    text = OPEN.replace(
        "    backends:", "    rate_limits: {requests: null, tokens: null}\n    backends:"
    )
    policy = admission_policy(model_of(text))
    assert policy.limits_for(None, "chat", "m") == ()
    assert not policy.enabled


def test_provider_limits_alone_enable_admission() -> None:
    text = OPEN.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    rate_limits: {requests: 1}\n",
    )
    policy = admission_policy(model_of(text))
    assert policy.limits_for(None, "chat", "m") == (
        Limit("provider", "alpha", "requests", 1, 60.0),
    )
    assert policy.enabled
