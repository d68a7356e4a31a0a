"""The router decides at the request's batch size from the S(g) curves published per profiled batch
size: hand-made cost profiles where verifying at batch 16 is nearly free (flat T(k, 16), as measured
on GPUs) and where it is not (steep, as on a CPU), interpolation between profiled sizes, the online
alpha's adjustment, and today's max_batch_size cut-off only where no profile covers the batch."""

from __future__ import annotations

import pytest

from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.pricing.policy_curve import PolicyCurve
from analyzer.pricing.speedup import best_gamma
from router.decide.adaptation import TaskState
from router.decide.decision import Router, RouterConfig, router_from_database
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot, publish_policies
from tests.factories import make_done_run

FLAT_16 = [0.100 * (1 + 0.02 * (k - 1)) for k in range(1, 10)]  # T(k, 16): a GPU-like batch
STEEP_16 = [0.100 * k for k in range(1, 10)]  # T(k, 16): every verified token costs a full step


def _router(session, batch_curves, alpha=0.9, config=None):
    with session.begin():
        run = make_done_run(session, {"code": alpha}, per_task=4, batch_curves=batch_curves)
        policy_set = publish_policies(session, run.id)
        curves = {p.task_type: p.speedup_curves_by_batch for p in policy_set.policies}
        router = router_from_database(session, config or RouterConfig(max_batch_size=8))
    return router, curves[FALLBACK_TASK]


def _reason(decision, code: str) -> dict | None:
    """The parameters of ``decision``'s first reason with ``code`` (None when it has none)."""
    return next((dict(r.params) for r in decision.reason_codes if r.code == code), None)


def test_the_policy_curve_interpolates_linearly_between_measured_sizes_and_not_outside():
    curve = PolicyCurve((1.0, 2.0), {1: (1.0, 2.0), 4: (4.0, 8.0), 16: (2.0,)})
    assert curve.curve(1) == (1.0, 2.0) and curve.at(1).measured
    assert curve.curve(2) == (2.0, 4.0) and (curve.at(2).lower_batch, curve.at(2).upper_batch) == (1, 4)
    assert curve.curve(10) == (3.0,)  # over the g both curves cover
    assert curve.curve(17) is None and curve.at(17) is None and PolicyCurve(()).curve(2) is None


def test_published_policies_carry_one_curve_per_profiled_batch_size(session):
    _, curves = _router(session, {16: FLAT_16})
    assert set(curves) == {"1", "16"} and len(curves["1"]) == len(curves["16"]) == 8
    # the flat batch-16 cost makes every gamma cheaper to verify than on the CPU-like batch-1 curve (the simulated
    # run's, where verifying 3 tokens costs 1.75 steps): a larger g* there
    assert best_gamma(curves["16"])[0] > best_gamma(curves["1"])[0]


def test_flat_cost_at_batch_16_keeps_speculating_beyond_max_batch_size(session):
    router, curves = _router(session, {16: FLAT_16})
    gamma, speedup = best_gamma(curves["16"])
    decision = router.route("def add(a, b):", max_new_tokens=200, batch_size=16)
    assert (
        decision.speculate and decision.gamma == gamma and decision.expected_speedup == pytest.approx(speedup)
    )
    assert speedup > 1.5 and gamma >= 6
    at_16 = _reason(decision, "batch_size_curve")
    assert (at_16["batch_size"], at_16["lower"], at_16["upper"], at_16["gamma"]) == (16, 16, 16, gamma)
    assert at_16["alpha"] is None and at_16["speculate"]
    assert "batch_not_profiled" not in decision.codes  # the cut-off is not used where a profile exists
    between = router.route("def add(a, b):", max_new_tokens=200, batch_size=8)
    weight = 7 / 15
    expected_curve = [(1 - weight) * a + weight * b for a, b in zip(curves["1"], curves["16"])]
    g8, s8 = best_gamma(expected_curve)
    assert (between.speculate, between.gamma) == (True, g8) and between.expected_speedup == pytest.approx(s8)
    assert {k: _reason(between, "batch_size_curve")[k] for k in ("lower", "upper")} == {
        "lower": 1,
        "upper": 16,
    }


def test_steep_cost_at_batch_16_turns_speculation_off(session):
    router, curves = _router(session, {16: STEEP_16})
    _, speedup = best_gamma(curves["16"])
    assert speedup < 1.05
    decision = router.route("def add(a, b):", max_new_tokens=200, batch_size=16)
    assert not decision.speculate and decision.gamma == 0
    off = _reason(decision, "batch_size_curve")
    assert (off["lower"], off["upper"], off["speculate"], off["margin"]) == (16, 16, False, 0.05)
    assert off["speedup"] == pytest.approx(speedup) and off["speedup"] <= 1.05  # off: below the margin
    single = router.route("def add(a, b):", max_new_tokens=200, batch_size=1)
    assert single.speculate  # at batch 1 the analysis still says yes
    beyond = router.route("def add(a, b):", max_new_tokens=200, batch_size=32)
    assert not beyond.speculate
    assert _reason(beyond, "batch_not_profiled") == {"batch_size": 32, "max_batch_size": 8}


def test_without_batch_profiles_the_max_batch_size_cut_off_applies(session):
    router, curves = _router(session, None)
    assert set(curves) == {"1"}
    assert router.route("def f():", max_new_tokens=200, batch_size=4).speculate
    cut = router.route("def f():", max_new_tokens=200, batch_size=16)
    assert not cut.speculate and _reason(cut, "batch_not_profiled") == {"batch_size": 16, "max_batch_size": 8}


def test_short_outputs_stay_off_at_any_batch_size(session):
    router, _ = _router(session, {16: FLAT_16})
    decision = router.route("def f():", max_new_tokens=5, batch_size=16)
    assert not decision.speculate and _reason(decision, "short_output") == {
        "max_new_tokens": 5,
        "min_output_tokens": 20,
    }


def test_the_batch_curve_follows_the_online_alpha_after_feedback():
    curve_1 = (1.2, 1.3, 1.35, 1.3)
    curve_16 = (1.4, 1.7, 1.9, 2.0)
    policy = PolicySnapshot(
        "*", True, 3, 0.8, 0.01, 10, 1.35, "RECOMMENDED", curve_1, {1: curve_1, 16: curve_16}
    )
    fresh = Router(None, {"*": policy}, policy_version=1)
    assert fresh.route("x", batch_size=16).gamma == 4
    # feedback moved alpha from 0.8 down to 0.3: the measured curve is scaled by E[tokens](0.3, g) / E[tokens](0.8, g)
    state = TaskState(beta_a=15.0, beta_b=35.0, speculate=True, gamma=1, prior_alpha=0.8, events=12)
    adapted = Router(None, {"*": policy}, policy_version=1, states={"*": state})
    scaled = [
        s * expected_tokens_iid(0.3, g) / expected_tokens_iid(0.8, g) for g, s in enumerate(curve_16, start=1)
    ]
    gamma, speedup = best_gamma(scaled)
    decision = adapted.route("x", batch_size=16)
    assert gamma == 1 and speedup == pytest.approx(1.4 * 1.3 / 1.8)  # below the 1.05x margin: off
    assert (decision.speculate, decision.gamma, decision.expected_speedup) == (False, 0, 1.0)
    moved = _reason(decision, "batch_size_curve")
    assert moved["alpha"] == pytest.approx(0.3) and moved["gamma"] == 1 and not moved["speculate"]
    assert moved["speedup"] == pytest.approx(speedup)
    recovered = Router(
        None,
        {"*": policy},
        policy_version=1,
        states={"*": TaskState(beta_a=45.0, beta_b=5.0, speculate=True, gamma=4, prior_alpha=0.8, events=12)},
    )
    up = [
        s * expected_tokens_iid(0.9, g) / expected_tokens_iid(0.8, g) for g, s in enumerate(curve_16, start=1)
    ]
    better = recovered.route("x", batch_size=16)
    assert (better.speculate, better.gamma) == (True, 4) and better.expected_speedup == pytest.approx(max(up))


def test_the_batch_rule_also_needs_the_published_lower_end_above_break_even():
    curve_1, curve_16 = (1.2, 1.3, 1.35, 1.3), (1.4, 1.7, 1.9, 2.0)
    policy = PolicySnapshot(
        "*",
        True,
        3,
        0.8,
        0.01,
        10,
        1.35,
        "RECOMMENDED",
        curve_1,
        {1: curve_1, 16: curve_16},
        (1.1, 1.6),
        "task",
        {1: 1.1, 16: 0.95},
    )
    router = Router(None, {"*": policy}, policy_version=1)
    at_16 = router.route("x", batch_size=16)
    assert not at_16.speculate  # S(4) = 2.0, but the prompts' spread reaches 0.95x at batch 16
    loss = _reason(at_16, "batch_size_curve")
    assert (loss["gamma"], loss["speedup"], loss["low"], loss["speculate"]) == (4, 2.0, 0.95, False)
    at_8 = router.route("x", batch_size=8)  # lower end interpolated: 1.1 + 7/15 (0.95 - 1.1) = 1.03
    assert at_8.speculate and _reason(at_8, "batch_size_curve")["low"] == pytest.approx(
        1.1 + 7 / 15 * (0.95 - 1.1)
    )
    published = Router(
        None,
        {
            "*": PolicySnapshot(
                "*", True, 3, 0.8, 0.01, 10, 1.35, "RECOMMENDED", curve_1, {1: curve_1, 16: curve_16}
            )
        },
        policy_version=1,
    )
    assert published.route(
        "x", batch_size=16
    ).speculate  # a policy published before intervals: S alone decides


def test_published_policies_carry_each_batch_sizes_lower_end(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9}, batch_curves={16: FLAT_16})
        policy_set = publish_policies(session, run.id)
        report_lows = {p.task_type: p.speedup_lows_by_batch for p in policy_set.policies}
    assert set(report_lows["code"]) == {"1", "16"} and all(v > 1.0 for v in report_lows["code"].values())
    assert report_lows[FALLBACK_TASK] == report_lows["code"]  # one task: the workload is that task


def test_the_policies_api_reports_each_batch_decision_with_the_routers_rule():
    from router.orm import TaskPolicy
    from router.policies.records import policy_dict

    curve_1, curve_16 = [1.2, 1.3, 1.35, 1.3], [1.4, 1.7, 1.9, 2.0]
    policy = TaskPolicy(
        task_type="code",
        is_fallback=False,
        speculate=True,
        gamma=3,
        alpha_mean=0.8,
        alpha_var=0.01,
        n_prompts=10,
        expected_speedup=1.35,
        tier="RECOMMENDED",
        speedup_curve=curve_1,
        speedup_curves_by_batch={"1": curve_1, "16": curve_16},
        speedup_lows_by_batch={"1": 1.1, "16": 0.95},
    )
    by_batch = policy_dict(policy, PolicyContract(margin=0.05))["by_batch"]
    assert by_batch["1"] == {
        "gamma": 3,
        "expected_speedup": 1.35,
        "speculate": True,
        "decision_code": "clears",
    }
    assert by_batch["16"] == {
        "gamma": 4,
        "expected_speedup": 2.0,
        "speculate": False,
        "decision_code": "interval_reaches_loss",
    }
    snapshot = Router(
        None,
        {
            "*": PolicySnapshot(
                "*",
                True,
                3,
                0.8,
                0.01,
                10,
                1.35,
                "RECOMMENDED",
                tuple(curve_1),
                {1: tuple(curve_1), 16: tuple(curve_16)},
                (1.1, 1.6),
                "task",
                {1: 1.1, 16: 0.95},
            )
        },
        policy_version=1,
    )
    assert snapshot.route("x", batch_size=16).speculate is by_batch["16"]["speculate"]  # API and router agree
