"""`admission.lane` left out: `auto` where that changes nothing the config asks for, else
`exact` (config/lane_rules.py; docs/fast-lane.md, "The default lane")."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sluicegate.config import describe_lanes, load_config_text

from .helpers import MINIMAL, problems_of

KEY_HASH = (
    "sha256:000102030405060708090a0b0c0d0e0f:"
    "de35febd815a7f97b36f7fda9515cc9397dbe02f55ce3124b39b63af69e343a7"
)


def tenant(secret: bool = True, limits: str = "{requests: 60, per: 1m}", lane: str = "") -> str:
    return textwrap.dedent(f"""\
        tenants:
          - name: team
            {f"lane: {lane}" if lane else ""}
            rate_limits: {limits}
            keys:
              - name: ci
                hash: "{KEY_HASH}"
                {"secret: {env: CI_KEY}" if secret else ""}
        """)


def lane_of(text: str) -> tuple[str | None, str]:
    admission = load_config_text(text, "t.yaml").admission
    return admission.lane, admission.lane_defaulted


def test_a_plain_gateway_is_routed_by_envoy() -> None:
    assert lane_of(MINIMAL) == (
        "auto",
        "no tenants, and nothing needs the routing stage",
    )


@pytest.mark.parametrize(
    ("extra", "needs"),
    [
        ("    concurrency: {max_requests: 4}\n", "routes' concurrency gates"),
        ("    rate_limits: {requests: 10, per: 1m}\n", "routes' rate limits"),
    ],
)
def test_without_tenants_what_the_routing_stage_enforces_keeps_it(extra: str, needs: str) -> None:
    lane, why = lane_of(MINIMAL + extra)
    assert lane == "exact"
    assert why == f"no tenants, and the routing stage enforces {needs}"


def test_providers_gates_keep_the_routing_stage_and_scenarios_do_not() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    concurrency: {max_requests: 2}\n",
    )
    assert lane_of(text)[0] == "exact"
    assert "providers' concurrency gates" in lane_of(text)[1]
    # A client's scenario header counts in either lane (records.RecordDefaults).
    assert lane_of(MINIMAL + "scenarios: [chat]\n")[0] == "auto"


def test_tenants_whose_keys_all_have_their_secret_take_the_auto_lane() -> None:
    assert lane_of(MINIMAL + tenant()) == (
        "auto",
        "every client key has its secret and every limit fits Envoy's buckets",
    )


@pytest.mark.parametrize(
    ("secret", "limits", "why"),
    [
        (False, "{requests: 60, per: 1m}", "client key 'ci' has no secret for Envoy to check"),
        (True, "{requests: 60, per: 500ms}", "a limit does not fit Envoy's token buckets"),
        (True, "{requests: 4294967296, per: 1m}", "a limit does not fit Envoy's token buckets"),
        # A bucket of 750 tokens (1,000 less auto_lane.fast_below) under the allowance of
        # 1,024 of a request without max_tokens: each such request would be refused.
        (True, "{tokens: 1000, per: 1m}", "a token limit's fast-lane bucket is smaller"),
    ],
)
def test_tenants_the_fast_lane_cannot_hold_keep_the_exact_lane(
    secret: bool, limits: str, why: str
) -> None:
    lane, reason = lane_of(MINIMAL + tenant(secret, limits))
    assert lane == "exact"
    assert reason.startswith(why)


def test_a_written_lane_is_never_changed() -> None:
    assert lane_of(MINIMAL + "admission: {lane: exact}\n") == ("exact", "")
    assert lane_of(MINIMAL + "admission: {lane: fast}\n" + tenant()) == ("fast", "")
    # A tenant's own lane stands; when every tenant names its own, nobody takes the
    # default, and `auto` would only put Envoy's key check in front of them.
    assert lane_of(MINIMAL + tenant(lane="exact")) == ("exact", "every tenant names its own lane")
    other = tenant().replace("tenants:\n", "").replace("team", "crew").replace("ci", "cd")
    two = MINIMAL + tenant(lane="exact") + other.replace(KEY_HASH[-8:], "00000000")
    config = load_config_text(two, "t.yaml")
    assert config.admission.lane == "auto"
    assert [config.admission.lane_of(t) for t in config.tenants] == ["exact", "auto"]


def test_limits_shared_across_replicas_keep_the_exact_lane() -> None:
    """Envoy's token buckets are per Envoy process; a Redis store shares the windows."""
    text = MINIMAL + tenant() + "admission: {store: {kind: redis, url: redis://127.0.0.1:1}}\n"
    assert lane_of(text) == ("exact", "limits are shared across replicas (admission.store: redis)")


def test_a_defaulted_auto_tenant_without_limits_is_no_warning() -> None:
    """A written `auto` on a tenant without limits is warned (it would never move); the
    default, which chose auto for the whole gateway, is not."""
    assert problems_of(MINIMAL + tenant(limits="null")) == []
    written = problems_of(MINIMAL + tenant(limits="null", lane="auto"))
    assert [p.message for p in written] == [
        "tenant 'team' takes lane auto but has no rate limit, its own or a key's: it stays "
        "in the fast lane"
    ]


def test_a_document_with_other_errors_gets_the_default_from_what_is_valid() -> None:
    """A key without its secret keeps the exact lane even where the rest of the file
    failed, so validation does not also ask that key for a secret the exact lane needs
    not."""
    broken = MINIMAL.replace("port: 10000", "port: -1") + tenant(secret=False)
    assert [p.key_path for p in problems_of(broken)] == ["listeners[0].port"]
    # A tenant that failed validation leaves the exact lane: the rest of the file is
    # judged as with it, never more (here: no fast lane asked to enforce providers' limits).
    limited = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    rate_limits: {requests: 5}\n",
    )
    for base in (MINIMAL, limited):
        for secret in (False, True):
            broken = base + tenant(secret).replace("rate_limits:", "priority: 3\n    rate_limits:")
            assert [p.key_path for p in problems_of(broken)] == ["tenants[0].priority"]


def test_validate_says_which_lane_and_why(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(MINIMAL)
    assert describe_lanes(path) == [
        "requests: lane auto (the default: no tenants, and nothing needs the routing "
        "stage): Envoy routes every request (no routing-stage stream)"
    ]
    path.write_text(MINIMAL + tenant(secret=False))
    assert describe_lanes(path) == [
        "tenant team: lane exact (the default: client key 'ci' has no secret for Envoy to "
        "check): the routing stage admits it (sliding windows, queues)"
    ]
