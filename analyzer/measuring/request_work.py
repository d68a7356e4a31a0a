"""What one request's decoding did, counted for a cost model with the context in it
(:mod:`analyzer.pricing.context_cost`): steps, rounds, drafted and accepted tokens, and how many tokens the
decoded rows attended over. Every engine's replay fills one; plain decoding's is :func:`plain_work`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestWork:
    """What one request's decoding did, as a cost model counts it: ``plain_steps`` single-token steps
    attending over ``plain_context`` tokens in all; ``rounds`` verification rounds that drafted ``drafted``
    and accepted ``accepted`` tokens, whose rows attended over ``round_context`` tokens in all; and
    ``draft_decodes`` decodes of a draft model in its draft loops."""

    plain_steps: int
    plain_context: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    round_context: int = 0
    draft_decodes: int = 0

    @property
    def mean_context(self) -> float:
        """The tokens one row attends over, on average over every row decoded (0 without a step)."""
        rows = self.plain_steps + self.rounds + self.drafted
        return (self.plain_context + self.round_context) / rows if rows else 0.0


def plain_work(prompt_tokens: int, output_tokens: int) -> RequestWork:
    """Plain greedy decoding of ``output_tokens`` after a prompt of ``prompt_tokens``: the first output token
    comes from the prompt's pass, then step g = 1 .. N - 1 decodes output token g over P + g tokens, so
    the context sums to (N - 1) P + N (N - 1) / 2."""
    steps = max(output_tokens - 1, 0)
    return RequestWork(steps, steps * prompt_tokens + steps * (steps + 1) // 2)


def round_rows_context(position: int, drafted: int) -> int:
    """The tokens the k + 1 rows of one verification round attend over in all, when its first row attends
    over ``position`` tokens: (k + 1) position + k (k + 1) / 2."""
    return (drafted + 1) * position + drafted * (drafted + 1) // 2
