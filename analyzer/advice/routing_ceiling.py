"""How much a finer router could still win: three speedups from the exact replays, per task and overall.

- **static**: the one option (or off) that is best over the whole workload, used for every prompt;
- **by task**: each task on its own best option (or off), what the task router does;
- **oracle**: each prompt on its own best option (or off), the ceiling of any router that decides before
  generation.

Each is time-weighted: the plain time of the prompts over their time under the choice, both predicted from
the replays and the cost model. Given the decisions the one rule made (``decided``: per task, and the
workload's), static and by task are those decisions, so "by task" is what the published policies route;
without them an option is chosen for the workload or a task only where its speedup there exceeds
``min_speedup``. The oracle takes any option faster than plain. Each number has a 95% interval from a bootstrap
over prompts (resampled within each task): under the given decisions, or with the choices made anew in every
resample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SEED = 20261128


@dataclass(frozen=True)
class Ceiling:
    """One group of prompts (a task, or "all"): the three speedups with their 95% intervals, and which option
    the static and the by-task choice took (None: off)."""

    group: str
    prompts: int
    static: float
    static_interval: tuple[float, float]
    static_option: str | None
    by_task: float
    by_task_interval: tuple[float, float]
    task_options: dict[str, str | None]
    oracle: float
    oracle_interval: tuple[float, float]

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _best_column(plain: np.ndarray, options: np.ndarray, min_speedup: float) -> np.ndarray:
    """Per draw (rows of ``plain`` (b,) and ``options`` (b, m): summed times), the best option's column, or
    -1 (off) where none beats plain by ``min_speedup``; shape (b,)."""
    speedups = plain[:, None] / np.where(options > 0, options, np.inf)
    best = np.argmax(speedups, axis=1)
    return np.where(speedups[np.arange(len(best)), best] > min_speedup, best, -1)


def _chosen_time(options: np.ndarray, plain: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Per draw, the summed time under the chosen column (-1: plain); shape (b,)."""
    picked = options[np.arange(len(column)), np.maximum(column, 0)]
    return np.where(column >= 0, picked, plain)


def _bootstrap_weights(task_array: np.ndarray, names: list[str], draws: int, seed: int) -> np.ndarray:
    """Weights (draws + 1, n): row 0 the prompts as measured, the rest resampled within each task."""
    rng = np.random.default_rng(seed)
    weights = np.zeros((draws + 1, len(task_array)))
    weights[0] = 1.0
    for name in names:
        members = np.flatnonzero(task_array == name)
        picks = rng.integers(0, len(members), size=(draws, len(members)))
        for column in range(len(members)):
            np.add.at(weights[1:], (np.arange(draws), members[picks[:, column]]), 1.0)
    return weights


def routing_ceiling(
    tasks: Sequence[str],
    plain_ms: Sequence[float] | np.ndarray,
    option_ms: np.ndarray,
    labels: Sequence[str],
    *,
    min_speedup: float,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
    decided: Mapping[str, str | None] | None = None,
    static_decided: str | None = None,
) -> list[Ceiling]:
    """The three numbers for every task and for "all" (last): ``plain_ms`` (n,) each prompt's predicted
    plain time, ``option_ms`` (n, m) its predicted time under each of the ``labels`` options. ``decided``: the
    option (None: off) the decision rule chose per task, and ``static_decided`` the workload's; given, "by task"
    and "static" are what those decisions do (the same options in every draw, so their intervals are the
    prompts' sampling under the published decisions) instead of each draw's best option over
    ``min_speedup``."""
    if not labels:
        raise ValueError("the ceiling compares at least one option with plain decoding")
    plain = np.asarray(plain_ms, dtype=np.float64)
    options = np.asarray(option_ms, dtype=np.float64).reshape(len(plain), len(labels))
    task_array = np.asarray(list(tasks))
    names = sorted(set(tasks))
    weights = _bootstrap_weights(task_array, names, draws, seed)
    oracle_ms = np.minimum(plain, options.min(axis=1))
    fixed = None
    if decided is not None:
        fixed = {t: (labels.index(decided[t]) if decided.get(t) is not None else -1) for t in names}
        fixed["*"] = labels.index(static_decided) if static_decided is not None else -1
    draws_all = _draws(weights, plain, options, task_array, names, min_speedup, fixed)
    static_all = draws_all.static_column
    results = []
    for name in [*names, "all"]:
        mask = np.ones(len(plain)) if name == "all" else (task_array == name).astype(np.float64)
        w = weights * mask
        plain_sum = w @ plain
        static = plain_sum / _chosen_time(w @ options, plain_sum, static_all)  # the workload's one option
        group = (
            draws_all
            if name == "all"
            else _draws(weights * mask, plain, options, task_array, [name], min_speedup, fixed)
        )
        oracle = plain_sum / (w @ oracle_ms)
        results.append(
            Ceiling(
                name,
                int(mask.sum()),
                float(static[0]),
                _interval(static[1:]),
                labels[int(static_all[0])] if static_all[0] >= 0 else None,
                float(group.by_task[0]),
                _interval(group.by_task[1:]),
                {t: (labels[int(c[0])] if c[0] >= 0 else None) for t, c in group.task_columns.items()},
                float(oracle[0]),
                _interval(oracle[1:]),
            )
        )
    return results


@dataclass(frozen=True)
class _Draws:
    """Per draw: the static choice's column over the weighted prompts, the by-task speedup and each task's
    chosen column (-1: off)."""

    static_column: np.ndarray
    by_task: np.ndarray
    task_columns: dict[str, np.ndarray]


def _draws(
    weights: np.ndarray,
    plain: np.ndarray,
    options: np.ndarray,
    task_array: np.ndarray,
    names: Sequence[str],
    min_speedup: float,
    fixed: Mapping[str, int] | None = None,
) -> _Draws:
    """Each draw's choices: the best option over ``min_speedup``, or ``fixed``'s column per task ("*": the
    workload's) in every draw."""
    plain_sum = weights @ plain
    if fixed is not None:
        static_column = np.full(len(weights), fixed["*"])
    else:
        static_column = _best_column(plain_sum, weights @ options, min_speedup)
    task_sum = np.zeros(len(weights))
    task_columns = {}
    for name in names:
        wt = weights * (task_array == name)
        if fixed is not None:
            columns = np.full(len(weights), fixed[name])
        else:
            columns = _best_column(wt @ plain, wt @ options, min_speedup)
        task_columns[name] = columns
        task_sum += _chosen_time(wt @ options, wt @ plain, columns)
    return _Draws(static_column, plain_sum / task_sum, task_columns)


def _interval(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return (float("nan"), float("nan"))
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))
