"""Cross-document rules: each reported at the right line and key path."""

from __future__ import annotations

import pytest

from sluicegate.config import load_config_text

from .helpers import MINIMAL, errors_of, only, problems_of, where

TWO_PROVIDERS = """\
version: 1
listeners:
  - name: gw
    port: 10000
providers:
  - name: alpha
    base_url: http://127.0.0.1:18081/v1
  - name: beta
    base_url: https://api.beta.example/v1
routes:
  - name: chat
    models: [m]
    backends:
      - provider: alpha
      - provider: beta
"""


def test_fixture_documents_are_clean() -> None:
    assert problems_of(MINIMAL) == []
    assert problems_of(TWO_PROVIDERS) == []


@pytest.mark.parametrize(
    ("text", "path", "line", "message"),
    [
        (
            TWO_PROVIDERS.replace("name: beta", "name: alpha").replace("  - provider: beta\n", ""),
            "providers[1].name",
            8,
            "duplicate provider name 'alpha' (first at providers[0].name, line 6)",
        ),
        (
            MINIMAL + "  - name: chat\n    models: [n]\n    backends: [{provider: alpha}]\n",
            "routes[1].name",
            13,
            "duplicate route name 'chat' (first at routes[0].name, line 9)",
        ),
    ],
)
def test_duplicate_names(text: str, path: str, line: int, message: str) -> None:
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (line, path, message)


def test_unknown_provider_lists_known_and_suggests() -> None:
    problem = only(errors_of(TWO_PROVIDERS.replace("provider: beta", "provider: betta")))
    assert (problem.line, problem.key_path) == (15, "routes[0].backends[1].provider")
    assert problem.message == (
        "unknown provider 'betta' (known: alpha, beta); did you mean 'beta'?"
    )


def test_unknown_provider_without_suggestion() -> None:
    problem = only(errors_of(TWO_PROVIDERS.replace("provider: beta", "provider: gama")))
    assert problem.message == "unknown provider 'gama' (known: alpha, beta)"


def test_provider_named_by_a_broken_entry_is_not_unknown() -> None:
    text = TWO_PROVIDERS.replace("https://api.beta.example/v1", "ftp://x")
    problem = only(problems_of(text))
    assert problem.key_path == "providers[1].base_url"


def test_same_provider_twice_in_one_route() -> None:
    problem = only(problems_of(MINIMAL + "      - provider: alpha\n        weight: 2\n"))
    assert (problem.line, problem.key_path) == (13, "routes[0].backends[1].provider")
    assert problem.message.startswith(
        "provider 'alpha' is already a backend of route 'chat' "
        "(at routes[0].backends[0].provider, line 12)"
    )


def test_same_model_twice_under_one_prefix() -> None:
    extra = "  - name: second\n    models: [x, m]\n    backends: [{provider: alpha}]\n"
    problem = only(problems_of(MINIMAL + extra))
    assert (problem.line, problem.key_path) == (14, "routes[1].models[1]")
    assert problem.message == (
        "model 'm' under path_prefix '/v1/' is already served by route 'chat' "
        "(at routes[0].models[0], line 10)"
    )


def test_same_model_under_another_prefix_is_fine() -> None:
    extra = "  - name: second\n    models: [m]\n    path_prefix: /v2/\n"
    extra += "    backends: [{provider: alpha}]\n"
    assert problems_of(MINIMAL + extra) == []


def test_model_listed_twice_in_one_route_is_a_warning() -> None:
    problem = only(problems_of(MINIMAL.replace("models: [m]", "models: [m, m]")))
    assert (problem.line, problem.key_path, problem.severity) == (
        10,
        "routes[0].models[1]",
        "warning",
    )


def test_unused_model_map_entry_is_a_warning() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    model_map:\n      m: up-m\n      z: up-z\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.severity) == (
        10,
        "providers[0].model_map.z",
        "warning",
    )
    assert problem.message == (
        "no route sends model 'z' to provider 'alpha', so this mapping is never used"
    )
    assert load_config_text(text, "w.yaml").providers[0].model_map["z"] == "up-z"


def test_unused_provider_is_a_warning() -> None:
    text = TWO_PROVIDERS.replace("      - provider: beta\n", "")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.severity) == (8, "providers[1].name", "warning")


def test_usage_warnings_stay_quiet_when_a_route_is_broken() -> None:
    text = TWO_PROVIDERS.replace("      - provider: beta\n", "      - provider: beta\n  - bad\n")
    assert where(problems_of(text)) == [(16, "routes[1]")]


def test_tls_needs_https() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    tls:\n      sni: a.example\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (8, "providers[0].tls")
    assert "https://" in problem.message
    assert (
        problems_of(TWO_PROVIDERS.replace("beta.example/v1\n", "beta.example/v1\n    tls: {}\n"))
        == []
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://127.0.0.1:18081", "a mock provider is served over plain http://, not https://"),
        (
            "http://10.0.0.5:18081",
            "a mock provider runs on this machine: use host 127.0.0.1, not '10.0.0.5'",
        ),
        (
            "http://127.0.0.1/v1",
            "a mock provider needs an explicit port, e.g. http://127.0.0.1:8101",
        ),
    ],
)
def test_mock_provider_url(url: str, message: str) -> None:
    text = MINIMAL.replace("http://127.0.0.1:18081/v1", url) + "\n"
    text = text.replace("    base_url:", "    mock: {}\n    base_url:")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (
        8,
        "providers[0].base_url",
        message,
    )


def test_mock_on_localhost_is_refused() -> None:
    # `up` binds mocks on 127.0.0.1; Envoy may resolve localhost to ::1 and miss them.
    text = MINIMAL.replace("127.0.0.1:18081", "localhost:18081")
    problem = only(problems_of(text.replace("    base_url:", "    mock: {}\n    base_url:")))
    assert "use host 127.0.0.1" in problem.message


def test_mock_that_does_not_serve_a_routed_model_is_a_warning() -> None:
    text = MINIMAL.replace("    base_url:", "    mock: {models: [other]}\n    base_url:")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.severity) == (
        7,
        "providers[0].mock.models",
        "warning",
    )
    assert problem.message == (
        "routes send model 'm' to mock provider 'alpha', which serves only: other"
    )


def test_two_listeners_on_one_port() -> None:
    text = MINIMAL.replace(
        "    port: 10000\n",
        "    port: 10000\n  - name: gw2\n    address: 0.0.0.0\n    port: 10000\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (7, "listeners[1].port")
    assert problem.message == (
        "listener 'gw2' on 0.0.0.0:10000 collides with listener 'gw' on 127.0.0.1:10000 "
        "(at listeners[0].port, line 4)"
    )


def test_listeners_on_different_addresses_share_a_port() -> None:
    text = MINIMAL.replace(
        "    port: 10000\n",
        "    port: 10000\n  - name: gw2\n    address: 127.0.0.2\n    port: 10000\n",
    )
    assert problems_of(text) == []


def test_listener_on_a_default_sluicegate_port() -> None:
    problem = only(problems_of(MINIMAL.replace("port: 10000", "port: 9901")))
    assert (problem.line, problem.key_path) == (4, "listeners[0].port")
    assert problem.message == (
        "listener 'gw' on 127.0.0.1:9901 collides with sluicegate.envoy_admin on "
        "127.0.0.1:9901 (default)"
    )


def test_sluicegate_addresses_collide_with_each_other() -> None:
    text = MINIMAL + "sluicegate:\n  xds: 127.0.0.1:7000\n  http: localhost:7000\n"
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (15, "sluicegate.http")
    assert "collides with sluicegate.xds on 127.0.0.1:7000 (at sluicegate.xds, line 14)" in (
        problem.message
    )


def test_mock_provider_port_collides_with_a_listener() -> None:
    text = MINIMAL.replace("18081", "10000").replace("    base_url:", "    mock: {}\n    base_url:")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (8, "providers[0].base_url")
    assert problem.message.startswith("mock provider 'alpha' on 127.0.0.1:10000 collides with")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope", "expected host:port, got 'nope'"),
        ("127.0.0.1:0", "port must be between 1 and 65535, got 0"),
        ("127.0.0.1:http", "expected a numeric port after ':', got '127.0.0.1:http'"),
        (":18000", "expected host:port with a host, got ':18000'"),
        ("::1:18000", "put an IPv6 address in brackets, like [::1]:18000; got '::1:18000'"),
    ],
)
def test_sluicegate_address_form(value: str, message: str) -> None:
    problem = only(problems_of(MINIMAL + f"sluicegate:\n  ext_proc: '{value}'\n"))
    assert (problem.line, problem.key_path, problem.message) == (
        14,
        "sluicegate.ext_proc",
        message,
    )


def test_sluicegate_addresses_may_be_hostnames() -> None:
    assert problems_of(MINIMAL + "sluicegate:\n  xds: sluicegate-xds.prod.svc:18000\n") == []


def test_listener_address_must_be_an_ip() -> None:
    problem = only(
        problems_of(MINIMAL.replace("    port: 10000", "    address: localhost\n    port: 1"))
    )
    assert (problem.line, problem.key_path) == (4, "listeners[0].address")
    assert problem.message.startswith("address must be an IP address")


def test_cross_checks_run_even_with_schema_errors_elsewhere() -> None:
    text = TWO_PROVIDERS.replace("port: 10000", "port: x").replace(
        "provider: beta", "provider: gama"
    )
    assert where(problems_of(text)) == [
        (4, "listeners[0].port"),
        (15, "routes[0].backends[1].provider"),
    ]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "http://127.0.0.1:10000/v1",
            "base_url points at listener 'gw' on 127.0.0.1:10000; "
            "requests would loop back into Envoy",
        ),
        (
            "http://localhost:9100",
            "base_url points at sluicegate.http on 127.0.0.1:9100; that is not an LLM provider",
        ),
    ],
)
def test_provider_must_not_point_at_our_own_sockets(url: str, message: str) -> None:
    problem = only(problems_of(MINIMAL.replace("http://127.0.0.1:18081/v1", url)))
    assert (problem.line, problem.key_path, problem.message) == (
        7,
        "providers[0].base_url",
        message,
    )


def test_remote_provider_on_a_listener_port_is_fine() -> None:
    text = MINIMAL.replace("http://127.0.0.1:18081/v1", "http://10.1.2.3:10000/v1")
    assert problems_of(text) == []
