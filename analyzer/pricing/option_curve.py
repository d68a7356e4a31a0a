"""One curve over the drafting options of an engine whose setting is fixed per server (llama-server's
``--spec-type`` settings), decided by the policy curve's one rule.

A group of prompts (a task, or the whole workload) has, per option, its time-weighted speedup (the prompts'
plain time over their time under the option, both predicted) and the percentile bootstrap interval of that
ratio over its prompts (:func:`analyzer.pricing.speedup.bootstrap_speedup_interval`, as a run's tasks have).
The options stand where a run's gammas stand: :class:`analyzer.pricing.policy_curve.PolicyCurve` takes the
curve with the interval's lower end at its best option, and decides by the rule every engine shares (on
where S* clears 1 + margin and the lower end clears 1.0; a task of fewer than ``min_prompts`` prompts takes
the workload's decision). The analysis, its report and the policy set it publishes all decide here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.names import DEFAULT_MARGIN
from analyzer.pricing.policy_curve import CurvePoint, PolicyCurve
from analyzer.pricing.speedup import MIN_TASK_PROMPTS, best_gamma, bootstrap_speedup_interval


@dataclass(frozen=True)
class OptionCurve:
    """One group's options: per option (``labels``) its speedup and interval over the ``prompts`` prompts,
    the policy curve they make and its decision (``point.gamma`` is the 1-based position of the option)."""

    labels: tuple[str, ...]
    speedups: tuple[float, ...]
    intervals: tuple[tuple[float, float], ...]
    prompts: int
    curve: PolicyCurve
    point: CurvePoint

    @property
    def chosen(self) -> str | None:
        """The option the rule chose (None: off)."""
        point = self.point
        return self.labels[point.gamma - 1] if point.speculate and point.gamma is not None else None

    @property
    def best(self) -> str | None:
        """The option with the highest speedup, chosen or not (None: nothing finite)."""
        gamma, _ = best_gamma(self.speedups)
        return self.labels[gamma - 1] if gamma is not None else None

    def speedup_of(self, label: str) -> float:
        return self.speedups[self.labels.index(label)]

    def interval_of(self, label: str) -> tuple[float, float]:
        return self.intervals[self.labels.index(label)]

    def as_dict(self) -> dict[str, object]:
        """The curve as stored with an analysis' task and a published policy: per option its label, speedup
        and interval; the decision's code and basis."""
        return {
            "options": [
                {"label": label, "speedup": _finite(speedup), "low": _finite(low), "high": _finite(high)}
                for label, speedup, (low, high) in zip(self.labels, self.speedups, self.intervals)
            ],
            "chosen": self.chosen,
            "code": self.point.code,
            "basis": self.point.basis,
        }


def _finite(value: float) -> float | None:
    """A number as stored JSON holds it: None where it is not finite (no interval, nothing priced)."""
    return float(value) if np.isfinite(value) else None


def option_curve(
    plain_ms: Sequence[float] | np.ndarray,
    option_ms: Sequence[Sequence[float]] | np.ndarray,
    labels: Sequence[str],
    *,
    margin: float = DEFAULT_MARGIN,
    fallback: OptionCurve | None = None,
    min_prompts: int = MIN_TASK_PROMPTS,
) -> OptionCurve:
    """The curve of one group: ``plain_ms`` (n,) each prompt's predicted plain time, ``option_ms`` (n, m) its
    predicted time under each of the ``labels`` options. With a ``fallback`` (the workload's curve), a group
    of fewer than ``min_prompts`` prompts takes its decision; without one the group decides alone."""
    if not labels:
        raise ValueError("an option curve needs at least one option")
    plain = np.asarray(plain_ms, dtype=np.float64)
    options = np.asarray(option_ms, dtype=np.float64).reshape(len(plain), len(labels))
    if len(plain) == 0:
        raise ValueError("an option curve needs at least one prompt")
    spent = options.sum(axis=0)
    speedups = tuple(float(plain.sum() / s) if s > 0 else float("nan") for s in spent)
    intervals = tuple(bootstrap_speedup_interval(plain, options[:, j]) for j in range(len(labels)))
    gamma, _ = best_gamma(speedups)
    low = intervals[gamma - 1][0] if gamma is not None else None
    curve = PolicyCurve(
        base=speedups,
        base_low=low,
        margin=margin,
        gamma_max=len(labels),
        n=len(plain) if fallback is not None else None,
        min_prompts=min_prompts,
        fallback=fallback.curve if fallback is not None else None,
    )
    point = curve.decide()
    assert point is not None  # the base curve always decides
    return OptionCurve(tuple(labels), speedups, intervals, len(plain), curve, point)


def task_option_curves(
    tasks: Sequence[str],
    plain_ms: Sequence[float] | np.ndarray,
    option_ms: Sequence[Sequence[float]] | np.ndarray,
    labels: Sequence[str],
    *,
    margin: float = DEFAULT_MARGIN,
) -> tuple[dict[str, OptionCurve], OptionCurve]:
    """Each task's curve (a task of too few prompts taking the workload's decision) and the workload's, from
    every prompt's task, predicted plain time (n,) and time under each option (n, m)."""
    plain = np.asarray(plain_ms, dtype=np.float64)
    options = np.asarray(option_ms, dtype=np.float64).reshape(len(plain), len(labels))
    workload = option_curve(plain, options, labels, margin=margin)
    task_array = np.asarray(list(tasks))
    by_task = {
        task: option_curve(plain[task_array == task], options[task_array == task], labels, margin=margin,
                           fallback=workload)
        for task in sorted(set(tasks))
    }  # fmt: skip
    return by_task, workload


def stored_option_rows(rows: Sequence[Mapping]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(tasks, plain ms (n,), ms under each option (n, m)) from an analysis' stored prompt rows: each row's
    ``predicted_plain_ms`` and, per setting, the plain time over its ``predicted_speedup``."""
    tasks = [row["task"] for row in rows]
    plain = np.asarray([row["predicted_plain_ms"] for row in rows], dtype=np.float64)
    options = np.asarray(
        [
            [p / s["predicted_speedup"] if s["predicted_speedup"] > 0 else np.inf for s in row["settings"]]
            for p, row in zip(plain, rows)
        ],
        dtype=np.float64,
    )
    return tasks, plain, options
