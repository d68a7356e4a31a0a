"""llama-server's step costs from its own ``timings``, and the speedup a replayed request predicts.

A request's ``predicted_ms`` runs from its first output token to its last (the first comes from the
prompt's pass). On a plain server it is ``n_steps * plain_step_ms`` with ``n_steps = predicted_n - 1``.
On a speculating server the replay (analyzer/measuring/server_drafting.py) splits the same steps into
plain steps and verification rounds, and the cost model is

    predicted_ms = step_ms * plain_steps + sum over rounds of (round_ms + per_draft_ms * k_r)
                   + per_accepted_ms * accepted

(+ ``per_draft_decode_ms`` per decode of a draft model in its draft loops, which the replay counts) where
``k_r`` is the round's drafted tokens: the round's fixed part (one batch decode, the sampling and
the server's own per-round work), each drafted token's share of the batch (and, with a draft model, its
draft decode), and the per-token work of the tokens a round adds beyond one. ``plain_step_ms`` is the
median of the plain server's own per-step time. ``round_ms``, ``per_draft_ms`` and ``per_accepted_ms`` are
the non-negative least-squares fit over calibration requests of one drafter family; so is ``step_ms``, a
step with nothing drafted, for a draft model's servers (the draft decodes every token beside the target),
while an n-gram server's plain step is the plain server's. A round at draft length k costs
``round_ms + per_draft_ms * k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from analyzer.measuring.server_drafting import ServerReplay


@dataclass(frozen=True)
class ServerCost:
    """The fitted step costs of one llama-server setup (model, threads, machine), in milliseconds;
    ``samples`` requests fitted the rounds, with a mean absolute relative error ``fit_mare``."""

    plain_step_ms: float
    step_ms: float
    round_ms: float
    per_draft_ms: float
    per_accepted_ms: float
    samples: int
    fit_mare: float
    per_draft_decode_ms: float = 0.0  # a draft model's decode in its draft loop (draft-simple)

    def round_cost_ms(self, drafted: int) -> float:
        """One verification round that drafted ``drafted`` tokens."""
        return self.round_ms + self.per_draft_ms * drafted

    def plain_ms(self, output_tokens: int) -> float:
        """Plain decoding of ``output_tokens`` (the first is free)."""
        return self.plain_step_ms * max(output_tokens - 1, 0)

    def speculative_ms(self, replay: ServerReplay) -> float:
        """The replayed request on a speculating server."""
        rounds = sum(self.round_cost_ms(k) for k, _ in replay.rounds)
        return (
            self.step_ms * replay.plain_steps
            + rounds
            + self.per_accepted_ms * replay.draft_n_accepted
            + self.per_draft_decode_ms * replay.draft_decodes
        )

    def speedup(self, replay: ServerReplay) -> float:
        """Plain time over speculative time of the replayed request (1.0 when it has no step)."""
        spec = self.speculative_ms(replay)
        return self.plain_ms(replay.output_tokens) / spec if spec > 0 else 1.0


def plain_step_ms(timings: Sequence[dict]) -> float:
    """The median per-step time over plain requests' ``timings`` (requests of one token are skipped)."""
    per_step = [t["predicted_ms"] / (t["predicted_n"] - 1) for t in timings if t["predicted_n"] > 1]
    if not per_step:
        raise ValueError("no plain request generated more than one token, so no step was timed")
    return float(np.median(np.asarray(per_step, dtype=float)))


def _features(replay: ServerReplay, fit_step: bool) -> list[float]:
    """(plain steps), rounds, drafted, accepted, (draft decodes): the parenthesized ones where the step
    is fitted, i.e. for a draft model's servers."""
    drafted = float(sum(k for k, _ in replay.rounds))
    rounds = [float(len(replay.rounds)), drafted, float(replay.draft_n_accepted)]
    if not fit_step:
        return rounds
    return [float(replay.plain_steps), *rounds, float(replay.draft_decodes)]


def fit_server_cost(
    plain_step: float, samples: Sequence[tuple[ServerReplay, float]], *, fit_step: bool = False
) -> ServerCost:
    """Fit the round costs on ``samples`` of (replay, measured ``predicted_ms``) from one drafter family's
    speculating servers, given the plain server's step time; ``fit_step`` fits their step with nothing
    drafted too (else it is the plain server's). Raises ValueError when no sample has a round."""
    with_rounds = [(replay, ms) for replay, ms in samples if replay.rounds]
    if not with_rounds:
        raise ValueError("no calibration request drafted anything, so no round was timed")
    design = np.asarray([_features(replay, fit_step) for replay, _ in with_rounds])  # (n, 3 or 4)
    known = 0.0 if fit_step else plain_step
    target = np.asarray([ms - known * replay.plain_steps for replay, ms in with_rounds])  # (n,)
    coef = [float(c) for c in nnls(design, target)[0]]
    step = coef.pop(0) if fit_step else plain_step
    decode = coef.pop() if fit_step else 0.0
    cost = ServerCost(plain_step, step, coef[0], coef[1], coef[2], len(with_rounds), 0.0, decode)
    predicted = np.asarray([cost.speculative_ms(replay) for replay, _ in with_rounds])
    measured = np.asarray([ms for _, ms in with_rounds])
    mare = float(np.mean(np.abs(predicted - measured) / measured))
    return ServerCost(plain_step, step, coef[0], coef[1], coef[2], len(with_rounds), mare, decode)
