"""llama-server's step costs from its own ``timings``, with the context in them, and the speedup a replayed
request predicts.

A request's ``predicted_ms`` runs from its first output token to its last (the first comes from the
prompt's pass). The replay (analyzer/measuring/server_drafting.py) splits those steps into plain steps and
verification rounds and counts the tokens each decoded row attends over; :mod:`analyzer.pricing.context_cost`
prices them:

    predicted_ms = step_ms * (plain steps + rounds) + per_context_ms * (tokens the steps and the rounds'
                   first rows attend over) + per_row_context_ms * (the same for the rounds' other rows)
                   + round_ms * rounds + per_draft_ms * drafted + per_accepted_ms * accepted
                   (+ step_extra_ms * plain steps + per_draft_decode_ms * draft decodes, draft-simple)

The plain step and its context term are fitted from plain requests (every prompt's generation and the
calibration prompts' plain runs, whose lengths span the workload); a drafter family's round terms from its
speculating servers' runs of the calibration prompts, under the constraints that keep them physical (none
negative; an accepted token at most a step). An n-gram server's plain step is the plain server's; a draft
model's servers add ``step_extra_ms`` (the draft decodes beside the target).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, fields

from analyzer.measuring.request_work import RequestWork, plain_work
from analyzer.measuring.server_drafting import ServerReplay
from analyzer.pricing.context_cost import (
    FittedCost,
    StepCost,
    checked_error,
    checked_reach,
    fit_error_bound,
    fit_step_cost,
)


@dataclass(frozen=True)
class ServerCost:
    """The fitted step costs of one llama-server setup (model, threads, machine) and drafter family, in
    milliseconds (``per_context_ms`` per token one row attends over): :class:`StepCost`'s terms, and how well
    they fit (:class:`analyzer.pricing.context_cost.FittedCost`: in-sample and held-out errors of the
    ``samples`` speculating and ``plain_samples`` plain requests)."""

    plain_step_ms: float
    per_context_ms: float
    round_ms: float
    per_draft_ms: float
    per_accepted_ms: float
    per_draft_decode_ms: float
    step_extra_ms: float
    samples: int
    fit_mare: float
    heldout_mare: float | None
    plain_samples: int
    plain_fit_mare: float
    plain_heldout_mare: float | None
    context_fitted: bool
    per_row_context_ms: float = 0.0
    # how far the fits without each prompt reach to it (analyzer/pricing/context_cost.py heldout_reach)
    heldout_reach: float = 1.0
    plain_heldout_reach: float = 1.0
    # the leave-one-prompt-out fits (:func:`analyzer.pricing.context_cost.fit_without`), one per calibration
    # prompt, in the same order for every family of one analysis: their spread is the fit's own uncertainty,
    # which the decision counts (:mod:`analyzer.pricing.option_curve`); empty where too few prompts were fitted
    refits: tuple[StepCost, ...] = ()

    @classmethod
    def from_fit(cls, fitted: FittedCost) -> "ServerCost":
        c = fitted.cost
        return cls(
            c.step_ms, c.per_context_ms, c.round_ms, c.per_draft_ms, c.per_accepted_ms, c.per_draft_decode_ms,
            c.step_extra_ms, fitted.samples, fitted.fit_mare, fitted.heldout_mare, fitted.plain_samples,
            fitted.plain_fit_mare, fitted.plain_heldout_mare, fitted.context_fitted, c.per_row_context_ms,
            fitted.heldout_reach, fitted.plain_heldout_reach,
        )  # fmt: skip

    @property
    def step_cost(self) -> StepCost:
        return StepCost(
            self.plain_step_ms,
            self.per_context_ms,
            self.round_ms,
            self.per_draft_ms,
            self.per_accepted_ms,
            self.per_draft_decode_ms,
            self.step_extra_ms,
            self.per_row_context_ms,
        )

    @property
    def checked_error(self) -> float:
        """The error its bound is checked on (:attr:`FittedCost.checked_error`)."""
        return checked_error(self.fit_mare, self.plain_fit_mare, self.heldout_mare, self.plain_heldout_mare)

    @property
    def checked_reach(self) -> float:
        """The reach of the error its bound is checked on (:attr:`FittedCost.checked_reach`)."""
        return checked_reach(
            self.heldout_mare, self.plain_heldout_mare, self.heldout_reach, self.plain_heldout_reach
        )

    def bound(self, run_noise: float | None) -> float:
        """The largest checked error this fit may show on a machine whose one run's noise is ``run_noise``
        (:func:`analyzer.pricing.context_cost.fit_error_bound` at its reach)."""
        return fit_error_bound(run_noise, self.checked_reach)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def plain_ms(self, replay: ServerReplay) -> float:
        """Plain decoding of the replayed request's output on the plain server (the first token is free)."""
        return self.step_cost.plain_ms(plain_work(replay.prompt_tokens, replay.output_tokens))

    def speculative_ms_of(self, work: RequestWork) -> float:
        """A request that did ``work`` on a speculating server of this family."""
        return self.step_cost.request_ms(work)

    @classmethod
    def from_stored(cls, stored: dict[str, object]) -> "ServerCost":
        """The cost as an analysis stored it (its fields; other keys, such as the bound, left aside)."""
        values = {f.name: stored[f.name] for f in fields(cls) if f.name in stored}
        values["refits"] = tuple(StepCost(**refit) for refit in values.get("refits") or ())  # type: ignore[attr-defined]
        return cls(**values)  # type: ignore[arg-type]

    def refit_plain_ms(self, replay: ServerReplay) -> list[float]:
        """:meth:`plain_ms` under each leave-one-out fit (empty where there is none)."""
        work = plain_work(replay.prompt_tokens, replay.output_tokens)
        return [refit.plain_ms(work) for refit in self.refits]

    def refit_speculative_ms(self, replay: ServerReplay) -> list[float]:
        """:meth:`speculative_ms` under each leave-one-out fit (empty where there is none)."""
        work = replay.work()
        return [refit.request_ms(work) for refit in self.refits]

    def speculative_ms(self, replay: ServerReplay) -> float:
        """The replayed request on a speculating server of this family."""
        return self.step_cost.request_ms(replay.work())

    def speedup(self, replay: ServerReplay) -> float:
        """Plain time over speculative time of the replayed request (1.0 when it has no step)."""
        spec = self.speculative_ms(replay)
        return self.plain_ms(replay) / spec if spec > 0 else 1.0

    def round_cost_ms(self, drafted: int, position: int = 0) -> float:
        """One verification round that drafted ``drafted`` tokens, its first row over ``position`` tokens."""
        return self.step_cost.round_ms_at(drafted, position)


Sample = tuple[Hashable, RequestWork, float]


def fit_server_cost(
    plain_samples: Sequence[Sample], spec_samples: Sequence[Sample], *, fit_step: bool = False
) -> ServerCost:
    """Fit the step costs of one drafter family: ``plain_samples`` (prompt key, the plain request's work,
    measured ``predicted_ms``) from the plain server, ``spec_samples`` the same from the family's
    speculating servers; ``fit_step`` fits the extra of their plain step (a draft model's servers). Raises
    ValueError when no plain request has a step or no speculating request a round."""
    return ServerCost.from_fit(fit_step_cost(plain_samples, spec_samples, fit_step_extra=fit_step))
