"""What the fast lane can enforce, and the lane a gateway takes when `admission.lane` is
left out (docs/fast-lane.md, "The default lane").

The default is `auto` where that changes no limit, gate or key the config declares, else
`exact` (docs/fast-lane.md lists what a client or a dashboard may still see differ):

- with tenants, `auto` when some tenant takes the default, the limiter store is not
  shared (with `redis`, limits are shared across replicas; Envoy's token buckets are per
  Envoy process), every client key has its `secret` (with any tenant in Envoy's hands,
  Envoy checks every key itself), every tenant's, key's and route's limit fits
  Envoy's token buckets, and no token limit's fast-lane bucket is smaller than the
  allowance of a request without an output cap (which it would refuse). Whatever an
  `auto` tenant's request needs of the routing stage (a gate, a route's or its sole
  provider's limits) it gets there (docs/fast-lane.md, "Models held in the exact lane");
- without tenants `auto` is Envoy's routing alone, so only when nothing needs the routing
  stage: no provider's or route's rate limits or concurrency gate (Envoy's gate has no
  `max_wait` and no order between classes).

validate.py's rules then hold the default as they hold a written lane; a written lane is
never changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .admission import (
    LANE_AUTO,
    LANE_EXACT,
    Admission,
    Concurrency,
    Lane,
    RateLimits,
    Tenant,
)


class Limited(Protocol):
    """A provider or a route, as these rules read it (schema.py imports this module)."""

    @property
    def rate_limits(self) -> RateLimits | None: ...

    @property
    def concurrency(self) -> Concurrency | None: ...


def fast_lane_cannot_enforce(
    providers: Iterable[Limited], routes: Iterable[Limited], beside_exact: bool
) -> list[str]:
    """What a gateway has that requests Envoy decides whatever their model (a `fast`
    tenant's, or every request without tenants) would pass unchecked: providers' limits
    and gates (taken before Envoy picks a provider, across routes: no cluster holds them),
    and, `beside_exact` (an exact-lane or `auto` tenant), routes' per-model limits, which
    each lane would count apart (up to twice the limit)."""
    providers, routes = list(providers), list(routes)
    found = []
    if any(provider.rate_limits for provider in providers):
        found.append("providers' rate limits")
    if beside_exact and any(route.rate_limits for route in routes):
        found.append("routes' per-model rate limits beside exact-lane or auto tenants")
    if any(provider.concurrency for provider in providers):
        found.append("providers' concurrency gates")
    return found


@dataclass(frozen=True)
class Declared:
    """What the default lane depends on: the valid tenants, providers and routes;
    `tenants_complete` is False when some tenant failed validation."""

    tenants: Sequence[Tenant]
    providers: Sequence[Limited]
    routes: Sequence[Limited]
    tenants_complete: bool = True


def default_lane(admission: Admission, declared: Declared) -> tuple[Lane, str]:
    """The lane for `admission.lane` left out, and why (this module's rules)."""
    if not declared.tenants_complete:
        # The rules below would judge the file without that tenant: its other problems
        # are reported as they would be with the exact lane, never more.
        return LANE_EXACT, "a tenant is not valid"
    if declared.tenants:
        return _default_with_tenants(admission, declared)
    needs = fast_lane_cannot_enforce(declared.providers, declared.routes, beside_exact=False)
    if any(route.rate_limits for route in declared.routes):
        needs.append("routes' rate limits")
    if any(route.concurrency for route in declared.routes):
        needs.append("routes' concurrency gates")
    if needs:
        return LANE_EXACT, f"no tenants, and the routing stage enforces {', '.join(needs)}"
    return LANE_AUTO, "no tenants, and nothing needs the routing stage"


def _default_with_tenants(admission: Admission, declared: Declared) -> tuple[Lane, str]:
    if all(tenant.lane is not None for tenant in declared.tenants):
        # Nobody takes the default: `auto` would only put Envoy's key check in front of
        # tenants that all chose their lanes (model.resolve_admission).
        return LANE_EXACT, "every tenant names its own lane"
    if admission.store.kind == "redis":
        # Envoy's buckets are per Envoy process: limits asked to be shared stay shared.
        return LANE_EXACT, "limits are shared across replicas (admission.store: redis)"
    bare = [key.name for t in declared.tenants for key in t.keys if key.secret is None]
    if bare:
        return LANE_EXACT, f"client key '{bare[0]}' has no secret for Envoy to check"
    # The tenants' and keys' limits become their fast-lane buckets; routes' are checked
    # as buckets too whenever a lane is not exact (validate.check_lane).
    own: list[RateLimits | None] = []
    for tenant in declared.tenants:
        if tenant.lane is None:
            own += [tenant.rate_limits, *(key.rate_limits for key in tenant.keys)]
    buckets = [block for block in own if block is not None]
    routes = [route.rate_limits for route in declared.routes if route.rate_limits is not None]
    if not all(block.fits_token_buckets() for block in [*buckets, *routes]):
        return LANE_EXACT, "a limit does not fit Envoy's token buckets (per under 1s, or 2^32+)"
    if any(admission.bucket_refuses_uncapped(limit) for b in buckets for limit in b.limits()):
        return LANE_EXACT, (
            "a token limit's fast-lane bucket is smaller than admission.default_max_tokens"
        )
    return LANE_AUTO, "every client key has its secret and every limit fits Envoy's buckets"


def with_default_lane(admission: Admission, declared: Declared) -> Admission:
    """`admission` with its lane: as written, or the default (`default_lane`), noting why."""
    if admission.lane is not None:
        return admission
    lane, why = default_lane(admission, declared)
    resolved = admission.model_copy(update={"lane": lane})
    resolved._lane_default = why
    return resolved
