"""The client-facing errors of the ext_proc stages, serialized once."""

from __future__ import annotations

from typing import Final

from .jsonbody import BodyProblem
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

BODY_PROBLEMS: Final[dict[BodyProblem, bytes]] = {
    "json": INVALID_JSON,
    "object": NOT_AN_OBJECT,
    "duplicate": DUPLICATE_MODEL,
}


def model_not_found(model: str) -> bytes:
    """404 for a model no route serves (name shortened, never more than a line)."""
    shown = model if len(model) <= _MODEL_NAME_SHOWN else model[:_MODEL_NAME_SHOWN] + "…"
    return immediate_error(
        404,
        f"The model `{shown}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )
