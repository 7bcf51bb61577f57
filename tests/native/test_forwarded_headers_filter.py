"""The native forwarded headers filter (sluicegate/native/c/forwarded_headers.c) against
its specification, the header_mutation filters the translator writes
(xds/translate/forwarded_headers.py), through a mock of Envoy's header map
(headers_harness.c, built with gcc here, with AddressSanitizer and UBSan when gcc has
them: a removed entry is freed, so a filter that read one would be caught).

The specification is executed, not restated: a header is removed when one of the
translator's own regular expressions (`removal_regexes`) matches its whole name (Python's
`re` and RE2 agree on these: literals, classes, `.*`, groups); a provider's block is the
one Envoy's composite would pick (the provider header's values joined by a comma, matched
exactly); the headers the route's other providers set are withheld; the fixed headers then
replace every value. The configurations are the
translator's (native_forwarded_headers_config) for the golden case forwarded_headers.yaml:
route `same` (one list) and route `mixed` (a block per provider, the built-in list for
any other).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Final

import pytest

from sluicegate import wire
from sluicegate.model import Route
from sluicegate.native import MODULE
from sluicegate.xds.translate.forwarded_headers import (
    CLIENT_HEADERS,
    KEPT,
    native_forwarded_headers_config,
    removal_regexes,
    route_receives,
)
from tests.native.mock_envoy import build_mock, run_mock
from tests.translate.cases import load_case, model_from, model_of

HARNESS: Final = Path(__file__).with_name("headers_harness.c")
SOURCES: Final = ("forwarded_headers.c",)
FUZZ_REQUESTS: Final = 3000
ROUTES: Final = {route.name: route for route in model_of("forwarded_headers").routes}

Headers = list[tuple[str, str]]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert set(SOURCES) <= set(MODULE.sources)  # the files the library is built from
    return build_mock(HARNESS, SOURCES, tmp_path_factory.mktemp("headers") / "harness")


# What the request hooks return (headers, body, trailers): going on, or held.
PASSED: Final = "0 0 0"
HELD: Final = "1 3 1"


def run(harness: Path, config: str, requests: list[Headers]) -> list[tuple[str, Headers]]:
    """What the filter's hooks returned and what it left of each request, under `config`."""
    script = f"config\n{config}.\n"
    for headers in requests:
        script += "request\n" + "".join(f"{n}\t{v}\n" for n, v in headers) + ".\n"
    lines = run_mock(harness, stdin=script).splitlines()
    assert lines[0] == "ok", lines[0]
    results: list[tuple[str, Headers]] = []
    at = 1
    for _ in requests:
        status, left = lines[at], []
        at += 1
        while lines[at] != ".":
            name, value = lines[at].split("\t", 1)
            left.append((name, value))
            at += 1
        results.append((status, left))
        at += 1
    return results


def expected(route: Route, headers: Headers) -> Headers:
    """What the header_mutation filters leave of `headers` on an attempt to `route`: the
    provider Envoy's composite picks (the provider header's values joined by a comma),
    each name off its list matched by a regex of the translator's, then its withheld
    names removed and its fixed headers set."""
    anyone, each = route_receives(route)
    named = ",".join(v for n, v in headers if n == wire.PROVIDER_HEADER)
    receives = each.get(named, anyone)
    patterns = [re.compile(regex) for regex in removal_regexes(receives.allowed)]
    off = {n for n, _ in headers if any(p.fullmatch(n) for p in patterns)}
    left = [(n, v) for n, v in headers if n not in off and n not in receives.withheld]
    for name, value in receives.fixed:
        left = [(n, v) for n, v in left if n != name] + [(name, value)]
    return left


# Names a request may carry: every listed name, names a letter or a separator away from
# them or from a prefix, pseudo-headers, what must never pass, and the provider header.
NAMES: Final = (
    *CLIENT_HEADERS, *KEPT, "idempotency-key", "openai-organization", "openai-project",
    "accep", "accepts", "accept-x", "user-agen", "content-typ", "content-length2",
    "x-stainless", "x-stainless-", "x-stainless-os", "x-stainlessos", "x-stainless*",
    "idempotency-keys", "idempotency", ":path", ":authority", ":method", ":",
    "cookie", "x-api-key", "x-forwarded-for", "x-envoy-expected-rq-timeout-ms", "a", "x",
    "x-", "traceparent2", "tracestat", "authorizatio", "openai-bet", "openai-beta-",
)  # fmt: skip
PROVIDER_VALUES: Final = ("openai", "local", "zzz", "", "openai,local", "OpenAI")
TOKEN: Final = "abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~"


def random_request(rng: random.Random) -> Headers:
    headers: Headers = []
    for _ in range(rng.randrange(0, 14)):
        roll = rng.random()
        if roll < 0.6:
            name = rng.choice(NAMES)
        elif roll < 0.8:
            name = "".join(rng.choice(TOKEN) for _ in range(rng.randrange(1, 12)))
        else:
            name = wire.PROVIDER_HEADER
        if name == wire.PROVIDER_HEADER:
            value = rng.choice(PROVIDER_VALUES)
        else:
            value = "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(1, 9)))
        headers.append((name, value))
    return headers


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_fixed_cases(harness: Path, route: str) -> None:
    requests: list[Headers] = [
        [],
        [(":method", "POST"), ("accept", "a"), ("cookie", "c"), ("accept", "b")],
        [("x-stainless-os", "Linux"), ("x-stainless-", "x"), ("x-stainless", "no")],
        [("openai-organization", "org-client"), ("openai-organization", "org-2")],
        [(wire.PROVIDER_HEADER, "openai"), ("idempotency-key", "k"), ("x-stainless-lang", "p")],
        [(wire.PROVIDER_HEADER, "local"), ("idempotency-key", "k"), ("x-stainless-lang", "p")],
        [(wire.PROVIDER_HEADER, "openai"), (wire.PROVIDER_HEADER, "openai"), ("x-stainless", "1")],
        [("a", str(i)) for i in range(300)] + [("accept", "kept")],  # beyond the stack's list
    ]  # fmt: skip
    results = run(harness, native_forwarded_headers_config(ROUTES[route]), requests)
    for headers, (status, left) in zip(requests, results, strict=True):
        assert status == PASSED
        assert left == expected(ROUTES[route], headers), headers


def test_held_when_a_removal_does_not_take(harness: Path) -> None:
    """Envoy removes by the lower-case name, so a name its map held in upper case could
    not be removed (its codecs and filters write lower case): the attempt is held, body
    and trailers too, never sent with it."""
    requests: list[Headers] = [
        [("Cookie", "secret")],
        [("accept", "a"), ("Accept", "b"), ("x-y", "c")],
        [("accept", "a"), ("X-Forwarded-For", "1.2.3.4")],
    ]
    results = run(harness, native_forwarded_headers_config(ROUTES["same"]), requests)
    assert [status for status, _ in results] == [HELD] * len(requests)


def test_routes_whose_providers_receive_the_same_have_one_block(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "listeners": [{"name": "main", "port": 8080}],
        "providers": [
            {"name": name, "base_url": f"http://{name}.internal/v1",
             "headers": {"OpenAI-Project": "p"}, "forward_headers": ["x-b*"]}
            for name in ("one", "two")
        ],
        "routes": [{"name": "r", "models": ["m"], "backends": [
            {"provider": "one"}, {"provider": "two", "priority": 1}]}],
    }  # fmt: skip
    path = tmp_path / "sluicegate.yaml"
    path.write_text(json.dumps(doc))
    (route,) = model_from(*load_case(path), path).routes
    config = native_forwarded_headers_config(route)
    assert "provider=" not in config
    assert "allow=x-b*\n" in config and "set=openai-project:p\n" in config


def test_provider_blocks_differ() -> None:
    """The cases above could not fail on `mixed` if its providers received the same."""
    mixed = ROUTES["mixed"]
    assert len({(b.provider.forward_headers, b.provider.headers) for b in mixed.backends}) == 2


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_fuzzed_requests(harness: Path, route: str, seed: int) -> None:
    rng = random.Random(f"{route}-{seed}")
    requests = [random_request(rng) for _ in range(FUZZ_REQUESTS)]
    results = run(harness, native_forwarded_headers_config(ROUTES[route]), requests)
    removed = 0
    for headers, (status, left) in zip(requests, results, strict=True):
        assert status == PASSED
        assert left == expected(ROUTES[route], headers), headers
        removed += len(headers) - len(left)
    assert removed > FUZZ_REQUESTS  # the requests did carry headers off the lists


@pytest.mark.parametrize(
    "config",
    [
        "allow=accept\n",  # no provider header
        "provider_header=x-p\nprovider_header=x-q\n",
        "provider_header=x-p\nallow=Accept\n",  # names are lower case
        "provider_header=x-p\nallow=*\n",
        "provider_header=x-p\nallow=\n",
        "provider_header=x-p\nallow=a b\n",
        "provider_header=x-p\nprovider=a\nprovider=a\n",
        "provider_header=x-p\nprovider=\n",
        "provider_header=x-p\nset=x-a\n",  # no value
        "provider_header=x-p\nset=x-a:\n",
        "provider_header=x-p\nset=:v\n",
        "provider_header=x-p\nset=x-a:b\x7fc\n",  # a byte no header value holds
        "provider_header=x-p\nset=x-a:b\x01c\n",
        "provider_header=x-p\nremove=x-a\n",
        "provider_header=x-p\nallow\n",
    ],
)
def test_wrong_configurations_are_refused(harness: Path, config: str) -> None:
    assert run_mock(harness, stdin=f"config\n{config}.\n").strip() == "refused"


def test_names_with_a_star_and_values_with_a_colon(harness: Path) -> None:
    """`*` is a token character (config validation takes `x-a*b`; `x-a**` is the prefix
    `x-a*`); a fixed value runs to the line's end, colons and all; CRLF lines are lines."""
    config = "provider_header=x-p\r\nallow=x-a*b\r\nallow=x-c**\r\nset=x-v:b:c\r\n"
    request = [("x-a*b", "1"), ("x-a*", "2"), ("x-c*d", "3"), ("x-c", "4"), ("x-v", "5")]
    [(status, left)] = run(harness, config, [request])
    assert status == PASSED
    assert left == [("x-a*b", "1"), ("x-c*d", "3"), ("x-v", "b:c")]


def test_a_withheld_header_is_removed_though_listed(harness: Path) -> None:
    config = "provider_header=x-p\nallow=user-agent\nallow=x-s*\nwithhold=user-agent\n" \
             "withhold=x-s-org\nset=x-own:1\n"  # fmt: skip
    request = [("user-agent", "client/1"), ("x-s-org", "org-a"), ("x-s-lang", "py")]
    [(status, left)] = run(harness, config, [request])
    assert status == PASSED
    assert left == [("x-s-lang", "py"), ("x-own", "1")]
