"""The routing stage with admission: one instance per request (one ext_proc stream).

Envoy keeps the stream open until the HTTP request ends, the response finished or the
client gone (checked on Envoy 1.40), so the end of this stream is exactly when a gate
slot must be released: `close()` runs then, whatever happened.

On the request headers: their count, size and declared body length are checked (431,
413: request_limits.py), then the client key (401), which is removed, so it never reaches
a provider. Requests without a body (model listings, 404s) are checked too, and a tenant
allowed only some models is listed only those (listing.py).

On the buffered body, in this order: the body is read (400), the model routed (404) and
checked against the tenant's models (403); tokens are estimated and reserved on every
applicable limit at once (429, or 503 when the store is down and set to fail
closed); the request then waits for a slot at its route's gate in its priority class
(503 when shed; the reservation is refunded). The answer routes the request, says who
reads its usage (usage_reader.py) and leaves dynamic metadata: the reservation for
whoever charges it (charge.py), the x-ratelimit-* values for the route's response headers.

Without admission (no tenants, limits or gates) only the model is routed (routing.py),
and who reads the usage is said all the same: the record's metrics need it.
Either way the stage's last answer to every request, refusals included, carries what it
learnt for the request record (record.py).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import duration_pb2

from sluicegate import wire
from sluicegate.config import DEFAULT_SCENARIO
from sluicegate.records import scenario_of

from .. import counters as outcome
from .. import errors
from ..counters import Counters
from ..estimate import estimate_output_tokens
from ..headers import header_text
from ..jsonbody import BodyError
from ..limiter import Decision, Usage
from ..queueing import Shed, Slot
from ..request_facts import RequestFacts, inspect_request
from ..responses import (
    CONTINUE_REQUEST_HEADERS,
    PASS_THROUGH,
    common,
    metadata_field,
    metadata_fields,
    request_headers_answer,
    with_path,
)
from ..routing import BODILESS_ANSWER, read_body
from ..table import RoutingTable
from ..usage_reader import INJECTED_FIELD, UsageReading, routed_usage_answer, usage_answer
from . import answers
from .controller import AdmissionController
from .keyring import ClientIdentity, presented_key
from .listing import tenant_listing
from .policy import AdmissionPolicy, TenantPolicy
from .record import (
    ANONYMOUS,
    NO_SCENARIO,
    known_field,
    record_fields,
    routed_record,
    with_record,
)

STAGE: Final = wire.STAGE_ROUTING
NO_CLASS: Final = wire.NO_PRIORITY_CLASS  # priority label before a class is known


def _without_client_key(*, bodiless: bool = False) -> bytes:
    """Removes the client's key. Bodiless, also as routing.BODILESS_ANSWER: drops any
    client-sent model header and re-matches, so only routes needing no model match."""
    response = common(clear_route_cache=bodiless)
    response.header_mutation.remove_headers.extend(wire.CLIENT_KEY_HEADERS)
    if bodiless:
        response.header_mutation.remove_headers.append(wire.MODEL_HEADER)
    return request_headers_answer(response)


KEY_REMOVED: Final = _without_client_key()
BODILESS_KEY_REMOVED: Final = _without_client_key(bodiless=True)


# The request headers the admission stage reads.
_READ: Final = frozenset(
    (
        ":method",
        ":path",
        wire.PRIORITY_HEADER,
        wire.SCENARIO_HEADER,
        wire.CLIENT_HEADER,
        *wire.CLIENT_KEY_HEADERS,
    )
)
# Without admission, only the path (which route: the scenario; the endpoint: who reads the
# usage) and the scenario header.
_READ_WITHOUT_ADMISSION: Final = frozenset((":path", wire.SCENARIO_HEADER))

# Reservation ids: unique across replicas (random per process) and cheap per request.
_PROCESS_TOKEN: Final = os.urandom(6).hex()
_SEQUENCE = itertools.count(1)


def new_reservation_id() -> str:
    return f"{_PROCESS_TOKEN}-{next(_SEQUENCE)}"


@functools.lru_cache(maxsize=64)
def _override_answer(seconds: float) -> bytes:
    timeout = duration_pb2.Duration()
    timeout.FromNanoseconds(int(seconds * 1e9))
    answer: bytes = ep.ProcessingResponse(override_message_timeout=timeout).SerializeToString()
    return answer


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A request whose answer waits for gate slots (after the timeout override)."""

    gates: tuple[str, ...]
    priority: str
    tokens: int
    admitted: Callable[[], bytes]


_USAGE_VIA_OBSERVER: Final = metadata_field(wire.META_USAGE_VIA, wire.USAGE_VIA_OBSERVER)


class AdmissionStream:
    """State of one request at the routing stage (see the module docstring)."""

    __slots__ = (
        "_controller",
        "_counters",
        "_identity",
        "_model",
        "_model_routed",
        "_path",
        "_policy",
        "_priority_header",
        "_queued_s",
        "_reservation",
        "_route",
        "_routed",
        "_scenario",
        "_scenario_header",
        "_slots",
        "_stream",
        "_table",
        "_waiting",
    )

    def __init__(
        self, controller: AdmissionController, table: RoutingTable, counters: Counters
    ) -> None:
        self._controller = controller
        self._policy: AdmissionPolicy = controller.policy
        self._table = table
        self._counters = counters
        self._identity: ClientIdentity | None = None
        self._priority_header: str | None = None
        self._path: str | None = None
        self._reservation: str | None = None
        self._routed = False
        self._slots: list[Slot] = []
        self._waiting: _Waiting | None = None
        # For the request record (record.py), as learnt: None is not known yet.
        self._scenario_header: str | None = None
        self._model: str | None = None
        self._model_routed = False  # a route serves self._model
        self._route: str | None = None  # the model route that serves it
        self._stream: bool | None = None
        self._scenario = NO_SCENARIO
        self._queued_s = 0.0

    async def on_message(self, request: Any) -> bytes:
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(request.request_headers)
        if kind == "request_body":
            body = request.request_body.body
            if not self._policy.enabled:
                return self._route_only(body)
            return await self._on_body(body)
        return PASS_THROUGH.get(kind or "", CONTINUE_REQUEST_HEADERS)

    def close(self) -> None:
        """The request is over: free the slot; refund a reservation never sent upstream
        (their records, or the observer, reconcile those that were)."""
        while self._slots:
            self._slots.pop().release()
        if self._reservation is not None and not self._routed:
            # Turned away by the gateway itself: give back tokens and the request.
            rid, self._reservation = self._reservation, None
            self._controller.spawn(self._controller.store().reconcile(rid, Usage(0, 0, 0)))

    # ----- request headers ---------------------------------------------------------------

    def _on_headers(self, message: Any) -> bytes:
        check = self._table.check_headers(message)
        if check.refusal is not None:
            self._counters.inc(STAGE, outcome.BAD_REQUEST)
            return self._refuse("bad_request", NO_CLASS, check.refusal)
        answer = self._headers_answer(message)
        # A credential in the query string: sent on without it (request_limits.py).
        return answer if check.path is None else with_path(answer, check.path)

    def _headers_answer(self, message: Any) -> bytes:
        bodiless = message.end_of_stream
        policy = self._policy
        keyring = policy.keyring
        if bodiless and keyring is None:
            # No body, no model: only routes without a provider can match (404, listings).
            self._counters.inc(STAGE, outcome.NO_BODY)
            return self._bodiless(BODILESS_ANSWER, policy.default_priority)
        if not policy.enabled:
            self._read_headers(message, _READ_WITHOUT_ADMISSION)
            return CONTINUE_REQUEST_HEADERS
        headers = self._read_headers(message, _READ)
        self._priority_header = headers.get(wire.PRIORITY_HEADER)
        if keyring is None:
            return CONTINUE_REQUEST_HEADERS
        named = headers.get(wire.CLIENT_HEADER) if policy.keys_checked_by_envoy else None
        if named is not None:
            # Envoy checked the key and removed it (xds/translate/client_keys.py); no
            # client can send this header itself (removed before any filter).
            identity = keyring.named(named)
            if identity is None:
                return self._refuse("unauthenticated", NO_CLASS, answers.INVALID_KEY)
        else:
            key = presented_key(headers)
            if key is None:
                return self._refuse("unauthenticated", NO_CLASS, answers.MISSING_KEY)
            identity = keyring.identify(key)
            if identity is None:
                return self._refuse("unauthenticated", NO_CLASS, answers.INVALID_KEY)
        self._identity = identity
        if not bodiless:
            return KEY_REMOVED
        # A listing, a 404: keys are checked on these too, so none is open to anyone.
        self._counters.inc(STAGE, outcome.NO_BODY)
        tenant = self._tenant()
        priority = tenant.priority if tenant is not None else policy.default_priority
        if tenant is not None and tenant.allowed_models is not None:
            answer = tenant_listing(
                headers.get(":method"),
                self._path,
                self._table.models_under(),
                tenant.allowed_models,
            )
            if answer is not None:
                return self._bodiless(answer, priority, made_here=True)
        return self._bodiless(BODILESS_KEY_REMOVED, priority)

    def _read_headers(self, message: Any, names: frozenset[str]) -> dict[str, str]:
        """Decode only the headers in `names` (a request carries twenty or more)."""
        headers = {h.key: header_text(h) for h in message.headers.headers if h.key in names}
        self._path = headers.get(":path")
        self._scenario_header = headers.get(wire.SCENARIO_HEADER)
        return headers

    def _bodiless(self, answer: bytes, priority: str, *, made_here: bool = False) -> bytes:
        """A request without a body is answered on its headers: no model, no stream."""
        self._stream = False
        return with_record(answer, self._record(priority), made_here=made_here)

    # ----- request body without admission -----------------------------------------------

    def _route_only(self, body: bytes) -> bytes:
        """Route the model (routing.py); the class reported is the default one, the only
        one there is without admission (the priority header is not read)."""
        answer, model, stream, routed, members, usage_members = read_body(
            body, self._table, self._counters
        )
        self._model, self._stream = model, stream
        if not routed or model is None or stream is None or members is None:
            return self._refuse("not_routed", NO_CLASS, answer)
        self._model_routed = True
        policy = self._policy
        info = self._table.route_for(model, self._path)
        scenario = self._scenario = NO_SCENARIO if info is None else self._scenario_of(info.route)
        route = None if info is None else policy.routes.get(info.route)
        default_max = policy.default_max_tokens if route is None else route.default_max_tokens
        asks = route is None or route.asks_stream_usage
        usage = routed_usage_answer(
            body, self._path, members, stream, default_max, asks, members_read=usage_members
        )
        record = routed_record(
            ANONYMOUS, None, model, policy.default_priority, scenario, stream, usage.injected
        )
        return answer + record + usage.answer

    # ----- request body ------------------------------------------------------------------

    async def _on_body(self, body: bytes) -> bytes:
        policy = self._policy
        try:
            facts = inspect_request(body, max_output_tokens=policy.max_output_tokens)
        except BodyError as exc:
            self._counters.inc(STAGE, outcome.BAD_REQUEST)
            answer = errors.body_error(exc, max_output_tokens=policy.max_output_tokens)
            return self._refuse("bad_request", NO_CLASS, answer)
        self._model, self._stream = facts.model, facts.stream
        info = self._table.route_for(facts.model, self._path)
        routed = self._table.routed_answer(facts.model, stream=facts.stream)
        if info is None or routed is None:
            self._counters.inc(STAGE, outcome.MODEL_NOT_FOUND)
            return self._refuse("model_not_found", NO_CLASS, errors.model_not_found(facts.model))
        self._model_routed = True
        self._route = info.route
        self._scenario = self._scenario_of(info.route)
        tenant = self._tenant()
        models = None if tenant is None else tenant.allowed_models
        if tenant is not None and models is not None and facts.model not in models:
            return self._refuse(
                "model_not_allowed",
                tenant.priority,
                answers.model_forbidden(tenant.name, facts.model),
            )
        priority = self._priority(tenant)
        if priority is None:
            classes = self._allowed_classes(tenant)
            return self._refuse(
                "bad_request", NO_CLASS, answers.bad_priority(self._priority_header or "", classes)
            )
        route = policy.routes.get(info.route)
        limits = policy.limits_for(self._identity, info.route, facts.model)
        gates = route.gates if route is not None else ()
        self._counters.inc(STAGE, outcome.ROUTED)
        default_max = route.default_max_tokens if route is not None else policy.default_max_tokens
        allowance = estimate_output_tokens(facts.max_tokens, facts.n, default_max)
        if not limits and not gates and self._identity is None:
            self._routed = True
            usage = self._usage(body, facts, allowance)
            record = routed_record(
                ANONYMOUS, None, facts.model, priority, self._scenario, facts.stream, usage.injected
            )
            return routed + record + usage.answer
        estimate = Usage(facts.prompt_tokens, allowance)
        decision: Decision | None = None
        if limits:
            # Known before the await: a client gone while Redis answers still gets its
            # reservation refunded by close().
            rid = self._reservation = new_reservation_id()
            decision = await self._controller.store().reserve(rid, limits, estimate)
            if not decision.admitted:
                self._reservation = None
                outcome_name = (
                    "store_unavailable"
                    if decision.refused_by is None
                    else "too_large"
                    if decision.too_large
                    else "rate_limited"
                )
                return self._refuse(outcome_name, priority, answers.refused(decision))
            self._controller.metrics.tokens_reserved.labels(self._tenant_label(), facts.model).inc(
                estimate.input_tokens + estimate.output_tokens
            )
        tokens = estimate.input_tokens + estimate.output_tokens
        admitted = partial(self._admitted, body, routed, priority, facts, estimate, decision)
        for index, name in enumerate(gates):
            gate = self._controller.gates.get(name)
            if gate is None:
                continue  # removed by a reload a moment ago
            slot = gate.try_acquire(priority, tokens)
            if slot is None:
                # This one makes it wait, after this answer (finish_waiting): first ask
                # Envoy to wait that long for the real one, so its message timeout can stay
                # short for everything else. A gate with room costs no extra message.
                rest = gates[index:]
                self._waiting = _Waiting(rest, priority, tokens, admitted)
                return self._override_timeout(rest, priority)
            self._taken(slot, priority)
        return admitted()

    @property
    def waiting(self) -> bool:
        """The last answer only extended Envoy's timeout; finish_waiting() gives the real one."""
        return self._waiting is not None

    async def finish_waiting(self) -> bytes:
        """Wait for a slot at each of the route's gates, in order; the routed answer, or the
        503 of a shed request (its slots and reservation given back)."""
        pending, self._waiting = self._waiting, None
        assert pending is not None
        for name in pending.gates:
            gate = self._controller.gates.get(name)
            if gate is None:
                continue  # removed by a reload a moment ago
            try:
                slot = await gate.acquire(pending.priority, pending.tokens)
            except Shed as shed:
                queue_time = self._controller.metrics.queue_time
                queue_time.labels(pending.priority, "shed").observe(shed.queued_s)
                self._queued_s += shed.queued_s
                self.close()  # frees slots taken so far and refunds the reservation
                return self._refuse(f"shed_{shed.reason}", pending.priority, answers.shed(shed))
            self._taken(slot, pending.priority)
        return pending.admitted()

    def _taken(self, slot: Slot, priority: str) -> None:
        self._slots.append(slot)
        self._queued_s += slot.queued_s
        self._controller.metrics.queue_time.labels(priority, "admitted").observe(slot.queued_s)

    def _override_timeout(self, gates: tuple[str, ...], priority: str) -> bytes:
        """ProcessingResponse.override_message_timeout: the longest this request may wait
        (its class's max_wait at every gate it passes) plus a margin. The translator sets
        Envoy's max_message_timeout to cover it."""
        wait_s = wire.QUEUE_MARGIN_MS / 1000
        for name in gates:
            gate = self._controller.gates.get(name)
            if gate is not None:
                wait_s += max(
                    (c.max_wait_s for c in gate.policy.classes if c.name == priority), default=0
                )
        return _override_answer(wait_s)

    def _admitted(
        self,
        body: bytes,
        routed: bytes,
        priority: str,
        facts: RequestFacts,
        estimate: Usage,
        decision: Decision | None,
    ) -> bytes:
        self._routed = True
        self._controller.metrics.decisions.labels("admitted", priority).inc()
        usage = self._usage(body, facts, estimate.output_tokens)
        fields = self._record(priority) + self._admission_fields(
            estimate, decision, by_observer=usage.reader == wire.USAGE_BY_OBSERVER
        )
        if usage.injected:
            fields += INJECTED_FIELD
        return with_record(routed, fields) + usage.answer

    def _usage(self, body: bytes, facts: RequestFacts, allowance: int) -> UsageReading:
        """Who reads this routed request's usage (usage_reader.py)."""
        route = None if self._route is None else self._policy.routes.get(self._route)
        return usage_answer(
            body,
            self._path,
            stream=facts.stream,
            has_stream_options=facts.has_stream_options,
            logprobs=facts.logprobs,
            output_allowance=allowance,
            # Only a reservation of tokens is charged (_admission_fields).
            reserved=self._reservation is not None and self._policy.counts_tokens,
            ask_allowed=route is None or route.asks_stream_usage,
        )

    def _admission_fields(
        self, estimate: Usage, decision: Decision | None, *, by_observer: bool = False
    ) -> bytes:
        """The reservation (for whoever reads the usage: charge.py) and the x-ratelimit-*
        values (for the route's response headers), besides the record's fields. Without
        token limits a reservation is a request counted, which its usage cannot change:
        nobody is given it to charge."""
        values: dict[str, str | float] = {}
        reservation = self._reservation if self._policy.counts_tokens else None
        charged = reservation is not None
        if reservation is not None:
            values[wire.META_RESERVATION] = reservation
            values[wire.META_ESTIMATE_INPUT] = str(estimate.input_tokens)
            values[wire.META_ESTIMATE_OUTPUT] = str(estimate.output_tokens)
        if decision is not None:
            for _, key, value in answers.ratelimit_values(decision.states):
                values[key] = value
        fields = metadata_fields(values) if values else b""
        return fields + _USAGE_VIA_OBSERVER if by_observer and charged else fields

    # ----- helpers -----------------------------------------------------------------------

    def _record(self, priority: str) -> bytes:
        """The request record's fields as known now (record.py)."""
        identity = self._identity
        return record_fields(
            tenant=self._tenant_label(),
            key_name=None if identity is None else identity.key,
            model=self._model,
            routed=self._model_routed,
            priority=priority,
            scenario=self._scenario,
            queued_s=self._queued_s,
            stream=self._stream,
            auto_lane=self._auto_tenant(),
        )

    def _refuse(self, outcome_name: str, priority: str, answer: bytes) -> bytes:
        """`answer`, an error the filter made, with the request record (and, with
        admission, counted among the admission decisions). Refused after routing, it names
        the model route: Envoy's route for it is not the model's."""
        if self._policy.enabled:
            self._controller.metrics.decisions.labels(outcome_name, priority).inc()
        fields = self._record(priority)
        if self._route is not None:
            fields += known_field(wire.META_ROUTE, self._route)
        return with_record(answer, fields, made_here=True)

    def _scenario_of(self, route: str) -> str:
        """The scenario of a request `route` serves (record.scenario_of)."""
        policy = self._policy
        route_policy = policy.routes.get(route)
        declared = DEFAULT_SCENARIO if route_policy is None else route_policy.scenario
        return scenario_of(declared, self._scenario_header, policy.scenarios)

    def _tenant(self) -> TenantPolicy | None:
        if self._identity is None:
            return None
        return self._policy.tenants.get(self._identity.tenant)

    def _auto_tenant(self) -> bool:
        """Whether the request's tenant is `auto` (its record says so: record.py)."""
        tenant = self._tenant()
        return tenant is not None and tenant.auto

    def _tenant_label(self) -> str:
        return self._identity.tenant if self._identity is not None else ANONYMOUS

    def _allowed_classes(self, tenant: TenantPolicy | None) -> list[str]:
        classes = list(self._policy.classes)
        if tenant is None:
            return classes
        rank = self._policy.class_rank(tenant.priority)
        return classes[rank:] if rank is not None else classes

    def _priority(self, tenant: TenantPolicy | None) -> str | None:
        """The tenant's class, or a lower one the client asked for; None if it asked for
        a class that does not exist or is above its tenant's."""
        default = tenant.priority if tenant is not None else self._policy.default_priority
        asked = requested_class(self._priority_header)
        if asked is None:
            return default
        return asked if asked in self._allowed_classes(tenant) else None


def requested_class(header: str | None) -> str | None:
    """The class a wire.PRIORITY_HEADER value asks for, as the fast lane's model reader
    reads it too (xds/translate/model_reader.py): its last comma-separated value (a
    repeated header's last), trimmed of ASCII whitespace, in lower case; None when it
    asks none (absent or blank). Non-ASCII text is kept as it is, so it names no class."""
    if header is None:
        return None
    asked = header.rpartition(",")[2].strip(" \t\n\v\f\r")
    if not asked:
        return None
    return asked.lower() if asked.isascii() else asked

