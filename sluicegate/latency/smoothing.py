"""A time-decayed mean: recent samples count, old ones fade by a half-life.

Each sample enters with weight 1, and every weight halves every `half_life_s` seconds, so
the mean is over the last few half-lives, and a route with no traffic at all lets its
evidence fade to nothing, which the weighing reads as "no data". Besides the mean it keeps
what says how far to trust it: the decayed sum of weights (`mass`, recent samples), the
effective number of samples those weights amount to, and the variance, hence the mean's
standard error. A provider's few trickle samples after a slowdown move its mean as much as
many would; the standard error says they are few (docs/latency-routing.md). Pure: the
caller passes the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

# Below this mass a mean is forgotten (about 30 half-lives after the last sample).
_FORGOTTEN: Final = 1e-9


@dataclass(slots=True)
class DecayingMean:
    half_life_s: float
    _total: float = 0.0  # sum of weight x value
    _squares: float = 0.0  # sum of weight x value^2
    _mass: float = 0.0  # sum of weights
    _mass2: float = 0.0  # sum of squared weights
    _at: float = 0.0  # when the sums were last decayed

    def add(self, value: float, now: float) -> None:
        self._decay(now)
        self._total += value
        self._squares += value * value
        self._mass += 1.0
        self._mass2 += 1.0

    def mean(self) -> float | None:
        """The weighted mean (decay scales every weight alike, so it does not move it)."""
        return self._total / self._mass if self._mass > _FORGOTTEN else None

    def mass(self, now: float) -> float:
        """The samples' summed weights at `now`: recent evidence, in samples."""
        self._decay(now)
        return self._mass

    def effective_samples(self) -> float:
        """Kish's effective sample size of the weights, (sum w)^2 / sum w^2: between the
        mass and the number of samples. Decay scales it not."""
        return self._mass * self._mass / self._mass2 if self._mass2 > 0 else 0.0

    def standard_error(self) -> float | None:
        """The mean's standard error (weighted variance, corrected for the effective
        sample size), or None with fewer than two effective samples."""
        samples = self.effective_samples()
        if samples < 2:
            return None
        mean = self._total / self._mass
        variance = max(0.0, self._squares / self._mass - mean * mean) * samples / (samples - 1)
        return math.sqrt(variance / samples)

    def _decay(self, now: float) -> None:
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        if self._mass:
            factor = 0.5 ** (elapsed / self.half_life_s)
            self._total *= factor
            self._squares *= factor
            self._mass *= factor
            self._mass2 *= factor * factor
            if self._mass <= _FORGOTTEN:
                self._total = self._squares = self._mass = self._mass2 = 0.0
