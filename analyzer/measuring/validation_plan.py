"""Which prompts validate an analysis, and when validation stops: a sample chosen across tasks and predicted
speedups, taken one prompt at a time until each option's measured aggregate is as precise as asked or the
budget is spent.

Validation runs each chosen prompt once plainly and once per option, so validating a whole workload costs a
sweep of it: more than the analysis it checks. What it must show is whether the advice holds, per option,
within the machine's noise; a sample that spans the workload's tasks and predicted speedups shows that. The
sample is ordered so that every prefix spans as well as it can (:func:`validation_order`): the tasks in turn,
the largest first, and within each task its prompts by farthest-point sampling over their predicted speedups
(:func:`spanning_order`), so the extremes come early.

:func:`run_validation` takes that order's prompts one at a time (the stopping rule): after each, once
``at_least`` prompts are validated, it asks the widest 95% interval run noise leaves on any option's
time-weighted speedup (:func:`analyzer.measuring.noise.sampled_half_width`, from the noise measured so far)
and stops when it is within the target; before each, it stops when the prompt's estimated pass would overrun
the budget. Where every held-out prompt is validated and the interval is still wide, it makes another pass
over them, up to the passes asked. The plan it returns says which rule stopped it, with the numbers. The
engines give it two callables (validate one prompt, tell the widest interval) and no engine is named here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.measuring.calibration_choice import spanning_order

DEFAULT_BUDGET_SHARE = 0.5  # validation may cost this share of the plain generation's time ...
MIN_VALIDATED = 4  # ... and validates at least this many prompts (or every held-out one, where fewer)
DEFAULT_TARGET = 0.05  # ... and stops once run noise leaves every option's aggregate within this (95%)

TARGET, BUDGET, PASSES = "target", "budget", "passes"  # what stopped validation


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
    """What validation did: the prompts it took (``chosen``, indices in the order they ran), of ``held_out``;
    ``passes`` over them (the most any prompt had); its ``budget_s`` (inf: none) and what it spent
    (``spent_s``, the seconds its passes took); the ``target`` half-width and the widest one when it
    stopped (``half_width``, None where it could not be told); ``stopped``: TARGET, BUDGET or PASSES (every
    held-out prompt validated the passes asked); ``why`` says it in words."""

    chosen: list[int]
    held_out: int
    budget_s: float
    spent_s: float
    passes: int
    target: float
    half_width: float | None
    stopped: str
    why: str

    def as_json(self) -> dict:
        return {
            "validated": len(self.chosen),
            "held_out": self.held_out,
            "budget_s": self.budget_s if math.isfinite(self.budget_s) else None,
            "spent_s": self.spent_s,
            "passes": self.passes,
            "target": self.target,
            "half_width": self.half_width,
            "stopped": self.stopped,
            "why": self.why,
        }


def run_validation(
    order: Sequence[int],
    pass_cost_s: Callable[[int], float],
    validate: Callable[[int, int], float],
    widest: Callable[[], float | None],
    *,
    budget_s: float,
    target: float = DEFAULT_TARGET,
    passes: int = 1,
    at_least: int = MIN_VALIDATED,
) -> ValidationPlan:
    """Validate the prompts of ``order`` one at a time (``validate(index, pass_number)``, which returns the
    seconds that pass took) until the widest
    interval run noise leaves on any option's aggregate (``widest()``, None: not known yet) is within
    ``target`` (0: never stop for it) with at least ``at_least`` prompts validated, or the next prompt's
    estimated pass (``pass_cost_s(index)``, asked just before it, so an estimate may learn from the passes
    run so far) would take the spending past ``budget_s`` (inf: no budget),
    making up to ``passes`` passes over every prompt before giving up on the target. With no budget every
    prompt of a pass is validated before the interval is asked."""
    chosen: list[int] = []
    spent, number, stopped = 0.0, 0, PASSES
    bounded = math.isfinite(budget_s)
    for number in range(1, max(passes, 1) + 1):
        for index in order:
            taken = len(chosen) if number == 1 else len(order)
            if bounded and taken >= at_least and spent + pass_cost_s(index) > budget_s:
                stopped = BUDGET
                break
            spent += validate(index, number)
            if number == 1:
                chosen.append(index)
            if bounded and len(chosen) >= at_least and _within(widest(), target):
                stopped = TARGET
                break
        if stopped != PASSES:
            break
        if _within(widest(), target):  # a whole pass: asked once it is done
            stopped = TARGET
            break
    width = widest()
    return ValidationPlan(
        chosen, len(order), float(budget_s), spent, number, target, width, stopped,
        _why(len(chosen), len(order), budget_s, spent, number, target, width, stopped),
    )  # fmt: skip


def _within(width: float | None, target: float) -> bool:
    return target > 0 and width is not None and width <= target


def _why(
    validated: int,
    held_out: int,
    budget_s: float,
    spent_s: float,
    passes: int,
    target: float,
    width: float | None,
    stopped: str,
) -> str:
    which = (
        f"every held-out prompt ({held_out})"
        if validated == held_out
        else f"{validated} of {held_out} held-out prompts (chosen across tasks and predicted speedups)"
    )
    over = f" in {passes} passes" if passes > 1 else ""
    reached = f"±{width:.1%}" if width is not None else "an interval run noise could not tell"
    goal = f"(target ±{target:.1%})" if target > 0 else "(no target)"
    budget = f"{spent_s:.0f} s of the {budget_s:.0f} s budget" if math.isfinite(budget_s) else "no budget"
    if stopped == TARGET:
        return f"{which}{over}: every setting's aggregate within {reached} {goal}, {budget}"
    if stopped == BUDGET:
        return f"{which}{over}: the validation budget ran out at {reached} {goal}, {budget}"
    return f"{which}{over}, as asked: every setting's aggregate within {reached} {goal}, {budget}"
