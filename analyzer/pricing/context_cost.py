"""Step costs with the context in them, for every engine: what one request's decoding costs as a function of
how many tokens each step attends over and how many it verifies, fitted under physical constraints and
checked on prompts the fit did not see.

A decoding step's time grows with the context: every new row attends over all earlier tokens (measured on a
2-core EPYC through llama-server: 14.0 ms per token under 100 tokens of context, 36.2 ms above 1,000). So a
request is described by :class:`RequestWork`, counts an engine's replay gives exactly, and priced by
:class:`StepCost`:

    ms = step_ms * (plain_steps + rounds) + per_context_ms * (plain_context + round_context)
         + per_row_context_ms * row_context
         + round_ms * rounds + per_draft_ms * drafted + per_accepted_ms * accepted
         + step_extra_ms * plain_steps + per_draft_decode_ms * draft_decodes

where ``plain_context`` sums, over the plain steps, the tokens each step attends over, ``round_context`` the
same over each verification round's first row, and ``row_context`` over its other rows (k drafted tokens
make k more rows). A forward pass reads the cache once whatever its rows, so a round's first row costs
what a plain step at its context costs, and each further row only the work beyond that read,
``per_row_context_ms``, at most ``per_context_ms`` (pricing every row like a plain step made a 48-token
draft at 200 tokens of context cost 150 ms, and the fit then set every round term to 0). A plain request
(``rounds`` = 0) costs ``step_ms`` per step plus its context. A round costs at least the plain step at its
context: the constraints of :func:`fit_step_cost` keep every cost non-negative (a round's, a rejected drafted
token's, an accepted one's, a row's context) and an accepted token's cost (``per_draft_ms + per_accepted_ms``)
at most ``step_ms`` (accepting a token saves a step; it cannot cost more than one).

The fit has two stages, each a bounded least squares on relative error (rows divided by the measured time):
the plain step and its context term from plain requests, whose lengths span the workload; then a drafter
family's round terms from its speculating requests, the plain part known. ``heldout_mare`` is the error on
requests of prompts left out of the fit (leave one prompt out), the figure :func:`fit_problem` checks
against :func:`fit_error_bound` (the median over the prompts left out in turn).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from analyzer.measuring.request_work import RequestWork, round_rows_context

FIT_ERROR_MARGIN = 0.05  # a fit may miss held-out requests by this much beyond one run's own noise
# a held-out request's leverage counted at most this much: a prompt the others reach only by extrapolating
# far is expected to miss by at most twice one run's noise (sqrt(1 + 3)); the analysis prices no such prompt
# from a fit without it (every calibration prompt is in the fit)
MAX_LEVERAGE = 3.0
MIN_HELDOUT_GROUPS = 3  # prompts needed before a fit can be checked on prompts it did not see
MIN_CONTEXT_SPREAD = 1.25  # longest over shortest mean context: below it the context term is not fitted


@dataclass(frozen=True)
class StepCost:
    """Fitted step costs in milliseconds (``per_context_ms`` per token of context one row attends over);
    ``step_extra_ms`` is what a plain step costs more on a drafter family's servers (a draft model decodes
    beside the target), 0 for model-free drafting."""

    step_ms: float
    per_context_ms: float
    round_ms: float = 0.0
    per_draft_ms: float = 0.0
    per_accepted_ms: float = 0.0
    per_draft_decode_ms: float = 0.0
    step_extra_ms: float = 0.0
    per_row_context_ms: float = 0.0

    def plain_ms(self, work: RequestWork) -> float:
        """The work on a plain server (its rounds, if any, priced as plain steps would not be: use it for
        plain work)."""
        return self.step_ms * work.plain_steps + self.per_context_ms * work.plain_context

    def request_ms(self, work: RequestWork) -> float:
        """The work on a speculating server of this family."""
        return float(np.dot(self._coefficients(), _features(work)))

    def _coefficients(self) -> np.ndarray:
        return np.asarray(
            [
                self.step_ms,
                self.per_context_ms,
                self.round_ms,
                self.per_draft_ms,
                self.per_accepted_ms,
                self.step_extra_ms,
                self.per_draft_decode_ms,
                self.per_row_context_ms,
            ]
        )

    def round_ms_at(self, drafted: int, position: int) -> float:
        """One verification round that drafted ``drafted`` tokens, its first row attending over ``position``
        tokens (accepted tokens not included)."""
        return (
            self.step_ms
            + self.round_ms
            + self.per_draft_ms * drafted
            + self.per_context_ms * position
            + self.per_row_context_ms * round_rows_context(position, drafted)
        )


def _features(work: RequestWork) -> np.ndarray:
    """The work's counts in :class:`StepCost`'s coefficient order, shape (8,)."""
    return np.asarray(
        [
            work.plain_steps + work.rounds,
            work.plain_context + work.round_context,
            work.rounds,
            work.drafted,
            work.accepted,
            work.plain_steps,
            work.draft_decodes,
            work.row_context,
        ],
        dtype=np.float64,
    )


Sample = tuple[Hashable, RequestWork, float]  # (the prompt it ran, its work, measured ms)


@dataclass(frozen=True)
class FittedCost:
    """A :class:`StepCost` with how well it fits: ``samples`` speculating requests (``plain_samples`` plain
    ones) fitted with a mean absolute relative error ``fit_mare`` (``plain_fit_mare``); ``heldout_mare``
    (``plain_heldout_mare``), the same error on each prompt's requests when that prompt was left out of the
    fit, the median over the prompts (None: fewer than MIN_HELDOUT_GROUPS prompts); ``context_fitted`` says
    whether the plain requests' contexts spread enough to fit the context term (else it is 0)."""

    cost: StepCost
    samples: int
    fit_mare: float
    heldout_mare: float | None
    plain_samples: int
    plain_fit_mare: float
    plain_heldout_mare: float | None
    context_fitted: bool
    heldout_reach: float = 1.0
    plain_heldout_reach: float = 1.0

    @property
    def checked_error(self) -> float:
        """The error the bound is checked on: the worse held-out one, else the in-sample one."""
        return checked_error(self.fit_mare, self.plain_fit_mare, self.heldout_mare, self.plain_heldout_mare)

    @property
    def checked_reach(self) -> float:
        """The reach (:func:`heldout_reach`) of the error the bound is checked on."""
        return checked_reach(
            self.heldout_mare, self.plain_heldout_mare, self.heldout_reach, self.plain_heldout_reach
        )


def checked_error(fit: float, plain_fit: float, heldout: float | None, plain_heldout: float | None) -> float:
    """The error a fit's bound is checked on: the worse held-out error, else the worse in-sample one."""
    left_out = [e for e in (heldout, plain_heldout) if e is not None]
    return max(left_out) if left_out else max(fit, plain_fit)


def checked_reach(
    heldout: float | None, plain_heldout: float | None, reach: float, plain_reach: float
) -> float:
    """The reach that goes with :func:`checked_error`: the speculating requests' where their held-out error is
    the worse one, the plain requests' where theirs is; 1.0 where nothing was held out (in-sample errors)."""
    if heldout is None and plain_heldout is None:
        return 1.0
    if plain_heldout is None or (heldout is not None and heldout >= plain_heldout):
        return reach
    return plain_reach


def _bounded_fit(
    design: np.ndarray, target: np.ndarray, upper: np.ndarray, measured: np.ndarray | None = None
) -> np.ndarray:
    """Least squares on relative error: each row divided by its request's measured time (``measured``,
    default ``target``; a residual target, the time beyond a known part, can be near 0 or negative, and
    dividing by it let one such request outweigh all the others); coefficients in [0, upper]. A term that no
    request has (an all-zero column: no rejected token among the calibration runs, say) is not fitted and
    costs 0 (scipy's solver left it at an arbitrary point of its bounds: 0.1)."""
    total = target if measured is None else measured
    scale = 1.0 / np.where(total > 0, total, 1.0)
    coef = np.zeros(design.shape[1])
    present = np.flatnonzero(np.any(design != 0, axis=0))
    if len(present) == 0:
        return coef
    scaled = design[:, present] * scale[:, None]
    # scipy's trust-region step multiplies 0 by an infinite distance to a bound it cannot reach (collinear
    # terms, fewer runs than terms) and numpy warns of the NaN, which its step selection then discards
    with np.errstate(invalid="ignore"):
        result = lsq_linear(scaled, target * scale, bounds=(np.zeros(len(present)), upper[present]))
    coef[present] = np.clip(result.x, 0.0, upper[present])
    return coef


def fit_plain(samples: Sequence[Sample]) -> tuple[StepCost, bool]:
    """``step_ms`` and ``per_context_ms`` from plain requests (the context term only where their mean
    contexts spread by MIN_CONTEXT_SPREAD; else 0); and whether the context term was fitted. Raises
    ValueError when no request has a step."""
    rows = [(work, ms) for _, work, ms in samples if work.plain_steps > 0 and ms > 0]
    if not rows:
        raise ValueError("no plain request generated more than one token, so no step was timed")
    contexts = np.asarray([work.mean_context for work, _ in rows])
    with_context = bool(contexts.min() > 0 and contexts.max() / contexts.min() >= MIN_CONTEXT_SPREAD)
    design = np.asarray([[w.plain_steps, w.plain_context] for w, _ in rows], dtype=np.float64)
    target = np.asarray([ms for _, ms in rows])
    if not with_context:
        design = design[:, :1]
    coef = _bounded_fit(design, target, np.full(design.shape[1], np.inf))
    return StepCost(float(coef[0]), float(coef[1]) if with_context else 0.0), with_context


def fit_rounds(plain: StepCost, samples: Sequence[Sample], *, fit_step_extra: bool = False) -> StepCost:
    """A drafter family's round terms from its speculating requests, ``plain``'s step and context terms
    known: ``round_ms`` and ``per_draft_decode_ms`` non-negative; a rejected drafted token's cost
    (``per_draft_ms``) non-negative and an accepted one's (``per_draft_ms + per_accepted_ms``) in [0, step_ms]
    (so ``per_accepted_ms`` is negative where a rejected token costs more than an accepted one: its cache
    entries are removed again); ``per_row_context_ms`` in [0, per_context_ms] (fitted where the plain stage
    fitted a context term); ``step_extra_ms`` too where ``fit_step_extra`` (a draft model's servers). Raises
    ValueError when no request has a round."""
    rows = [(work, ms) for _, work, ms in samples if work.rounds > 0 and ms > 0]
    if not rows:
        raise ValueError("no calibration request drafted anything, so no round was timed")
    full = np.asarray([_features(work) for work, _ in rows])  # (n, 8)
    known = full[:, :2] @ np.asarray([plain.step_ms, plain.per_context_ms])
    # fitted as a rejected token's cost (>= 0) and an accepted token's (0 .. step_ms), then written as
    # per_draft_ms (every drafted token) + per_accepted_ms (what an accepted one costs beyond that)
    design = [full[:, 2], full[:, 3] - full[:, 4], full[:, 4]]
    upper = [np.inf, np.inf, plain.step_ms]
    if fit_step_extra:
        design += [full[:, 5], full[:, 6]]
        upper += [np.inf, np.inf]
    if plain.per_context_ms > 0:
        design.append(full[:, 7])
        upper.append(plain.per_context_ms)
    measured = np.asarray([ms for _, ms in rows])
    coef = [
        float(c) for c in _bounded_fit(np.column_stack(design), measured - known, np.asarray(upper), measured)
    ]
    round_ms, rejected_ms, accepted_ms = coef[:3]
    extra, decode = (coef[3], coef[4]) if fit_step_extra else (0.0, 0.0)
    row_context = coef[-1] if plain.per_context_ms > 0 else 0.0
    return StepCost(
        plain.step_ms,
        plain.per_context_ms,
        round_ms=round_ms,
        per_draft_ms=rejected_ms,
        per_accepted_ms=accepted_ms - rejected_ms,
        step_extra_ms=extra,
        per_draft_decode_ms=decode,
        per_row_context_ms=row_context,
    )


def _mare(cost: StepCost, samples: Sequence[Sample], plain: bool) -> np.ndarray:
    """Per request: |predicted - measured| / measured, shape (n,)."""
    price = cost.plain_ms if plain else cost.request_ms
    return np.asarray([abs(price(work) - ms) / ms for _, work, ms in samples if ms > 0])


def fit_step_cost(
    plain_samples: Sequence[Sample], spec_samples: Sequence[Sample], *, fit_step_extra: bool = False
) -> FittedCost:
    """Both stages on all the requests, and the held-out errors: for each prompt (the samples' first
    element) with speculating requests, both stages fitted again without that prompt's requests and its
    speculating requests priced; for each prompt with plain requests, the plain stage fitted without it and
    its plain requests priced. Raises ValueError as the stages do."""
    plain_cost, context_fitted = fit_plain(plain_samples)
    cost = fit_rounds(plain_cost, spec_samples, fit_step_extra=fit_step_extra)
    spec_rows = [s for s in spec_samples if s[1].rounds > 0 and s[2] > 0]
    return FittedCost(
        cost,
        len(spec_rows),
        float(np.mean(_mare(cost, spec_rows, plain=False))),
        _heldout(plain_samples, spec_rows, fit_step_extra),
        len(plain_samples),
        float(np.mean(_mare(cost, plain_samples, plain=True))),
        _heldout(plain_samples, [], fit_step_extra),
        context_fitted,
        heldout_reach(plain_samples, spec_rows, fit_step_extra=fit_step_extra, with_context=context_fitted),
        heldout_reach(plain_samples, [], with_context=context_fitted),
    )


def heldout_reach(
    plain_samples: Sequence[Sample],
    spec_rows: Sequence[Sample],
    *,
    fit_step_extra: bool = False,
    with_context: bool = True,
) -> float:
    """How far the fits without each prompt reach to it, as the factor on one run's noise that its held-out
    error is expected to show from noise alone: for a request priced by a least-squares fit it was not in,
    the expected squared relative error is noise^2 * (1 + h), h its leverage over the requests fitted
    (z' (Z'Z)^+ z, each row divided by its measured time, as the fit weighs it; the fit's bounds are left
    aside). Per prompt (as :func:`heldout_errors` groups them) the mean of sqrt(1 + min(h, MAX_LEVERAGE))
    over its requests; the median over the prompts (1.0 under MIN_HELDOUT_GROUPS prompts). A prompt in the
    middle of the others reaches about 1; the longest prompt of a workload, left out, is priced by
    extrapolating from the shorter ones and may miss by more than one run's noise with a right fit."""
    reaches = heldout_reaches(
        plain_samples, spec_rows, fit_step_extra=fit_step_extra, with_context=with_context
    )
    return float(np.median(list(reaches.values()))) if reaches else 1.0


def heldout_reaches(
    plain_samples: Sequence[Sample],
    spec_rows: Sequence[Sample],
    *,
    fit_step_extra: bool = False,
    with_context: bool = True,
) -> dict[Hashable, float]:
    """Per prompt, the reach :func:`heldout_reach` takes the median of (empty under MIN_HELDOUT_GROUPS
    prompts)."""
    checked = list(spec_rows) if spec_rows else list(plain_samples)
    groups = list(dict.fromkeys(key for key, _, _ in checked))
    if len(groups) < MIN_HELDOUT_GROUPS:
        return {}

    def row(work: RequestWork, ms: float, spec: bool) -> np.ndarray:
        """A request's row of the design both stages fit, divided by its measured time (a plain request
        has no round terms; the plain server no step extra)."""
        f = _features(work)
        columns = [f[0], f[1] if with_context else 0.0]
        if spec_rows:
            rounds = [f[2], f[3] - f[4], f[4], f[7] if with_context else 0.0]
            rounds += [f[5], f[6]] if fit_step_extra else []
            columns += rounds if spec else [0.0] * len(rounds)
        return np.asarray(columns, dtype=np.float64) / ms

    reaches: dict[Hashable, float] = {}
    for group in groups:
        fitted = [row(w, ms, False) for key, w, ms in plain_samples if key != group and ms > 0]
        fitted += [row(w, ms, True) for key, w, ms in spec_rows if key != group]
        mine = [row(w, ms, bool(spec_rows)) for key, w, ms in checked if key == group and ms > 0]
        if not fitted or not mine:
            continue
        design = np.asarray(fitted)
        inverse, projector = np.linalg.pinv(design.T @ design), np.linalg.pinv(design) @ design
        # a request with a term the others do not determine (outside their rows' span) is priced by
        # extrapolating as far as can be: it takes the cap
        leverages = [
            MAX_LEVERAGE
            if np.linalg.norm(z - projector @ z) > 1e-6 * np.linalg.norm(z)
            else min(float(z @ inverse @ z), MAX_LEVERAGE)
            for z in mine
        ]
        reaches[group] = float(np.mean(np.sqrt(1.0 + np.asarray(leverages))))
    return reaches


def _heldout(
    plain_samples: Sequence[Sample], spec_rows: Sequence[Sample], fit_step_extra: bool
) -> float | None:
    """The median of :func:`heldout_errors` over the prompts (None under MIN_HELDOUT_GROUPS prompts). The
    median, because calibration prompts are chosen to span the workload: leaving out the most extreme one
    makes the others extrapolate to it, which the analysis never does (that prompt is in its fit), and one
    such prompt must not decide alone."""
    errors = heldout_errors(plain_samples, spec_rows, fit_step_extra=fit_step_extra)
    return float(np.median(list(errors.values()))) if errors else None


def heldout_errors(
    plain_samples: Sequence[Sample], spec_rows: Sequence[Sample], *, fit_step_extra: bool = False
) -> dict[Hashable, float]:
    """Leave one prompt out: per prompt (the samples' first element), the mean relative error of its
    speculating requests (its plain ones where ``spec_rows`` is empty) priced by a fit without that prompt.
    Empty under MIN_HELDOUT_GROUPS prompts; a prompt whose absence leaves nothing to fit is skipped."""
    checked = [s for s in spec_rows if s[1].rounds > 0 and s[2] > 0] if spec_rows else list(plain_samples)
    groups = list(dict.fromkeys(key for key, _, _ in checked))
    if len(groups) < MIN_HELDOUT_GROUPS:
        return {}
    errors: dict[Hashable, float] = {}
    for group in groups:
        mine = [s for s in checked if s[0] == group]
        try:
            refit = fit_without(
                group, plain_samples, checked if spec_rows else None, fit_step_extra=fit_step_extra
            )
        except ValueError:  # the other prompts alone time no round (or no step): nothing to check it with
            continue
        errors[group] = float(np.mean(_mare(refit, mine, plain=not spec_rows)))
    return errors


def fit_without(
    group: Hashable,
    plain_samples: Sequence[Sample],
    spec_samples: Sequence[Sample] | None,
    *,
    fit_step_extra: bool = False,
) -> StepCost:
    """Both stages fitted without prompt ``group``'s requests (the plain stage alone where ``spec_samples`` is
    None): what :func:`heldout_errors` checks a prompt with, and one of the leave-one-out fits whose spread the
    decision counts (:mod:`analyzer.pricing.option_curve`). Raises ValueError as the stages do."""
    refit = fit_plain([s for s in plain_samples if s[0] != group])[0]
    if spec_samples is None:
        return refit
    return fit_rounds(refit, [s for s in spec_samples if s[0] != group], fit_step_extra=fit_step_extra)


def fit_error_bound(run_noise: float | None, reach: float = 1.0) -> float:
    """The largest held-out error a fit may show: FIT_ERROR_MARGIN beyond one run's own relative noise on
    this machine (``run_noise``, :class:`analyzer.measuring.noise.NoiseFloor`'s ``run_error``; 0 when it is
    not known), that noise taken ``reach`` times (:func:`heldout_reach`: as far as the fits without each
    prompt reach to it; 1.0 for requests priced from where the fit was made)."""
    return FIT_ERROR_MARGIN + (run_noise or 0.0) * reach


def fit_problem(
    error: float, bound: float, family: str, *, heldout: bool = True, reach: float = 1.0
) -> str | None:
    """Why a fit whose checked error (:attr:`FittedCost.checked_error`) is ``error`` may not price advice
    (over ``bound``), in words with the numbers; None when it passes. ``heldout`` False: the error is
    in-sample (too few prompts to leave one out); ``reach``: the bound's (:func:`fit_error_bound`)."""
    if error <= bound:
        return None
    where = "on prompts it was not fitted on" if heldout else "in-sample"
    reached = (
        f", that noise taken {reach:.2f} times for how far the fits without each prompt reach to it"
        if reach > 1.0
        else ""
    )
    return (
        f"the {family} step costs miss the measured time by {error:.1%} {where} "
        f"(bound {bound:.1%}: {FIT_ERROR_MARGIN:.0%} beyond one run's noise on this machine{reached})"
    )
