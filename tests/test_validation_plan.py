"""Validation's sample (analyzer/measuring/validation_plan.py): the held-out prompts in an order whose every
prefix spans the tasks and the predicted speedups, and the prefix one pass of which the budget pays for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analyzer.measuring.calibration_choice import spanning_choice, spanning_order
from analyzer.measuring.validation_plan import MIN_VALIDATED, plan_validation, validation_order

# task a: five prompts predicted 1.0, 1.5, 1.2, 2.0, 1.1 with one option (ranks 0, 3/4, 1/2, 1, 1/4);
# task b: two, 0.9 and 1.1
TASKS = ["a", "a", "a", "a", "a", "b", "b"]
PREDICTED = np.array([[1.0], [1.5], [1.2], [2.0], [1.1], [0.9], [1.1]])


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


def test_the_budget_takes_the_orders_prefix_that_one_pass_fits_and_says_so():
    costs = [10.0] * 7
    plan = plan_validation(TASKS, PREDICTED, costs, budget_s=55.0, at_least=2)
    assert plan.chosen == [2, 5, 0, 6, 3] and plan.held_out == 7 and plan.estimated_s == 50.0
    assert plan.why == (
        "5 of 7 held-out prompts, chosen across tasks and predicted speedups, fit the validation budget of "
        "55 s (estimated 50 s a pass)"
    )
    assert plan.as_json() == {
        "validated": 5, "held_out": 7, "budget_s": 55.0, "estimated_s": 50.0, "why": plan.why,
    }  # fmt: skip


def test_at_least_the_minimum_is_validated_whatever_the_budget_and_all_where_it_pays_for_all():
    costs = [10.0] * 7
    tight = plan_validation(TASKS, PREDICTED, costs, budget_s=1.0)
    assert tight.chosen == [2, 5, 0, 6][:MIN_VALIDATED] and tight.estimated_s == 10.0 * MIN_VALIDATED
    roomy = plan_validation(TASKS, PREDICTED, costs, budget_s=70.0)
    assert roomy.chosen == [2, 5, 0, 6, 3, 1, 4]
    assert roomy.why == "every held-out prompt (7) fits the validation budget of 70 s"
    unbounded = plan_validation(TASKS, PREDICTED, costs, budget_s=math.inf)
    assert unbounded.why == "every held-out prompt (7), with no validation budget"


@pytest.mark.parametrize("expensive", [0, 4])
def test_an_expensive_prompt_ends_the_sample_where_its_pass_no_longer_fits(expensive):
    costs = [10.0] * 7
    costs[expensive] = 100.0
    plan = plan_validation(TASKS, PREDICTED, costs, budget_s=45.0, at_least=1)
    order = validation_order(TASKS, PREDICTED)
    spent, expected = 0.0, []
    for index in order:
        if expected and spent + costs[index] > 45.0:
            break
        expected.append(index)
        spent += costs[index]
    assert plan.chosen == expected and plan.chosen == order[: len(expected)]
    assert len(plan.chosen) == (2 if expensive == 0 else 4)
