"""The rules translation must keep, checked one by one (goldens show the whole picture)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    header_mutation_pb2 as early_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.config import Config, normalize_path_prefix
from sluicegate.model import Gateway, build_model, match_order
from sluicegate.xds.resource import EXTENSION_CONFIG, PUSH_ORDER
from sluicegate.xds.translate import (
    CLUSTER,
    CREDENTIALS_FILTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    SECRET,
    models_list_json,
    resource_name,
    translate,
)
from sluicegate.xds.translate.forwarded_headers import FORWARDED_HEADERS_FILTER

from .cases import config_of, exact_lane_model_of, model_of

Mode = processing_mode_pb2.ProcessingMode


def doc(providers: str, routes: str, extra: str = "") -> str:
    """A config whose requests the routing stage routes (`admission.lane: exact`: these
    tests read its translation; the fast lane's has its golden cases)."""
    extra = extra or "admission: {lane: exact}\n"
    return f"version: 1\n{extra}listeners: [{{name: main, port: 8080}}]\n" + (
        f"providers:\n{providers}\nroutes:\n{routes}\n"
    )


def one_route(base_url: str, key: str | None = None, **provider: Any) -> Gateway:
    fields = ", ".join(f"{k}: {json.dumps(v)}" for k, v in provider.items())
    document = doc(
        f'  - {{name: p, base_url: "{base_url}"{", " + fields if fields else ""}}}',
        "  - {name: r, models: [m], backends: [{provider: p}]}",
    )
    return build_model(config_of(document), {"p": key})


def only(resources: list[Message]) -> Message:
    assert len(resources) == 1
    return resources[0]


def hcm_of(listener: Message) -> hcm_pb2.HttpConnectionManager:
    assert isinstance(listener, listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[-1].typed_config.Unpack(hcm)
    return hcm


def ext_proc_of(typed_config: Any) -> ext_proc_pb2.ExternalProcessor:
    config = ext_proc_pb2.ExternalProcessor()
    assert typed_config.Unpack(config)
    return config


def protocol_options(cluster: Message) -> http_protocol_options_pb2.HttpProtocolOptions:
    assert isinstance(cluster, cluster_pb2.Cluster)
    options = http_protocol_options_pb2.HttpProtocolOptions()
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert cluster.typed_extension_protocol_options[key].Unpack(options)
    return options


def routes_of(ir: Gateway) -> list[Any]:
    config = translate(ir)[ROUTE][0]
    assert isinstance(config, route_pb2.RouteConfiguration)
    return list(config.virtual_hosts[0].routes)


def is_stream_twin(route: Any) -> bool:
    return any(h.name == wire.STREAM_HEADER for h in route.match.headers)


def model_routes(ir: Gateway) -> list[Any]:
    """The plain model routes (each follows its stream twin, streams.py)."""
    return [r for r in routes_of(ir) if r.HasField("route") and not is_stream_twin(r)]


# --- listeners -------------------------------------------------------------------------


def test_listener_buffer_limit_is_the_request_body_limit() -> None:
    ir = model_of("limits")
    listener = only(translate(ir)[LISTENER])
    assert isinstance(listener, listener_pb2.Listener)
    assert listener.name == "listener-main"
    assert listener.per_connection_buffer_limit_bytes.value == 1_048_576


@pytest.mark.parametrize(
    ("case", "remote"), [("single_provider", True), ("sidecar", False)]
)
def test_use_remote_address_follows_the_role(case: str, remote: bool) -> None:
    hcm = hcm_of(only(translate(model_of(case))[LISTENER]))
    assert hcm.use_remote_address.value is remote


def test_connection_manager_timeouts_and_rds() -> None:
    hcm = hcm_of(only(translate(exact_lane_model_of("single_provider"))[LISTENER]))
    assert hcm.stream_idle_timeout.seconds == 300
    # limits.request_timeout (60 s) + the queue margin + the ext_proc timeout; the timer
    # stops once the request is in, so it never cuts a generation (test_client_limits.py).
    assert hcm.request_timeout.ToSeconds() == 60 + 2 + 5
    assert hcm.request_headers_timeout.ToSeconds() == 10
    assert hcm.rds.route_config_name == "routes-main"
    assert hcm.rds.config_source.HasField("ads")
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.ext_proc",
        # Usage readers (usage.py): no Python one without token limits.
        "envoy.filters.http.json_to_metadata",
        "sluicegate.stream_usage",
        "envoy.filters.http.sse_to_metadata",
        "envoy.filters.http.fault",  # after ext_proc: drills see the model's route
        "sluicegate.error_body",  # wraps a provider's non-JSON error (error_bodies.py)
        "envoy.filters.http.router",
    ]


def test_routing_stage_ext_proc() -> None:
    hcm = hcm_of(only(translate(model_of("limits"))[LISTENER]))
    config = ext_proc_of(hcm.http_filters[0].typed_config)
    assert config.grpc_service.envoy_grpc.cluster_name == wire.EXT_PROC_CLUSTER
    metadata = [(m.key, m.value) for m in config.grpc_service.initial_metadata]
    assert metadata == [(wire.STAGE_METADATA_KEY, wire.STAGE_ROUTING)]
    mode = config.processing_mode
    # SEND: with SKIP, Envoy routes before the body arrives (see _ext_proc.py).
    assert mode.request_header_mode == Mode.SEND
    assert mode.request_body_mode == Mode.BUFFERED
    assert mode.response_header_mode == Mode.SKIP
    assert mode.response_body_mode == Mode.NONE
    assert config.message_timeout.ToMilliseconds() == 2000
    assert config.max_message_timeout.ToMilliseconds() == 20_000
    assert not config.failure_mode_allow
    assert not config.allow_mode_override


def test_client_model_and_usage_headers_are_removed_before_routing() -> None:
    hcm = hcm_of(only(translate(model_of("single_provider"))[LISTENER]))
    (extension,) = hcm.early_header_mutation_extensions
    mutation = early_pb2.HeaderMutation()
    assert extension.typed_config.Unpack(mutation)
    model, observer, stream, client, envoy_headers = mutation.mutations
    assert model.remove == wire.MODEL_HEADER
    # Only Envoy's key check names the client (the fast lane).
    assert client.remove == wire.CLIENT_HEADER
    # Only the admission stage may say who reads a request's usage.
    assert observer.remove == wire.USAGE_HEADER
    # Only the routing stage may send a request to a route's stream twin (first_token).
    assert stream.remove == wire.STREAM_HEADER
    # Clients cannot steer retries or timeouts with x-envoy-* request headers.
    assert envoy_headers.remove_on_match.key_matcher.prefix == "x-envoy-"


def test_local_replies_pass_json_through_first_and_default_to_openai_errors() -> None:
    reply = hcm_of(only(translate(model_of("single_provider"))[LISTENER])).local_reply_config
    first = reply.mappers[0]
    assert first.filter.extension_filter.name == "envoy.access_loggers.extension_filters.cel"
    assert first.body_format_override.text_format_source.inline_string == "%LOCAL_REPLY_BODY%"
    codes = {
        m.filter.status_code_filter.comparison.value.default_value: m.body_format_override
        for m in reply.mappers
        if m.filter.HasField("status_code_filter")
    }
    assert codes[413].json_format["error"]["code"] == "request_too_large"
    assert codes[503].json_format["error"]["code"] == "upstream_unavailable"
    assert codes[504].json_format["error"]["code"] == "upstream_timeout"
    assert reply.body_format.json_format["error"]["type"] == "server_error"
    assert reply.body_format.content_type == "application/json"


# --- routes ----------------------------------------------------------------------------


def test_model_routes_set_their_deadline_and_rewrite_host() -> None:
    routes = model_routes(exact_lane_model_of("weighted_keys"))
    assert len(routes) == 2  # one per model
    for route in routes:
        # Always written: Envoy's default (15 s) would cut long streams.
        assert route.route.HasField("timeout") and route.route.timeout.ToSeconds() == 600
        assert route.route.auto_host_rewrite.value
        assert route.route.cluster == "route-chat"
        assert route.match.prefix == "/v1/"
        (header,) = route.match.headers
        assert header.name == wire.MODEL_HEADER
    assert [r.match.headers[0].string_match.exact for r in routes] == ["gpt-4o", "gpt-4o-mini"]


def test_every_model_route_follows_its_stream_twin() -> None:
    routes = [r for r in routes_of(exact_lane_model_of("weighted_keys")) if r.HasField("route")]
    assert [is_stream_twin(r) for r in routes] == [True, False, True, False]
    for twin, plain in zip(routes[::2], routes[1::2], strict=True):
        assert list(twin.match.headers)[:-1] == list(plain.match.headers)
        assert twin.route.cluster == plain.route.cluster and twin.name == plain.name


def test_route_order_listing_then_models_then_fallbacks() -> None:
    routes = routes_of(exact_lane_model_of("rewrite"))
    kinds = [
        "listing" if r.match.path else "model" if r.HasField("route") else "fallback"
        for r in routes
    ]
    assert kinds == sorted(kinds, key=["listing", "model", "fallback"].index)
    fallbacks = [r for r in routes if r.direct_response.status == 404]
    assert [r.match.prefix for r in fallbacks] == ["/openai/", "/v1/", "/"]
    disabled = [EXT_PROC in r.typed_per_filter_config for r in fallbacks]
    # Under a route prefix ext_proc must run (it routes by model); elsewhere nothing to do.
    assert disabled == [False, False, True]


EXT_PROC = "envoy.filters.http.ext_proc"


def test_models_listing_skips_ext_proc_and_is_json() -> None:
    ir = exact_lane_model_of("weighted_keys")
    listing = routes_of(ir)[0]
    assert listing.match.path == "/v1/models"
    assert [(h.name, h.string_match.exact) for h in listing.match.headers] == [(":method", "GET")]
    assert listing.direct_response.body.inline_string.encode() == models_list_json(ir)
    per_route = ext_proc_pb2.ExtProcPerRoute()
    assert listing.typed_per_filter_config[EXT_PROC].Unpack(per_route)
    assert per_route.disabled
    headers = {h.header.key: h.header.value for h in listing.response_headers_to_add}
    assert headers == {"content-type": "application/json"}


def test_root_prefix_route_has_no_separate_catch_all() -> None:
    document = doc(
        "  - {name: p, base_url: 'http://10.0.0.1/v1'}",
        "  - {name: r, path_prefix: /, models: [m], backends: [{provider: p}]}",
    )
    fallbacks = [
        r
        for r in routes_of(build_model(config_of(document), {}))
        if r.direct_response.status == 404
    ]
    assert [(r.match.prefix, EXT_PROC in r.typed_per_filter_config) for r in fallbacks] == [
        ("/", False)
    ]


@pytest.mark.parametrize(
    ("base_url", "route_prefix", "rewrite"),
    [
        ("http://10.0.0.1/v1", "/v1/", None),  # same prefix: nothing to do
        ("http://10.0.0.1/v1/", "/v1", None),  # both normalise to /v1/
        ("http://10.0.0.1", "/v1/", "/"),
        ("http://10.0.0.1/api/paas/v4", "/v1/", "/api/paas/v4/"),
        ("http://10.0.0.1/v1", "/openai", "/v1/"),
    ],
)
def test_prefix_rewrite_when_providers_share_a_prefix(
    base_url: str, route_prefix: str, rewrite: str | None
) -> None:
    document = doc(
        f"  - {{name: p, base_url: '{base_url}'}}",
        f"  - {{name: r, path_prefix: '{route_prefix}', models: [m], backends: [{{provider: p}}]}}",
    )
    (route,) = model_routes(build_model(config_of(document), {}))
    assert route.match.prefix == normalize_path_prefix(route_prefix)
    assert (route.route.prefix_rewrite or None) == rewrite


def test_differing_prefixes_leave_the_path_to_the_attempt_stage() -> None:
    ir = model_of("rewrite")
    mixed = next(r for r in model_routes(ir) if r.name == "mixed")
    assert mixed.route.prefix_rewrite == ""
    meta = mixed.metadata.filter_metadata[wire.METADATA_NAMESPACE]
    assert dict(meta) == {"route": "mixed", wire.META_PATH_PREFIX: "/v1/"}


# --- clusters --------------------------------------------------------------------------


def clusters_by_name(ir: Gateway) -> dict[str, cluster_pb2.Cluster]:
    found = {}
    for cluster in translate(ir)[CLUSTER]:
        assert isinstance(cluster, cluster_pb2.Cluster)
        found[cluster.name] = cluster
    return found


def upstream_filters(cluster: cluster_pb2.Cluster) -> list[str]:
    return [f.name for f in protocol_options(cluster).http_filters]


def test_attempt_stage_only_where_a_route_needs_rewriting() -> None:
    clusters = clusters_by_name(model_of("rewrite"))
    with_attempt = [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_proc",
        FORWARDED_HEADERS_FILTER,
        "envoy.filters.http.upstream_codec",
    ]

    def without_keys(name: str) -> list[str]:  # the credentials filter: tests/credentials
        return [f for f in upstream_filters(clusters[name]) if f != CREDENTIALS_FILTER]

    assert without_keys("route-mixed") == with_attempt  # prefixes differ
    assert without_keys("route-renamed") == with_attempt  # model_map
    assert without_keys("route-bare") == [with_attempt[0], *with_attempt[2:]]
    attempt = next(
        f
        for f in protocol_options(clusters["route-mixed"]).http_filters
        if f.name == "envoy.filters.http.ext_proc"
    )
    config = ext_proc_of(attempt.typed_config)
    assert [(m.key, m.value) for m in config.grpc_service.initial_metadata] == [
        (wire.STAGE_METADATA_KEY, wire.STAGE_ATTEMPT)
    ]
    assert wire.UPSTREAM_HOST_METADATA_ATTRIBUTE in config.request_attributes
    assert config.processing_mode.request_header_mode == Mode.SEND
    assert config.processing_mode.request_body_mode == Mode.BUFFERED
    assert not config.failure_mode_allow


def header_mutations(cluster: cluster_pb2.Cluster) -> list[tuple[str, str]]:
    mutation = header_mutation_pb2.HeaderMutation()
    assert protocol_options(cluster).http_filters[0].typed_config.Unpack(mutation)
    return [
        ("remove", m.remove) if m.remove else ("set", m.append.header.key)
        for m in mutation.mutations.request_mutations
    ]


@pytest.mark.parametrize(
    ("case", "cluster"), [("weighted_keys", "route-chat"), ("no_key", "route-local")]
)
def test_client_authorization_is_removed_and_provider_header_set(case: str, cluster: str) -> None:
    # Keys come from the credentials filter next (SDS; tests/credentials), never from here.
    assert header_mutations(clusters_by_name(model_of(case))[cluster]) == [
        ("remove", "authorization"),
        ("remove", wire.PROVIDER_HEADER),
        ("set", wire.PROVIDER_HEADER),
    ]


def test_ip_hosts_use_eds_and_host_names_use_dns() -> None:
    resources = translate(model_of("dns_tls"))
    clusters = clusters_by_name(model_of("dns_tls"))
    chat, lab = clusters["route-chat"], clusters["route-lab"]
    assert chat.cluster_type.name == "envoy.cluster.dns"
    assert chat.load_assignment.cluster_name == "route-chat"
    assert lab.type == cluster_pb2.Cluster.EDS
    assert lab.eds_cluster_config.eds_config.HasField("ads")
    assert [resource_name(ENDPOINT, a) for a in resources[ENDPOINT]] == ["route-lab"]


def test_mixed_ip_and_name_route_is_dns() -> None:
    cluster = clusters_by_name(model_of("no_key"))["route-local"]  # 127.0.0.1 and localhost
    assert cluster.cluster_type.name == "envoy.cluster.dns"
    assert not translate(model_of("no_key"))[ENDPOINT]


def test_cluster_basics() -> None:
    cluster = clusters_by_name(model_of("single_provider"))["route-chat"]
    assert cluster.connect_timeout.seconds == 3  # timeouts.connect's default
    assert cluster.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    assert cluster.common_lb_config.HasField("locality_weighted_lb_config")
    assert protocol_options(cluster).explicit_http_config.HasField("http_protocol_options")


def tls_contexts(cluster: cluster_pb2.Cluster) -> dict[str, tls_pb2.UpstreamTlsContext]:
    contexts = {}
    for match in cluster.transport_socket_matches:
        context = tls_pb2.UpstreamTlsContext()
        assert match.transport_socket.typed_config.Unpack(context)
        contexts[match.match["provider"]] = context
    return contexts


def test_tls_sni_and_verification() -> None:
    clusters = clusters_by_name(model_of("dns_tls"))
    chat = tls_contexts(clusters["route-chat"])
    assert chat["openai"].sni == "api.openai.com"
    validation = chat["openai"].common_tls_context.validation_context
    assert validation.trusted_ca.filename == "/etc/ssl/certs/ca-certificates.crt"
    (san,) = validation.match_typed_subject_alt_names
    assert (san.san_type, san.matcher.exact) == (
        common_pb2.SubjectAltNameMatcher.DNS,
        "api.openai.com",
    )
    private = chat["private"]
    assert private.sni == "gateway.internal.example"
    validation = private.common_tls_context.validation_context
    assert validation.trusted_ca.filename == "/etc/sluicegate/private-ca.pem"
    assert validation.match_typed_subject_alt_names[0].matcher.exact == "gateway.internal.example"
    lab = tls_contexts(clusters["route-lab"])["lab"]
    assert lab.sni == ""  # an IP address is never sent as SNI
    assert not lab.common_tls_context.HasField("validation_context")  # insecure_skip_verify


def test_tls_ip_host_verifies_ip_san() -> None:
    ir = one_route("https://192.0.2.7:8443/v1")
    context = tls_contexts(clusters_by_name(ir)["route-r"])["p"]
    assert context.sni == ""
    (san,) = context.common_tls_context.validation_context.match_typed_subject_alt_names
    assert (san.san_type, san.matcher.exact) == (
        common_pb2.SubjectAltNameMatcher.IP_ADDRESS,
        "192.0.2.7",
    )


def test_plain_providers_have_no_transport_socket_match() -> None:
    cluster = clusters_by_name(model_of("single_provider"))["route-chat"]
    assert not cluster.transport_socket_matches
    assert cluster.transport_socket.name == "envoy.transport_sockets.raw_buffer"


# --- endpoints -------------------------------------------------------------------------


def assignment(ir: Gateway, name: str) -> endpoint_pb2.ClusterLoadAssignment:
    for item in translate(ir)[ENDPOINT]:
        assert isinstance(item, endpoint_pb2.ClusterLoadAssignment)
        if item.cluster_name == name:
            return item
    raise AssertionError(name)


def test_weights_are_locality_weights_and_endpoint_weights() -> None:
    cla = assignment(model_of("weighted_keys"), "route-chat")
    summary = [
        (e.locality.zone, e.priority, e.load_balancing_weight.value,
         e.lb_endpoints[0].load_balancing_weight.value)
        for e in cla.endpoints
    ]  # fmt: skip
    assert summary == [("alpha", 0, 3, 3), ("beta", 0, 1, 1)]


def test_priorities_are_made_dense_and_sorted() -> None:
    cla = assignment(model_of("priority_fallback"), "route-chat")
    assert [(e.locality.zone, e.priority) for e in cla.endpoints] == [("primary", 0), ("spare", 1)]


def test_endpoint_metadata_carries_what_attempt_filters_need() -> None:
    cla = assignment(model_of("rewrite"), "route-mixed")
    meta = {
        e.locality.zone: dict(
            e.lb_endpoints[0].metadata.filter_metadata[wire.METADATA_NAMESPACE].items()
        )
        for e in cla.endpoints
    }
    assert meta["openai-like"] == {"provider": "openai-like", "path_prefix": "/v1"}  # no key
    zhipu = meta["zhipu"]
    assert zhipu["path_prefix"] == "/api/paas/v4"
    # Only this route's models; "unrelated" from the provider's map stays out.
    assert dict(zhipu["model_map"]) == {"chat-default": "glm-4"}


def test_endpoint_address_and_hostname() -> None:
    cla = assignment(model_of("weighted_keys"), "route-chat")
    endpoints = [e.lb_endpoints[0].endpoint for e in cla.endpoints]
    found = [
        (e.address.socket_address.address, e.address.socket_address.port_value, e.hostname)
        for e in endpoints
    ]
    assert found == [("10.0.0.1", 8000, "10.0.0.1:8000"), ("10.0.0.2", 80, "10.0.0.2")]


def test_ipv6_host_authority_has_brackets() -> None:
    ir = one_route("http://[2001:db8::1]:8000/v1")
    provider = ir.providers[0]
    assert provider.host == "2001:db8::1" and provider.is_ip
    assert provider.authority == "[2001:db8::1]:8000"


# --- Model rules ---------------------------------------------------------------------


def test_api_key_is_trimmed_and_becomes_a_bearer_header() -> None:
    provider = model_of("weighted_keys").providers[1]
    assert provider.name == "beta"
    assert provider.authorization == "Bearer sk-fake-beta"  # file key's newline dropped


@pytest.mark.parametrize("key", [None, "", "   "])
def test_missing_key_means_no_authorization(key: str | None) -> None:
    assert one_route("http://10.0.0.1/v1", key).providers[0].authorization is None


def test_same_model_under_two_prefixes_is_fine() -> None:
    gateway = model_of("rewrite")
    served = gateway.served
    assert [(r.name, r.path_prefix) for r in served["chat-default"]] == [
        ("mixed", "/v1/"),
        ("renamed", "/openai/"),
    ]
    assert (
        gateway.route_for("chat-default", "/openai/chat/completions") == served["chat-default"][1]
    )
    assert served["chat-default"][1].cluster_name == "route-renamed"
    assert list(served) == sorted(served)


def test_model_routes_follow_the_match_order() -> None:
    gateway = exact_lane_model_of("rewrite")
    pushed = [(r.name, r.match.headers[0].string_match.exact) for r in model_routes(gateway)]
    ordered = [
        (route.name, model) for route, models in match_order(gateway.routes) for model in models
    ]
    assert (
        pushed
        == ordered
        == [
            ("mixed", "chat-default"),
            ("renamed", "chat-default"),
            ("renamed", "glm-4"),
            ("bare", "tiny"),
        ]
    )


def test_models_list_json_is_openai_shaped() -> None:
    ir = model_of("rewrite")
    body = json.loads(models_list_json(ir))
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["chat-default", "glm-4", "tiny"]
    assert body["data"][0] == {
        "id": "chat-default",
        "object": "model",
        "created": 0,
        "owned_by": "sluicegate",
    }
    assert [m["id"] for m in json.loads(models_list_json(ir, "/openai"))["data"]] == [
        "chat-default",
        "glm-4",
    ]


def test_every_type_url_is_present_and_names_are_sorted_and_unique() -> None:
    resources = translate(model_of("rewrite"))
    assert set(resources) == set(PUSH_ORDER)
    assert set(resources) == {SECRET, EXTENSION_CONFIG, LISTENER, ROUTE, CLUSTER, ENDPOINT}
    for type_url, items in resources.items():
        names = [resource_name(type_url, item) for item in items]
        assert names == sorted(set(names)), type_url
    route_configs = translate(model_of("several_listeners"))[ROUTE]
    assert [resource_name(ROUTE, r) for r in route_configs] == ["routes-main", "routes-second"]


def test_fault_drill_is_per_route_and_exact_to_the_millionth() -> None:
    config = Config.model_validate(
        {
            "version": 1,
            "listeners": [{"name": "gw", "port": 10000}],
            "providers": [{"name": "a", "base_url": "http://127.0.0.1:18081/v1"}],
            "routes": [
                {"name": "drill", "models": ["m"], "backends": [{"provider": "a"}],
                 "fault": {"delay": {"percent": 0.1, "duration": "250ms"},
                           "abort": {"percent": 50, "status": 503}}},
                {"name": "calm", "models": ["n"], "backends": [{"provider": "a"}]},
            ],
        }
    )  # fmt: skip
    (route_config,) = translate(build_model(config, {}))[ROUTE]
    by_name = {r.name: r for r in route_config.virtual_hosts[0].routes}
    assert "envoy.filters.http.fault" not in by_name["calm"].typed_per_filter_config
    fault = fault_pb2.HTTPFault()
    assert by_name["drill"].typed_per_filter_config["envoy.filters.http.fault"].Unpack(fault)
    assert (fault.delay.percentage.numerator, fault.delay.fixed_delay.ToMilliseconds()) == (
        1000,
        250,
    )
    assert (fault.abort.http_status, fault.abort.percentage.numerator) == (503, 500_000)
