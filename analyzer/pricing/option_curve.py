"""One curve over the drafting options of an engine whose setting is fixed per server (llama-server's
``--spec-type`` settings), decided by the policy curve's one rule.

A group of prompts (a task, or the whole workload) has, per option, its time-weighted speedup (the prompts'
plain time over their time under the option, both predicted) and the percentile bootstrap interval of that
ratio over its prompts (:func:`analyzer.pricing.speedup.bootstrap_speedup_interval`, as a run's tasks have).
The options stand where a run's gammas stand: :class:`analyzer.pricing.policy_curve.PolicyCurve` takes the
curve with the interval's lower end at its best option, and decides by the rule every engine shares (on
where S* clears 1 + margin and the lower end clears 1.0; a task of fewer than ``min_prompts`` prompts takes
the workload's decision). The analysis, its report and the policy set it publishes all decide here.

The interval also holds the fit's own uncertainty. The bootstrap says how the speedup varies with the prompts;
the step costs that price every prompt come from a handful of calibration runs, and another calibration of the
same workload on the same quiet machine fits slightly different costs. A task whose speedup sits near the
margin then flipped from run to run (five demos on a 2-core Xeon: translation on in two, off in three). So,
where the costs carry their leave-one-prompt-out fits (:class:`FitSpread`), each option's speedup is priced
under every one of them, the jackknife standard error of the group's speedup is taken, and the interval is
widened by it: each end moves out to ``sqrt(bootstrap half ** 2 + (z * jackknife se) ** 2)`` from S, z the
normal quantile of the interval's level. A speedup the fit cannot tell from break-even then reaches 1.0 and
stays off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from analyzer.names import DEFAULT_MARGIN
from analyzer.pricing.policy_curve import CurvePoint, PolicyCurve
from analyzer.pricing.speedup import INTERVAL_LEVEL, MIN_TASK_PROMPTS, best_gamma, bootstrap_speedup_interval


@dataclass(frozen=True)
class FitSpread:
    """The prompts' times priced by each leave-one-prompt-out fit of the step costs: ``plain`` (k, n) each
    prompt's plain time under fit j, ``options`` (k, n, m) its time under each option."""

    plain: np.ndarray
    options: np.ndarray

    def of(self, mask: np.ndarray) -> "FitSpread":
        """The same fits over the prompts ``mask`` selects (a task's)."""
        return FitSpread(self.plain[:, mask], self.options[:, mask, :])

    def standard_errors(self) -> np.ndarray:
        """Per option, the jackknife standard error of the group's pooled speedup over the k fits,
        ``sqrt((k - 1) / k * sum_j (S_j - mean S) ** 2)``, shape (m,); zeros under two fits."""
        k = self.plain.shape[0]
        if k < 2:
            return np.zeros(self.options.shape[2])
        spent = self.options.sum(axis=1)  # (k, m)
        with np.errstate(divide="ignore", invalid="ignore"):
            speedups = self.plain.sum(axis=1)[:, None] / spent
        deviations = speedups - speedups.mean(axis=0)
        errors = np.sqrt((k - 1) / k * (deviations**2).sum(axis=0))
        return np.where(np.isfinite(errors), errors, 0.0)


def spread_words(fit_error: float | None) -> str:
    """What a decision's text adds for the fit's share of its interval: " (the fit's own spread ±0.25 in it)",
    or nothing where the fit's standard error is under half a hundredth (or there is none)."""
    return (
        f" (the fit's own spread ±{fit_error:.2f} in it)"
        if fit_error is not None and fit_error > 0.005
        else ""
    )


def widened(speedup: float, interval: tuple[float, float], fit_error: float) -> tuple[float, float]:
    """The bootstrap ``interval`` of ``speedup`` with the fit's standard error added in quadrature at the
    interval's level (module docstring)."""
    z = float(norm.ppf((1 + INTERVAL_LEVEL) / 2))
    low, high = interval
    if not (np.isfinite(low) and np.isfinite(high) and np.isfinite(speedup)) or fit_error <= 0:
        return interval
    return (
        float(speedup - np.hypot(speedup - low, z * fit_error)),
        float(speedup + np.hypot(high - speedup, z * fit_error)),
    )


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
    fit_errors: tuple[float, ...] = ()  # per option, the fit's standard error in the interval (empty: none)

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
            "fit_errors": [float(e) for e in self.fit_errors],
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
    spread: FitSpread | None = None,
) -> OptionCurve:
    """The curve of one group: ``plain_ms`` (n,) each prompt's predicted plain time, ``option_ms`` (n, m) its
    predicted time under each of the ``labels`` options. With a ``fallback`` (the workload's curve), a group
    of fewer than ``min_prompts`` prompts takes its decision; without one the group decides alone. With a
    ``spread`` (the same prompts under the leave-one-out fits), each interval holds the fit's error too."""
    if not labels:
        raise ValueError("an option curve needs at least one option")
    plain = np.asarray(plain_ms, dtype=np.float64)
    options = np.asarray(option_ms, dtype=np.float64).reshape(len(plain), len(labels))
    if len(plain) == 0:
        raise ValueError("an option curve needs at least one prompt")
    spent = options.sum(axis=0)
    speedups = tuple(float(plain.sum() / s) if s > 0 else float("nan") for s in spent)
    intervals = tuple(bootstrap_speedup_interval(plain, options[:, j]) for j in range(len(labels)))
    fit_errors: tuple[float, ...] = ()
    if spread is not None and spread.plain.shape[0] >= 2:
        fit_errors = tuple(float(e) for e in spread.standard_errors())
        intervals = tuple(widened(s, iv, e) for s, iv, e in zip(speedups, intervals, fit_errors))
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
    return OptionCurve(tuple(labels), speedups, intervals, len(plain), curve, point, fit_errors)


def task_option_curves(
    tasks: Sequence[str],
    plain_ms: Sequence[float] | np.ndarray,
    option_ms: Sequence[Sequence[float]] | np.ndarray,
    labels: Sequence[str],
    *,
    margin: float = DEFAULT_MARGIN,
    spread: FitSpread | None = None,
) -> tuple[dict[str, OptionCurve], OptionCurve]:
    """Each task's curve (a task of too few prompts taking the workload's decision) and the workload's, from
    every prompt's task, predicted plain time (n,) and time under each option (n, m), and the ``spread`` of
    those times under the leave-one-out fits (None: the intervals hold the prompts' spread alone)."""
    plain = np.asarray(plain_ms, dtype=np.float64)
    options = np.asarray(option_ms, dtype=np.float64).reshape(len(plain), len(labels))
    workload = option_curve(plain, options, labels, margin=margin, spread=spread)
    task_array = np.asarray(list(tasks))
    by_task = {}
    for task in sorted(set(tasks)):
        mask = task_array == task
        by_task[task] = option_curve(
            plain[mask], options[mask], labels, margin=margin, fallback=workload,
            spread=spread.of(mask) if spread is not None else None,
        )  # fmt: skip
    return by_task, workload


def stored_option_rows(rows: Sequence[Mapping]) -> tuple[list[str], np.ndarray, np.ndarray, FitSpread | None]:
    """(tasks, plain ms (n,), ms under each option (n, m), their spread under the leave-one-out fits) from an
    analysis' stored prompt rows: each row's ``predicted_plain_ms`` and, per setting, the plain time over its
    ``predicted_speedup``; each row's ``refit_plain_ms`` and each setting's ``refit_ms`` (None where a row
    holds no leave-one-out fit: a cost fitted on too few prompts)."""
    tasks = [row["task"] for row in rows]
    plain = np.asarray([row["predicted_plain_ms"] for row in rows], dtype=np.float64)
    options = np.asarray(
        [
            [p / s["predicted_speedup"] if s["predicted_speedup"] > 0 else np.inf for s in row["settings"]]
            for p, row in zip(plain, rows)
        ],
        dtype=np.float64,
    )
    refit_plain = [row["refit_plain_ms"] for row in rows]
    refit_options = [[s["refit_ms"] for s in row["settings"]] for row in rows]
    return tasks, plain, options, fit_spread(refit_plain, refit_options)


def fit_spread(
    refit_plain: Sequence[Sequence[float]], refit_options: Sequence[Sequence[Sequence[float]]]
) -> FitSpread | None:
    """A :class:`FitSpread` from per prompt its plain time under each of the k fits (n lists of k) and per
    prompt and option its time under each (n lists of m lists of k); None where some prompt or option has no
    fit, or their counts differ (nothing to take a spread over)."""
    counts = {len(times) for times in refit_plain} | {len(times) for row in refit_options for times in row}
    if len(counts) != 1 or counts == {0} or not refit_plain:
        return None
    plain = np.asarray(refit_plain, dtype=np.float64).T  # (k, n)
    options = np.transpose(np.asarray(refit_options, dtype=np.float64), (2, 0, 1))  # (k, n, m)
    return FitSpread(plain, options)
