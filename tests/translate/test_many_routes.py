"""A config with hundreds of models still translates into resources Envoy accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.config import Config
from sluicegate.model import build_model
from sluicegate.xds.translate import ROUTE, models_list_json, translate

from .envoy_harness import static_bootstrap, validate


def many_models(count: int) -> Config:
    return Config.model_validate(
        {
            "version": 1,
            "listeners": [{"name": "gw", "port": 10000}],
            "providers": [{"name": "alpha", "base_url": "http://127.0.0.1:18081/v1"}],
            "routes": [
                {"name": f"r-{i:04d}", "models": [f"model-with-a-long-name-{i:04d}"],
                 "backends": [{"provider": "alpha"}]}
                for i in range(count)
            ],
        }
    )  # fmt: skip


def test_route_config_allows_the_models_list_body() -> None:
    ir = build_model(many_models(300), {})
    body = models_list_json(ir)
    assert len(body) > 4096  # Envoy's default limit for direct response bodies
    (route_config,) = translate(ir)[ROUTE]
    assert route_config.max_direct_response_body_size_bytes.value >= len(body)


@pytest.mark.e2e
def test_envoy_accepts_hundreds_of_models(tmp_path: Path) -> None:
    resources = translate(build_model(many_models(300), {}))
    result = validate(static_bootstrap(resources, ext_proc_port=1), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
