"""Which prompts validate an analysis, and how many of them its budget pays for: a sample chosen across tasks
and predicted speedups, not every prompt.

Validation runs each chosen prompt once plainly and once per option, so validating a whole workload costs a
sweep of it: more than the analysis it checks. What it must show is whether the advice holds, per option,
within the machine's noise; a sample that spans the workload's tasks and predicted speedups shows that. The
sample is ordered so that every prefix spans as well as it can (:func:`validation_order`): the tasks in turn,
the largest first, and within each task its prompts by farthest-point sampling over their predicted speedups
(:func:`spanning_order`), so the extremes come early. :func:`plan_validation` takes that order's prompts while
their estimated cost fits the budget and says what it took; the engines run it (no engine is named here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.measuring.calibration_choice import spanning_order

DEFAULT_BUDGET_SHARE = 0.5  # validation may cost this share of the plain generation's time ...
MIN_VALIDATED = 4  # ... and validates at least this many prompts (or every held-out one, where fewer)


def validation_order(tasks: Sequence[str], predicted: np.ndarray) -> list[int]:
    """Every prompt's index in the order validation takes them: one task at a time in turn (the tasks with the
    most prompts first, ties by name), each task's prompts in :func:`spanning_order` over their predicted
    speedups (``predicted``: shape (prompts, options)). Any prefix holds each task's share as evenly as it can
    and, within a task, its extreme predictions first."""
    rows = np.asarray(predicted, dtype=np.float64).reshape(len(tasks), -1)
    by_task: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        by_task.setdefault(task, []).append(index)
    queues = []
    for task in sorted(by_task, key=lambda t: (-len(by_task[t]), t)):
        members = by_task[task]
        queues.append([members[i] for i in spanning_order(rows[members])])
    order = []
    for position in range(max((len(q) for q in queues), default=0)):
        order += [q[position] for q in queues if position < len(q)]
    return order


@dataclass(frozen=True)
class ValidationPlan:
    """The prompts validation takes (``chosen``, indices in the order they run), of ``held_out``; its
    ``budget_s`` and what the chosen prompts are estimated to cost once (``estimated_s``); ``why`` says in
    words how the sample was decided."""

    chosen: list[int]
    held_out: int
    budget_s: float
    estimated_s: float
    why: str

    def as_json(self) -> dict:
        return {
            "validated": len(self.chosen),
            "held_out": self.held_out,
            "budget_s": self.budget_s,
            "estimated_s": self.estimated_s,
            "why": self.why,
        }


def plan_validation(
    tasks: Sequence[str],
    predicted: np.ndarray,
    pass_cost_s: Sequence[float],
    budget_s: float,
    *,
    at_least: int = MIN_VALIDATED,
) -> ValidationPlan:
    """The prompts of :func:`validation_order` that one pass over each fits in ``budget_s`` (``pass_cost_s``:
    each prompt's estimated seconds for one pass, its plain runs and one run per option), at least
    ``at_least`` of them whatever they cost (or every one, where fewer are held out); ``budget_s`` inf or
    the whole workload fitting: every prompt."""
    order = validation_order(tasks, predicted)
    costs = np.asarray(pass_cost_s, dtype=np.float64)
    chosen: list[int] = []
    spent = 0.0
    for index in order:
        if len(chosen) >= at_least and spent + costs[index] > budget_s:
            break
        chosen.append(index)
        spent += float(costs[index])
    if len(chosen) == len(order):
        why = (
            f"every held-out prompt ({len(order)}), with no validation budget"
            if budget_s == float("inf")
            else f"every held-out prompt ({len(order)}) fits the validation budget of {budget_s:.0f} s"
        )
    else:
        why = (
            f"{len(chosen)} of {len(order)} held-out prompts, chosen across tasks and predicted speedups, fit "
            f"the validation budget of {budget_s:.0f} s (estimated {spent:.0f} s a pass)"
        )
    return ValidationPlan(chosen, len(order), float(budget_s), spent, why)
