"""What a run's engine measured of one prompt: the record both engines' ``measure_batch`` give
(:mod:`analyzer.engine.run_models` for transformers, :mod:`analyzer.engine.llamacpp_run` for llama.cpp) and
:mod:`analyzer.analysis.runs` turns into stored results. No engine is imported here, so any engine may use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass
class PromptPasses:
    """What a run's engine measured of one prompt (``measure_batch`` of either engine gives one per
    prompt): the ``output_ids`` (N,) the target generated in ``target_time_s``, with the ``entropies``
    (N,) in nats of its next-token distributions; a model draft's ``matches`` (N,) int8 (None for
    prompt lookup, whose matches the run finds from the output), found in ``draft_time_s``;
    ``replay_mismatches``, the positions where teacher-forced verification departs from decoding
    (None where not checked); and, sampling, the raw ``target_logits`` and ``draft_logits`` (N, V);
    ``assistant_rounds``: (drafted, accepted) per round of transformers' assisted generation under its
    defaults, replayed (a greedy transformers run with a draft model; None otherwise)."""

    output_ids: list[int]
    entropies: np.ndarray
    target_time_s: float
    matches: np.ndarray | None
    replay_mismatches: int | None
    draft_time_s: float
    target_logits: torch.Tensor | None = None
    draft_logits: torch.Tensor | None = None
    assistant_rounds: list[tuple[int, int]] | None = None
