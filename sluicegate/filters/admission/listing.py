"""A tenant's own model listing: `GET <prefix>models` and `GET <prefix>models/<id>`.

Envoy answers the listings itself, from the routes (direct responses). A tenant allowed
only some models must not be shown the others, nor be told that one it may not use
exists: for it the routing stage answers in Envoy's place, as OpenAI does for a key
restricted to some models.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate import wire

from .. import errors
from ..responses import immediate_json

_LISTING_DETAILS = f"{wire.EXT_PROC_DETAILS_PREFIX}tenant_models"


def tenant_listing(
    method: str | None,
    path: str | None,
    served: Mapping[str, frozenset[str]],
    allowed: frozenset[str],
) -> bytes | None:
    """The answer to a listing request from a tenant limited to `allowed`, or None when the
    request is no listing, or one Envoy's own answer serves as well (a model it may use).

    `served`: path prefix -> models served under it. Like Envoy's listing routes this
    matches GET and the exact path; the query string is ignored.
    """
    if method != "GET" or path is None:
        return None
    path = path.split("?", 1)[0]
    for prefix, models in served.items():
        listing = f"{prefix}models"
        if path == listing:
            return immediate_json(
                200, wire.models_list_body(models & allowed), details=_LISTING_DETAILS
            )
        if path.startswith(listing + "/"):
            model = path[len(listing) + 1 :]
            if model in models and model not in allowed:
                return errors.model_not_found(model)
    return None
