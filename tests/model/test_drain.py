"""Draining in the model: which backends Envoy sees while providers drain, and what stays."""

from __future__ import annotations

from collections.abc import Set

from sluicegate.config import Config
from sluicegate.model import Gateway, build_model


def config(drain_beta: bool = False) -> Config:
    return Config.model_validate(
        {
            "version": 1,
            "listeners": [{"name": "gw", "port": 10000}],
            "providers": [
                {"name": "alpha", "base_url": "http://127.0.0.1:18081/v1"},
                {"name": "beta", "base_url": "http://127.0.0.1:18082/v1", "drain": drain_beta},
            ],
            "routes": [
                {"name": "both", "models": ["m"],
                 "backends": [{"provider": "alpha"}, {"provider": "beta", "priority": 3}]},
                {"name": "only-beta", "models": ["n"], "backends": [{"provider": "beta"}]},
            ],
        }
    )  # fmt: skip


def model(cfg: Config, drained: Set[str] = frozenset()) -> Gateway:
    return build_model(cfg, {}, drained)


def backends(gateway: Gateway) -> dict[str, list[str]]:
    return {r.name: [b.provider.name for b in r.backends] for r in gateway.routes}


def test_nothing_drained_keeps_every_backend() -> None:
    gateway = model(config())
    assert backends(gateway) == {"both": ["alpha", "beta"], "only-beta": ["beta"]}
    assert gateway.warnings == ()


def test_live_drain_drops_the_provider_where_another_is_left() -> None:
    gateway = model(config(), {"beta"})
    assert backends(gateway) == {"both": ["alpha"], "only-beta": ["beta"]}
    assert len(gateway.warnings) == 1 and "only-beta" in gateway.warnings[0]


def test_yaml_drain_flag_counts_too() -> None:
    assert backends(model(config(drain_beta=True)))["both"] == ["alpha"]


def test_a_drain_moves_no_gate_or_provider_limit() -> None:
    """A provider's gate covers the routes the file sends to it alone: a drain that leaves
    one provider on a route must not start gating it in one replica and not the others."""
    both = model(config(), {"beta"}).routes[0]
    assert both.sole_provider is None and both.gates == ()
    only_beta = model(config(), {"beta"}).routes[1]
    assert only_beta.sole_provider is not None and only_beta.sole_provider.name == "beta"
