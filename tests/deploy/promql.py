"""What the PromQL in deploy/ names: metric names, and the labels it selects or groups
by, read from the expressions' text (enough for the expressions written there; not a
PromQL parser: promtool checks the syntax)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

# sluicegate's own metrics and the GenAI conventions' (docs/metrics.md).
METRIC: Final = re.compile(r"\b(?:sluicegate|gen_ai)_[a-z_]+\b")
_MATCHER: Final = re.compile(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"')
_GROUPING: Final = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)\s*\(")
# Labels Prometheus adds to every scraped series.
SCRAPE_LABELS: Final = frozenset({"job", "instance"})


@dataclass(frozen=True)
class LabelUse:
    """`labels` selected or grouped by over the series `names`."""

    names: frozenset[str]
    labels: frozenset[str]
    text: str


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(_without_comments(expr)))


def label_uses(expr: str) -> Iterator[LabelUse]:
    """Each selector's matchers (`name{a="x"}`) and each `by (...)`/`without (...)`
    grouping, with the metric names it applies to."""
    expr = _without_comments(expr)
    for match in re.finditer(r"\b((?:sluicegate|gen_ai)_[a-z_]+)\s*\{([^}]*)\}", expr):
        labels = frozenset(_MATCHER.findall(match.group(2)))
        if labels:
            yield LabelUse(frozenset({match.group(1)}), labels, match.group(0))
    for match in _GROUPING.finditer(expr):
        argument = _balanced(expr, match.end() - 1)
        labels = frozenset(label.strip() for label in match.group(1).split(",") if label.strip())
        names = frozenset(METRIC.findall(argument))
        if labels and names:
            yield LabelUse(names, labels, match.group(0) + argument[1:])


def _balanced(text: str, start: int) -> str:
    """The parenthesised text opening at `start`."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return text[start : index + 1]
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _without_comments(expr: str) -> str:
    """PromQL comments run from # to the end of the line, outside strings."""
    return "\n".join(_code_of(line) for line in expr.splitlines())


def _code_of(line: str) -> str:
    quote: str | None = None
    escaped = False
    for index, char in enumerate(line):
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'`":
            quote = char
        elif char == "#":
            return line[:index]
    return line
