"""Where provider keys go in the translated resources: only into SDS Secrets.

The real-Envoy proofs (config_dump, per-provider keys on retries, rotation) are in
test_e2e.py; these check the resources themselves.
"""

from __future__ import annotations

from typing import Any

import pytest
from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.http.composite.v3 import composite_pb2
from envoy.extensions.filters.http.credential_injector.v3 import credential_injector_pb2
from envoy.extensions.http.injected_credentials.generic.v3 import generic_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import http_inputs_pb2

from sluicegate import wire
from sluicegate.model import Gateway, build_model
from sluicegate.xds.server import Snapshot
from sluicegate.xds.translate import (
    CLUSTER,
    CREDENTIALS_FILTER,
    SECRET,
    secret_name,
    translate,
)
from sluicegate.xds.translate.forwarded_headers import FORWARDED_HEADERS_FILTER
from tests.translate.cases import config_of

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

DOC = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: alpha, base_url: "http://10.0.0.1:8000/v1", api_key: {env: A}}
  - {name: beta, base_url: "http://10.0.0.2/api/v4", api_key: {env: B}, model_map: {m: m-beta}}
  - {name: plain, base_url: "http://10.0.0.3/v1"}
  - {name: unused, base_url: "http://10.0.0.4/v1", api_key: {env: U}}
routes:
  - name: mixed
    models: [m]
    backends: [{provider: alpha, weight: 3}, {provider: beta}, {provider: plain, priority: 1}]
  - {name: solo, models: [s], backends: [{provider: alpha}]}
  - {name: keyless, models: [k], backends: [{provider: plain}]}
"""
KEYS: dict[str, str | None] = {
    "alpha": "sk-alpha-SECRET",
    "beta": "sk-beta-SECRET",
    "plain": None,
    "unused": "sk-unused-SECRET",
}


def ir_with(keys: dict[str, str | None] = KEYS) -> Gateway:
    return build_model(config_of(DOC), keys)


def upstream_filters(cluster: Any) -> list[Any]:
    options = http_protocol_options_pb2.HttpProtocolOptions()
    assert cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Unpack(options)
    return list(options.http_filters)


def clusters() -> dict[str, Any]:
    return {c.name: c for c in translate(ir_with())[CLUSTER]}


def injectors(cluster: Any) -> dict[str, credential_injector_pb2.CredentialInjector]:
    """Provider name -> the credential_injector the credentials filter runs for it."""
    (item,) = [f for f in upstream_filters(cluster) if f.name == CREDENTIALS_FILTER]
    wrapper = extension_matcher_pb2.ExtensionWithMatcher()
    assert item.typed_config.Unpack(wrapper)
    assert wrapper.extension_config.typed_config.Is(composite_pb2.Composite.DESCRIPTOR)
    tree = wrapper.xds_matcher.matcher_tree
    header_input = http_inputs_pb2.HttpRequestHeaderMatchInput()
    assert tree.input.typed_config.Unpack(header_input)
    assert header_input.header_name == wire.PROVIDER_HEADER
    assert not wrapper.xds_matcher.HasField("on_no_match")  # a keyless provider gets nothing
    found = {}
    for provider, on_match in tree.exact_match_map.map.items():
        action = composite_pb2.ExecuteFilterAction()
        assert on_match.action.typed_config.Unpack(action)
        injector = credential_injector_pb2.CredentialInjector()
        assert action.typed_config.typed_config.Unpack(injector)
        found[provider] = injector
    return found


def test_no_key_in_any_resource_but_the_secrets() -> None:
    resources = translate(ir_with())
    secrets = [s.SerializeToString() for s in resources[SECRET]]
    assert any(b"sk-alpha-SECRET" in s for s in secrets)
    for type_url, items in resources.items():
        if type_url == SECRET:
            continue
        for item in items:
            data = item.SerializeToString(deterministic=True)
            assert b"SECRET" not in data, (type_url, item)


def test_one_secret_per_keyed_provider_a_route_uses() -> None:
    secrets = translate(ir_with())[SECRET]
    assert [(s.name, s.generic_secret.secret.inline_string) for s in secrets] == [
        ("sluicegate-key-alpha", "Bearer sk-alpha-SECRET"),
        ("sluicegate-key-beta", "Bearer sk-beta-SECRET"),
    ]  # plain has no key; unused serves no route


def test_each_keyed_provider_of_a_route_gets_its_own_injector() -> None:
    found = injectors(clusters()["route-mixed"])
    assert sorted(found) == ["alpha", "beta"]  # plain: no match, so no Authorization
    for provider, injector in found.items():
        assert injector.overwrite  # retries share one header map
        assert not injector.allow_request_without_credential  # fail closed
        generic = generic_pb2.Generic()
        assert injector.credential.typed_config.Unpack(generic)
        assert generic.header == "authorization"
        assert generic.credential.name == f"{wire.KEY_SECRET_PREFIX}{provider}"
        assert generic.credential.sds_config.HasField("ads")


def test_keyless_route_has_no_credentials_filter() -> None:
    names = [f.name for f in upstream_filters(clusters()["route-keyless"])]
    assert names == [
        "envoy.filters.http.header_mutation",
        FORWARDED_HEADERS_FILTER,
        "envoy.filters.http.upstream_codec",
    ]


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        (
            "route-mixed",  # model_map: the attempt stage runs, and before the key is set
            [
                "envoy.filters.http.header_mutation",
                "envoy.filters.http.ext_proc",
                CREDENTIALS_FILTER,
                FORWARDED_HEADERS_FILTER,
                "envoy.filters.http.upstream_codec",
            ],
        ),
        (
            "route-solo",
            [
                "envoy.filters.http.header_mutation",
                CREDENTIALS_FILTER,
                FORWARDED_HEADERS_FILTER,
                "envoy.filters.http.upstream_codec",
            ],
        ),
    ],
)
def test_upstream_filter_order(route: str, expected: list[str]) -> None:
    # header_mutation sets the provider header the credentials filter matches on; the
    # attempt stage comes before the key, so no key is ever sent to the ext_proc server.
    assert [f.name for f in upstream_filters(clusters()[route])] == expected


def test_secret_names_are_per_provider() -> None:
    ir = ir_with()
    assert [secret_name(p) for p in ir.providers] == [
        "sluicegate-key-alpha",
        "sluicegate-key-beta",
        "sluicegate-key-plain",
        "sluicegate-key-unused",
    ]


def test_a_rotated_key_changes_only_its_secret() -> None:
    before = Snapshot.from_resources(translate(ir_with()))
    after = Snapshot.from_resources(translate(ir_with({**KEYS, "beta": "sk-beta-ROTATED"})))
    changed = {t for t in before.type_urls() if before.version(t) != after.version(t)}
    assert changed == {SECRET}
    assert before.get(SECRET, "sluicegate-key-alpha") == after.get(SECRET, "sluicegate-key-alpha")
