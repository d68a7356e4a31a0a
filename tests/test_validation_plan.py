"""Validation's sample and stopping rule (analyzer/measuring/validation_plan.py): the held-out prompts in an
order whose every prefix spans the tasks and the predicted speedups, taken one at a time until every interval
reaches its target or the budget is spent, and the passes over all of them where there is no budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analyzer.measuring.calibration_choice import spanning_choice, spanning_order
from analyzer.measuring.validation_plan import (
    BUDGET,
    MIN_VALIDATED,
    PASSES,
    TARGET,
    run_validation,
    validation_order,
)

# task a: five prompts predicted 1.0, 1.5, 1.2, 2.0, 1.1 with one option (ranks 0, 3/4, 1/2, 1, 1/4);
# task b: two, 0.9 and 1.1
TASKS = ["a", "a", "a", "a", "a", "b", "b"]
PREDICTED = np.array([[1.0], [1.5], [1.2], [2.0], [1.1], [0.9], [1.1]])


def ten_seconds(index: int) -> float:
    """Every prompt's estimated pass."""
    return 10.0


def test_the_order_takes_the_tasks_in_turn_the_largest_first_and_each_tasks_extremes_early():
    # a: 1.2 (the middle), 1.0 (farthest from it; 2.0 as far, the earlier row first), 2.0, then 1.5 and 1.1
    # (a quarter from the nearest taken, the earlier first); b: 0.9, 1.1. In turn, a first (more prompts).
    assert validation_order(TASKS, PREDICTED) == [2, 5, 0, 6, 3, 1, 4]


def test_each_prefix_of_the_order_spans_as_a_calibration_choice_of_its_size():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(30, 3))
    order = spanning_order(features)
    assert sorted(order) == list(range(30))
    for count in (1, 5, 12, 30):
        assert spanning_choice(features, count) == sorted(order[:count])


class Recorder:
    """Validation's two callables: ``validate`` records (index, pass) and returns the pass's seconds
    (``costs``); ``widest`` gives the next of ``widths`` (the interval shrinking as prompts are added)."""

    def __init__(self, costs, widths=()):
        self.costs, self.widths, self.calls = costs, list(widths), []

    def validate(self, index: int, number: int) -> float:
        self.calls.append((index, number))
        return self.costs[index]

    def widest(self):
        return self.widths[min(len(self.calls), len(self.widths)) - 1] if self.widths else None


ORDER = validation_order(TASKS, PREDICTED)  # [2, 5, 0, 6, 3, 1, 4]


def test_the_budget_stops_validation_before_the_pass_that_would_overrun_it_and_says_so():
    seen = Recorder([10.0] * 7, widths=[0.3] * 7)
    plan = run_validation(
        ORDER, ten_seconds, seen.validate, seen.widest, budget_s=55.0, target=0.05, at_least=2
    )
    assert seen.calls == [(2, 1), (5, 1), (0, 1), (6, 1), (3, 1)] and plan.chosen == [2, 5, 0, 6, 3]
    assert (plan.stopped, plan.spent_s, plan.passes, plan.half_width) == (BUDGET, 50.0, 1, 0.3)
    assert plan.why == (
        "5 of 7 held-out prompts (chosen across tasks and predicted speedups): the validation budget ran out at "
        "±30.0% (target ±5.0%), 50 s of the 55 s budget"
    )
    assert plan.as_json() == {
        "validated": 5, "held_out": 7, "budget_s": 55.0, "spent_s": 50.0, "passes": 1, "target": 0.05,
        "half_width": 0.3, "stopped": BUDGET, "why": plan.why,
    }  # fmt: skip


def test_validation_stops_once_every_interval_reaches_the_target_but_not_before_the_minimum():
    # the interval is within the target from the second prompt on, but the minimum is four
    seen = Recorder([10.0] * 7, widths=[0.2, 0.04, 0.04, 0.04, 0.04, 0.04, 0.04])
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=1000.0, target=0.05)
    assert plan.chosen == ORDER[:MIN_VALIDATED] and plan.stopped == TARGET and plan.half_width == 0.04
    assert plan.why.endswith(
        ": every setting's aggregate within ±4.0% (target ±5.0%), 40 s of the 1000 s budget"
    )
    # a target of 0 never stops validation: the budget does
    seen = Recorder([10.0] * 7, widths=[0.01] * 7)
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=45.0, target=0.0)
    assert plan.chosen == ORDER[:4] and plan.stopped == BUDGET


def test_at_least_the_minimum_is_validated_whatever_the_budget_and_measured_seconds_count():
    seen = Recorder([30.0] * 7)  # each pass takes three times its estimate
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=1.0)
    assert plan.chosen == ORDER[:MIN_VALIDATED] and plan.spent_s == 30.0 * MIN_VALIDATED
    assert plan.half_width is None and "an interval run noise could not tell" in plan.why
    seen = Recorder([30.0] * 7)
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=185.0)
    assert (
        plan.chosen == ORDER[:6]
    )  # 150 s spent and the next estimated 10 s: 160 s fits; then 190 s does not


def test_with_no_budget_every_prompt_is_validated_in_passes_until_the_target_or_the_passes_asked():
    seen = Recorder([10.0] * 7, widths=[0.09] * 7 + [0.06] * 7 + [0.05] * 7)
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=math.inf, passes=5)
    assert seen.calls == [(i, n) for n in (1, 2, 3) for i in ORDER]  # asked after each whole pass only
    assert (plan.passes, plan.stopped, plan.chosen, plan.budget_s) == (3, TARGET, ORDER, math.inf)
    assert plan.why == (
        "every held-out prompt (7) in 3 passes: every setting's aggregate within ±5.0% (target ±5.0%), no budget"
    )
    assert plan.as_json()["budget_s"] is None
    seen = Recorder([10.0] * 7, widths=[0.09] * 14)
    plan = run_validation(ORDER, ten_seconds, seen.validate, seen.widest, budget_s=math.inf, passes=2)
    assert (plan.passes, plan.stopped, len(seen.calls)) == (2, PASSES, 14)
    assert plan.why.startswith(
        "every held-out prompt (7) in 2 passes, as asked: every setting's aggregate within ±9.0%"
    )


@pytest.mark.parametrize("expensive", [0, 4])
def test_an_expensive_prompt_ends_the_sample_where_its_pass_no_longer_fits(expensive):
    costs = [10.0] * 7
    costs[expensive] = 100.0
    seen = Recorder(costs)
    plan = run_validation(ORDER, costs.__getitem__, seen.validate, seen.widest, budget_s=45.0, at_least=1)
    spent, expected = 0.0, []
    for index in ORDER:
        if expected and spent + costs[index] > 45.0:
            break
        expected.append(index)
        spent += costs[index]
    assert plan.chosen == expected and plan.chosen == ORDER[: len(expected)]
    assert len(plan.chosen) == (2 if expensive == 0 else 4)


def test_each_estimate_is_asked_just_before_its_prompt_so_it_can_learn_from_the_passes_run():
    seen = Recorder([30.0] * 7)  # every pass takes three times the first estimate
    asked = []

    def learning(index: int) -> float:
        asked.append((index, len(seen.calls)))
        done = len(seen.calls)
        return 10.0 if done == 0 else sum(seen.costs[i] for i, _ in seen.calls) / done

    plan = run_validation(ORDER, learning, seen.validate, seen.widest, budget_s=185.0, at_least=1)
    # asked for each prompt after the minimum, once the ones before it ran; the learned 30 s stops it at 180 s
    assert asked == [(ORDER[position], position) for position in range(1, 7)]
    assert plan.chosen == ORDER[:6] and plan.spent_s == 180.0 and plan.stopped == BUDGET
