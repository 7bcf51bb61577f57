"""What a finished response is charged: the reservation reconciled by one rule
(records/billing.py: the provider's usage, else nothing for an error or no answer, else a
stream's counted events, else the estimate).

Each reservation is charged once, by one of two: the request record (every request has
exactly one; `charge_record`), or, for a large JSON answer (wire.META_USAGE_VIA), the
usage observer, which parses it in Python. Such a request that got no response reaches
no observer, so its record charges it.

An `auto` tenant's request Envoy admitted in the fast lane has no reservation: its record
charges what it was billed into the tenant's and key's exact-lane windows
(`charge_fast_lane`), so that when the control plane moves the tenant to the exact lane
its windows already hold what the fast lane let through (docs/admission.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sluicegate import wire
from sluicegate.records import RequestRecord, billed, billed_in_flight, billed_record

from ..limiter import DuplicateReservation, Limit, Usage
from .controller import AdmissionController
from .keyring import ClientIdentity


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
    bill = billed_record(record)
    return _reconcile(
        controller, reserved, Usage(bill.input_tokens, bill.output_tokens), bill.source
    )


def charge_fast_lane(controller: AdmissionController, record: RequestRecord) -> bool:
    """Charge a fast-lane request of an `auto` tenant into its tenant's and key's windows
    (the module docstring); whether it was charged. Only a record marked auto
    (wire.META_AUTO_LANE) that the fast lane's buckets charged (`fast_lane`: an
    exact-lane request was reserved here), of a tenant the policy knows as auto.
    Unconditional: Envoy already admitted it, so a window may go over its limit and
    refuse the exact lane's next request. Routes' and providers' limits are not charged
    (the fast lane counts those in its own buckets).

    A long request is charged while it runs: its first record sent while it runs
    (`in_flight`) charges its estimate under its charge id (`tenant/stream id`: stream
    ids are unique per tenant only); its end record then reconciles that charge to what
    it was billed (nothing, for a failed one), or, when none was made, charges that.
    Whichever of the two records comes first, the store takes an id's charge once (a
    second is DuplicateReservation); this process skips ids it charged or settled
    already (controller.fast_lane_ids) before asking the store. A request that ended
    surely before Envoy could log it running (_surely_unlogged), its id not seen, has no
    other record to settle with: a failed one touches nothing; any other waits in
    controller.fast_lane_pending, summed with its client's others of the same batch, for
    one charge at the batch's end (charge_pending). Either way its id is kept, so that a
    record of it running, if one came, charges nothing."""
    if not (record.auto_lane and record.fast_lane):
        return False
    policy = controller.policy
    tenant = policy.tenants.get(record.tenant)
    if tenant is None or not tenant.auto:
        return False
    limits = policy.client_limits(ClientIdentity(tenant.name, record.key_name))
    if not limits:
        return False
    if record.in_flight and not record.stream_id:
        return False  # nothing to settle it by at its end
    charge_id = f"{tenant.name}/{record.stream_id or uuid.uuid4().hex}"
    seen = controller.fast_lane_ids
    if not record.in_flight and charge_id not in seen and _surely_unlogged(record):
        # No record of it running exists (nor will count: its id is kept), so nothing to
        # settle: summed with its client's others of this batch, charged once at the
        # batch's end (charge_pending).
        bill = billed_record(record)
        if record.stream_id:
            seen.add(charge_id)
        if bill.failed:
            return False  # a refusal: a store record of it would live a window for nothing
        used = Usage(bill.input_tokens, bill.output_tokens)
        controller.fast_lane_pending.add(tenant.name, record.key_name, limits, used)
        _count_charge(controller, tenant.name, record.model, used)
        return True
    if record.in_flight:
        if seen.add(charge_id):
            estimate = billed_in_flight(record)
            usage = Usage(estimate.input_tokens, estimate.output_tokens)
            controller.spawn(_charge_once(controller, charge_id, limits, usage))
        return True
    bill = billed_record(record)
    seen.add(charge_id)
    actual = Usage(bill.input_tokens, bill.output_tokens, requests=0 if bill.failed else 1)
    controller.spawn(_settle(controller, charge_id, limits, actual))
    if bill.failed:
        return False
    _count_charge(controller, tenant.name, record.model, actual)
    return True


def _count_charge(controller: AdmissionController, tenant: str, model: str, used: Usage) -> None:
    metrics = controller.metrics
    metrics.tokens_charged.labels(tenant, model, "input").inc(used.input_tokens)
    metrics.tokens_charged.labels(tenant, model, "output").inc(used.output_tokens)
    metrics.fast_lane_charges.labels(tenant).inc()


def charge_pending(controller: AdmissionController) -> None:
    """At a batch of records' end: each client's summed fast-lane charges of the batch
    (charge_fast_lane), one store charge a client, under a new id."""
    if not controller.fast_lane_pending:
        return
    store = controller.store()
    for limits, used in controller.fast_lane_pending.take():
        controller.spawn(store.charge(uuid.uuid4().hex, limits, used))


# How much sooner than IN_FLIGHT_FLUSH_MS a request must end to surely have no record
# while running: Envoy arms the flush timer on its coarse event-loop clock, the duration
# is measured on a precise one, so a request of 498 ms may have one.
RUNNING_RECORD_MARGIN_MS: Final = 100


def _surely_unlogged(record: RequestRecord) -> bool:
    """Whether the request ended well before Envoy's first record of it while running
    was due, so that no such record exists on any ext_proc server."""
    duration_s = record.duration_s
    limit_ms = wire.IN_FLIGHT_FLUSH_MS - RUNNING_RECORD_MARGIN_MS
    return duration_s is not None and duration_s * 1000 < limit_ms


async def _charge_once(
    controller: AdmissionController, charge_id: str, limits: Sequence[Limit], usage: Usage
) -> None:
    """Charge `usage` under `charge_id` unless it was charged already. A charge counted
    nowhere (Redis down: FailoverStore) forgets the id here, so the request's next
    record tries again."""
    try:
        counted = await controller.store().charge(charge_id, limits, usage)
    except DuplicateReservation:
        return
    if not counted:
        controller.fast_lane_ids.discard(charge_id)


async def _settle(
    controller: AdmissionController, charge_id: str, limits: Sequence[Limit], actual: Usage
) -> None:
    """At a request's end: its charge made while it ran becomes `actual`; without one,
    `actual` is charged, a failed request's nothing too: the empty charge holds the id, so
    a record of it while it ran that arrives late charges nothing. On Redis that record's
    charge may land between the two calls (its id then in use): reconcile once more."""
    store = controller.store()
    if await store.reconcile(charge_id, actual):
        return
    try:
        await store.charge(charge_id, limits, actual)
    except DuplicateReservation:
        await store.reconcile(charge_id, actual)


def charge_finished(controller: AdmissionController, record: RequestRecord) -> None:
    """Everything a request's record charges: at its end its reservation
    (`charge_record`), or, for an auto tenant's fast-lane request, its windows
    (`charge_fast_lane`, which also takes its records sent while it runs; a reservation
    is reconciled at the end alone)."""
    if record.in_flight or charge_record(controller, record) is None:
        charge_fast_lane(controller, record)


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
    bill = billed(
        status=status,
        estimate_input=reserved.estimate.input_tokens,
        estimate_output=reserved.estimate.output_tokens,
        used=None if used is None else (used.input_tokens, used.output_tokens),
        counted=counted,
    )
    return _reconcile(
        controller, reserved, Usage(bill.input_tokens, bill.output_tokens), bill.source
    )


def _reconcile(
    controller: AdmissionController, reserved: Reserved, actual: Usage, source: str
) -> str:
    """Count what `reserved` is charged and reconcile its reservation to `actual`."""
    estimate = reserved.estimate
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
