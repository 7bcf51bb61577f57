"""The usage log: JSON answers' real token usage, from Envoy's gRPC access log.

For a request the admission stage marked (wire.META_USAGE_VIA), Envoy's json_to_metadata
filter has read the answer's `usage` members into metadata, and its access log sends the
finished request here (AccessLogService.StreamAccessLogs): the reservation, those members
and the response status, entries batched on one long-lived stream (xds translate
usage.py). Each entry is charged by the rule streams follow (charge.py).
"""

from __future__ import annotations

from typing import Any

from sluicegate import wire

from ..usage import ObservedUsage, usage_counts
from .charge import charge, reserved_from
from .controller import AdmissionController


def _json_value(value: Any) -> object:
    """A member as the body parser would hold it. Envoy keeps JSON numbers as doubles, so
    a whole one becomes an int again (12 and 12.0 alike); anything else is not a count."""
    if value.WhichOneof("kind") == "number_value" and value.number_value.is_integer():
        return int(value.number_value)
    return None


def observed_from(filter_metadata: Any) -> ObservedUsage:
    """What json_to_metadata found in the answer (nothing: a body without usage), read by
    the body parser's rules (usage.usage_counts)."""
    if wire.USAGE_METADATA_NAMESPACE not in filter_metadata:
        return ObservedUsage(None, None, content_chunks=0, malformed=0, done=False)
    fields = filter_metadata[wire.USAGE_METADATA_NAMESPACE].fields
    members = {name: _json_value(value) for name, value in fields.items()}
    input_tokens, output_tokens = usage_counts(members)
    return ObservedUsage(input_tokens, output_tokens, content_chunks=0, malformed=0, done=True)


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
