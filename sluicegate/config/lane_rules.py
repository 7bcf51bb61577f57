"""What the fast lane can enforce, and the lane a gateway takes when `admission.lane` is
left out (docs/fast-lane.md, "The default lane").

The default is `auto` where that changes nothing the config asks for, else `exact`:

- with tenants, `auto` when every client key has its `secret` (with any tenant in Envoy's
  hands, Envoy checks every key itself), every tenant's, key's and route's limit fits
  Envoy's token buckets, and no token limit's fast-lane bucket is smaller than the
  allowance of a request without an output cap (which it would refuse). Whatever an
  `auto` tenant's request needs of the routing stage (a gate, a route's or its sole
  provider's limits) it gets there (docs/fast-lane.md, "Models held in the exact lane");
- without tenants `auto` is Envoy's routing alone, so only when nothing needs the routing
  stage: no provider's or route's rate limits or concurrency gate (Envoy's gate has no
  `max_wait` and no order between classes), and no `scenarios:` a client may choose per
  request (the fast lane reports a request under its route's scenario).

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
    ClientKey,
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
    """What the default lane depends on: the valid tenants, every valid client key (even
    of a tenant that is not valid), providers, routes and declared scenarios."""

    tenants: Sequence[Tenant]
    keys: Sequence[ClientKey]
    providers: Sequence[Limited]
    routes: Sequence[Limited]
    scenarios: Sequence[str]


def default_lane(admission: Admission, declared: Declared) -> tuple[Lane, str]:
    """The lane for `admission.lane` left out, and why (this module's rules)."""
    if declared.tenants or declared.keys:  # keys: of tenants that failed validation too
        return _default_with_tenants(admission, declared)
    needs = fast_lane_cannot_enforce(declared.providers, declared.routes, beside_exact=False)
    if any(route.rate_limits for route in declared.routes):
        needs.append("routes' rate limits")
    if any(route.concurrency for route in declared.routes):
        needs.append("routes' concurrency gates")
    if declared.scenarios:
        needs.append("scenarios a client may choose per request")
    if needs:
        return LANE_EXACT, f"no tenants, and the routing stage enforces {', '.join(needs)}"
    return LANE_AUTO, "no tenants, and nothing needs the routing stage"


def _default_with_tenants(admission: Admission, declared: Declared) -> tuple[Lane, str]:
    bare = [key.name for key in declared.keys if key.secret is None]
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
