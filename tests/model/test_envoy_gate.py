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


def _pooled(text: str, pool: str) -> str:
    """`text` with route local's `pool:` set to `pool` (a YAML flow mapping)."""
    line = "    concurrency: {max_requests: 8, headroom: 0.25}\n"
    return text.replace(line, f"{line}    pool: {pool}\n")


def _gate(text: str) -> EnvoyGate | None:
    gateway = build_model(load_config_text(text, "gate.yaml"), {})
    (route,) = [route for route in gateway.routes if route.name == "local"]
    return route.envoy_gate


def test_a_top_class_tenant_gets_the_headroom_at_high_priority() -> None:
    text = GATED + "tenants:\n" + _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    # 8 * (1 - 0.25) = 6 for the lower classes, 2 for interactive; each waits its classes'
    # queues (128 + 256; 64) plus its share in flight (Envoy counts a request waiting for
    # its connection to open as pending).
    assert _gate(text) == EnvoyGate(
        requests=6, pending=390, top_class="interactive", top_requests=2, top_pending=66
    )
    bounded = text.replace("  lane: fast\n", "  lane: fast\n  max_queued: 100\n")
    assert _gate(bounded) == EnvoyGate(
        requests=6, pending=106, top_class="interactive", top_requests=2, top_pending=66
    )


def test_a_class_that_never_waits_adds_no_queue() -> None:
    # standard's max_wait 0: the routing stage never queues it either.
    classes = (
        "  lane: fast\n  priority_classes:\n"
        "    - {name: interactive, max_queue: 5, max_wait: 10s}\n"
        "    - {name: standard, max_queue: 100, max_wait: 0s}\n"
    )
    text = GATED.replace("  lane: fast\n", classes) + "tenants:\n"
    text += _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    assert _gate(text) == EnvoyGate(
        requests=6, pending=6, top_class="interactive", top_requests=2, top_pending=7
    )


def test_the_pool_bounds_the_gate_before_it_is_split() -> None:
    text = GATED + "tenants:\n" + _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    pooled = _pooled(text, "{max_connections: 4, max_pending_requests: 50}")
    # A gate of 4 (the pool's connections): 3 and 1. The pool's 50 pending split alike:
    # 12 (of the top class's 64 + 1) and 38 (of the others' 384 + 3).
    assert _gate(pooled) == EnvoyGate(
        requests=3, pending=38, top_class="interactive", top_requests=1, top_pending=12
    )


def test_without_tenants_of_both_the_top_and_a_lower_class_there_is_one_partition() -> None:
    # No tenant may ask for interactive: nobody would use a HIGH share.
    assert _gate(GATED + "tenants:\n" + _tenant("bulk")) == EnvoyGate(requests=8, pending=456)
    # Every tenant interactive: a HIGH share alone would leave DEFAULT's idle.
    top = "    priority: interactive\n"
    vips = _tenant("vip", top) + _tenant("ace", top)
    assert _gate(GATED + "tenants:\n" + vips) == EnvoyGate(requests=8, pending=456)
    # Without tenants nobody has a class at all, under `fast` or `auto`.
    assert _gate(GATED) == EnvoyGate(requests=8, pending=456)
    assert _gate(GATED.replace("lane: fast", "lane: auto")) == EnvoyGate(requests=8, pending=456)
    # A headroom that rounds to no slot leaves one partition too.
    small = GATED.replace("{max_requests: 8, headroom: 0.25}", "{max_requests: 1, headroom: 0.5}")
    both = _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    assert _gate(small + "tenants:\n" + both) == EnvoyGate(requests=1, pending=449)


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


def test_connections_bound_the_gate_on_http1_only() -> None:
    both = "tenants:\n" + _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    one_connection = _pooled(GATED, "{max_connections: 1}")
    # HTTP/1.1: a request per connection, so one connection is one request: one partition.
    assert _gate(one_connection + both) == EnvoyGate(requests=1, pending=449)
    http2 = one_connection.replace(
        "    base_url: http://127.0.0.1:8001/v1\n",
        "    base_url: http://127.0.0.1:8001/v1\n    protocol: http2\n",
    )
    # HTTP/2: one connection carries them all; the gate stays whole.
    assert _gate(http2 + both) == EnvoyGate(
        requests=6, pending=390, top_class="interactive", top_requests=2, top_pending=66
    )
    per_provider = _pooled(GATED, "{max_connections_per_provider: 4}")
    # One provider of 4 connections, whatever their priority: a gate of 4, 3 and 1.
    assert _gate(per_provider + both) == EnvoyGate(
        requests=3, pending=387, top_class="interactive", top_requests=1, top_pending=65
    )


def test_a_pending_limit_too_small_to_split_leaves_one_partition() -> None:
    both = "tenants:\n" + _tenant("vip", "    priority: interactive\n") + _tenant("bulk")
    tiny = _pooled(GATED, "{max_pending_requests: 1}")
    assert _gate(tiny + both) == EnvoyGate(requests=8, pending=1)
