"""Golden files: each config case in cases.py, translated, equals tests/translate/golden/.

Each resource list is stored as YAML (MessageToDict with proto field names, keys sorted)
in `golden/<case>/<type>.yaml`, type one of listener, route, cluster, endpoint, secret.

After an intended change, regenerate and review the diff:

    SLUICEGATE_UPDATE_GOLDENS=1 pytest tests/translate/test_golden.py

The `e2e` tests here feed the same resources to `envoy --mode validate` (Envoy 1.40), so
every golden file is also known to be accepted by the real proxy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sluicegate.xds.translate import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, translate

from .cases import CASES, ir_of
from .envoy_harness import ads_bootstrap, static_bootstrap, to_dict, validate

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SLUICEGATE_UPDATE_GOLDENS") == "1"
FILES = {
    LISTENER: "listener",
    ROUTE: "route",
    CLUSTER: "cluster",
    ENDPOINT: "endpoint",
    SECRET: "secret",
}


def render(case: str) -> dict[str, str]:
    resources = translate(ir_of(case))
    return {
        FILES[type_url]: yaml.safe_dump(
            [to_dict(message) for message in messages], sort_keys=True, width=100
        )
        for type_url, messages in resources.items()
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_golden(case: str) -> None:
    rendered = render(case)
    folder = GOLDEN / case
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (folder / f"{name}.yaml").write_text(text)
    for name, text in rendered.items():
        path = folder / f"{name}.yaml"
        assert path.exists(), f"{path} missing; run with SLUICEGATE_UPDATE_GOLDENS=1"
        assert text == path.read_text(), f"{path} differs; review, then regenerate"


@pytest.mark.parametrize("case", sorted(CASES))
def test_translation_is_deterministic(case: str) -> None:
    """Same input, byte-identical deterministic serialization (content hashes rely on it)."""
    first, second = translate(ir_of(case)), translate(ir_of(case))
    for type_url in first:
        assert [m.SerializeToString(deterministic=True) for m in first[type_url]] == [
            m.SerializeToString(deterministic=True) for m in second[type_url]
        ]


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(CASES))
def test_envoy_accepts_inlined_resources(case: str, tmp_path: Path) -> None:
    """Every generated Listener, RouteConfiguration, Cluster, ClusterLoadAssignment, Secret."""
    result = validate(static_bootstrap(translate(ir_of(case)), ext_proc_port=1), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(CASES))
def test_envoy_accepts_ads_config_sources(case: str, tmp_path: Path) -> None:
    """Listeners (rds) and clusters (eds_config) exactly as pushed, with an ADS source."""
    result = validate(ads_bootstrap(translate(ir_of(case))), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
