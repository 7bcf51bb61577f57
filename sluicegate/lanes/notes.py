"""What the lane steering counts of an `auto` tenant's request: a usage note, made by the
ext_proc servers from the request records Envoy sends them, and sent on to the control
plane (docs/fast-lane.md, "The auto lane").

    note = note_of(record)              # None: not an auto tenant's request, or a listing
    body = note_body(note)              # a LogRecord body (wire.LANE_USAGE_LOG_NAME)
    note = note_from_fields(fields)     # records.fields_of(log_record) in the control plane

The ext_proc servers decode every record anyway (metrics, charges); a note is the little
the steering reads of one, so Envoy sends the control plane no record log of its own and
the control plane decodes no record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from sluicegate import wire
from sluicegate.local_replies import BUCKETS_REFUSED
from sluicegate.records import RequestRecord, billed_in_flight, billed_record

# running: its first record while it runs, its estimate; ended: its end, what it was
# billed; failed: its end, billed nothing; refused: failed, refused by the fast lane's
# token buckets (the steering moves the tenant at once).
Kind = Literal["running", "ended", "failed", "refused"]
KINDS: Final[tuple[Kind, ...]] = ("running", "ended", "failed", "refused")


@dataclass(frozen=True, slots=True)
class UsageNote:
    """One request record of an auto tenant, as the steering counts it: the request (its
    tenant, key and Envoy's stream id), whether it runs or ended and how, and its tokens
    (the estimate while it runs, what it was billed at its end)."""

    tenant: str
    key_name: str
    stream_id: str
    kind: Kind
    input_tokens: int
    output_tokens: int

    @property
    def running(self) -> bool:
        return self.kind == "running"

    @property
    def failed(self) -> bool:
        return self.kind in ("failed", "refused")


def note_of(record: RequestRecord) -> UsageNote | None:
    """The note of an auto tenant's request record (wire.META_AUTO_LANE, either lane);
    None for another's, or one without a model (a listing: no lane charges it)."""
    if not record.auto_lane or not record.tenant or not record.model:
        return None
    if record.in_flight:
        estimate = billed_in_flight(record)
        kind: Kind = "running"
        input_tokens, output_tokens = estimate.input_tokens, estimate.output_tokens
    else:
        bill = billed_record(record)
        if not bill.failed:
            kind = "ended"
        elif record.fast_lane and record.code_details == BUCKETS_REFUSED:
            kind = "refused"  # a provider's own 429 says `via_upstream`
        else:
            kind = "failed"
        input_tokens, output_tokens = bill.input_tokens, bill.output_tokens
    return UsageNote(
        record.tenant, record.key_name, record.stream_id, kind, input_tokens, output_tokens
    )


def note_body(note: UsageNote) -> str:
    """The note as a LogRecord body (wire.record_body)."""
    return wire.record_body(
        wire.LANE_USAGE_LOG_NAME,
        {
            wire.NOTE_TENANT: note.tenant,
            wire.NOTE_KEY_NAME: note.key_name or "-",
            wire.NOTE_STREAM_ID: note.stream_id or "-",
            wire.NOTE_KIND: note.kind,
            wire.NOTE_INPUT_TOKENS: str(note.input_tokens),
            wire.NOTE_OUTPUT_TOKENS: str(note.output_tokens),
        },
    )


def note_from_fields(fields: dict[str, str]) -> UsageNote | None:
    """A note from a body's fields (records.fields_of); None for one that is not whole
    (a sender of another version)."""
    kind = next((kind for kind in KINDS if kind == fields.get(wire.NOTE_KIND)), None)
    tenant = fields.get(wire.NOTE_TENANT, "-")
    if kind is None or tenant == "-":
        return None
    try:
        input_tokens = int(fields.get(wire.NOTE_INPUT_TOKENS, ""))
        output_tokens = int(fields.get(wire.NOTE_OUTPUT_TOKENS, ""))
    except ValueError:
        return None
    if input_tokens < 0 or output_tokens < 0:
        return None
    key_name, stream_id = fields.get(wire.NOTE_KEY_NAME, "-"), fields.get(wire.NOTE_STREAM_ID, "-")
    return UsageNote(
        tenant,
        "" if key_name == "-" else key_name,
        "" if stream_id == "-" else stream_id,
        kind,
        input_tokens,
        output_tokens,
    )
