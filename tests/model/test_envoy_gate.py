"""Which gate Envoy enforces, and its two partitions (model.EnvoyGate; docs/fast-lane.md,
"Gates in the fast lane"): a route's gate only fast-lane requests reach is Envoy's,
split between the top class (Envoy's HIGH priority, the headroom's share) and the rest."""

from __future__ import annotations

from sluicegate.config import hash_key, load_config_text, validate_text
from sluicegate.model import EnvoyGate, build_model

GATED = """\
version: 1
listeners:
  - {name: main, port: 8080}
providers:
  - name: local
    base_url: http://127.0.0.1:8001/v1
routes:
  - name: local
    models: [llama]
    backends: [{provider: local}]
    concurrency: {max_requests: 8, headroom: 0.25}
  - name: chat
    models: [mini]
    backends: [{provider: local}]
admission:
  lane: fast
"""


def _tenant(name: str, extra: str = "") -> str:
    key = hash_key(f"sk-sg-{name}-00000000000000000000")
    return (
        f"  - name: {name}\n{extra}    keys:\n"
        f'      - {{name: {name}-key, hash: "{key}", secret: {{env: KEY_{name.upper()}}}}}\n'
    )


def _gate(text: str) -> EnvoyGate | None:
    gateway = build_model(load_config_text(text, "gate.yaml"), {})
    (route,) = [route for route in gateway.routes if route.name == "local"]
    return route.envoy_gate


def test_a_top_class_tenant_gets_the_headroom_at_high_priority() -> None:
    text = GATED + "tenants:\n" + _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    # 8 * (1 - 0.25) = 6 for the lower classes (queues 128 + 256), 2 for interactive (64).
    assert _gate(text) == EnvoyGate(
        requests=6, queue=384, top_class="interactive", top_requests=2, top_queue=64
    )
    bounded = text.replace("  lane: fast\n", "  lane: fast\n  max_queued: 100\n")
    gate = _gate(bounded)
    assert gate == EnvoyGate(
        requests=6, queue=100, top_class="interactive", top_requests=2, top_queue=64
    )
    # Envoy's pending limits: a request waiting for its connection to open is pending.
    assert (gate.pending, gate.top_pending) == (106, 66)


def test_without_a_top_class_tenant_the_whole_gate_is_one_partition() -> None:
    # No tenant may ask for interactive: nobody would use a HIGH share.
    assert _gate(GATED + "tenants:\n" + _tenant("bulk")) == EnvoyGate(requests=8, queue=448)
    # Without tenants nobody has a class at all.
    assert _gate(GATED) == EnvoyGate(requests=8, queue=448)
    # A headroom that rounds to no slot leaves one partition too.
    small = GATED.replace("{max_requests: 8, headroom: 0.25}", "{max_requests: 1, headroom: 0.5}")
    vip = _tenant("vip", "    priority: interactive\n")
    assert _gate(small + "tenants:\n" + vip) == EnvoyGate(requests=1, queue=448)


def test_a_gate_the_exact_lane_reaches_stays_the_routing_stage_s() -> None:
    exact = GATED.replace("  lane: fast\n", "  lane: exact\n")
    assert _gate(exact) is None
    gateway = build_model(load_config_text(exact, "gate.yaml"), {})
    assert [gate.name for route in gateway.routes for gate in route.gates] == ["route:local"]
    # A fast tenant kept from the gated model leaves it to the exact tenant's lane.
    mixed = exact + "tenants:\n" + _tenant("quick", "    lane: fast\n    models: [mini]\n")
    mixed += _tenant("slow")
    assert _gate(mixed) is None


def test_envoy_s_gate_is_no_routing_stage_gate_and_holds_no_model() -> None:
    text = GATED + "tenants:\n" + _tenant("vip", "    priority: interactive\n")
    gateway = build_model(load_config_text(text, "gate.yaml"), {})
    assert [gate for route in gateway.routes for gate in route.gates] == []
    assert dict(gateway.held_models) == {}


def test_envoy_s_gate_counts_no_tokens() -> None:
    text = GATED.replace("{max_requests: 8, headroom: 0.25}", "{max_requests: 8, max_tokens: 9000}")
    errors = [p for p in validate_text(text, "gate.yaml", check_secrets=False) if p.is_error]
    (problem,) = errors
    assert problem.key_path == "routes[0].concurrency.max_tokens"
    assert problem.line == 11
    assert "counts requests in flight, not tokens" in problem.message


def test_no_replica_share_warning_for_envoy_s_gate() -> None:
    text = GATED.replace("{max_requests: 8,", "{max_requests: 7,") + (
        "sluicegate: {ext_proc_replicas: [127.0.0.1:18101]}\n"
    )
    problems = validate_text(text, "gate.yaml", check_secrets=False)
    assert not [p for p in problems if "replicas" in p.message], problems
    exact = text.replace("  lane: fast\n", "  lane: exact\n")
    problems = validate_text(exact, "gate.yaml", check_secrets=False)
    assert [p for p in problems if "replicas each allow" in p.message]
