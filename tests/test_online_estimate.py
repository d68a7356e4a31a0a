"""Online adaptation: the alpha estimator inverts the i.i.d. round model, the posterior follows a
change of acceptance, speculation turns off below break-even without flapping, and probes continue."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.measuring.acceptance import expected_tokens_iid, walk_model_draft
from analyzer.pricing.policy_curve import BASE, PolicyCurve
from analyzer.pricing.speedup import Cost
from router.decide.adaptation import (
    AdaptationConfig,
    alpha_from_round_counts,
    apply_feedback,
    initial_state,
    next_request,
)
from tests.factories import COST_CURVE

COST = Cost(COST_CURVE, 0.004)
CONFIG = AdaptationConfig()


def policy_curve(published=(), gamma_max=8) -> PolicyCurve:
    """A policy's curve as the router holds it: ``published`` S(g) at batch 1 (empty: nothing was
    published, the i.i.d. formula prices it) with the test's cost."""
    return PolicyCurve(tuple(published), gamma_max=gamma_max, cost=COST)


def speedup_curve(state, curve: PolicyCurve, gamma_max=None) -> np.ndarray:
    """S(g) under the state's posterior alpha, as the adaptation decides from it."""
    if gamma_max is not None:
        curve = PolicyCurve(curve.base, gamma_max=gamma_max, cost=curve.cost)
    return np.array(curve.curve(BASE, state.alpha, state.prior_alpha))


CURVE = policy_curve()


@given(alpha=st.floats(0.01, 0.99), gamma=st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_alpha_estimator_inverts_expected_accepted_per_round(alpha, gamma):
    rounds = 10_000
    accepted = rounds * (expected_tokens_iid(alpha, gamma) - 1.0)
    assert alpha_from_round_counts(rounds, accepted, gamma) == pytest.approx(alpha, abs=1e-6)


def test_alpha_estimator_edges():
    assert alpha_from_round_counts(10, 0, 4) == 0.0
    assert alpha_from_round_counts(10, 40, 4) == 1.0
    assert np.isnan(alpha_from_round_counts(0, 0, 4))


def _event(rng, alpha, gamma, tokens=64):
    counts = walk_model_draft((rng.random(tokens) < alpha).astype(int), gamma, tokens)
    return counts.rounds, counts.drafted, counts.accepted


def test_posterior_follows_a_drop_in_acceptance_and_turns_off_without_flapping():
    rng = np.random.default_rng(0)
    state = initial_state(0.85, True, 5, CONFIG)
    assert state.speculate and abs(state.alpha - 0.85) < 1e-9
    for _ in range(40):
        state = apply_feedback(state, *_event(rng, 0.85, state.gamma), CURVE, CONFIG)
    assert state.speculate and state.alpha > 0.75 and state.gamma >= 3
    switches, was_on = 0, state.speculate
    for _ in range(200):  # acceptance collapses; while off, only probes bring feedback
        state, speculate, gamma = next_request(state, CONFIG)
        if speculate:
            state = apply_feedback(state, *_event(rng, 0.05, gamma), CURVE, CONFIG)
        switches += state.speculate != was_on
        was_on = state.speculate
    assert not state.speculate and state.alpha < 0.5  # from 0.85; only probes report once it is off
    assert switches == 1, "one switch off, no flapping"


def test_hysteresis_keeps_the_current_decision_between_the_margins():
    near = initial_state(0.45, False, 2, CONFIG)
    from router.decide.adaptation import decide

    best = float(speedup_curve(near, CURVE).max())
    curve = replace(CURVE, margin=best - 1 + 0.01)  # the set's margin: S(g*) does not clear it
    config = AdaptationConfig(off_margin=best - 1 - 0.01)
    assert decide(near, curve, config).speculate is False  # below the on threshold: stays off
    on = initial_state(0.45, True, 2, config)
    assert decide(on, curve, config).speculate is True  # above the off threshold: stays on
    assert (
        curve.decide(BASE, on.alpha, on.prior_alpha, hold=True, off_margin=config.off_margin).code
        == "kept_on"
    )
    low = replace(curve, margin=0.0, base_low=0.9)  # clears the margin, but its interval reaches a loss
    assert decide(near, low, config).speculate is False  # turning on takes the whole rule
    assert decide(on, low, config).speculate is True  # staying on takes S(g*) above 1 + off_margin


def test_probes_while_off_every_nth_request():
    state = initial_state(0.05, False, 3, AdaptationConfig(probe_every=5))
    probes = []
    for _ in range(20):
        state, speculate, gamma = next_request(state, AdaptationConfig(probe_every=5))
        probes.append(speculate)
    assert probes.count(True) == 4 and probes[4] and not probes[3]


def test_the_published_curve_is_in_force_until_feedback_moves_alpha():
    from analyzer.measuring.acceptance import expected_tokens_iid
    from analyzer.pricing.speedup import iid_speedup
    from router.decide.adaptation import decide

    # a bursty task: the measured curve peaks at g = 2 where the i.i.d. formula would pick a longer g
    published = (1.10, 1.30, 1.20, float("nan"), 0.95, 0.90, 0.85, 0.80)
    config = AdaptationConfig()
    state = initial_state(0.7, True, 2, config)
    published_curve = policy_curve(published)
    curve = speedup_curve(state, published_curve)
    assert np.allclose(curve, published, equal_nan=True)  # nothing i.i.d. about it before feedback
    iid = [iid_speedup(0.7, g, COST) for g in range(1, 9)]
    assert int(np.argmax(iid)) + 1 != 2
    assert (
        decide(state, published_curve, config).gamma == 2 and decide(state, published_curve, config).speculate
    )
    lower = apply_feedback(state, rounds=100, drafted=200, accepted=20, curve=published_curve, config=config)
    ratio = [expected_tokens_iid(lower.alpha, g) / expected_tokens_iid(0.7, g) for g in range(1, 9)]
    assert lower.alpha < 0.6
    assert np.allclose(speedup_curve(lower, published_curve), np.array(published) * ratio, equal_nan=True)
    assert (
        not lower.speculate or lower.gamma < 2
    )  # fewer tokens per round: the curve falls, the best g does not rise
    assert len(speedup_curve(state, published_curve, gamma_max=3)) == 3  # cut at the gamma the run analysed


def test_the_speedup_at_one_gamma_is_that_point_of_the_curve():
    published = (1.10, 1.30, float("nan"), 0.95)
    for values in (published, ()):
        curve = policy_curve(values)
        state = apply_feedback(
            initial_state(0.7, True, 2, CONFIG),
            rounds=50,
            drafted=100,
            accepted=30,
            curve=curve,
            config=CONFIG,
        )
        whole = speedup_curve(state, curve)
        for gamma in range(0, 10):
            expected = float(whole[gamma - 1]) if 1 <= gamma <= len(whole) else float("nan")
            point = curve.speedup(gamma, BASE, state.alpha, state.prior_alpha)
            assert point == pytest.approx(expected, nan_ok=True)
