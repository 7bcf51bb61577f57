"""drained_view: which backends Envoy sees while providers drain."""

from __future__ import annotations

from sluicegate.config import Config, drained_view


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
                 "backends": [{"provider": "alpha"}, {"provider": "beta"}]},
                {"name": "only-beta", "models": ["n"], "backends": [{"provider": "beta"}]},
            ],
        }
    )  # fmt: skip


def backends(cfg: Config) -> dict[str, list[str]]:
    return {r.name: [b.provider for b in r.backends] for r in cfg.routes}


def test_nothing_drained_is_the_same_config() -> None:
    original = config()
    view, warnings = drained_view(original, set())
    assert view is original and warnings == []


def test_live_drain_drops_the_provider_where_another_is_left() -> None:
    view, warnings = drained_view(config(), {"beta"})
    assert backends(view) == {"both": ["alpha"], "only-beta": ["beta"]}
    assert len(warnings) == 1 and "only-beta" in warnings[0]


def test_yaml_drain_flag_counts_too() -> None:
    view, _ = drained_view(config(drain_beta=True), set())
    assert backends(view)["both"] == ["alpha"]
