"""The client-facing errors of the ext_proc stages, serialized once."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from .jsonbody import BodyError, BodyProblem
from .responses import immediate_error

_MODEL_NAME_SHOWN: Final = 200  # longest model name echoed back in a 404

INVALID_JSON: Final = immediate_error(
    400,
    "We could not parse the JSON body of your request: it must be a JSON object encoded as UTF-8.",
    param=None,
    code="invalid_json",
)
NOT_AN_OBJECT: Final = immediate_error(
    400,
    "The request body must be a JSON object.",
    param=None,
    code="invalid_body",
)
DUPLICATE_MODEL: Final = immediate_error(
    400,
    "The 'model' parameter appears more than once in the request body.",
    param="model",
    code="duplicate_parameter",
)
MISSING_MODEL: Final = immediate_error(
    400,
    "You must provide a model parameter.",
    param="model",
    code="missing_model",
)
MODEL_NOT_STRING: Final = immediate_error(
    400,
    "Invalid type for 'model': expected a string.",
    param="model",
    code="invalid_type",
)
INVALID_MAX_TOKENS: Final = immediate_error(
    400,
    "Invalid 'max_tokens': expected an integer of at least 1, no larger than the gateway's "
    "limit on output tokens.",
    param="max_tokens",
    code="invalid_value",
)
INVALID_N: Final = immediate_error(
    400,
    "Invalid 'n': expected an integer from 1 to 128.",
    param="n",
    code="invalid_value",
)
STREAM_NOT_BOOLEAN: Final = immediate_error(
    400,
    "Invalid type for 'stream': expected a boolean.",
    param="stream",
    code="invalid_type",
)
INVALID_STREAM_OPTIONS: Final = immediate_error(
    400,
    "Invalid type for 'stream_options': expected an object whose 'include_usage' is a boolean.",
    param="stream_options",
    code="invalid_type",
)
UNKNOWN_STAGE: Final = immediate_error(
    500,
    "The gateway's request filter is misconfigured (unknown ext_proc stage).",
    type="server_error",
    code="ext_proc_misconfigured",
)
BAD_UPSTREAM_METADATA: Final = immediate_error(
    500,
    "The gateway's provider metadata could not be read.",
    type="server_error",
    code="bad_provider_metadata",
)

# One answer per problem; `body_error` refines two of them with the member at fault.
BODY_PROBLEMS: Final[dict[BodyProblem, bytes]] = {
    "json": INVALID_JSON,
    "object": NOT_AN_OBJECT,
    "duplicate": DUPLICATE_MODEL,
    "model": MISSING_MODEL,
    "model_type": MODEL_NOT_STRING,
    "max_tokens": INVALID_MAX_TOKENS,
    "n": INVALID_N,
    "stream": STREAM_NOT_BOOLEAN,
    "stream_options": INVALID_STREAM_OPTIONS,
}


def body_error(exc: BodyError, *, max_output_tokens: int | None = None) -> bytes:
    """The answer to `exc`, naming the parameter the client actually sent.

    A duplicate names its member; a max-tokens problem names its spelling
    (max_tokens, max_completion_tokens, max_output_tokens) and, given the
    gateway's limit, states it. Answers are built once per distinct case.
    """
    member = exc.member
    if exc.problem == "duplicate" and member is not None and member != "model":
        return _duplicate(member)
    if exc.problem == "max_tokens" and (
        (member is not None and member != "max_tokens") or max_output_tokens is not None
    ):
        return _max_tokens(member or "max_tokens", max_output_tokens)
    return BODY_PROBLEMS[exc.problem]


# The members are the few names the filters read, so these caches stay small.
@lru_cache(maxsize=64)
def _duplicate(member: str) -> bytes:
    return immediate_error(
        400,
        f"The '{member}' parameter appears more than once in the request body.",
        param=member,
        code="duplicate_parameter",
    )


@lru_cache(maxsize=64)
def _max_tokens(member: str, limit: int | None) -> bytes:
    allowed = (
        "of at least 1, no larger than the gateway's limit on output tokens"
        if limit is None
        else f"from 1 to {limit}"
    )
    return immediate_error(
        400,
        f"Invalid '{member}': expected an integer {allowed}.",
        param=member,
        code="invalid_value",
    )


def shown_model(model: str) -> str:
    """A client's model name as an error message echoes it: never more than a line."""
    return model if len(model) <= _MODEL_NAME_SHOWN else model[:_MODEL_NAME_SHOWN] + "…"


def model_not_found(model: str) -> bytes:
    """404 for a model no route serves."""
    shown = shown_model(model)
    return immediate_error(
        404,
        f"The model `{shown}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )
