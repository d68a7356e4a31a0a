"""How predictable a long accepted run is from the target's uncertainty: the table
P(accepted run >= L | entropy bucket of the previous token), pooled over prompts."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from analyzer.measuring.acceptance import match_runs
from analyzer.names import ENTROPY_EDGES_NATS

LONG_RUN = 5


def long_run_by_entropy(
    match_sequences: Sequence[Sequence[int]],
    entropy_sequences: Sequence[Sequence[float]],
    edges: Sequence[float] = ENTROPY_EDGES_NATS,
    run_length: int = LONG_RUN,
) -> dict:
    """For every output position i >= 2 of every prompt: bucket the target entropy at position i-1
    (nats) by ``edges`` (left-closed), and count whether the draft matches run for at least
    ``run_length`` tokens starting at i. Returns ``{"edges", "run_length", "positions", "long_runs",
    "probability"}`` with one entry per bucket (probability NaN -> None for empty buckets)."""
    edges_array = np.asarray(edges, dtype=np.float64)
    buckets = len(edges_array) - 1
    positions = np.zeros(buckets, dtype=np.int64)
    long_runs = np.zeros(buckets, dtype=np.int64)
    for matches, entropies in zip(match_sequences, entropy_sequences):
        n = min(len(matches), len(entropies))
        if n < 2:
            continue
        runs = match_runs(np.asarray(matches[:n]))[1:n]
        previous = np.asarray(entropies[: n - 1], dtype=np.float64)
        index = np.clip(np.searchsorted(edges_array, previous, side="right") - 1, 0, buckets - 1)
        np.add.at(positions, index, 1)
        np.add.at(long_runs, index, (runs >= run_length).astype(np.int64))
    probability = [float(h / p) if p else None for h, p in zip(long_runs, positions)]
    return {
        "edges": [float(e) if np.isfinite(e) else None for e in edges_array],
        "run_length": run_length,
        "positions": positions.tolist(),
        "long_runs": long_runs.tolist(),
        "probability": probability,
    }
