"""Which prompts calibrate a cost model: a few that span the workload's context lengths and draft rates, not
the first N.

The first N prompts of a set are whatever order the user uploaded: six short chat prompts that draft nothing
fit nothing about long contexts or long drafts, and a cost fitted on them prices the rest of the workload
outside its range. :func:`spanning_choice` picks prompts by farthest-point sampling over their features,
each scaled to its rank in [0, 1]: first the prompt nearest the middle, then each time the prompt farthest
from every prompt chosen so far, so the extremes of every feature and the space between are covered
(:func:`spanning_order` gives every prompt in that order: validation's sample takes its prefixes).

Calibration measures that order's prompts a few at a time and stops once its fit holds on prompts it was not
fitted on; where the fit misses a prompt, the next one it measures is the one nearest the missed prompt
(:func:`nearest_untaken`): more of what the miss points to, not the same prompts again.
"""

from __future__ import annotations

import numpy as np


def _ranks(column: np.ndarray) -> np.ndarray:
    """Each value's rank scaled to [0, 1] (ties share their mean rank; a constant column is all 0.5)."""
    n = len(column)
    if n < 2 or np.all(column == column[0]):
        return np.full(n, 0.5)
    order = np.argsort(column, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(n, dtype=np.float64)
    for value in np.unique(column):  # ties: the mean of their ranks
        tied = column == value
        ranks[tied] = ranks[tied].mean()
    return ranks / (n - 1)


def _scaled(features: np.ndarray) -> np.ndarray:
    rows = np.asarray(features, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError("features must be a (prompts, features) matrix")
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        return rows
    return np.column_stack([_ranks(rows[:, j]) for j in range(rows.shape[1])])


def spanning_order(features: np.ndarray) -> list[int]:
    """Every row index of ``features`` (shape (n, d)) in farthest-point order over the rank-scaled features:
    first the row nearest the middle, then each time the row farthest from every row taken so far (ties: the
    earlier row), so any prefix spans the rows as well as that many can."""
    scaled = _scaled(features)
    n = scaled.shape[0]
    if n == 0:
        return []
    taken = [int(np.argmin(np.linalg.norm(scaled - 0.5, axis=1)))]
    nearest = np.linalg.norm(scaled - scaled[taken[0]], axis=1)
    nearest[taken[0]] = -1.0
    while len(taken) < n:
        candidate = int(np.argmax(nearest))  # argmax takes the first of equal distances
        taken.append(candidate)
        nearest = np.minimum(nearest, np.linalg.norm(scaled - scaled[candidate], axis=1))
        nearest[taken] = -1.0  # a taken row is never taken again, even among identical rows
    return taken


def spanning_choice(features: np.ndarray, count: int) -> list[int]:
    """``count`` row indices of ``features`` that span them (the first ``count`` of :func:`spanning_order`),
    in the rows' order; all rows when ``count`` >= n."""
    if count <= 0:
        return []
    return sorted(spanning_order(features)[:count])


def nearest_untaken(features: np.ndarray, taken: list[int], near: int) -> int | None:
    """The row not in ``taken`` nearest row ``near`` over the rank-scaled features (ties: the earlier row);
    None when every row is taken."""
    scaled = _scaled(features)
    distance = np.linalg.norm(scaled - scaled[near], axis=1) if scaled.shape[1] else np.zeros(len(scaled))
    distance[taken] = np.inf
    distance[near] = np.inf
    best = int(np.argmin(distance))
    return None if not np.isfinite(distance[best]) else best
