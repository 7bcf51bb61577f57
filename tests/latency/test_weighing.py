"""The weighing, pure: shares of one priority level from smoothed figures
(docs/latency-routing.md, "The weighing")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.latency import Smoothed, Weighing, factors, floored, step, target_shares

W = Weighing()
EVEN = {"a": 0.5, "b": 0.5}


def seen(
    ttft_s: float | None, error_rate: float = 0.0, mass: float = 50.0, stderr: float = 0.02
) -> Smoothed:
    """Smoothed figures whose standard errors are `stderr` of their values."""
    return Smoothed(
        ttft_s=ttft_s,
        tpot_s=None,
        error_rate=error_rate,
        mass=mass,
        samples=100,
        ttft_stderr_s=None if ttft_s is None else ttft_s * stderr,
        error_stderr=0.01 if stderr else 0.0,
    )


def test_no_evidence_keeps_the_configured_shares_exactly() -> None:
    priors = {"a": 0.75, "b": 0.25}
    assert target_shares(priors, {}, W) == priors
    assert target_shares(priors, {"a": seen(0.05)}, W) == priors  # nothing to compare with
    # Evidence that has faded away is no evidence.
    faded = {"a": seen(0.05, mass=0.01), "b": seen(5.0, mass=0.01)}
    assert target_shares(priors, faded, W) == priors


def test_scores_within_the_dead_band_are_equal() -> None:
    within = {"a": seen(0.100), "b": seen(0.124)}  # 24% slower
    assert target_shares(EVEN, within, W) == EVEN
    assert factors(within, W) == {}


def test_the_factor_is_continuous_at_the_edge_of_the_dead_band() -> None:
    """Just past the band a provider loses almost nothing: noise around the edge cannot
    flip it between two shares."""
    exact = {"stderr": 0.0, "mass": 1e6}  # no noise, no fading: the edge itself
    just_past = factors({"a": seen(0.100, **exact), "b": seen(0.1251, **exact)}, W)
    assert 0.99 < just_past["b"] < 1.0
    assert factors({"a": seen(0.100, **exact), "b": seen(0.1249, **exact)}, W) == {}


def test_a_5x_slower_provider_falls_below_20_percent_but_not_below_the_floor() -> None:
    shares = target_shares(EVEN, {"a": seen(0.05), "b": seen(0.25)}, W)
    assert W.floor <= shares["b"] < 0.10
    assert shares["a"] == pytest.approx(1 - shares["b"])
    # 50x slower: held at the floor, so its recovery is still seen.
    shares = target_shares(EVEN, {"a": seen(0.05), "b": seen(2.5)}, W)
    assert shares["b"] == pytest.approx(W.floor)


def test_errors_weigh_like_latency() -> None:
    """All failing scores 1 + error_penalty times its TTFT; a provider that never succeeded
    is judged on its errors alone (the best TTFT is lent to it)."""
    shares = target_shares(EVEN, {"a": seen(0.05), "b": seen(None, error_rate=1.0)}, W)
    assert shares["b"] < 0.10
    shares = target_shares(EVEN, {"a": seen(0.05), "b": seen(0.05, error_rate=0.05)}, W)
    assert shares == EVEN  # 5% errors: 1.2x, within the dead band


def test_thin_or_noisy_evidence_counts_less() -> None:
    thick = target_shares(EVEN, {"a": seen(0.05), "b": seen(0.25)}, W)
    faded = target_shares(EVEN, {"a": seen(0.05), "b": seen(0.25, mass=0.5)}, W)
    assert thick["b"] < faded["b"] < 0.5
    noisy = target_shares(EVEN, {"a": seen(0.05), "b": seen(0.25, stderr=0.3)}, W)
    assert thick["b"] < noisy["b"] < 0.5
    # A difference the noise explains is none: 40% apart, each mean +-20% (one stderr).
    assert (
        target_shares(EVEN, {"a": seen(0.05, stderr=0.2), "b": seen(0.07, stderr=0.2)}, W) == EVEN
    )
    # A TTFT of too few samples for a standard error could be anything.
    lone = Smoothed(0.25, None, 0.0, mass=1.0, samples=1, ttft_stderr_s=None, error_stderr=0.4)
    assert target_shares(EVEN, {"a": seen(0.05), "b": lone}, W) == EVEN


def test_the_floor_never_lifts_a_provider_above_its_prior() -> None:
    priors = {"a": 0.97, "b": 0.02, "c": 0.01}
    shares = floored({"a": 0.999, "b": 0.0005, "c": 0.0005}, priors, 0.05)
    assert shares["b"] == pytest.approx(0.02) and shares["c"] == pytest.approx(0.01)
    assert sum(shares.values()) == pytest.approx(1)


def test_a_step_is_damped_and_reaches_its_target_exactly() -> None:
    current = dict(EVEN)
    target = {"a": 0.95, "b": 0.05}
    moves = []
    for _ in range(30):
        current = step(current, target, W)
        moves.append(current["b"])
        assert sum(current.values()) == pytest.approx(1)
    assert 0.5 - moves[0] == pytest.approx(W.gain * 0.45)  # a damped first step
    assert current == target  # exactly, in a finite number of ticks
    assert moves.index(0.05) < 15


shares_st = st.dictionaries(
    st.sampled_from("abcd"), st.integers(1, 1000), min_size=2, max_size=4
).map(lambda weights: {k: v / sum(weights.values()) for k, v in weights.items()})


@given(
    priors=shares_st,
    ttfts=st.lists(st.floats(0.001, 60.0), min_size=4, max_size=4),
    errors=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
)
def test_targets_are_shares_with_every_floor_kept(
    priors: dict[str, float], ttfts: list[float], errors: list[float]
) -> None:
    names = sorted(priors)
    evidence = {name: seen(ttfts[i], errors[i]) for i, name in enumerate(names)}
    shares = target_shares(priors, evidence, W)
    assert set(shares) == set(priors)
    assert sum(shares.values()) == pytest.approx(1)
    for name, share in shares.items():
        assert share >= min(W.floor, priors[name]) - 1e-9
    # The best-scored provider never loses share against its prior.
    scores = {name: ttfts[i] * (1 + W.error_penalty * errors[i]) for i, name in enumerate(names)}
    best = min(scores, key=scores.__getitem__)
    assert shares[best] >= priors[best] - 1e-9
