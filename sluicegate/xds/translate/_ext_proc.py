"""The ext_proc filter configs: downstream "routing" (admission) and "usage" (an observer),
and upstream per-attempt "attempt".

Both call the same gRPC cluster; the `x-sluicegate-stage` initial metadata tells the
server which one is calling. Both send the request headers and the buffered request body,
and skip everything on the response side (each enabled phase is one more round trip to
Python, docs/architecture.md, "The hot path").

Request headers must be SENT, although the model is in the body. Checked on Envoy 1.40:
with request_header_mode SKIP the filter lets the headers continue at once, so
- downstream, the router acts on the route matched *before* the body (the catch-all 404)
  and ext_proc never sees the body;
- upstream, the headers leave for the provider before the body is processed: `:path` can
  no longer change and a renamed model's body goes out with the old length (chunked).
With SEND, Envoy holds the headers until the buffered body has been answered.
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.core.v3 import backoff_pb2, base_pb2, grpc_service_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from google.protobuf import wrappers_pb2

from sluicegate import wire
from sluicegate.model import Limits

from ._proto import duration_ms, pack
from .retries import PREVIOUS_HOSTS

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
OBSERVER_STAT_PREFIX = "usage_observer"
ERROR_BODY_STAT_PREFIX = "error_body"

# How much longer than message_timeout the server may ask Envoy to wait for one message
# (override_message_timeout), e.g. while a request waits in the admission queue.
MAX_MESSAGE_TIMEOUT_FACTOR = 10


_Mode = processing_mode_pb2.ProcessingMode


def request_only_mode() -> processing_mode_pb2.ProcessingMode:
    """Request headers and buffered request body. Explicit values, so Envoy's defaults
    (which also send response headers) never apply by omission."""
    return _Mode(
        request_header_mode=_Mode.SEND,
        response_header_mode=_Mode.SKIP,
        request_body_mode=_Mode.BUFFERED,
        response_body_mode=_Mode.NONE,
        request_trailer_mode=_Mode.SKIP,
        response_trailer_mode=_Mode.SKIP,
    )


def observer_mode() -> processing_mode_pb2.ProcessingMode:
    """Response headers and the response body as it streams, nothing of the request."""
    return _Mode(
        request_header_mode=_Mode.SKIP,
        response_header_mode=_Mode.SEND,
        request_body_mode=_Mode.NONE,
        response_body_mode=_Mode.STREAMED,
        request_trailer_mode=_Mode.SKIP,
        response_trailer_mode=_Mode.SKIP,
    )


def _grpc_service(stage: str) -> grpc_service_pb2.GrpcService:
    """The ext_proc servers, telling them the stage; only the routing stage, one stream per
    request, uses the routing cluster (see wire.EXT_PROC_SIDE_CLUSTER)."""
    cluster = wire.EXT_PROC_CLUSTER if stage == wire.STAGE_ROUTING else wire.EXT_PROC_SIDE_CLUSTER
    return grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster),
        initial_metadata=[base_pb2.HeaderValue(key=wire.STAGE_METADATA_KEY, value=stage)],
        retry_policy=_STREAM_RETRY if stage in _RETRIED_STAGES else None,
    )


# A stream that cannot reach its ext_proc server (refused, reset before an answer: the
# server died) is opened again on another one, so a dead replica fails only the requests
# it was answering. Nothing is retried once the server has answered. Only the stages that
# answer at once: with a retry policy Envoy keeps a copy of what it sent (up to 64 KB) for
# the stream's life, and the observer never answers, so it would keep one per response
# and could replay a cut copy (counting usage twice); error_body must not hold an answer.
_RETRIED_STAGES = frozenset({wire.STAGE_ROUTING, wire.STAGE_ATTEMPT})
_STREAM_RETRY = base_pb2.RetryPolicy(
    retry_on="connect-failure,refused-stream,reset",
    num_retries=wrappers_pb2.UInt32Value(value=2),
    retry_back_off=backoff_pb2.BackoffStrategy(
        base_interval=duration_ms(10), max_interval=duration_ms(100)
    ),
    retry_host_predicate=[
        base_pb2.RetryPolicy.RetryHostPredicate(
            name=PREVIOUS_HOSTS, typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate())
        )
    ],
    host_selection_retry_max_attempts=5,
)


def usage_observer_config(limits: Limits) -> ext_proc_pb2.ExternalProcessor:
    """The usage stage: reads real token usage off each streamed response to reconcile
    reservations (JSON answers skip it: their usage comes with the access log, usage.py).

    observability_mode: Envoy sends the response headers and every body chunk without
    waiting for an answer, so a streamed response never waits on Python chunk by chunk
    (checked on Envoy 1.40: chunks reach the client as they come; the observer's stream
    closes a moment after the response ends). It reads the admission stage's dynamic
    metadata (the reservation id), forwarded with every message. failure_mode_allow: an
    observer that is down must not fail responses already admitted and paid for.
    """
    return ext_proc_pb2.ExternalProcessor(
        grpc_service=_grpc_service(wire.STAGE_USAGE),
        # Its own stats (streams_started ...), apart from the routing stage's.
        stat_prefix=OBSERVER_STAT_PREFIX,
        processing_mode=observer_mode(),
        observability_mode=True,
        metadata_options=ext_proc_pb2.MetadataOptions(
            forwarding_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=[wire.METADATA_NAMESPACE]
            ),
        ),
        message_timeout=duration_ms(limits.ext_proc_message_timeout_ms),
        failure_mode_allow=True,
    )


def error_body_mode() -> processing_mode_pb2.ProcessingMode:
    """Response headers and the whole response body, nothing of the request."""
    return _Mode(
        request_header_mode=_Mode.SKIP,
        response_header_mode=_Mode.SEND,
        request_body_mode=_Mode.NONE,
        response_body_mode=_Mode.BUFFERED,
        request_trailer_mode=_Mode.SKIP,
        response_trailer_mode=_Mode.SKIP,
    )


def error_body_config(limits: Limits) -> ext_proc_pb2.ExternalProcessor:
    """The error-body stage: wraps a provider's non-JSON error answer in OpenAI's error
    JSON (error_bodies.py runs it only for those). failure_mode_allow: with the ext_proc
    servers unreachable the provider's answer passes unchanged, with its status, rather
    than becoming a 500."""
    return ext_proc_pb2.ExternalProcessor(
        grpc_service=_grpc_service(wire.STAGE_ERROR_BODY),
        stat_prefix=ERROR_BODY_STAT_PREFIX,
        processing_mode=error_body_mode(),
        message_timeout=duration_ms(limits.ext_proc_message_timeout_ms),
        failure_mode_allow=True,
        allow_mode_override=False,
    )


def ext_proc_config(
    stage: str,
    limits: Limits,
    request_attributes: Sequence[str] = (),
    metadata_namespaces: Sequence[str] = (),
    *,
    reads_metadata: bool = True,
    longest_queue_wait_ms: int = 0,
) -> ext_proc_pb2.ExternalProcessor:
    """An ExternalProcessor for `stage` (wire.STAGE_ROUTING or wire.STAGE_ATTEMPT).

    failure_mode_allow is false: a request the filter could not inspect (keys, limits,
    model routing) must not reach a provider. message_timeout comes from the config
    because Envoy's 200 ms default is shorter than any queue wait. metadata_namespaces
    are dynamic-metadata namespaces the server may read and write (the attempt stage
    keeps the client's original path there, because retries reuse the rewritten headers);
    with reads_metadata false the server may only write them, and Envoy sends none of
    it along with each message (the routing stage writes the request record's facts and
    reads nothing back).
    A request may wait in an admission queue before its body is answered: the server then
    first sends override_message_timeout (its class's wait at each gate plus 2 s), and
    max_message_timeout allows it; the queue, not Envoy, decides when a waiting request is
    shed (with a 503 that says why). Every other message keeps the short timeout, so a
    stuck ext_proc server fails requests fast.
    """
    timeout_ms = limits.ext_proc_message_timeout_ms
    # A request may pass a route gate and a provider gate, each up to its class's wait.
    longest_override_ms = 2 * longest_queue_wait_ms + wire.QUEUE_MARGIN_MS
    max_timeout_ms = max(timeout_ms * MAX_MESSAGE_TIMEOUT_FACTOR, longest_override_ms)
    return ext_proc_pb2.ExternalProcessor(
        grpc_service=_grpc_service(stage),
        processing_mode=request_only_mode(),
        request_attributes=list(request_attributes),
        metadata_options=ext_proc_pb2.MetadataOptions(
            forwarding_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=list(metadata_namespaces)
            )
            if reads_metadata
            else None,
            receiving_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=list(metadata_namespaces)
            ),
        )
        if metadata_namespaces
        else None,
        message_timeout=duration_ms(timeout_ms),
        max_message_timeout=duration_ms(max_timeout_ms),
        failure_mode_allow=False,
        allow_mode_override=False,
    )
