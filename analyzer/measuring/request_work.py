"""What one request's decoding did, counted for a cost model with the context in it
(:mod:`analyzer.pricing.context_cost`): steps, rounds, drafted and accepted tokens, and how many tokens the
decoded rows attended over. Every engine's replay fills one; plain decoding's is :func:`plain_work`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestWork:
    """What one request's decoding did, as a cost model counts it: ``plain_steps`` single-token steps
    attending over ``plain_context`` tokens in all; ``rounds`` verification rounds that drafted ``drafted``
    and accepted ``accepted`` tokens, whose first rows attended over ``round_context`` tokens in all and
    whose other rows (one per drafted token) over ``row_context``; and ``draft_decodes`` decodes of a draft
    model in its draft loops. A round's forward reads the cache once for all its rows, so its first row's
    context and its other rows' are counted apart (the cost model prices them apart)."""

    plain_steps: int
    plain_context: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    round_context: int = 0
    draft_decodes: int = 0
    row_context: int = 0

    @property
    def mean_context(self) -> float:
        """The tokens one forward pass attends over, on average over the steps and rounds (0 without one)."""
        passes = self.plain_steps + self.rounds
        return (self.plain_context + self.round_context) / passes if passes else 0.0


def plain_work(prompt_tokens: int, output_tokens: int) -> RequestWork:
    """Plain greedy decoding of ``output_tokens`` after a prompt of ``prompt_tokens``: the first output token
    comes from the prompt's pass, then step g = 1 .. N - 1 decodes output token g over P + g tokens, so
    the context sums to (N - 1) P + N (N - 1) / 2."""
    steps = max(output_tokens - 1, 0)
    return RequestWork(steps, steps * prompt_tokens + steps * (steps + 1) // 2)


def round_rows_context(position: int, drafted: int) -> int:
    """The tokens the k rows after the first of one verification round attend over in all, when its first
    row attends over ``position`` tokens: k position + k (k + 1) / 2."""
    return drafted * position + drafted * (drafted + 1) // 2
