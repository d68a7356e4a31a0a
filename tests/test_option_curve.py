"""The one rule over an engine's drafting options (analyzer/pricing/option_curve.py) and the online estimate of
a llama-server set's settings (router/decide/server_adaptation.py), on numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.pricing.option_curve import (
    FitSpread,
    fit_spread,
    option_curve,
    stored_option_rows,
    task_option_curves,
)
from router.decide.adaptation import AdaptationConfig
from router.decide.server_adaptation import (
    OptionPrior,
    PlainCost,
    apply_server_feedback,
    choose_setting,
    estimate,
    initial_server_state,
)

LABELS = ("a", "b")


def test_an_option_is_chosen_only_where_its_speedup_and_its_interval_clear_the_rule():
    plain = np.full(6, 100.0)
    # option a: 1.25x on every prompt; option b: 1.6x on average but slower than plain on half the prompts
    steady = np.column_stack([plain / 1.25, [40.0, 40.0, 40.0, 150.0, 150.0, 150.0]])
    curve = option_curve(plain, steady, LABELS)
    assert curve.speedups == pytest.approx((1.25, 600 / 570))
    assert (
        curve.chosen == "a"
        and curve.point.code == "clears"
        and curve.intervals[0] == pytest.approx((1.25, 1.25))
    )
    # b alone on four prompts: 1.21x in all, three prompts fast and one three times slower than plain, so
    # the interval's lower end reaches below 1.0 and nothing is chosen
    wide = option_curve(plain[:4], np.column_stack([plain[:4], [10.0, 10.0, 10.0, 300.0]]), LABELS)
    assert wide.speedups[1] == pytest.approx(400 / 330) and wide.speedups[1] > 1.05
    assert wide.intervals[1][0] < 1.0 and wide.chosen is None and wide.point.code == "interval_reaches_loss"
    assert wide.best == "b"


def test_a_task_of_too_few_prompts_takes_the_workloads_decision():
    tasks = ["copy"] * 4 + ["chat"] * 2
    plain = np.full(6, 100.0)
    # copy: 2x with b; chat: 1.5x with a on its own two prompts, but the workload (mostly copy) takes b
    times = np.array([[100.0, 50.0]] * 4 + [[66.0, 100.0]] * 2)
    curves, workload = task_option_curves(tasks, plain, times, LABELS)
    assert workload.chosen == "b" and curves["copy"].chosen == "b" and curves["copy"].point.basis == "task"
    assert curves["chat"].best == "a" and curves["chat"].chosen == "b"
    assert (curves["chat"].point.basis, curves["chat"].point.code) == ("workload", "too_few_prompts")
    rows = [
        {
            "task": t,
            "predicted_plain_ms": p,
            "refit_plain_ms": [],
            "settings": [{"predicted_speedup": p / x, "refit_ms": []} for x in row],
        }
        for t, p, row in zip(tasks, plain, times)
    ]
    again_tasks, again_plain, again_times, spread = stored_option_rows(rows)
    assert again_tasks == tasks and np.allclose(again_plain, plain) and np.allclose(again_times, times)
    assert spread is None  # no leave-one-out fit stored: the intervals hold the prompts' spread alone


def _spread(speedups: tuple[float, ...], prompts: int = 4) -> FitSpread:
    """k fits under which every one of ``prompts`` prompts of 100 ms runs ``speedups[j]`` times faster with
    option a, and option b never drafts (100 ms)."""
    plain = np.full((len(speedups), prompts), 100.0)
    options = np.stack(
        [np.column_stack([np.full(prompts, 100.0 / s), np.full(prompts, 100.0)]) for s in speedups]
    )
    return FitSpread(plain, options)


def test_the_fits_spread_widens_the_interval_so_a_speedup_it_cannot_tell_from_break_even_stays_off():
    plain = np.full(4, 100.0)
    times = np.column_stack([plain / 1.08, plain])  # a: 1.08x on every prompt, so the bootstrap has no width
    alone = option_curve(plain, times, LABELS)
    assert (
        alone.chosen == "a" and alone.intervals[0] == pytest.approx((1.08, 1.08)) and alone.fit_errors == ()
    )
    # three leave-one-out fits price a at 1.02, 1.08 and 1.14: jackknife se = sqrt(2/3 * (0.06^2 + 0.06^2))
    # = 0.0693, and the 90% interval's lower end 1.08 - 1.645 * 0.0693 = 0.966 reaches a loss
    wide = option_curve(plain, times, LABELS, spread=_spread((1.02, 1.08, 1.14)))
    assert wide.fit_errors[0] == pytest.approx(np.sqrt(0.0048)) and wide.fit_errors[1] == pytest.approx(0.0)
    assert wide.intervals[0] == pytest.approx(
        (1.08 - 1.644854 * np.sqrt(0.0048), 1.08 + 1.644854 * np.sqrt(0.0048))
    )
    assert wide.chosen is None and wide.point.code == "interval_reaches_loss" and wide.best == "a"
    # fits that agree within 1%: se 0.0115, lower end 1.061, still on
    narrow = option_curve(plain, times, LABELS, spread=_spread((1.07, 1.08, 1.09)))
    assert narrow.intervals[0][0] == pytest.approx(1.08 - 1.644854 * np.sqrt(0.0002 * 2 / 3), rel=1e-4)
    assert narrow.chosen == "a" and narrow.point.code == "clears"
    assert narrow.as_dict()["fit_errors"] == pytest.approx([np.sqrt(0.0002 * 2 / 3), 0.0])


def test_each_task_takes_the_spread_of_its_own_prompts_and_stored_rows_give_it_back():
    tasks = ["copy"] * 3 + ["chat"] * 3
    plain = np.full(6, 100.0)
    times = np.column_stack([np.r_[np.full(3, 50.0), np.full(3, 100 / 1.08)], plain])
    # the fits agree on copy (2x under each) and spread on chat (1.02, 1.08, 1.14)
    refit_plain = np.full((3, 6), 100.0)
    refit_times = np.stack(
        [
            np.column_stack([np.r_[np.full(3, 50.0), np.full(3, 100 / s)], np.full(6, 100.0)])
            for s in (1.02, 1.08, 1.14)
        ]
    )
    curves, _ = task_option_curves(tasks, plain, times, LABELS, spread=FitSpread(refit_plain, refit_times))
    assert curves["copy"].chosen == "a" and curves["copy"].fit_errors[0] == pytest.approx(0.0)
    assert curves["chat"].chosen is None and curves["chat"].fit_errors[0] == pytest.approx(np.sqrt(0.0048))
    rows = [
        {
            "task": t,
            "predicted_plain_ms": plain[i],
            "refit_plain_ms": list(refit_plain[:, i]),
            "settings": [
                {"predicted_speedup": plain[i] / times[i, j], "refit_ms": list(refit_times[:, i, j])}
                for j in range(2)
            ],
        }
        for i, t in enumerate(tasks)
    ]
    *_, spread = stored_option_rows(rows)
    assert (
        spread is not None
        and np.allclose(spread.plain, refit_plain)
        and np.allclose(spread.options, refit_times)
    )
    # a row whose fits are missing, or counted otherwise, leaves nothing to take a spread over
    assert fit_spread([[100.0, 100.0], [100.0]], [[[50.0, 50.0]], [[50.0]]]) is None


def test_the_estimate_of_a_setting_is_its_prior_moved_by_the_time_its_pool_took():
    config = AdaptationConfig(prior_strength=50.0, decay=0.5)
    cost = PlainCost(step_ms=10.0, per_context_ms=0.0)
    assert cost.plain_ms(100, 65) == pytest.approx(640.0)  # 64 steps after the first token
    weight = 50 * 10.0
    a, b = "ngram-simple 3/8", "ngram-simple 2/4"
    priors = (OptionPrior(a, 2.0, 1.5), OptionPrior(b, 1.2, 1.1))
    state = initial_server_state(0.8, a, config)
    assert estimate(priors[0], state, weight) == (2.0, 1.5)
    common = {"drafted": 30, "accepted": 3, "rounds": 60, "plain_ms": 640.0, "priors": priors, "margin": 0.05,
              "weight_ms": weight, "config": config}  # fmt: skip
    # one request on a took 800 ms for 640 ms of plain work (0.8x)
    state = apply_server_feedback(state, setting=a, served_ms=800.0, **common)
    expected = (500 + 640) / (500 / 2.0 + 800)
    assert estimate(priors[0], state, weight)[0] == pytest.approx(expected)  # 1.086: a is kept (above 1.0)
    assert estimate(priors[0], state, weight)[1] == pytest.approx(1.5 * expected / 2.0)
    assert (state.setting, state.speculate, state.gamma) == (a, True, 8)
    # a second one, 1200 ms: the first's sums halve (decay 0.5) before it adds; a falls below 1.0 (0.79x),
    # and b, published and untried, clears the whole rule on its prior
    state = apply_server_feedback(state, setting=a, served_ms=1200.0, **common)
    expected = (500 + 640 * 1.5) / (500 / 2.0 + 800 * 0.5 + 1200)
    assert estimate(priors[0], state, weight)[0] == pytest.approx(expected) and expected < 1.0
    assert (state.setting, state.gamma) == (b, 4) and state.options[a] == pytest.approx([960.0, 1600.0, 2])
    # b's own pool is as slow: off (a does not clear either), and a probe goes to the best estimate
    for _ in range(3):
        state = apply_server_feedback(state, setting=b, served_ms=1200.0, **common)
    choice = choose_setting(priors, state, 0.05, config, weight)
    assert (state.setting, state.speculate, choice.setting) == (None, False, None)
    assert choice.probe == max(priors, key=lambda p: estimate(p, state, weight)[0]).label


def test_routing_by_task_is_what_the_rules_decisions_do():
    from analyzer.advice.routing_ceiling import routing_ceiling

    tasks = ["a", "a", "b", "b"]
    plain = [100.0] * 4
    options = np.array([[50.0, 80.0], [50.0, 80.0], [120.0, 90.0], [120.0, 90.0]])
    # the rule chose y for a (say x's interval reached a loss), off for b; x for the workload
    rows = {c.group: c for c in routing_ceiling(tasks, plain, options, ["x", "y"], min_speedup=1.05,
                                                  decided={"a": "y", "b": None}, static_decided="x")}  # fmt: skip
    assert rows["all"].by_task == pytest.approx(400 / 360) and rows["a"].by_task == pytest.approx(200 / 160)
    assert rows["all"].static == pytest.approx(400 / 340) and rows["all"].static_option == "x"
    assert rows["all"].task_options == {"a": "y", "b": None}
    # without the decisions each group takes its own best option over 1.05: x for a, y for b
    free = {c.group: c for c in routing_ceiling(tasks, plain, options, ["x", "y"], min_speedup=1.05)}
    assert free["all"].by_task == pytest.approx(400 / 280) and free["all"].task_options == {
        "a": "x",
        "b": "y",
    }
    assert rows["all"].oracle == free["all"].oracle == pytest.approx(400 / 280)


def test_a_published_task_is_off_where_the_fits_spread_reaches_break_even_and_says_so(session):
    from analyzer.pricing.context_cost import StepCost
    from analyzer.prompts.prompt_sets import import_sample
    from router.policies.server_policy import publish_server_policies
    from tests.factories import make_server_analysis

    prompt_set, _ = import_sample(session)
    steady = make_server_analysis(session, prompt_set, {"extraction": "copy"})
    on = next(
        p
        for p in publish_server_policies(session, steady.id, pools={}).policies
        if p.task_type == "extraction"
    )
    assert on.speculate and on.speedup_low is not None and on.speedup_low > 1.0
    # the same runs, but one of three fits without a calibration prompt prices a drafted token at two steps
    fits = (StepCost(10.0, 0.0, 1.0, 0.5), StepCost(10.0, 0.0, 1.0, 20.0), StepCost(10.0, 0.0, 1.0, 0.5))
    loose = make_server_analysis(session, prompt_set, {"extraction": "copy"}, refits=fits)
    task = next(t for t in loose.tasks if t["task"] == "extraction")
    assert task["curve"]["fit_errors"][0] > 0.3  # the first setting's, per the jackknife over the three fits
    # every fit keeps the plain step, so each prices a prompt's plain time alike
    assert loose.prompts[0]["refit_plain_ms"] == pytest.approx([loose.prompts[0]["predicted_plain_ms"]] * 3)
    off = next(
        p
        for p in publish_server_policies(session, loose.id, pools={}).policies
        if p.task_type == "extraction"
    )
    assert (
        not off.speculate
        and off.expected_speedup == 1.0
        and off.speedup_low is not None
        and off.speedup_low < 1.0
    )
    assert "(the fit's own spread ±" in off.decision_reason and "interval reaches loss" in off.decision_reason
