"""Lengths of prompts and answers, in tokens: `fixed:N`, `uniform:A-B`,
`lognormal:mean=M,sigma=S`, each drawn from a seeded random.Random."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts; `text` is how it was written (reports, JSON)."""

    kind: str  # fixed | uniform | lognormal
    low: int = 0  # fixed: the value; uniform: the bounds (inclusive)
    high: int = 0
    mean: float = 0.0  # lognormal: the arithmetic mean of the lengths and the normal's sigma
    sigma: float = 0.0

    @property
    def text(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.low}"
        if self.kind == "uniform":
            return f"uniform:{self.low}-{self.high}"
        return f"lognormal:mean={self.mean:g},sigma={self.sigma:g}"

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        # mu chosen so that the lengths' mean is `mean`: E[X] = exp(mu + sigma^2 / 2).
        mu = math.log(self.mean) - self.sigma * self.sigma / 2
        return min(MAX_TOKENS, max(1, round(rng.lognormvariate(mu, self.sigma))))


def parse_lengths(text: str) -> Lengths:
    """Parse one distribution; ValueError says what was expected."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    try:
        if kind == "fixed":
            value = _count(rest)
            return Lengths("fixed", low=value, high=value)
        if kind == "uniform":
            low_text, dash, high_text = rest.partition("-")
            if not dash:
                raise ValueError
            low, high = _count(low_text), _count(high_text)
            if low > high:
                raise ValueError
            return Lengths("uniform", low=low, high=high)
        if kind == "lognormal":
            fields = dict(part.strip().split("=", 1) for part in rest.split(","))
            if set(fields) != {"mean", "sigma"}:
                raise ValueError
            mean, sigma = float(fields["mean"]), float(fields["sigma"])
            if not (1 <= mean <= MAX_TOKENS and 0 <= sigma <= 5):
                raise ValueError
            return Lengths("lognormal", mean=mean, sigma=sigma)
    except ValueError:
        pass
    raise ValueError(
        f"expected fixed:N, uniform:A-B or lognormal:mean=M,sigma=S (token counts >= 1, "
        f"sigma 0..5), got {text!r}"
    )


def _count(text: str) -> int:
    value = int(text.strip())
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError
    return value
