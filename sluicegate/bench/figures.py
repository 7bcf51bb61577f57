"""Every figure of a run, from its samples: overall, per scenario, per priority, and
over time (the JSON's content, docs/bench.md, "The JSON")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from sluicegate.bench.http import CONNECTION, INCOMPLETE, TIMEOUT
from sluicegate.bench.samples import HTTP_ERROR, OK, REFUSAL, Sample
from sluicegate.bench.slo import Slo
from sluicegate.bench.stats import counts, percentile, summary

# Bucket widths over time (s): the narrowest that keeps a run within _TIMELINE_POINTS.
_BUCKET_LADDER: Final = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
_TIMELINE_POINTS: Final = 150


def window_s(samples: Sequence[Sample], warmup_s: float) -> float:
    """The measured window: from the end of the warm-up to the last answer."""
    if not samples:
        return 0.0
    return max(max(s.start + s.e2e for s in samples) - warmup_s, 1e-9)


def group_figures(samples: Sequence[Sample], window: float, slo: Slo | None) -> dict[str, Any]:
    """One group's figures (the whole run, a scenario or a priority class)."""
    ok = [s for s in samples if s.kind == OK]
    failed = len(samples) - len(ok)
    output_tokens = sum(s.output_tokens for s in ok)
    known_inputs = [s.input_tokens for s in ok if s.input_tokens is not None]
    per_s = 1.0 / window if window > 0 else 0.0
    tpots = [t for t in (s.tpot for s in ok) if t is not None]
    itls = [gap for s in ok if s.itl is not None for gap in s.itl]
    errors = [s for s in samples if s.kind not in (OK, REFUSAL)]
    refusals = [s for s in samples if s.kind == REFUSAL]
    queued = [s.queue_s for s in samples if s.queue_s is not None]
    retry_after = [s.retry_after for s in refusals if s.retry_after is not None]
    figures: dict[str, Any] = {
        "requests": {"measured": len(samples), "ok": len(ok), "failed": failed},
        "requests_per_s": len(ok) * per_s,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens * per_s,
        "input_tokens": sum(known_inputs) if known_inputs else None,
        "input_tokens_per_s": sum(known_inputs) * per_s if known_inputs else None,
        "error_rate": failed / len(samples) if samples else None,
        "ttft": summary(s.ttft for s in ok if s.ttft is not None),
        "tpot": summary(tpots),
        "itl": summary(itls),
        "e2e": summary(s.e2e for s in ok),
        "goodput": _goodput(samples, ok, per_s, slo),
        "errors": {
            "total": len(errors),
            "by_status": counts(s.status for s in errors if s.kind == HTTP_ERROR),
            "by_code": counts(s.code for s in errors if s.code is not None),
            "by_kind": counts(s.kind for s in errors),
            "connection": sum(1 for s in errors if s.kind == CONNECTION),
            "timeout": sum(1 for s in errors if s.kind == TIMEOUT),
            "incomplete": sum(1 for s in errors if s.kind == INCOMPLETE),
        },
        "refusals": {
            "total": len(refusals),
            "by_status": counts(s.status for s in refusals),
            "by_code": counts(s.code or "" for s in refusals),
            "retry_after": summary(retry_after) if retry_after else None,
        },
        # Only when the gateway reported it (x-sluicegate-queue-ms); null otherwise.
        "queue": summary(queued) if queued else None,
    }
    if slo is not None:
        checks = slo.check(figures)
        figures["slo"] = {"met": all(c["met"] for c in checks), "checks": checks}
    return figures


def _goodput(samples: Sequence[Sample], ok: Sequence[Sample], per_s: float,
             slo: Slo | None) -> dict[str, Any] | None:  # fmt: skip
    """Requests that succeeded within every per-request objective (vLLM's goodput)."""
    if slo is None:
        return None
    limits = slo.per_request_limits()
    good = 0
    for s in ok:
        if "ttft" in limits and (s.ttft is None or s.ttft > limits["ttft"]):
            continue
        # A request with one output token has no TPOT: it meets the objective (as in vLLM).
        if "tpot" in limits and (s.tpot or 0.0) > limits["tpot"]:
            continue
        if "e2e" in limits and s.e2e > limits["e2e"]:
            continue
        good += 1
    return {
        "requests": good,
        "requests_per_s": good * per_s,
        "percent": 100.0 * good / len(samples) if samples else None,
        "objectives": limits,
    }


def timeline(samples: Sequence[Sample], warmup_s: float, window: float) -> dict[str, Any]:
    """Figures per bucket of send time: 0.1 s wide for a short run, wider for longer ones,
    so that there are at most 150 buckets."""
    width = next((w for w in _BUCKET_LADDER if window / w <= _TIMELINE_POINTS), None)
    if width is None:
        width = float(math.ceil(window / _TIMELINE_POINTS))
    buckets: dict[int, list[Sample]] = {}
    for s in samples:
        buckets.setdefault(int((s.start - warmup_s) // width), []).append(s)
    points = []
    for index in sorted(buckets):
        group = buckets[index]
        ok = [s for s in group if s.kind == OK]
        point: dict[str, Any] = {"t": round(index * width, 6), "sent": len(group), "ok": len(ok),
                                 "failed": len(group) - len(ok)}  # fmt: skip
        for name, values in (("ttft", [s.ttft for s in ok if s.ttft is not None]),
                             ("e2e", [s.e2e for s in ok])):  # fmt: skip
            ordered = sorted(values)
            point[name] = (
                {q: percentile(ordered, n) for q, n in (("p50", 50), ("p95", 95), ("p99", 99))}
                if ordered else None
            )  # fmt: skip
        points.append(point)
    return {"bucket_s": width, "points": points}


def run_figures(samples: Sequence[Sample], warmup_s: float, slo: Slo | None,
                scenarios: Sequence[str], priorities: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """Overall figures, then `scenarios` and `priorities` (each the same figures for its
    part of the samples), the window and the timeline."""
    window = window_s(samples, warmup_s)
    figures = group_figures(samples, window, slo)
    figures["window_s"] = window
    figures["scenarios"] = {
        name: group_figures([s for s in samples if s.scenario == name], window, slo)
        for name in scenarios
    }
    figures["priorities"] = {
        name: group_figures([s for s in samples if s.priority == name], window, slo)
        for name in priorities
    }
    figures["timeline"] = timeline(samples, warmup_s, window)
    return figures
