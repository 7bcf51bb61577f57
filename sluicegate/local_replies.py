"""Replies Envoy makes itself (local replies) and the OpenAI error `code` each carries.

docs/architecture.md ("Replies Envoy makes itself") is the table these rows implement.
The translator writes them into every listener's local_reply_config
(xds/translate/listeners.py: the JSON pass-through, the FI and OM replies, then
UPSTREAM_ERRORS, then LOCAL_REPLY_ERRORS by status), and sluicegate.records reads the
same rows back (`local_reply_code`) to name the code a client got from what Envoy's
access log shows: the status as answered, the response code details and the flags.
One table, so a record cannot name a code no client was sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from .wire import (
    ANSWERED_ROUTE_PREFIX,
    BODY_READ_MEMBERS,
    MAX_N,
    MAX_TOKENS_MEMBERS,
    META_TENANT,
    METADATA_NAMESPACE,
)

# A drill's abort (route `fault.abort`, flag FI): keeps its status.
FAULT_FLAG: Final = "FI"
FAULT_CODE: Final = "fault_injected"
# Envoy's overload manager shed the request (flag OM): answered 503.
OVERLOAD_FLAG: Final = "OM"
OVERLOAD_CODE: Final = "gateway_overloaded"


@dataclass(frozen=True, slots=True)
class DetailsTest:
    """One test on Envoy's response code details (%RESPONSE_CODE_DETAILS%)."""

    op: Literal["equals", "starts_with", "contains"]
    value: str

    def __post_init__(self) -> None:
        if "'" in self.value or "\\" in self.value:
            raise ValueError(f"not a plain CEL string literal: {self.value!r}")

    def holds(self, details: str) -> bool:
        if self.op == "equals":
            return details == self.value
        if self.op == "starts_with":
            return details.startswith(self.value)
        return self.value in details

    @property
    def cel(self) -> str:
        """The same test as a CEL condition, for Envoy's local_reply_config."""
        if self.op == "equals":
            return f"response.code_details == '{self.value}'"
        method = "startsWith" if self.op == "starts_with" else "contains"
        return f"response.code_details.{method}('{self.value}')"


def equals(value: str) -> DetailsTest:
    return DetailsTest("equals", value)


def starts_with(value: str) -> DetailsTest:
    return DetailsTest("starts_with", value)


def contains(value: str) -> DetailsTest:
    return DetailsTest("contains", value)


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """One local-reply mapper for a way a request fails inside Envoy: it matches when any
    of `details_any` (each a conjunction of tests) holds for the details, or, without
    those, when Envoy set any of `flags`; the reply is `status` with `code`."""

    code: str
    status: int
    message: str
    details_any: tuple[tuple[DetailsTest, ...], ...] = ()
    flags: tuple[str, ...] = ()
    retry_after_s: int | None = None  # adds a Retry-After header
    # A refusal for capacity (not a failure): adds wire.REFUSAL_HEADER with the code.
    refusal: bool = False

    @property
    def details(self) -> str | None:
        """`details_any` as one CEL condition on response.code_details (None: by flags)."""
        if not self.details_any:
            return None
        alternatives = []
        for tests in self.details_any:
            joined = " && ".join(test.cel for test in tests)
            alternatives.append(joined if len(tests) == 1 else f"({joined})")
        return " || ".join(alternatives)

    def matches(self, details: str, flags: frozenset[str]) -> bool:
        """As Envoy's mapper filter does: the CEL condition, or a response flag filter
        (any of the flags set)."""
        if self.details_any:
            return any(all(test.holds(details) for test in tests) for tests in self.details_any)
        return not flags.isdisjoint(self.flags)


# Checked on Envoy 1.40 (xds/translate/upstream_errors.py: which details and flags each
# failure gives), in mapper order: the first that matches answers.
UPSTREAM_ERRORS: Final[tuple[UpstreamError, ...]] = (
    # No ext_proc server reachable (14 = UNAVAILABLE), or the one serving the request died
    # mid-stream: a fault of the gateway's own, but one a retry soon fixes (up restarts
    # the server; Envoy's health check moves traffic off it), so 503 with Retry-After.
    UpstreamError(
        "ext_proc_unavailable",
        503,
        "The gateway cannot process requests right now (no ext_proc server reachable); "
        "try again shortly",
        details_any=(
            (starts_with("ext_proc_error_gRPC_error_14{"),),
            (starts_with("ext_proc_error_gRPC_error_"), contains("{upstream_reset")),
        ),
        retry_after_s=1,
    ),
    UpstreamError(
        "upstream_timeout",
        504,
        "The provider did not start answering within the first-byte timeout "
        "(timeouts.first_byte, or timeouts.first_token for a streamed request), on every "
        "attempt",
        details_any=((equals("upstream_per_try_timeout"),),),
    ),
    UpstreamError(
        "upstream_idle_timeout",
        504,
        "The provider sent nothing for longer than the idle timeout (timeouts.idle), "
        "on every attempt",
        details_any=((equals("upstream_per_try_idle_timeout"),),),
    ),
    UpstreamError(
        "deadline_exceeded",
        504,
        "The request did not complete within the route's total timeout (timeouts.total)",
        details_any=((equals("response_timeout"),),),
    ),
    UpstreamError(
        "stream_idle_timeout",
        504,
        "Nothing was sent or received on this request for too long",
        details_any=((equals("stream_idle_timeout"),),),
    ),
    UpstreamError(
        "upstream_connect_timeout",
        503,
        "Could not connect to the provider within the connect timeout (timeouts.connect)",
        details_any=((contains("{connection_timeout"),),),
    ),
    UpstreamError(
        "upstream_overflow",
        503,
        "Too many requests in flight to this model's providers (a pool limit); try again shortly",
        flags=("UO",),
        retry_after_s=1,
        refusal=True,
    ),
    UpstreamError(
        "no_healthy_upstream",
        503,
        "No healthy provider is available for this model right now",
        flags=("UH",),
    ),
    UpstreamError(
        "upstream_connect_error",
        503,
        "Could not connect to the provider",
        flags=("UF",),
    ),
    UpstreamError(
        "upstream_reset",
        503,
        "The provider closed the connection before answering",
        flags=("UC", "UR"),
    ),
)


@dataclass(frozen=True, slots=True)
class LocalReplyError:
    """How a local reply with `status` is presented. `message` is an Envoy format string."""

    status: int
    type: str
    code: str | None
    message: str = "%LOCAL_REPLY_BODY%"
    # The status the client gets instead of `status` (a client fault Envoy answers 5xx).
    answered_as: int | None = None
    # With `answered_as`: the response code details Envoy gives this reply. Access logs
    # see the status as answered, so these tell it from the reply of that status.
    details: tuple[str, ...] = ()


# Envoy-originated replies, by status. Statuses not listed: 4xx → invalid_request_error,
# anything else → server_error (both with code null).
LOCAL_REPLY_ERRORS: Final[tuple[LocalReplyError, ...]] = (
    # Malformed HTTP from the client (Envoy's codec).
    LocalReplyError(400, "invalid_request_error", "bad_request"),
    # The catch-all route. %REQ_WITHOUT_QUERY% keeps query strings (maybe keys) out.
    LocalReplyError(
        404,
        "invalid_request_error",
        "unknown_url",
        "%LOCAL_REPLY_BODY% (%REQ(:METHOD)% %REQ_WITHOUT_QUERY(:PATH):200%)",
    ),
    # The client was too slow sending its request.
    LocalReplyError(408, "invalid_request_error", "request_timeout"),
    # Body above limits.max_request_body_bytes while ext_proc buffers it; the listener
    # builder replaces the message with one naming the limit.
    LocalReplyError(413, "invalid_request_error", "request_too_large"),
    LocalReplyError(431, "invalid_request_error", "request_headers_too_large"),
    # Envoy's codec refuses what it does not implement with 501, e.g. `Transfer-Encoding:
    # gzip, chunked` (its only 501, details http1.invalid_transfer_encoding): the client's
    # fault, so 400.
    LocalReplyError(
        501,
        "invalid_request_error",
        "unsupported_request",
        "The request uses an HTTP feature the gateway does not support (%RESPONSE_CODE_DETAILS%)",
        answered_as=400,
        details=("http1.invalid_transfer_encoding",),
    ),
    # ext_proc failures (gRPC error, server unreachable) and other internal errors.
    # Envoy gives these an empty body; the details name the cause, e.g.
    # "ext_proc_error_gRPC_error_14{…}".
    LocalReplyError(
        500, "server_error", "internal_error", "Gateway error (%RESPONSE_CODE_DETAILS%)"
    ),
    LocalReplyError(502, "server_error", "bad_gateway"),
    # No healthy provider, connect failure, reset, pool overflow.
    LocalReplyError(503, "server_error", "upstream_unavailable"),
    # Route / per-try timeout ("upstream_response_timeout", "upstream_per_try_timeout"), or
    # the ext_proc server did not answer in time (Envoy's body is then empty).
    LocalReplyError(
        504, "server_error", "upstream_timeout", "Request timed out (%RESPONSE_CODE_DETAILS%)"
    ),
)


@dataclass(frozen=True, slots=True)
class EnvoyRefusal:
    """A fast-lane refusal an Envoy filter makes (docs/fast-lane.md): its local reply is
    told by its response code details, exactly; `message` is an Envoy format string."""

    details: str
    status: int
    type: str
    code: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()


# Envoy's response details of a request a fast-lane token bucket refused.
BUCKETS_REFUSED: Final = "local_rate_limited"
# Checked on Envoy 1.40: api_key_auth's details for no key and an unknown key, and
# local_ratelimit's. In the routing stage's words where it has them (filters/admission).
FAST_LANE_REFUSALS: Final[tuple[EnvoyRefusal, ...]] = (
    EnvoyRefusal(
        "missing_api_key",
        401,
        "invalid_request_error",
        "missing_api_key",
        "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
        (("www-authenticate", "Bearer"),),
    ),
    EnvoyRefusal(
        "unknown_api_key",
        401,
        "invalid_request_error",
        "invalid_api_key",
        "Incorrect API key provided. Ask the gateway's operator for a valid key.",
        (("www-authenticate", "Bearer"),),
    ),
    # The bucket's filter adds Retry-After and the refusal header (tenant_limits.py).
    EnvoyRefusal(
        BUCKETS_REFUSED,
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
        f"Rate limit reached for tenant %DYNAMIC_METADATA({METADATA_NAMESPACE}:{META_TENANT})%, "
        "its key or this model "
        "(requests or tokens per window). Please retry after the Retry-After header's "
        "seconds.",
    ),
)


def split_flags(flags: str) -> frozenset[str]:
    """Envoy's %RESPONSE_FLAGS% ("UT,URX"; "-" or "" for none) as a set of flags."""
    return frozenset(flag for flag in flags.split(",") if flag and flag != "-")


def local_reply_code(status: int, details: str, flags: Iterable[str]) -> str | None:
    """The `code` of a local reply that is not already JSON, as local_reply_config gives
    it, from what the access log sees: `status` as answered (after a mapper's rewrite),
    the details and the flags. None: the reply's code is null (a status not listed)."""
    flag_set = frozenset(flags)
    for refusal in FAST_LANE_REFUSALS:
        if refusal.details == details:
            return refusal.code
    if FAULT_FLAG in flag_set:
        return FAULT_CODE
    if OVERLOAD_FLAG in flag_set:
        return OVERLOAD_CODE
    for upstream in UPSTREAM_ERRORS:
        if upstream.matches(details, flag_set):
            return upstream.code
    for reply in LOCAL_REPLY_ERRORS:
        if reply.answered_as == status and details in reply.details:
            return reply.code
    for reply in LOCAL_REPLY_ERRORS:
        if reply.status == status and reply.answered_as is None:
            return reply.code
    return None


@dataclass(frozen=True, slots=True)
class BodyRefusal:
    """A request Envoy answers itself when it routes without Python (docs/fast-lane.md):
    the body Envoy could not route by. `problem` is what the model reader found
    (xds/translate/model_reader.py)."""

    problem: str
    status: int
    code: str
    message: str
    param: str | None
    type: str = "invalid_request_error"


# The routing stage's own wording (filters/errors.py).
_BODY_REFUSALS: Final = (
    BodyRefusal(
        "json",
        400,
        "invalid_json",
        "We could not parse the JSON body of your request: it must be a JSON object "
        "encoded as UTF-8.",
        None,
    ),
    BodyRefusal("object", 400, "invalid_body", "The request body must be a JSON object.", None),
    BodyRefusal("model", 400, "missing_model", "You must provide a model parameter.", "model"),
    BodyRefusal(
        "model_type", 400, "invalid_type", "Invalid type for 'model': expected a string.", "model"
    ),
    BodyRefusal(
        "stream", 400, "invalid_type", "Invalid type for 'stream': expected a boolean.", "stream"
    ),
    BodyRefusal(
        "n", 400, "invalid_value", f"Invalid 'n': expected an integer from 1 to {MAX_N}.", "n"
    ),
)
DUPLICATE_PREFIX: Final = "duplicate_"
MAX_TOKENS_PREFIX: Final = "max_tokens_"


def body_refusals(max_output_tokens: int) -> tuple[BodyRefusal, ...]:
    """Every body the model reader refuses: the fixed ones, a repeated member it reads
    (wire.BODY_READ_MEMBERS: `duplicate_<member>`), and an output cap that is no whole
    number from 1 to `max_output_tokens` (admission's; `max_tokens_<spelling>`)."""
    duplicates = tuple(
        BodyRefusal(
            DUPLICATE_PREFIX + member,
            400,
            "duplicate_parameter",
            f"The '{member}' parameter appears more than once in the request body.",
            member,
        )
        for member in BODY_READ_MEMBERS
    )
    caps = tuple(
        BodyRefusal(
            MAX_TOKENS_PREFIX + member,
            400,
            "invalid_value",
            f"Invalid '{member}': expected an integer from 1 to {max_output_tokens}.",
            member,
        )
        for member in MAX_TOKENS_MEMBERS
    )
    return (*_BODY_REFUSALS, *duplicates, *caps)


# A tenant's key asked for a model outside the tenant's `models` (the routing stage's
# model_forbidden, without the tenant and model, which a fixed answer cannot name).
MODEL_NOT_ALLOWED: Final = BodyRefusal(
    "model_not_allowed",
    403,
    "model_not_allowed",
    "Your key's tenant may not use this model.",
    "model",
)
# Envoy's key check named a fast-lane client the model reader does not know yet: a reload
# that adds a tenant reaches the key check before the reader (their configurations are
# pushed one after the other).
UNKNOWN_CLIENT: Final = BodyRefusal(
    "unknown_client",
    503,
    "gateway_reconfiguring",
    "The gateway is applying a configuration change; please retry shortly.",
    None,
    "server_error",
)
# A client asked (wire.PRIORITY_HEADER) for a class that does not exist or is above its
# tenant's (the routing stage's bad_priority, without the value and the classes allowed,
# which a fixed answer cannot name).
INVALID_PRIORITY: Final = BodyRefusal(
    "invalid_priority",
    400,
    "invalid_priority",
    "Header x-sluicegate-priority names no priority class your key may use.",
    "x-sluicegate-priority",
)
# What the model reader refuses of the client rather than the body, each answered by a
# route of its own after the body's refusals.
CLIENT_REFUSALS: Final = (MODEL_NOT_ALLOWED, INVALID_PRIORITY, UNKNOWN_CLIENT)
MODEL_NOT_SERVED: Final = BodyRefusal(
    "model_not_served",
    404,
    "model_not_found",
    "The model does not exist or you do not have access to it.",
    "model",
)


def answered_route_name(refusal: BodyRefusal) -> str:
    """The name of the route that answers a refusal: named after it, so a record names
    its code."""
    return ANSWERED_ROUTE_PREFIX + refusal.problem


def answered_code(route: str) -> str | None:
    """The code of the refusal a route named by answered_route_name answers (None: not
    such a route)."""
    if not route.startswith(ANSWERED_ROUTE_PREFIX):
        return None
    # Codes do not depend on the limit a message names.
    for refusal in (*body_refusals(1), *CLIENT_REFUSALS, MODEL_NOT_SERVED):
        if answered_route_name(refusal) == route:
            return refusal.code
    return None
