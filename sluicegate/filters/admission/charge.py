"""What a finished response is charged: one rule for the usage observer and the usage log.

When the response ends (or is cut), its reservation is reconciled to:
- the provider's `usage` (JSON body, or the final SSE chunk when the client asked for
  `stream_options.include_usage`): exactly that;
- a stream without usage: the estimated prompt tokens and one output token per content
  chunk (OpenAI-compatible servers send about one token per chunk). The request is left
  as the client sent it: adding include_usage upstream would need the extra chunk cut
  out of the stream, which puts Python on every chunk;
- a JSON body without usage: the estimate stays charged;
- an error status (4xx/5xx from the provider or from Envoy) without usage, or no response
  at all (status 0: the client left first): nothing (the reservation is refunded:
  providers do not bill failed requests).

Each reservation is charged once: the usage log charges the requests marked for it and
those that never got a response; the observer charges the rest (xds translate usage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sluicegate import wire

from ..limiter import Usage
from ..usage import ObservedUsage
from .controller import AdmissionController

SOURCE_PROVIDER: Final = "provider"
SOURCE_COUNTED: Final = "counted"
SOURCE_ESTIMATE: Final = "estimate"
SOURCE_ERROR: Final = "error"


@dataclass(frozen=True, slots=True)
class Reserved:
    """A reservation as the admission stage described it in the request's metadata."""

    reservation: str
    tenant: str
    model: str
    estimate: Usage


def _int(fields: Any, key: str) -> int:
    if key not in fields:
        return 0
    try:
        return max(0, int(fields[key].string_value))
    except ValueError:
        return 0


def reserved_from(filter_metadata: Any) -> Reserved | None:
    """The reservation in a request's dynamic metadata (a `filter_metadata` map), if any."""
    if wire.METADATA_NAMESPACE not in filter_metadata:
        return None
    fields = filter_metadata[wire.METADATA_NAMESPACE].fields
    if wire.META_RESERVATION not in fields:
        return None
    return Reserved(
        reservation=fields[wire.META_RESERVATION].string_value,
        tenant=(
            fields[wire.META_TENANT].string_value
            if wire.META_TENANT in fields
            else wire.ANONYMOUS_TENANT
        ),
        model=fields[wire.META_MODEL].string_value if wire.META_MODEL in fields else "",
        estimate=Usage(
            _int(fields, wire.META_ESTIMATE_INPUT), _int(fields, wire.META_ESTIMATE_OUTPUT)
        ),
    )


def reported_by_log(filter_metadata: Any) -> bool:
    """Whether the usage log charges this request (wire.META_USAGE_VIA): then the
    observer must not, should it see the response (a local reply sent where the routing
    stage's header mutation failed reaches it)."""
    if wire.METADATA_NAMESPACE not in filter_metadata:
        return False
    fields = filter_metadata[wire.METADATA_NAMESPACE].fields
    return (
        wire.META_USAGE_VIA in fields
        and fields[wire.META_USAGE_VIA].string_value == wire.USAGE_VIA_LOG
    )


def charge(
    controller: AdmissionController,
    reserved: Reserved,
    *,
    status: int,
    seen: ObservedUsage | None,
    streaming: bool,
) -> str:
    """Reconcile `reserved` to what the response used (module docstring); the source."""
    estimate = reserved.estimate
    if seen is not None and seen.input_tokens is not None and seen.output_tokens is not None:
        actual, source = Usage(seen.input_tokens, seen.output_tokens), SOURCE_PROVIDER
    elif status >= 400 or status == 0:
        actual, source = Usage(0, 0), SOURCE_ERROR
    elif streaming and seen is not None:
        actual, source = Usage(estimate.input_tokens, seen.content_chunks), SOURCE_COUNTED
    else:
        actual, source = estimate, SOURCE_ESTIMATE
    metrics = controller.metrics
    tenant, model = reserved.tenant, reserved.model
    metrics.usage_source.labels(source).inc()
    metrics.tokens_charged.labels(tenant, model, "input").inc(actual.input_tokens)
    metrics.tokens_charged.labels(tenant, model, "output").inc(actual.output_tokens)
    estimated = estimate.input_tokens + estimate.output_tokens
    used = actual.input_tokens + actual.output_tokens
    if estimated > used:
        metrics.tokens_refunded.labels(tenant, model).inc(estimated - used)
    controller.spawn(controller.store().reconcile(reserved.reservation, actual))
    return source
