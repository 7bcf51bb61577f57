"""Resilience settings in the generated resources, rule by rule (the goldens show all)."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import (
    previous_priorities_config_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from sluicegate.local_replies import FAST_LANE_REFUSALS
from sluicegate.model import Gateway, build_model
from sluicegate.xds.translate import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    translate,
)
from sluicegate.xds.translate.upstream_errors import UPSTREAM_ERRORS

from .cases import config_of, model_of
from .test_rules import hcm_of

HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def gateway(routes: str, providers: str = "", defaults: str = "") -> Gateway:
    document = (
        "version: 1\n"
        + (f"defaults:\n{defaults}\n" if defaults else "")
        + "listeners: [{name: main, port: 8080}]\nproviders:\n"
        "  - {name: a, base_url: 'http://10.0.0.1:8000/v1'}\n"
        "  - {name: b, base_url: 'http://10.0.0.2:8000/v1'}\n"
        "  - {name: c, base_url: 'http://10.0.0.3:8000/v1'}\n"
        f"{providers}routes:\n{routes}\n"
    )
    return build_model(config_of(document), {})


def cluster(ir: Gateway, name: str = "r") -> cluster_pb2.Cluster:
    (found,) = [c for c in translate(ir)[CLUSTER] if c.name == f"route-{name}"]
    assert isinstance(found, cluster_pb2.Cluster)
    return found


def action(ir: Gateway, name: str = "r") -> rc.RouteAction:
    config = translate(ir)[ROUTE][0]
    assert isinstance(config, route_pb2.RouteConfiguration)
    (found,) = {r.name: r for r in config.virtual_hosts[0].routes if r.name == name}.values()
    result: rc.RouteAction = found.route
    return result


def http_options(found: cluster_pb2.Cluster) -> Any:
    options = http_protocol_options_pb2.HttpProtocolOptions()
    assert found.typed_extension_protocol_options[HTTP_OPTIONS].Unpack(options)
    return options


ONE = "  - {name: r, models: [m], backends: [{provider: a}]}"
TWO = "  - {name: r, models: [m], backends: [{provider: a}, {provider: b}]}"


def test_route_timeout_is_never_envoys_15s_default() -> None:
    assert action(gateway(ONE)).timeout.seconds == 600
    unlimited = gateway(ONE, defaults="  timeouts: {total: 0}")
    found = action(unlimited)
    assert found.HasField("timeout") and found.timeout.ToMilliseconds() == 0


def test_attempt_timeouts_and_stream_idle_backstop() -> None:
    found = action(gateway(ONE, defaults="  timeouts: {first_byte: 1500ms, idle: 3s}"))
    assert found.retry_policy.per_try_timeout.ToMilliseconds() == 1500
    assert found.retry_policy.per_try_idle_timeout.ToMilliseconds() == 3000
    # The per-attempt idle timer replaces the listener's stream idle timeout here.
    assert found.HasField("idle_timeout") and found.idle_timeout.ToMilliseconds() == 0
    off = action(gateway(ONE, defaults="  timeouts: {first_byte: 0, idle: 0}"))
    assert not off.retry_policy.HasField("per_try_timeout")
    assert not off.retry_policy.HasField("per_try_idle_timeout")
    assert not off.HasField("idle_timeout")  # the listener's 5 min still applies


def test_connect_timeout_on_the_cluster() -> None:
    ir = gateway(ONE, defaults="  timeouts: {connect: 750ms}")
    assert cluster(ir).connect_timeout.ToMilliseconds() == 750


def test_retry_conditions_statuses_and_counts() -> None:
    policy = action(gateway(TWO)).retry_policy
    assert policy.retry_on == "connect-failure,reset,retriable-status-codes"
    assert list(policy.retriable_status_codes) == [429, 502, 503, 504]
    assert policy.num_retries.value == 2
    assert policy.retry_back_off.base_interval.ToMilliseconds() == 100
    assert policy.retry_back_off.max_interval.ToMilliseconds() == 2000
    (header,) = policy.rate_limited_retry_back_off.reset_headers
    assert (header.name, header.format) == ("retry-after", rc.RetryPolicy.SECONDS)
    assert policy.rate_limited_retry_back_off.max_interval.ToMilliseconds() == 10_000
    words = action(gateway(TWO, defaults="  retries: {retry_on: [reset, refused-stream]}"))
    assert words.retry_policy.retry_on == "reset,refused-stream"
    assert not words.retry_policy.retriable_status_codes


def test_retries_off_keeps_attempt_timeouts_and_says_zero() -> None:
    policy = action(gateway(TWO, defaults="  retries: {max_retries: 0}")).retry_policy
    assert policy.HasField("num_retries") and policy.num_retries.value == 0  # Envoy's is 1
    assert policy.per_try_timeout.seconds == 90
    assert not policy.HasField("retry_back_off") and not policy.retry_host_predicate
    nothing = gateway(
        TWO, defaults="  retries: {max_retries: 0}\n  timeouts: {first_byte: 0, idle: 0}"
    )
    assert not action(nothing).HasField("retry_policy")


def test_retry_after_can_be_ignored() -> None:
    policy = action(gateway(TWO, defaults="  retries: {retry_after_max: 0}")).retry_policy
    assert not policy.HasField("rate_limited_retry_back_off")


def test_retries_go_to_other_providers_then_other_priorities() -> None:
    single = action(gateway(ONE)).retry_policy
    assert not single.retry_host_predicate and not single.HasField("retry_priority")
    two = action(gateway(TWO)).retry_policy
    assert [p.name for p in two.retry_host_predicate] == [
        "envoy.retry_host_predicates.previous_hosts"
    ]
    assert two.host_selection_retry_max_attempts == 5
    assert not two.HasField("retry_priority")
    levels = gateway(
        "  - {name: r, models: [m], backends: [{provider: a}, {provider: b}, "
        "{provider: c, priority: 3}]}"
    )
    policy = action(levels).retry_policy
    assert policy.retry_priority.name == "envoy.retry_priorities.previous_priorities"
    config = previous_priorities_config_pb2.PreviousPrioritiesConfig()
    assert policy.retry_priority.typed_config.Unpack(config)
    assert config.update_frequency == 2  # both first-level providers, then level 1
    same = action(gateway(TWO, defaults="  retries: {other_provider: false}")).retry_policy
    assert not same.retry_host_predicate


def test_circuit_breakers_and_retry_budget() -> None:
    ir = gateway(
        TWO,
        defaults="  pool: {max_connections: 10, max_pending_requests: 5, max_requests: 20,"
        " max_connections_per_provider: 4}\n"
        "  retries: {budget: {percent: 12.5, min_concurrency: 2}}",
    )
    breakers = cluster(ir).circuit_breakers
    (limits,) = breakers.thresholds
    assert (limits.max_connections.value, limits.max_pending_requests.value) == (10, 5)
    assert limits.max_requests.value == 20
    assert limits.retry_budget.budget_percent.value == 12.5
    assert limits.retry_budget.min_retry_concurrency.value == 2
    assert limits.track_remaining
    (per_host,) = breakers.per_host_thresholds
    assert per_host.max_connections.value == 4
    assert not cluster(gateway(TWO)).circuit_breakers.per_host_thresholds  # 0: no limit


def test_outlier_detection_sets_every_enforcing_field() -> None:
    detection = cluster(gateway(TWO)).outlier_detection
    enforcing = {
        field.name: value.value
        for field, value in detection.ListFields()
        if field.name.startswith("enforcing_")
    }
    assert enforcing == {
        "enforcing_consecutive_5xx": 100,
        "enforcing_consecutive_gateway_failure": 100,
        "enforcing_consecutive_local_origin_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_local_origin_success_rate": 0,
        "enforcing_failure_percentage": 0,
        "enforcing_failure_percentage_local_origin": 0,
    }
    # Connection-level failures count as gateway failures unless asked to count apart.
    assert not detection.split_external_local_origin_errors
    split = cluster(
        gateway(TWO, defaults="  outlier_detection: {consecutive_local_origin_failure: 4}")
    ).outlier_detection
    assert split.split_external_local_origin_errors
    assert split.consecutive_local_origin_failure.value == 4
    assert split.enforcing_consecutive_local_origin_failure.value == 100
    assert detection.max_ejection_percent.value == 50
    assert (detection.base_ejection_time.seconds, detection.max_ejection_time.seconds) == (
        30, 300,
    )  # fmt: skip
    assert detection.successful_active_health_check_uneject_host.value is False
    off = cluster(gateway(TWO, defaults="  outlier_detection: {consecutive_5xx: 0}"))
    assert off.outlier_detection.enforcing_consecutive_5xx.value == 0
    assert not off.outlier_detection.HasField("consecutive_5xx")
    disabled = cluster(gateway(TWO, defaults="  outlier_detection: {enabled: false}"))
    assert not disabled.HasField("outlier_detection")


def test_pool_reuse_settings() -> None:
    options = http_options(cluster(gateway(ONE)))
    assert options.common_http_protocol_options.idle_timeout.seconds == 50
    assert not options.common_http_protocol_options.HasField("max_requests_per_connection")
    assert options.explicit_http_config.HasField("http_protocol_options")
    tuned = gateway(ONE, defaults="  pool: {idle_timeout: 0, max_requests_per_connection: 7}")
    common = http_options(cluster(tuned)).common_http_protocol_options
    assert common.HasField("idle_timeout") and common.idle_timeout.ToMilliseconds() == 0
    assert common.max_requests_per_connection.value == 7


def test_http2_provider_gets_http2_options_and_alpn() -> None:
    ir = model_of("http2_provider")
    found = cluster(ir, "h2")
    h2 = http_options(found).explicit_http_config.http2_protocol_options
    assert h2.max_concurrent_streams.value == 50
    assert h2.connection_keepalive.interval.seconds == 20
    assert h2.connection_keepalive.timeout.seconds == 2
    (match,) = found.transport_socket_matches
    context = tls_pb2.UpstreamTlsContext()
    assert match.transport_socket.typed_config.Unpack(context)
    assert list(context.common_tls_context.alpn_protocols) == ["h2"]
    no_pings = gateway(
        "  - {name: r, models: [m], backends: [{provider: h}], pool: {http2: "
        "{keepalive_interval: 0}}}",
        providers="  - {name: h, base_url: 'http://10.0.0.9/v1', protocol: http2}\n",
    )
    options = http_options(cluster(no_pings)).explicit_http_config.http2_protocol_options
    assert not options.HasField("connection_keepalive")


def test_health_checks_per_route_cluster_and_opt_out_per_endpoint() -> None:
    ir = model_of("health_check")
    (check,) = cluster(ir, "checked").health_checks
    assert check.http_health_check.path == "/v1/models"
    assert [(r.start, r.end) for r in check.http_health_check.expected_statuses] == [
        (200, 201), (401, 405),
    ]  # fmt: skip
    assert (check.interval.seconds, check.timeout.seconds) == (3, 1)
    assert check.no_traffic_interval.seconds == 3
    assert check.unhealthy_threshold.value == 3
    assert not cluster(ir, "plain").health_checks
    (assignment,) = [
        a for a in translate(ir)[ENDPOINT]
        if isinstance(a, endpoint_pb2.ClusterLoadAssignment) and a.cluster_name == "route-checked"
    ]  # fmt: skip
    configs = {
        ep.endpoint.hostname: ep.endpoint.health_check_config
        for level in assignment.endpoints
        for ep in level.lb_endpoints
    }
    assert configs["10.0.0.1:8000"].hostname == "10.0.0.1:8000"
    assert not configs["10.0.0.1:8000"].disable_active_health_check
    assert configs["10.0.0.2:8000"].disable_active_health_check


def test_upstream_failures_get_their_own_codes_before_the_status_mappers() -> None:
    reply = hcm_of(translate(model_of("single_provider"))[LISTENER][0]).local_reply_config
    # The JSON pass-through, then (Envoy routing, this case's default lane) the fast
    # lane's refusals, which every later mapper follows.
    mappers = list(reply.mappers)
    mappers = mappers[:1] + mappers[1 + len(FAST_LANE_REFUSALS) :]
    # After the JSON pass-through: a drill's abort keeps its status (flag FI).
    assert mappers[1].filter.response_flag_filter.flags == ["FI"]
    assert not mappers[1].HasField("status_code")
    upstream = mappers[2 : 3 + len(UPSTREAM_ERRORS)]  # the overload reply, then these
    codes = [m.body_format_override.json_format["error"]["code"] for m in upstream]
    assert codes == [
        "gateway_overloaded",  # Envoy's overload manager refused it: no provider involved
        "ext_proc_unavailable",  # an ext_proc failure is no provider's either
        "upstream_timeout", "upstream_idle_timeout", "deadline_exceeded",
        "stream_idle_timeout", "upstream_connect_timeout", "upstream_overflow",
        "no_healthy_upstream", "upstream_connect_error", "upstream_reset",
    ]  # fmt: skip
    assert all(m.status_code.value in (503, 504) for m in upstream)
    assert all(not m.filter.HasField("status_code_filter") for m in upstream)
    by_status = mappers[2 + len(upstream) :]
    assert all(m.filter.WhichOneof("filter_specifier") != "extension_filter" for m in by_status)
    assert all(m.filter.WhichOneof("filter_specifier") != "response_flag_filter" for m in by_status)
    overflow = upstream[codes.index("upstream_overflow")]
    assert overflow.filter.response_flag_filter.flags == ["UO"]
    # A full pool is a refusal for capacity, told apart from a provider's 503.
    assert [(h.header.key, h.header.value) for h in overflow.headers_to_add] == [
        ("retry-after", "1"),
        ("x-sluicegate-refusal", "upstream_overflow"),
    ]
    # A provider that fails is not a refusal.
    for mapper in upstream:
        if mapper is not overflow and mapper is not upstream[0]:
            assert "x-sluicegate-refusal" not in [h.header.key for h in mapper.headers_to_add]
