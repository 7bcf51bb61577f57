"""The usage log: JSON answers' real token usage, from Envoy's gRPC access log.

For a request the admission stage marked (wire.META_USAGE_VIA), Envoy's json_to_metadata
filter has read the answer's `usage` members into metadata, and its access log sends the
finished request here (AccessLogService.StreamAccessLogs): the reservation, those members
and the response status, entries batched on one long-lived stream (xds translate
usage.py). Each entry is charged by the rule streams follow (charge.py).
"""

from __future__ import annotations

from typing import Any, Final

from sluicegate import wire

from ..usage import MAX_TOKEN_COUNT, ObservedUsage
from .charge import charge, reserved_from
from .controller import AdmissionController

_PROMPT: Final = ("prompt_tokens", "input_tokens")  # Chat Completions first, Responses API
_COMPLETION: Final = ("completion_tokens", "output_tokens")


def _count(fields: Any, names: tuple[str, ...]) -> int | None:
    """The first member that is a whole number in range (JSON's numbers only; a string,
    a fraction or a boolean is not usage), as the body parser takes them."""
    for name in names:
        if name not in fields:
            continue
        value = fields[name]
        if value.WhichOneof("kind") != "number_value":
            continue
        number = value.number_value
        if number.is_integer() and 0 <= number <= MAX_TOKEN_COUNT:
            return int(number)
    return None


def observed_from(filter_metadata: Any) -> ObservedUsage:
    """What json_to_metadata found in the answer (nothing: a body without usage)."""
    if wire.USAGE_METADATA_NAMESPACE not in filter_metadata:
        return ObservedUsage(None, None, content_chunks=0, malformed=0, done=False)
    fields = filter_metadata[wire.USAGE_METADATA_NAMESPACE].fields
    return ObservedUsage(
        _count(fields, _PROMPT), _count(fields, _COMPLETION), content_chunks=0, malformed=0,
        done=True,
    )  # fmt: skip


class UsageLog:
    """Charges the reservations of the access-log entries it is given."""

    __slots__ = ("_controller",)

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def on_message(self, message: Any) -> int:
        """One StreamAccessLogsMessage; returns how many entries were charged."""
        charged = 0
        for entry in message.http_logs.log_entry:
            filter_metadata = entry.common_properties.metadata.filter_metadata
            reserved = reserved_from(filter_metadata)
            if reserved is None:
                continue
            charge(
                self._controller,
                reserved,
                status=entry.response.response_code.value,
                seen=observed_from(filter_metadata),
                streaming=False,
            )
            charged += 1
        return charged
