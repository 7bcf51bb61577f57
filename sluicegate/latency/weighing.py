"""From providers' smoothed latency and errors to their shares of one priority level.

Pure functions of the evidence and the settings (docs/latency-routing.md, "The weighing"):

    score   = TTFT x (1 + error_penalty x error rate)      (lower is better)
    ratio   = a provider's score / the best one's, each taken `confidence_z` standard
              errors toward the other (a difference the noise could explain is none)
    factor  = 1 within the dead band (ratio <= 1 + dead_band), else
              ((1 + dead_band) / ratio) ^ (alpha x confidence), confidence fading with
              the evidence (stale data gives the configured weights back)
    target  = prior x factor, normalised, no provider below its floor
    current moves toward target by a damped step per tick

The factor is continuous at the dead band's edge (a ratio just past it loses almost
nothing), so noise around the edge cannot flip a provider between two shares; ratios
within the band are equal and leave the configured weights exactly as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .tracker import Smoothed

Shares = Mapping[str, float]  # provider -> share of its priority level (they sum to 1)

# Evidence below this many (decayed) samples is no evidence.
_MIN_MASS: Final = 0.05
# A score is never taken as below this (a TTFT of 0 would make every other infinitely slow).
_MIN_SCORE_S: Final = 1e-4
# Shares closer than this are equal (float noise of normalising).
_EPSILON: Final = 1e-9


@dataclass(frozen=True, slots=True)
class Weighing:
    """The settings; docs/latency-routing.md says why each value."""

    half_life_s: float = 3.0  # of the TTFT, TPOT and error means
    dead_band: float = 0.25  # scores within 25% of the best count as equal
    alpha: float = 2.0  # how hard a slower score pulls the share down
    error_penalty: float = 4.0  # all-failing scores 5x its TTFT
    floor: float = 0.05  # of the level, so a slowed provider's recovery is seen
    confidence_z: float = 1.0  # standard errors a difference must stand out by
    confidence_samples: float = 1.0  # evidence of this many (decayed) samples counts half
    gain: float = 0.35  # of the way to the target, per tick
    min_step: float = 0.01  # the smallest move, so a target is reached, not approached
    push_threshold: float = 0.02  # a share moved this far from the pushed one is pushed
    tick_s: float = 1.0


def factors(evidence: Mapping[str, Smoothed], weighing: Weighing) -> dict[str, float]:
    """Each provider's multiplier of its prior share (1 for as configured). Providers
    without evidence are left out (1)."""
    known = {name: e for name, e in evidence.items() if e.mass > _MIN_MASS}
    if len(known) < 2:
        return {}  # nothing to compare with
    ttfts = [e.ttft_s for e in known.values() if e.ttft_s is not None]
    best_ttft = min(ttfts) if ttfts else 1.0
    bounds = {name: score_bounds(e, best_ttft, weighing) for name, e in known.items()}
    best_name = min(bounds, key=lambda name: bounds[name][1])
    best_high = bounds[best_name][2]
    edge = 1.0 + weighing.dead_band
    result: dict[str, float] = {}
    for name, (low, _, _) in bounds.items():
        ratio = low / best_high
        if ratio <= edge:
            continue
        # Evidence that has faded on either side (this provider's, or the best's) counts
        # less, so stale data gives the configured weights back.
        mass = min(known[name].mass, known[best_name].mass)
        confidence = mass / (mass + weighing.confidence_samples)
        result[name] = (edge / ratio) ** (weighing.alpha * confidence)
    return result


def score_bounds(
    evidence: Smoothed, best_ttft_s: float, weighing: Weighing
) -> tuple[float, float, float]:
    """(low, score, high): the score, and `confidence_z` standard errors below and above.
    Lower is better. A provider with failures but no successful sample yet is lent the
    best TTFT of its level, so only its errors count against it; a TTFT of too few
    samples for a standard error could be anything (its bounds are the widest)."""
    if evidence.ttft_s is None:
        ttft, ttft_se = best_ttft_s, 0.0
    else:
        ttft = evidence.ttft_s
        ttft_se = evidence.ttft_stderr_s if evidence.ttft_stderr_s is not None else math.inf
    errors = evidence.error_rate or 0.0
    errors_se = evidence.error_stderr if evidence.error_stderr is not None else 1.0
    z = weighing.confidence_z
    penalty = weighing.error_penalty

    def scored(ttft_s: float, error_rate: float) -> float:
        return max(ttft_s, _MIN_SCORE_S) * (1.0 + penalty * min(max(error_rate, 0.0), 1.0))

    return (
        scored(ttft - z * ttft_se, errors - z * errors_se),
        scored(ttft, errors),
        scored(ttft + z * ttft_se, errors + z * errors_se),
    )


def target_shares(
    priors: Shares, evidence: Mapping[str, Smoothed], weighing: Weighing
) -> dict[str, float]:
    """The shares the level should have: the priors themselves when nothing is slower
    than the dead band allows (or there is no evidence), else priors x factors,
    normalised, each provider at least its floor."""
    found = factors({name: e for name, e in evidence.items() if name in priors}, weighing)
    if not found:
        return dict(priors)
    raw = {name: prior * found.get(name, 1.0) for name, prior in priors.items()}
    total = sum(raw.values())
    return floored({name: value / total for name, value in raw.items()}, priors, weighing.floor)


def floored(shares: Shares, priors: Shares, floor: float) -> dict[str, float]:
    """`shares` with every provider at least min(floor, its prior), the others scaled
    down to make room (a provider configured below the floor keeps its prior at most)."""
    fixed: dict[str, float] = {}
    while True:
        free = [name for name in shares if name not in fixed]
        room = 1.0 - sum(fixed.values())
        free_total = sum(shares[name] for name in free)
        if not free or free_total <= 0:
            result = {name: fixed.get(name, 0.0) for name in shares}
            total = sum(result.values())
            return {name: value / total for name, value in result.items()}
        result = {name: room * shares[name] / free_total for name in free}
        below = [name for name in free if result[name] < min(floor, priors[name]) - _EPSILON]
        if not below:
            return {**fixed, **result}
        for name in below:
            fixed[name] = min(floor, priors[name])


def step(current: Shares, target: Shares, weighing: Weighing) -> dict[str, float]:
    """One damped move from `current` toward `target`: `gain` of the way, at least
    `min_step` on the provider furthest off, and exactly `target` once within that. One
    fraction for every provider keeps the shares summing to 1."""
    furthest = max(abs(target[name] - current.get(name, 0.0)) for name in target)
    if furthest <= weighing.min_step:
        return dict(target)
    fraction = max(weighing.gain, weighing.min_step / furthest)
    return {
        name: current.get(name, 0.0) + fraction * (share - current.get(name, 0.0))
        for name, share in target.items()
    }


def distance(a: Shares, b: Shares) -> float:
    """How far apart two share vectors are: the largest move of one provider."""
    return max((abs(a.get(name, 0.0) - b.get(name, 0.0)) for name in {*a, *b}), default=0.0)


def same(a: Shares, b: Shares) -> bool:
    return distance(a, b) <= _EPSILON
