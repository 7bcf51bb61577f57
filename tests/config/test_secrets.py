"""API keys from the environment and from files next to the YAML; never leaked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sluicegate.config import (
    ConfigError,
    describe_lanes,
    hash_key,
    load_config,
    resolve_api_keys,
    resolve_client_keys,
    validate_file,
)

from .helpers import FIXTURES, MINIMAL

SECRET = "sk-test-DO-NOT-LEAK"


def _write(tmp_path: Path, api_key: str, extra: str = "") -> Path:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        f"    base_url: http://127.0.0.1:18081/v1\n    api_key: {api_key}\n",
    )
    path = tmp_path / "conf" / "routes.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + extra)
    return path


def test_keys_from_env_and_relative_file(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES, tmp_path / "fx")
    path = tmp_path / "fx" / "valid.yaml"
    keys = resolve_api_keys(load_config(path), path, env={"ALPHA_API_KEY": f"  {SECRET}\n"})
    assert keys == {"alpha": SECRET, "beta": "beta-test-key"}


def test_provider_without_api_key_maps_to_none(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(MINIMAL)
    assert resolve_api_keys(load_config(path), path, env={}) == {"alpha": None}


def test_key_file_relative_to_yaml_not_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "{file: secret/alpha.key}")
    (path.parent / "secret").mkdir()
    (path.parent / "secret" / "alpha.key").write_text(SECRET + "\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_api_keys(load_config(path), path, env={}) == {"alpha": SECRET}


def test_absolute_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "abs.key"
    key_file.write_text(SECRET)
    path = _write(tmp_path, f"{{file: '{key_file}'}}")
    assert resolve_api_keys(load_config(path), path, env={}) == {"alpha": SECRET}


def test_missing_env_is_located_and_not_leaked(tmp_path: Path) -> None:
    path = _write(tmp_path, "\n      env: ALPHA_KEY")
    config = load_config(path)
    with pytest.raises(ConfigError) as caught:
        resolve_api_keys(config, path, env={"OTHER": SECRET})
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.key_path) == (
        str(path),
        9,
        "providers[0].api_key.env",
    )
    assert problem.message == (
        "environment variable ALPHA_KEY is not set (API key of provider 'alpha')"
    )
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("   \n", "is empty"),
        (f"{SECRET}\nsecond-line\n", "holds whitespace or control characters inside the key"),
        (f"{SECRET[:5]} {SECRET[5:]}", "holds whitespace or control characters inside the key"),
    ],
)
def test_bad_key_file_contents(tmp_path: Path, content: str, message: str) -> None:
    path = _write(tmp_path, "{file: alpha.key}")
    (path.parent / "alpha.key").write_text(content)
    with pytest.raises(ConfigError) as caught:
        resolve_api_keys(load_config(path), path, env={})
    (problem,) = caught.value.problems
    assert (problem.line, problem.key_path) == (8, "providers[0].api_key.file")
    assert message in problem.message
    assert SECRET not in str(caught.value)
    assert SECRET[:5] not in str(caught.value)


def test_unreadable_key_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "{file: missing.key}")
    with pytest.raises(ConfigError) as caught:
        resolve_api_keys(load_config(path), path, env={})
    message = caught.value.problems[0].message
    assert message.startswith("cannot read key file 'missing.key' (")
    assert "No such file or directory" in message


def test_empty_env_var(tmp_path: Path) -> None:
    path = _write(tmp_path, "{env: ALPHA_KEY}")
    with pytest.raises(ConfigError, match="environment variable ALPHA_KEY is empty"):
        resolve_api_keys(load_config(path), path, env={"ALPHA_KEY": ""})


def test_validate_file_reports_secret_and_schema_problems_together(tmp_path: Path) -> None:
    path = _write(tmp_path, "{env: ALPHA_KEY}", extra="  - name: broken\n")
    problems = validate_file(path, env={})
    assert [(p.line, p.key_path) for p in problems] == [
        (8, "providers[0].api_key.env"),
        (14, "routes[1].models"),
        (14, "routes[1].backends"),
    ]
    assert validate_file(path, env={}, check_secrets=False)[0].key_path == "routes[1].models"


def test_validate_file_with_keys_present(tmp_path: Path) -> None:
    path = _write(tmp_path, "{env: ALPHA_KEY}")
    assert validate_file(path, env={"ALPHA_KEY": SECRET}) == []


CLIENT_KEY = "sk-sg-client-DO-NOT-LEAK"


def _with_tenant(tmp_path: Path, secret: str, *, lane: str = "fast", limit: int = 10) -> Path:
    tenant = (
        f"admission: {{lane: {lane}}}\n"
        "tenants:\n"
        "  - name: team\n"
        f"    rate_limits: {{requests: {limit}, per: 1m}}\n"
        "    keys:\n"
        f'      - {{name: ci, hash: "{hash_key(CLIENT_KEY)}"{secret}}}\n'
    )
    path = tmp_path / "routes.yaml"
    path.write_text(MINIMAL + tenant)
    return path


def test_a_client_keys_secret_is_read_and_checked_against_its_hash(tmp_path: Path) -> None:
    path = _with_tenant(tmp_path, ", secret: {env: CI_KEY}")
    config = load_config(path)
    assert resolve_client_keys(config, path, env={"CI_KEY": CLIENT_KEY}) == {"ci": CLIENT_KEY}
    with pytest.raises(ConfigError) as caught:
        resolve_client_keys(config, path, env={"CI_KEY": "sk-sg-another-key"})
    (problem,) = caught.value.problems
    assert problem.key_path == "tenants[0].keys[0].secret.env"
    assert "does not match the key's hash" in problem.message
    assert "sk-sg-another-key" not in str(problem) and CLIENT_KEY not in str(problem)
    problems = validate_file(path, env={})
    assert [p.key_path for p in problems] == ["tenants[0].keys[0].secret.env"]


def test_the_fast_lane_needs_every_keys_secret_and_limits_a_bucket_can_hold(
    tmp_path: Path,
) -> None:
    path = _with_tenant(tmp_path, "", limit=2**32)
    problems = validate_file(path, env={})
    assert [p.key_path for p in problems] == [
        "tenants[0].rate_limits.requests",
        "tenants[0].keys[0]",
    ]
    assert "at most 4,294,967,295" in problems[0].message
    assert "has no secret" in problems[1].message
    assert validate_file(_with_tenant(tmp_path, "", lane="exact", limit=2**32), env={}) == []


def test_one_tenant_in_the_fast_lane_makes_envoy_check_every_key(tmp_path: Path) -> None:
    """A tenant's own `lane: fast` puts Envoy's key check in front of every request, so
    the exact lane's keys need their secret too; each tenant's lane is said, with why."""
    path = _with_tenant(tmp_path, "", lane="exact")
    text = path.read_text().replace("  - name: team\n", "  - name: team\n    lane: fast\n")
    text += f'  - name: second\n    keys: [{{name: k2, hash: "{hash_key("sk-sg-other")}"}}]\n'
    path.write_text(text)
    problems = validate_file(path, env={})
    assert [p.key_path for p in problems] == ["tenants[0].keys[0]", "tenants[1].keys[0]"]
    fixed = text.replace('"}]\n', '", secret: {env: OTHER}}]\n').replace(
        '"}\n', '", secret: {env: CI}}\n'
    )
    path.write_text(fixed)
    assert validate_file(path, env={"CI": CLIENT_KEY, "OTHER": "sk-sg-other"}) == []
    assert describe_lanes(path) == [
        "tenant team: lane fast (its own lane): Envoy checks its keys and limits it with "
        "token buckets",
        "tenant second: lane exact (admission.lane): the routing stage admits it (sliding "
        "windows, queues)",
    ]


def test_a_fast_lane_window_under_a_second_is_refused(tmp_path: Path) -> None:
    """Envoy refills a bucket at most every 50 ms (it refuses the config otherwise), and
    the fast lane's refills are whole seconds."""
    path = _with_tenant(tmp_path, ", secret: {env: CI}")
    path.write_text(path.read_text().replace("per: 1m", "per: 200ms"))
    (problem,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert problem.key_path == "tenants[0].rate_limits.per"
    assert "at least 1s, got 200ms" in problem.message


def test_two_client_keys_may_not_be_the_same_key(tmp_path: Path) -> None:
    """Salted hashes differ for one key, but Envoy's key check maps a key to one client."""
    path = _with_tenant(tmp_path, ", secret: {env: CI}")
    path.write_text(
        path.read_text()
        + f'      - {{name: ci2, hash: "{hash_key(CLIENT_KEY)}", secret: {{env: CI}}}}\n'
    )
    (problem,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert problem.key_path == "tenants[0].keys[1].secret.env"
    assert "the same key as client key 'ci'" in problem.message
    assert CLIENT_KEY not in str(problem)


def test_the_auto_lane_needs_what_both_lanes_need(tmp_path: Path) -> None:
    """An `auto` tenant is limited by Envoy's buckets while fast: every key's secret,
    bucket-sized limits and whole-second windows, as the fast lane; and it is in the
    exact lane near its limits, so routes' per-model limits are refused beside it."""
    path = _with_tenant(tmp_path, "", lane="auto", limit=2**32)
    problems = validate_file(path, env={})
    assert [p.key_path for p in problems] == [
        "tenants[0].rate_limits.requests",
        "tenants[0].keys[0]",
    ]
    assert "lane auto keeps limits in Envoy's token buckets" in problems[0].message
    assert "with lane auto Envoy checks every key" in problems[1].message
    path = _with_tenant(tmp_path, ", secret: {env: CI}", lane="auto")
    assert validate_file(path, env={"CI": CLIENT_KEY}) == []
    assert describe_lanes(path) == [
        "tenant team: lane auto (admission.lane): Envoy decides its requests while it is "
        "far from its limits; the control plane moves it to the routing stage's sliding "
        "windows when its usage nears them, and back"
    ]
    text = path.read_text().replace(
        "    models: [m]\n", "    models: [m]\n    rate_limits: {requests: 5}\n", 1
    )
    path.write_text(text)
    # The route's limit is the routing stage's: an auto tenant's requests for its model
    # take the exact lane (Route.held_in_exact_lane).
    assert validate_file(path, env={"CI": CLIENT_KEY}) == []


def test_the_auto_lanes_thresholds_are_ordered(tmp_path: Path) -> None:
    path = _with_tenant(tmp_path, ", secret: {env: CI}", lane="auto")
    text = path.read_text().replace(
        "admission: {lane: auto}", "admission: {lane: auto, auto_lane: {exact_above: 0.2}}"
    )
    path.write_text(text)
    (problem,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert problem.key_path == "admission.auto_lane"
    assert "fast_below (0.25) must be below exact_above (0.2)" in problem.message


def test_the_auto_lane_warns_where_it_would_move_nobody(tmp_path: Path) -> None:
    """Thresholds with no auto tenant, and an auto tenant with no limit: valid, but said."""
    path = _with_tenant(tmp_path, ", secret: {env: CI}", lane="exact")
    text = path.read_text().replace(
        "admission: {lane: exact}", "admission: {lane: exact, auto_lane: {hold: 5s}}"
    )
    path.write_text(text)
    (warning,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert (warning.is_error, warning.key_path) == (False, "admission.auto_lane")
    assert "no tenant takes lane auto" in warning.message
    path = _with_tenant(tmp_path, ", secret: {env: CI}", lane="auto")
    path.write_text(path.read_text().replace("    rate_limits: {requests: 10, per: 1m}\n", ""))
    (warning,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert (warning.is_error, warning.key_path) == (False, "tenants[0]")
    assert "has no rate limit" in warning.message


def test_an_auto_tenant_s_bucket_is_its_limit_less_fast_below_in_exact_fractions() -> None:
    from sluicegate.config import AutoLane

    assert AutoLane().bucket_size(120) == 90
    assert AutoLane(fast_below=0.3, exact_above=0.5).bucket_size(90) == 63  # floats say 62
    assert AutoLane(fast_below=0.9, exact_above=1.0).bucket_size(10) == 1
    assert AutoLane().bucket_size(1) == 1


def test_the_auto_lane_warns_of_a_tokens_bucket_smaller_than_the_default_allowance(
    tmp_path: Path,
) -> None:
    path = _with_tenant(tmp_path, ", secret: {env: CI}", lane="auto")
    path.write_text(path.read_text().replace("requests: 10, per: 1m", "tokens: 1200, per: 1m"))
    (warning,) = validate_file(path, env={"CI": CLIENT_KEY})
    assert (warning.is_error, warning.key_path) == (False, "tenants[0].rate_limits.tokens")
    assert "a bucket of 900 tokens, less than admission.default_max_tokens (1,024)" in (
        warning.message
    )
