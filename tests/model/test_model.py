"""The resolved model: facts worked out once per load, read by the translator and the filter."""

from __future__ import annotations

import textwrap

from sluicegate.config import load_config_text
from sluicegate.model import Gateway, build_model

DOC = """\
version: 1
listeners: [{name: gw, port: 10000}]
providers:
  - {name: alpha, base_url: "http://10.0.0.1/v1", concurrency: {max_requests: 4}}
  - {name: beta, base_url: "https://api.example.com/api/v4", rate_limits: {requests: 9}}
admission:
  default_max_tokens: 512
  priority_classes:
    - {name: high, max_queue: 10, max_wait: 1s}
    - {name: low, max_queue: 10, max_wait: 5s}
  default_priority: low
tenants:
  - name: team
    keys: [{name: k1, hash: "sha256:00112233445566778899aabbccddeeff:%s"}]
  - name: vip
    priority: high
    models: [m1]
routes:
  - name: solo
    models: [m1, m2, m1]
    concurrency: {max_requests: 8}
    backends: [{provider: alpha}]
  - name: pair
    path_prefix: /openai
    models: [m1]
    default_max_tokens: 64
    backends: [{provider: beta, priority: 7}, {provider: alpha, priority: 2}]
""" % ("0" * 64)


def model() -> Gateway:
    return build_model(load_config_text(textwrap.dedent(DOC), "m.yaml"), {"beta": "sk-b"})


def test_routes_keep_config_order_with_dense_priorities_and_unique_models() -> None:
    solo, pair = model().routes
    assert solo.models == ("m1", "m2")
    assert [(b.provider.name, b.priority) for b in pair.backends] == [("alpha", 0), ("beta", 1)]
    assert pair.path_prefix == "/openai/"


def test_the_match_rule_picks_by_path_prefix_then_falls_back_to_the_first_route() -> None:
    gateway = model()
    assert [r.name for r in gateway.served["m1"]] == ["solo", "pair"]
    assert gateway.route_for("m1", "/openai/chat/completions").name == "pair"  # type: ignore[union-attr]
    assert gateway.route_for("m1", "/v1/chat/completions").name == "solo"  # type: ignore[union-attr]
    assert gateway.route_for("m1", "/other").name == "solo"  # type: ignore[union-attr]
    assert gateway.route_for("nope", "/v1/x") is None
    assert gateway.models_under("/openai") == ("m1",)
    assert gateway.models_under() == ("m1", "m2")


def test_gates_and_provider_limits_cover_only_routes_with_one_provider() -> None:
    solo, pair = model().routes
    assert [g.name for g in solo.gates] == ["route:solo", "provider:alpha"]
    assert solo.sole_provider is not None and solo.sole_provider.name == "alpha"
    assert pair.gates == () and pair.sole_provider is None


def test_admission_facts_are_resolved_once() -> None:
    gateway = model()
    solo, pair = gateway.routes
    assert (solo.default_max_tokens, pair.default_max_tokens) == (512, 64)
    assert {t.name: t.priority for t in gateway.tenants} == {"team": "low", "vip": "high"}
    assert gateway.tenants[1].models == frozenset({"m1"})
    admission = gateway.admission
    assert admission.enabled and admission.keys_required and not admission.counts_tokens
    assert admission.class_names == ("high", "low")
    assert admission.longest_queue_wait_ms == 5000
    assert admission.ext_proc_processes == 1


def test_providers_are_taken_apart_and_keys_become_authorization() -> None:
    alpha, beta = model().providers
    assert (alpha.scheme, alpha.host, alpha.port, alpha.path_prefix) == (
        "http",
        "10.0.0.1",
        80,
        "/v1",
    )
    assert alpha.authorization is None and alpha.tls is None
    assert beta.authorization == "Bearer sk-b"
    assert beta.tls is not None and beta.tls.sni == "api.example.com"
    assert beta.authority == "api.example.com"
