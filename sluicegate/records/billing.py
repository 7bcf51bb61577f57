"""What a finished request is billed, in tokens: one rule for every counter of a tenant's
usage (docs/admission.md, "Reconciliation").

Read by the routing stage when it reconciles a reservation (filters/admission/charge.py),
by the ext_proc servers when they charge an `auto` tenant's fast-lane request into its
exact-lane windows, and by the control plane's lane steering (sluicegate.lanes):
- the provider's `usage` (a JSON body's, or a stream's usage event): exactly that;
- an error status (4xx/5xx from the provider or from Envoy) without usage, or no response
  at all (status 0: the client left first): nothing (providers do not bill failed
  requests);
- a stream without usage: the estimated prompt tokens and one output token per event that
  carried text (OpenAI-compatible servers send about one token per event), as Envoy
  counted them;
- else (a JSON body without usage): the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .record import RequestRecord

SOURCE_PROVIDER: Final = "provider"
SOURCE_COUNTED: Final = "counted"
SOURCE_ESTIMATE: Final = "estimate"
SOURCE_ERROR: Final = "error"


@dataclass(frozen=True, slots=True)
class Billed:
    """Tokens a finished request is billed, and which rule gave them (the SOURCE_*)."""

    input_tokens: int
    output_tokens: int
    source: str

    @property
    def failed(self) -> bool:
        """Nothing was billed because the request failed or got no answer: it does not
        count as a request either."""
        return self.source == SOURCE_ERROR


def billed(
    *,
    status: int,
    estimate_input: int,
    estimate_output: int,
    used: tuple[int, int] | None,
    counted: int | None,
) -> Billed:
    """The module's rule. `used`: the provider's (input, output) usage when it stated
    both; `counted`: a stream's events that carried text, when Envoy counted them."""
    if used is not None:
        return Billed(used[0], used[1], SOURCE_PROVIDER)
    if status >= 400 or status == 0:
        return Billed(0, 0, SOURCE_ERROR)
    if counted is not None:
        return Billed(estimate_input, counted, SOURCE_COUNTED)
    return Billed(estimate_input, estimate_output, SOURCE_ESTIMATE)


def billed_in_flight(record: RequestRecord) -> Billed:
    """What a request still running is billed until its end: its estimate (its record
    sent while it runs: RequestRecord.in_flight)."""
    return Billed(record.estimate_input, record.estimate_output, SOURCE_ESTIMATE)


def billed_record(record: RequestRecord) -> Billed:
    """What the request of `record` is billed (the module's rule)."""
    used = (
        None
        if record.input_tokens is None or record.output_tokens is None
        else (record.input_tokens, record.output_tokens)
    )
    return billed(
        status=record.status,
        estimate_input=record.estimate_input,
        estimate_output=record.estimate_output,
        used=used,
        # A stream Envoy did not count (not an event stream after all) keeps its estimate.
        counted=record.counted_events,
    )
