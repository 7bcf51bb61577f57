"""What a finished response is charged: one rule for the request record and the observer.

When the response ends (or is cut), its reservation is reconciled to:
- the provider's `usage` (a JSON body's, or a stream's usage event, which the routing
  stage asks for when the client did not: filters/usage_reader.py): exactly that;
- a stream without usage (cut by the client or the provider, or a body whose
  `stream_options` the gateway left alone): the estimated prompt tokens and one output
  token per event that carried text (OpenAI-compatible servers send about one token per
  event), as Envoy counted them;
- a JSON body without usage: the estimate stays charged;
- an error status (4xx/5xx from the provider or from Envoy) without usage, or no response
  at all (status 0: the client left first): nothing (the reservation is refunded:
  providers do not bill failed requests).

Each reservation is charged once, by one of two: the request record (every request has
exactly one; `charge_record`), or, for a large JSON answer (wire.META_USAGE_VIA), the
usage observer, which parses it in Python. Such a request that got no response reaches
no observer, so its record charges it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sluicegate import wire
from sluicegate.records import RequestRecord

from ..limiter import Usage
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


def charged_by_observer(filter_metadata: Any) -> bool:
    """Whether the routing stage left this request's charge to the usage observer
    (wire.META_USAGE_VIA): a large JSON answer. The observer charges only those."""
    if wire.METADATA_NAMESPACE not in filter_metadata:
        return False
    fields = filter_metadata[wire.METADATA_NAMESPACE].fields
    return (
        wire.META_USAGE_VIA in fields
        and fields[wire.META_USAGE_VIA].string_value == wire.USAGE_VIA_OBSERVER
    )


def charge_record(controller: AdmissionController, record: RequestRecord) -> str | None:
    """Charge the reservation of a finished request from its record (module docstring);
    the source, or None when the record has no reservation or the observer charges it."""
    if not record.reservation or (record.usage_by_observer and record.status != 0):
        return None
    reserved = Reserved(
        reservation=record.reservation,
        tenant=record.tenant or wire.ANONYMOUS_TENANT,
        model=record.model,
        estimate=Usage(record.estimate_input, record.estimate_output),
    )
    return charge(
        controller,
        reserved,
        status=record.status,
        used=provider_usage(record.input_tokens, record.output_tokens),
        # A stream Envoy did not count (not an event stream after all) keeps its estimate.
        counted=record.content_events if record.stream else None,
    )


def provider_usage(input_tokens: int | None, output_tokens: int | None) -> Usage | None:
    """The provider's usage when it stated both counts."""
    if input_tokens is None or output_tokens is None:
        return None
    return Usage(input_tokens, output_tokens)


def charge(
    controller: AdmissionController,
    reserved: Reserved,
    *,
    status: int,
    used: Usage | None,
    counted: int | None,
) -> str:
    """Reconcile `reserved` to what the response used (module docstring); the source.
    `used`: the provider's usage; `counted`: a stream's events that carried text, when
    they were counted."""
    estimate = reserved.estimate
    if used is not None:
        actual, source = used, SOURCE_PROVIDER
    elif status >= 400 or status == 0:
        actual, source = Usage(0, 0), SOURCE_ERROR
    elif counted is not None:
        actual, source = Usage(estimate.input_tokens, counted), SOURCE_COUNTED
    else:
        actual, source = estimate, SOURCE_ESTIMATE
    metrics = controller.metrics
    tenant, model = reserved.tenant, reserved.model
    metrics.usage_source.labels(source).inc()
    metrics.tokens_charged.labels(tenant, model, "input").inc(actual.input_tokens)
    metrics.tokens_charged.labels(tenant, model, "output").inc(actual.output_tokens)
    refund = estimate.input_tokens + estimate.output_tokens
    refund -= actual.input_tokens + actual.output_tokens
    if refund > 0:
        metrics.tokens_refunded.labels(tenant, model).inc(refund)
    controller.spawn(controller.store().reconcile(reserved.reservation, actual))
    return source
