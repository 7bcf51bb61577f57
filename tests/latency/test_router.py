"""The latency router over simulated traffic (a fake clock, one tick a second): the
properties docs/latency-routing.md promises, without a real Envoy."""

from __future__ import annotations

import logging
from itertools import pairwise

import pytest

from sluicegate.latency import WEIGHT_SCALE, LatencyRouter, WeightChange

from .helpers import Clock, SimulatedRoute, document, gateway, record


def test_with_no_data_the_weights_are_the_configured_ones() -> None:
    router = LatencyRouter(clock=Clock())
    router.load(gateway())
    assert router.tick() == []
    assert router.weights() == {"chat": {"fast": 1, "slow": 1, "spare": 1}}  # static too
    report = router.report()
    assert report["plain"]["fast"].weight == report["plain"]["fast"].configured_weight == 3
    assert report["plain"]["fast"].ttft_s is None  # a static route learns nothing
    assert report["chat"]["slow"].share == 0.5 and report["chat"]["spare"].share == 1


def test_steady_noisy_providers_never_move_their_weights() -> None:
    """Five minutes of two equal providers, each TTFT +-20% noise: the scores stay within
    the dead band, so the weights stay exactly as configured (issue: < 5% in 5 min)."""
    route = SimulatedRoute(noise=0.2)
    shares = route.run(300)
    assert max(abs(share - 0.5) for share in shares) < 0.05
    assert set(shares) == {0.5}


@pytest.mark.parametrize(("rate", "noise"), [(10, 0.9), (2, 0.9), (1, 0.9)])
def test_few_and_noisy_samples_do_not_move_the_weights(rate: float, noise: float) -> None:
    """At a few requests a second with TTFTs anywhere from 0.1x to 1.9x, equal providers'
    means differ by chance; their standard errors say so, and the weights hold."""
    for seed in range(3):
        shares = SimulatedRoute(rate=rate, noise=noise, seed=seed).run(300)
        assert max(abs(share - 0.5) for share in shares) < 0.025


def test_steady_but_unequal_providers_settle_without_oscillating() -> None:
    """30% apart (just past the dead band): one small move, then nothing for minutes."""
    route = SimulatedRoute(ttft_s={"fast": 0.05, "slow": 0.065}, noise=0.2)
    route.run(60)
    settled = route.run(240)
    assert max(settled) - min(settled) < 0.05
    assert 0.35 < settled[-1] <= 0.5
    assert sum(1 for a, b in pairwise(settled) if a != b) <= 3  # pushes


def test_a_5x_slower_provider_falls_below_20_percent_and_recovers() -> None:
    route = SimulatedRoute()
    route.run(20)
    route.ttft_s["slow"] = 0.25
    slowed = route.run(40)
    below = next(i for i, share in enumerate(slowed) if share < 0.20) + 1
    assert below <= 15, slowed
    assert min(slowed) >= route.weighing.floor - 1e-9  # a trickle stays, so recovery is seen
    assert route.sent["slow"] > 0
    route.ttft_s["slow"] = 0.05
    recovered = route.run(60)
    back = next(i for i, share in enumerate(recovered) if abs(share - 0.5) <= 0.05) + 1
    assert back <= 60, recovered
    assert recovered[-1] == 0.5  # exactly the configured weights again


def test_a_failing_provider_is_weighted_down_like_a_slow_one() -> None:
    route = SimulatedRoute(failing={"slow": 1.0})
    shares = route.run(30)
    assert shares[-1] < 0.10


def test_stale_data_gives_the_configured_weights_back() -> None:
    """No traffic at all: the evidence fades and the weights return to the prior."""
    route = SimulatedRoute(ttft_s={"fast": 0.05, "slow": 0.25})
    assert route.run(30)[-1] < 0.2
    route.rate = 1e-9  # silence
    assert route.run(120)[-1] == 0.5


def test_a_reload_keeps_what_was_learned_for_routes_still_there() -> None:
    route = SimulatedRoute(ttft_s={"fast": 0.05, "slow": 0.25})
    route.run(30)
    learned = route.router.weights()["chat"]
    assert learned["slow"] < learned["fast"]
    doc = document()
    doc["routes"][1]["models"] = ["p", "q"]  # another route changes
    route.router.load(gateway(doc))
    assert route.router.weights()["chat"] == learned
    assert route.router.report()["chat"]["slow"].samples > 0
    # A route that is no longer `routing: latency` forgets; configured weights apply.
    doc["routes"][0]["routing"] = "static"
    route.router.load(gateway(doc))
    assert route.router.weights() == {}


def test_a_drained_provider_leaves_the_others_their_learned_ratio() -> None:
    route = SimulatedRoute(ttft_s={"fast": 0.05, "slow": 0.25})
    route.run(30)
    route.router.load(gateway(drained=frozenset({"fast"})))
    # Only slow is left in the first level: all of it, whatever was learned.
    assert route.router.weights()["chat"] == {"slow": 1, "spare": 1}


def test_weights_are_shares_of_the_level_in_envoy_units() -> None:
    route = SimulatedRoute(ttft_s={"fast": 0.05, "slow": 0.25})
    route.run(30)
    weights = route.router.weights()["chat"]
    assert weights["fast"] + weights["slow"] == pytest.approx(WEIGHT_SCALE, abs=1)
    assert weights["spare"] == 1  # its own level: nothing to weigh
    report = route.router.report()["chat"]
    assert report["slow"].weight == pytest.approx(2 * report["slow"].share, abs=1e-3)


def test_records_of_other_routes_and_unknown_providers_are_ignored() -> None:
    router = LatencyRouter(clock=Clock())
    router.load(gateway())
    assert not router.observe(record("fast", route="plain"))
    assert not router.observe(record("nobody"))
    assert not router.observe(record("fast", status=404))
    assert router.observe(record("fast"))
    assert router.records_counted == 1


def test_a_push_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    change = WeightChange("chat", {"fast": 0.5, "slow": 0.5}, {"fast": 0.8, "slow": 0.2})
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("%s", change.describe())
    (line,) = caplog.messages
    assert line == (
        "route chat: latency weights pushed: fast 50.0%->80.0% (ttft -, errors -), "
        "slow 50.0%->20.0% (ttft -, errors -)"
    )


def test_a_weight_edit_with_nothing_learned_applies_at_once() -> None:
    """Nothing learned yet: an edit of the configured weights is pushed as it is, as on a
    static route, not walked to over damped ticks from the old weights."""
    router = LatencyRouter(clock=Clock())
    router.load(gateway())
    doc = document()
    doc["routes"][0]["backends"][0]["weight"] = 3
    router.load(gateway(doc))
    assert router.weights()["chat"] == {"fast": 3, "slow": 1, "spare": 1}
    assert router.tick() == []
