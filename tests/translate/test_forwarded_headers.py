"""The allowlist filter: its regexes remove exactly the names not allowed, and Envoy
accepts every one of them (each under RE2's program-size limit of 100), also for the
longest lists the schema allows."""

from __future__ import annotations

import random
import re
import string
from pathlib import Path

import pytest

from sluicegate.config.headers import MAX_NAME_LENGTH
from sluicegate.model import build_model
from sluicegate.model.providers import MOCK_KNOBS
from sluicegate.provider import faults
from sluicegate.xds.translate.forwarded_headers import (
    CLIENT_HEADERS,
    KEPT,
    removal_regexes,
    withheld_headers,
)

from .cases import config_of
from .envoy_harness import validate

DEFAULT = sorted({*CLIENT_HEADERS, *KEPT})
TOKEN = string.ascii_lowercase + string.digits + "!#$%&'*+-.^_`|~"
MOST_FORWARDED = 24  # schema: forward_headers has at most 24 names


def removed(regexes: list[str], name: str) -> bool:
    # Envoy matches a safe_regex against the whole name (RE2 FullMatch).
    return any(re.fullmatch(regex, name, flags=re.DOTALL) for regex in regexes)


def is_allowed(allowed: list[str], name: str) -> bool:
    prefixes = [entry[:-1] for entry in allowed if entry.endswith("*")]
    return name in allowed or any(name.startswith(prefix) for prefix in prefixes)


def near(name: str, rng: random.Random) -> str:
    """A name one edit away from `name`: what a hostile client would try."""
    i = rng.randrange(len(name) + 1)
    edit = rng.choice(("insert", "delete", "replace", "prefix", "suffix"))
    char = rng.choice(TOKEN)
    if edit == "insert":
        return name[:i] + char + name[i:]
    if edit == "delete" and name:
        return name[: max(i - 1, 0)] + name[i:]
    if edit == "replace" and i < len(name):
        return name[:i] + char + name[i + 1 :]
    if edit == "prefix":
        return name[:i]
    return name + char


def long_lists(rng: random.Random) -> list[list[str]]:
    """Lists at the schema's bounds: long names, shared prefixes, many siblings."""
    stem = "x-" + "a" * (MAX_NAME_LENGTH - 4)
    siblings = [stem + char for char in TOKEN[:MOST_FORWARDED]]
    chain = ["x-" + "b" * n for n in range(MAX_NAME_LENGTH - MOST_FORWARDED, MAX_NAME_LENGTH - 1)]
    randoms = [
        "".join(rng.choice(TOKEN) for _ in range(rng.randint(1, MAX_NAME_LENGTH)))
        for _ in range(MOST_FORWARDED)
    ]
    prefixes = ["x-stainless-*", "x-mock-*", "x-stainless-lang", "user-*", "x-b*", "x-bar"]
    return [siblings, chain[:MOST_FORWARDED], randoms, prefixes]


@pytest.mark.parametrize("seed", range(4))
def test_exactly_the_names_off_the_list_are_removed(seed: int) -> None:
    rng = random.Random(seed)
    allowed = sorted({*DEFAULT, *long_lists(rng)[seed]})
    regexes = removal_regexes(allowed)
    for name in allowed:
        assert not removed(regexes, name.removesuffix("*")), name
    tried = [near(name.removesuffix("*"), rng) for name in allowed for _ in range(30)]
    tried += ["".join(rng.choice(TOKEN) for _ in range(rng.randint(1, 20))) for _ in range(500)]
    tried += ["cookie", "x-forwarded-for", "x-sluicegate-provider", "x-envoy-original-host",
              "accept-encoding", "authorizationx", "user-agen", "a", "x", "x-"]  # fmt: skip
    for name in tried:
        if name:
            assert removed(regexes, name) == (not is_allowed(allowed, name)), name


def test_a_prefix_keeps_every_name_under_it() -> None:
    regexes = removal_regexes([*DEFAULT, "x-mock-*"])
    for name in ("x-mock-", "x-mock-fault", "x-mock-ttft-ms", "x-mock-" + "z" * 40):
        assert not removed(regexes, name), name
    for name in ("x-mock", "x-moc", "x-mocks-fault", "x-m"):
        assert removed(regexes, name), name


MOCKED = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: mocked, base_url: "http://127.0.0.1:18081/v1", mock: {}}
  - {name: real, base_url: "https://api.example.com/v1", forward_headers: [X-Stainless-*]}
routes: [{name: r, models: [m], backends: [{provider: mocked}, {provider: real}]}]
"""


def test_a_mock_provider_receives_its_knobs() -> None:
    """`up` starts mocks whose per-request knobs are x-mock-* headers: the model forwards
    them to a provider with `mock:`, and every knob the mock reads has that prefix."""
    knobs = [value for key, value in vars(faults).items() if key.startswith("HEADER_")]
    assert knobs and all(knob.startswith(MOCK_KNOBS.removesuffix("*")) for knob in knobs)
    config = config_of(MOCKED)
    gateway = build_model(config, {})
    forwarded = {p.name: p.forward_headers for p in gateway.providers}
    assert forwarded == {"mocked": (MOCK_KNOBS,), "real": ("x-stainless-*",)}


def test_pseudo_headers_are_kept() -> None:
    regexes = removal_regexes(DEFAULT)
    for name in (":method", ":path", ":authority", ":scheme"):
        assert not removed(regexes, name)


def test_the_default_list_is_a_handful_of_regexes() -> None:
    """Each regex is matched against every header of every attempt: keep them few."""
    assert len(removal_regexes(DEFAULT)) <= 10


def _filter(name: str, type_name: str, **config: object) -> dict[str, object]:
    return {"name": name, "typed_config": {"@type": TYPE + type_name, **config}}


TYPE = "type.googleapis.com/envoy.extensions."


@pytest.mark.e2e
def test_envoy_accepts_every_regex_at_the_schema_bounds(tmp_path: Path) -> None:
    """Envoy refuses a regex whose RE2 program is over 100; the split must keep under."""
    rng = random.Random(0)
    lists = [[], *long_lists(rng)]
    regexes = [regex for extra in lists for regex in removal_regexes({*DEFAULT, *extra})]
    removals = [{"remove_on_match": {"key_matcher": {"safe_regex": {"regex": r}}}} for r in regexes]
    options = {
        "@type": TYPE + "upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http_protocol_options": {}},
        "http_filters": [
            _filter(
                "envoy.filters.http.header_mutation",
                "filters.http.header_mutation.v3.HeaderMutation",
                mutations={"request_mutations": removals},
            ),
            _filter(
                "envoy.filters.http.upstream_codec", "filters.http.upstream_codec.v3.UpstreamCodec"
            ),
        ],
    }
    cluster = {
        "name": "c",
        "type": "STATIC",
        "load_assignment": {"cluster_name": "c", "endpoints": []},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options
        },
    }
    result = validate({"static_resources": {"clusters": [cluster]}}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


THREE = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: a, base_url: "http://10.0.0.1/v1", headers: {OpenAI-Organization: org-a, X-Tier: gold}}
  - {name: b, base_url: "http://10.0.0.2/v1", headers: {X-Tier: silver}}
  - {name: c, base_url: "http://10.0.0.3/v1"}
  - {name: d, base_url: "http://10.0.0.4/v1", headers: {OpenAI-Project: p}}
  - {name: e, base_url: "http://10.0.0.5/v1", headers: {OpenAI-Project: p}}
routes:
  - {name: r, models: [m], backends: [{provider: a}, {provider: b}, {provider: c}]}
  - {name: same, models: [s], backends: [{provider: d}, {provider: e}]}
"""


def test_each_provider_is_withheld_what_only_the_routes_others_set() -> None:
    """A retry starts from the request the last attempt's filters left: a provider must
    not receive what another provider of its route set (withheld_headers)."""
    gateway = build_model(config_of(THREE), {})
    routes = {route.name: route for route in gateway.routes}
    providers = [b.provider for b in routes["r"].backends]
    withheld = {p.name: withheld_headers(p, providers) for p in providers}
    # X-Tier is set by a and b, each its own value (replaced on every attempt): not withheld.
    assert withheld == {
        "a": (),
        "b": ("openai-organization",),
        "c": ("openai-organization", "x-tier"),
    }
    assert withheld_headers(None, providers) == ("openai-organization", "x-tier")
    # Providers that set the same headers withhold nothing from each other.
    same = [b.provider for b in routes["same"].backends]
    assert [withheld_headers(p, same) for p in same] == [(), ()]
