"""Outlier detection: eject a provider (a host of the route's cluster) that keeps failing.

Every `enforcing_*` field is written: Envoy's defaults leave gateway-failure and
failure-percentage detection off (0) and success-rate detection on (100), which on a
route of two or three providers ejects on statistics too thin to mean anything. Here the
three consecutive-failure detectors are on (100) unless their count is 0, the
statistical ones off (0).

`split_external_local_origin_errors` is off unless `consecutive_local_origin_failure` is
set: failures Envoy sees itself (connect failure, reset, attempt timeout) then count as
503/504, toward consecutive_gateway_failure and consecutive_5xx. In split mode Envoy
reports every connection it gets to a provider as a local-origin success, which resets
that count: a provider that accepts connections and hangs is then never ejected while
few clients call it (checked on Envoy 1.40; tests/resilience/test_outlier.py).

An ejection lasts base_ejection_time times the number of ejections of that provider,
capped at max_ejection_time. Envoy ejects only while (ejected + 1) / providers stays within
max_ejection_percent (validation warns when that excludes everyone).

`successful_active_health_check_uneject_host` is off: a provider whose /models answers
while its completions fail must not be let back in by the next health check.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import outlier_detection_pb2
from envoy.config.common.matcher.v3 import matcher_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import wrappers_pb2

from sluicegate.model import Route

from ._proto import duration_ms

ENFORCED = 100


def outlier_detection(route: Route) -> outlier_detection_pb2.OutlierDetection | None:
    settings = route.settings.outlier_detection
    if not settings.enabled:
        return None

    def u32(value: int) -> wrappers_pb2.UInt32Value:
        return wrappers_pb2.UInt32Value(value=value)

    def enforcing(count: int | None) -> wrappers_pb2.UInt32Value:
        return u32(ENFORCED if count else 0)

    split = settings.consecutive_local_origin_failure is not None

    detection = outlier_detection_pb2.OutlierDetection(
        enforcing_consecutive_5xx=enforcing(settings.consecutive_5xx),
        enforcing_consecutive_gateway_failure=enforcing(settings.consecutive_gateway_failure),
        split_external_local_origin_errors=split,
        enforcing_consecutive_local_origin_failure=enforcing(
            settings.consecutive_local_origin_failure if split else 0
        ),
        enforcing_success_rate=u32(0),
        enforcing_local_origin_success_rate=u32(0),
        enforcing_failure_percentage=u32(0),
        enforcing_failure_percentage_local_origin=u32(0),
        interval=duration_ms(settings.interval),
        base_ejection_time=duration_ms(settings.base_ejection_time),
        max_ejection_time=duration_ms(settings.max_ejection_time),
        max_ejection_percent=u32(settings.max_ejection_percent),
        successful_active_health_check_uneject_host=wrappers_pb2.BoolValue(value=False),
    )
    # A count of 0 leaves Envoy's count in place; its detector is off (enforcing 0).
    if settings.consecutive_5xx:
        detection.consecutive_5xx.CopyFrom(u32(settings.consecutive_5xx))
    if settings.consecutive_gateway_failure:
        detection.consecutive_gateway_failure.CopyFrom(u32(settings.consecutive_gateway_failure))
    if split and settings.consecutive_local_origin_failure:
        detection.consecutive_local_origin_failure.CopyFrom(
            u32(settings.consecutive_local_origin_failure)
        )
    return detection


def _status_is(matcher: route_components_pb2.HeaderMatcher) -> matcher_pb2.MatchPredicate:
    return matcher_pb2.MatchPredicate(
        http_response_headers_match=matcher_pb2.HttpHeadersMatch(headers=[matcher])
    )


def failure_matcher(
    route: Route,
) -> http_protocol_options_pb2.HttpProtocolOptions.OutlierDetection | None:
    """Which answers outlier detection counts as failures, when 429 must count too.

    Envoy's outlier detection ignores 429, so a provider that rate-limits every request is
    never ejected and keeps taking first attempts (each then retried elsewhere). With an
    error matcher in the cluster's HttpProtocolOptions (Envoy 1.35+), an answer that
    matches is reported as a 5xx and one that does not as a success; so the matcher lists
    429 and every 5xx, and 5xx answers keep counting as before.
    """
    settings = route.settings.outlier_detection
    if not settings.enabled or not settings.eject_on_429:
        return None
    # string_match, not exact_match: Envoy warns that exact_match is deprecated.
    too_many = route_components_pb2.HeaderMatcher(
        name=":status", string_match=string_pb2.StringMatcher(exact="429")
    )
    server_error = route_components_pb2.HeaderMatcher(
        name=":status", range_match=range_pb2.Int64Range(start=500, end=600)
    )
    return http_protocol_options_pb2.HttpProtocolOptions.OutlierDetection(
        error_matcher=matcher_pb2.MatchPredicate(
            or_match=matcher_pb2.MatchPredicate.MatchSet(
                rules=[_status_is(too_many), _status_is(server_error)]
            )
        )
    )
