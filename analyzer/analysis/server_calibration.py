"""Calibration of an analysis in llama-server: prompts taken to span the workload (by
:func:`calibration_features`), the machine's noise from each pass's pair of plain runs (:func:`measured_noise`),
the step costs per drafter family fitted from the servers' ``timings`` (:func:`fit_costs`) and checked on prompts
they were not fitted on, with a stopping rule: a few prompts first, then one more at a time, nearest the prompt
the fit missed, until the fit holds or the most asked are measured (:func:`calibrate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from analyzer.analysis.server_outcomes import (
    Progress,
    PromptOutcome,
    ServerAnalysisError,
    ServerPrompt,
    replay_counts,
    served_counts,
)
from analyzer.analysis.server_passes import PassLog, ServerHistory
from analyzer.engine.llama_server_process import Server
from analyzer.measuring.calibration_choice import nearest_untaken, spanning_order
from analyzer.measuring.noise import NoiseFloor, noise_floor
from analyzer.measuring.request_work import plain_work
from analyzer.pricing.context_cost import (
    MIN_HELDOUT_GROUPS,
    StepCost,
    fit_error_bound,
    fit_problem,
    fit_without,
    heldout_errors,
)
from analyzer.pricing.server_cost import Sample, ServerCost, fit_server_cost

MIN_CALIBRATION = 4  # prompts calibration measures before it fits: three to check each one left out on
REUSE_CHECK = 2  # prompts of a new workload an earlier analysis' fit is checked on before it is reused
FALLBACK_RUN_ERROR = 0.05  # one run's relative noise assumed where the calibration pairs could not tell


def calibration_features(outcomes: Sequence[PromptOutcome]) -> np.ndarray:
    """Per prompt what calibration spans: the log of its mean context (prompt plus half the output), the
    share of its output the settings draft and the share they accept (means over the settings' replays)."""
    features = []
    for outcome in outcomes:
        output = max(len(outcome.plain.completion.tokens), 1)
        context = len(outcome.prompt_ids) + output / 2
        drafted = np.mean([s.replay.draft_n / output for s in outcome.settings]) if outcome.settings else 0.0
        accepted = (
            np.mean([s.replay.draft_n_accepted / output for s in outcome.settings])
            if outcome.settings
            else 0.0
        )
        features.append([np.log(context), drafted, accepted])
    return np.asarray(features, dtype=np.float64).reshape(len(outcomes), 3)


def measured_noise(outcomes: Sequence[PromptOutcome]) -> NoiseFloor:
    """The machine's noise from every pass's pair of plain runs (undisturbed ones), with the hypervisor's
    steal and the clock's spread over every run of the analysis."""
    pairs = [(a, b) for o in outcomes for a, b in o.plain_pairs if not (a.disturbed or b.disturbed)]
    runs = [o.plain for o in outcomes] + [t.measured for o in outcomes for s in o.settings for t in s.trials]
    runs += [run for o in outcomes for pair in o.plain_pairs for run in pair]
    steals = [r.steal for r in runs if r.steal is not None]
    walls = [r.completion.predicted_ms for r in runs if r.steal is not None]
    steal = float(np.average(steals, weights=walls)) if steals and sum(walls) > 0 else None
    clocks = [r.mhz for r in runs if r.mhz is not None]
    spread = (max(clocks) - min(clocks)) / max(clocks) if clocks and max(clocks) > 0 else None
    return noise_floor(
        [a.step_ms for a, _ in pairs], [b.step_ms for _, b in pairs], steal=steal, mhz_spread=spread
    )


@dataclass(frozen=True)
class PriorFit:
    """The step costs an earlier analysis fitted on this machine with this model, threads, context and server
    build (per drafter family), and where they come from (``analysis_id``: the analysis that fitted them)."""

    costs: dict[str, ServerCost]
    analysis_id: int


@dataclass(frozen=True)
class Calibration:
    """What calibration found: the step costs per drafter family, the prompts it measured (``chosen``, in the
    order it measured them), the machine's noise over their passes, the bound of the family nearest its bound
    (each is checked at its own reach, :meth:`ServerCost.bound`),
    why advice is withheld (None: it is not), the settings left out because their servers disagreed with
    their replays (label: why), ``why`` it stopped where it did, in words, and ``reused_from``, the earlier
    analysis whose fit it reused (None: fitted on this workload)."""

    costs: dict[str, ServerCost]
    chosen: list[PromptOutcome]
    noise: NoiseFloor
    bound: float
    withheld: str | None
    left_out: dict[str, str] = field(default_factory=dict)
    why: str = ""
    reused_from: int | None = None  # the analysis whose fit was reused (None: fitted here)


def calibrate(
    servers: list[Server],
    outcomes: Sequence[PromptOutcome],
    history: ServerHistory,
    say: Progress,
    pass_log: PassLog | None = None,
    *,
    at_most: int,
    started_here: bool = True,
    prior: PriorFit | None = None,
) -> Calibration:
    """Measure prompts one pass each on every server, :data:`MIN_CALIBRATION` of them first (in
    :func:`~analyzer.measuring.calibration_choice.spanning_order` over :func:`calibration_features`), then
    check that each setting's server did what its replay says (:func:`disagreeing_settings`): a setting whose
    server disagrees is left out of the analysis (its server stopped and removed from ``servers``, its outcome
    from every prompt's ``settings``) with the reason, and the others go on. Then fit each drafter family's
    costs and check them on prompts they were not fitted on
    (:func:`analyzer.pricing.context_cost.fit_error_bound`, from the noise the passes measured); the stopping
    rule: while a family misses its bound (or has too few prompts to be checked) and fewer than ``at_most``
    prompts are measured, measure one more, the prompt nearest the one the fit missed most
    (:func:`~analyzer.measuring.calibration_choice.nearest_untaken`; the next of the spanning order where the
    miss names no prompt), and fit again. A family that still misses at ``at_most`` withholds the advice.
    ``pass_log``: the earlier attempt's passes, kept; ``started_here``: whether specroute started the servers
    (the reasons say what to check on a user's own). ``prior``: an earlier analysis' fit on the same setup,
    checked first on :data:`REUSE_CHECK` prompts and reused where it prices their runs within the bound (no
    fit made); where it misses, calibration goes on from those prompts as above and fits anew."""
    run = _Calibrating(servers, outcomes, history, say, pass_log or PassLog(history), at_most, started_here)
    checking = prior is not None and set(prior.costs) >= {s.drafter.family for s in outcomes[0].settings}
    run.measure_first(REUSE_CHECK if checking else MIN_CALIBRATION)
    left_out = run.check_settings()
    if prior is not None and checking:
        reused = _reuse(prior, run.chosen, left_out, say)
        if reused is not None:
            return reused
        run.measure_first(MIN_CALIBRATION)
    return run.fit(left_out)


class _Calibrating:
    """One calibration under way: the prompts in spanning order, those measured (``taken``, indices in the
    order measured), and the steps of :func:`calibrate`."""

    def __init__(
        self,
        servers: list[Server],
        outcomes: Sequence[PromptOutcome],
        history: ServerHistory,
        say: Progress,
        pass_log: PassLog,
        at_most: int,
        started_here: bool,
    ):
        self.servers, self.outcomes, self.history, self.say, self.pass_log = (
            servers,
            outcomes,
            history,
            say,
            pass_log,
        )
        self.at_most = max(1, min(at_most, len(outcomes)))
        self.started_here = started_here
        self.features = calibration_features(outcomes)
        self.order = spanning_order(self.features)
        self.taken: list[int] = []

    @property
    def chosen(self) -> list[PromptOutcome]:
        return [self.outcomes[i] for i in self.taken]

    def measure(self, index: int, reason: str = "") -> None:
        """One pass of prompt ``index`` through every server, a calibration prompt from now on."""
        outcome = self.outcomes[index]
        outcome.calibration = True
        self.taken.append(index)
        kept = self.pass_log.run(self.servers, outcome, self.history, "calibration", 1)
        self.say(
            f"calibrated {len(self.taken)} (at most {self.at_most}): {outcome.prompt.key}{reason}"
            + (" (kept)" if kept else "")
        )

    def measure_first(self, count: int) -> None:
        """The spanning order's prompts not measured yet, until ``count`` (at most ``at_most``) are."""
        for index in [i for i in self.order if i not in self.taken]:
            if len(self.taken) >= min(count, self.at_most):
                break
            self.measure(index)

    def check_settings(self) -> dict[str, str]:
        """The settings whose servers disagreed with their replays on the prompts measured (label: why), left
        out of the analysis; ServerAnalysisError where that leaves none."""
        left_out = disagreeing_settings(self.servers, self.chosen, started_here=self.started_here)
        if left_out:
            _leave_out(self.servers, self.outcomes, left_out)
            for label, why in left_out.items():
                self.say(f"left out {label}: {why}")
            if not self.outcomes[0].settings:
                raise ServerAnalysisError(
                    "every setting's server disagreed with its replay, so nothing is left to analyze: "
                    + "; ".join(f"{label}: {why}" for label, why in left_out.items())
                )
        return left_out

    def fit(self, left_out: dict[str, str]) -> Calibration:
        """Fit and check; while a family misses and fewer than ``at_most`` are measured, measure the prompt
        nearest the one it missed most and fit again (:func:`calibrate`)."""
        while True:
            chosen = self.chosen
            noise = measured_noise(chosen)
            run_error = noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR
            fitted = _fit_or_none(chosen)
            miss = _first_miss(chosen, fitted, run_error)
            if miss is None or len(self.taken) >= self.at_most:
                break
            near = [i for i, o in enumerate(self.outcomes) if o.prompt is miss.prompt]
            following = nearest_untaken(self.features, self.taken, near[0]) if near else None
            if following is None:
                following = next(i for i in self.order if i not in self.taken)
            self.measure(following, f": {miss.text}")
        if fitted is None:
            fit_costs(chosen)  # raises the error that says which settings drafted nothing
        assert fitted is not None  # for mypy: fit_costs raised where nothing could be fitted
        problems = [
            problem
            for family, cost in fitted.items()
            if (
                problem := fit_problem(
                    cost.checked_error, cost.bound(run_error), family, heldout=cost.heldout_mare is not None,
                    reach=cost.checked_reach,
                )
            )
        ]  # fmt: skip
        if problems and miss is not None and miss.prompt is not None:
            problems.append(f"missed most: {miss.text}")
        worst = max(fitted.values(), key=lambda cost: cost.checked_error - cost.bound(run_error))
        bound = worst.bound(run_error)
        why = _calibration_why(worst, bound, len(self.taken), self.at_most, miss, bool(problems))
        self.say(f"calibration: {why}")
        return Calibration(fitted, chosen, noise, bound, "; ".join(problems) or None, left_out, why)


def _reuse(
    prior: PriorFit, chosen: list[PromptOutcome], left_out: dict[str, str], say: Progress
) -> Calibration | None:
    """The calibration ``prior`` gives where it prices the ``chosen`` prompts' runs within the bound (each
    family's mean relative error over its speculating runs and over the plain runs); None where it misses,
    said with its numbers."""
    noise = measured_noise(chosen)
    bound = fit_error_bound(noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR)
    families = sorted({s.drafter.family for o in chosen for s in o.settings})
    errors = {
        family: _prior_error(prior.costs[family], *_family_samples(chosen, family)) for family in families
    }
    worst = max(errors.values(), default=0.0)
    source = f"the fit of llama-server analysis #{prior.analysis_id}"
    if worst <= bound:
        why = (
            f"reused {source} (this machine, model, threads, context and server build), checked on {len(chosen)} "
            f"prompts of this workload: error {worst:.1%} (bound {bound:.1%})"
        )
        say(f"calibration: {why}")
        costs = {family: prior.costs[family] for family in families}
        return Calibration(costs, chosen, noise, bound, None, left_out, why, prior.analysis_id)
    say(
        f"{source} missed {len(chosen)} prompts of this workload by {worst:.1%} (bound {bound:.1%}): fitting anew"
    )
    return None


def _prior_error(cost: ServerCost, plain: list[Sample], spec: list[Sample]) -> float:
    """The worse of ``cost``'s mean relative errors over the speculating and the plain requests."""
    spec_errors = [abs(cost.speculative_ms_of(work) - ms) / ms for _, work, ms in spec if ms > 0]
    plain_errors = [abs(cost.step_cost.plain_ms(work) - ms) / ms for _, work, ms in plain if ms > 0]
    return max(float(np.mean(e)) if e else 0.0 for e in (spec_errors, plain_errors))


@dataclass(frozen=True)
class _Miss:
    """Why a fit does not hold yet: the prompt it missed most (None: it cannot be checked yet, too few
    prompts drafted) and the words for it."""

    prompt: ServerPrompt | None
    text: str


def _fit_or_none(chosen: Sequence[PromptOutcome]) -> dict[str, ServerCost] | None:
    try:
        return fit_costs(chosen)
    except ServerAnalysisError:  # some family has no round yet
        return None


def _first_miss(
    chosen: Sequence[PromptOutcome], fitted: dict[str, ServerCost] | None, run_error: float
) -> _Miss | None:
    """The first family whose fit does not hold on prompts it was not fitted on (None: every one holds), with
    the prompt it missed most: its speculating requests' held-out error where those miss, else its plain
    requests' (the plain step and context terms). Each is checked against its bound at its own reach
    (:meth:`ServerCost.bound`, ``run_error`` one run's noise)."""
    if fitted is None:
        return _Miss(None, "no round of some setting timed yet")
    for family, cost in fitted.items():
        if cost.heldout_mare is None or cost.plain_heldout_mare is None:
            return _Miss(None, f"too few prompts drafted with the {family} settings to check their fit")
        bound = cost.bound(run_error)
        if cost.checked_error <= bound:
            continue
        plain, spec = _family_samples(chosen, family)
        rounds = cost.heldout_mare > fit_error_bound(run_error, cost.heldout_reach)
        errors = heldout_errors(plain, spec if rounds else [], fit_step_extra=family == "draft model")
        if not errors:
            return _Miss(None, f"the {family} fit could not be checked")
        key = max(errors, key=lambda k: errors[k])
        prompt = next(o.prompt for o in chosen if o.prompt.key == key)
        term = "rounds" if rounds else "plain step and context terms"
        return _Miss(
            prompt,
            f"the {family} fit's {term} missed {key} by {errors[key]:.1%} when fitted without it "
            f"(bound {bound:.1%})",
        )
    return None


def _calibration_why(
    worst: ServerCost, bound: float, measured: int, at_most: int, miss: _Miss | None, failed: bool
) -> str:
    """Where calibration stopped and why, in words, with the numbers of the family nearest its bound
    (``worst``, checked against ``bound``)."""
    reach = f" at reach {worst.checked_reach:.2f}" if worst.checked_reach > 1.0 else ""
    errors = f"worst error {worst.checked_error:.1%}, bound {bound:.1%}{reach}"
    if miss is None:
        return f"the fit held on prompts it was not fitted on after {measured} prompts ({errors}; at most {at_most})"
    if failed:
        return f"the fit still missed after {measured} prompts, the most asked ({errors})"
    return f"{miss.text}: checked in-sample after {measured} prompts, the most asked ({errors})"


def fit_costs(chosen: Sequence[PromptOutcome]) -> dict[str, ServerCost]:
    """The step costs per drafter family (what calibration fits, and what a benchmark re-prices a measured
    analysis with), all from the chosen prompts' calibration passes: the plain step and its context term
    from their plain runs, the rounds from that family's settings' runs (undisturbed ones, each priced from the
    replay of the output it served; a draft model's runs whose output left plain greedy only where there is
    nothing else). The generation pass is left out: its plain runs follow each
    other on one server, with its weights warm in the CPU's caches, and ran 7.5% faster per step than the
    same server's runs interleaved with the other servers' (52 prompts, a 2-core Xeon), which is how every
    speculating run is timed. Each cost carries its fits without each calibration prompt in turn
    (:func:`_refits`), whose spread every decision counts."""
    costs = {}
    families = sorted({s.drafter.family for o in chosen for s in o.settings})
    samples_of = {family: _family_samples(chosen, family) for family in families}
    for family, (plain, samples) in samples_of.items():
        try:
            costs[family] = fit_server_cost(plain, samples, fit_step=family == "draft model")
        except ValueError:
            labels = ", ".join(
                sorted({s.drafter.label for o in chosen for s in o.settings if s.drafter.family == family})
            )
            raise ServerAnalysisError(
                f"none of the {len(chosen)} calibration prompts drafted anything with {labels}, so no round could "
                "be timed: raise --calibration, or add prompts that repeat their input (extraction, code edits)"
            ) from None
    refits = _refits([o.prompt.key for o in chosen], samples_of)
    return {family: replace(cost, refits=refits[family]) for family, cost in costs.items()}


def _refits(
    keys: Sequence[str], samples_of: dict[str, tuple[list[Sample], list[Sample]]]
) -> dict[str, tuple[StepCost, ...]]:
    """Per family, the fits without each calibration prompt in turn (both stages), the same prompts left out
    for every family (a prompt whose absence leaves some family nothing to fit is skipped for all), so that
    fit j prices the plain server and every setting alike; none under MIN_HELDOUT_GROUPS prompts."""
    refits: dict[str, list[StepCost]] = {family: [] for family in samples_of}
    if len(set(keys)) < MIN_HELDOUT_GROUPS:
        return {family: () for family in samples_of}
    for key in dict.fromkeys(keys):
        try:
            fits = {
                family: fit_without(key, plain, spec, fit_step_extra=family == "draft model")
                for family, (plain, spec) in samples_of.items()
            }
        except ValueError:
            continue
        for family, fit in fits.items():
            refits[family].append(fit)
    return {family: tuple(fits) for family, fits in refits.items()}


def _family_samples(chosen: Sequence[PromptOutcome], family: str) -> tuple[list[Sample], list[Sample]]:
    """What :func:`fit_costs` fits ``family`` on: the chosen prompts' plain runs (undisturbed) and that
    family's settings' runs (see there), each as (prompt key, work, measured ms)."""
    plain: list[Sample] = []
    for outcome in chosen:
        runs = [run for pair in outcome.plain_pairs for run in pair]
        plain += [
            (outcome.prompt.key, plain_work(len(outcome.prompt_ids), int(r.completion.timings["predicted_n"])),
             r.completion.predicted_ms)
            for r in runs
            if not r.disturbed
        ]  # fmt: skip
    settings = [(o.prompt.key, s) for o in chosen for s in o.settings if s.drafter.family == family]
    trials = [(k, s, t) for k, s in settings for t in s.quiet_trials] or [
        (k, s, t) for k, s in settings for t in s.trials
    ]
    served = [(k, s, t) for k, s, t in trials if s.replayed_as_served(t)]
    samples: list[Sample] = [
        (key, s.trial_replay(t).work(), t.measured.completion.predicted_ms)
        for key, s, t in (served or trials)
    ]
    return plain, samples


def disagreeing_settings(
    servers: Sequence[Server], outcomes: Sequence[PromptOutcome], *, started_here: bool = True
) -> dict[str, str]:
    """The settings whose servers did not do on the calibration prompts what their replays say (label: why):
    a model-free setting's server whose draft counts differ from the replay of the output it served, with
    the history that server had (ngram-mod's table holds only the requests that server got, not the whole
    workload's), or any setting's server that drafted nothing where that replay drafted. Raises
    ServerAnalysisError where the plain server drafted: no setting can be measured against it."""
    if any(o.plain.completion.timings.get("draft_n", 0) for o in outcomes):
        raise ServerAnalysisError(
            f"the plain server at {servers[0].client.url} drafted: "
            + ("start it without --spec-type" if not started_here else "report this with the server's build")
        )
    left_out = {}
    for index, server in enumerate(servers[1:]):
        settings = [o.settings[index] for o in outcomes if o.settings[index].trials]
        if not settings:
            continue
        drafter = settings[0].drafter
        pairs = [
            (served_counts(t.measured), replay_counts(s.trial_replay(t)))
            for s in settings
            for t in s.trials[:1]
            if s.replayed_as_served(t)
        ]
        served = tuple(sum(p[0][i] for p in pairs) for i in (0, 1))
        replayed = tuple(sum(p[1][i] for p in pairs) for i in (0, 1))
        differ = sum(1 for got, expected in pairs if got != expected)
        silent = replayed[0] > 0 and served[0] == 0
        if not silent and (drafter.needs_draft_model or differ == 0):
            continue
        found = (
            f"its server drafted {served[0]} tokens ({served[1]} accepted) on the {len(settings)} calibration "
            f"prompts where the replay of what it served drafted {replayed[0]} ({replayed[1]} accepted); "
            f"{differ} of {len(pairs)} requests differ"
        )
        if started_here:
            advice = (
                f"specroute started that server itself with {' '.join(drafter.server_flags())}, so its replay "
                "of this setting does not match this llama-server build: left out, the other settings analyzed"
            )
        else:
            advice = (
                f"check that the server at {server.client.url} runs {' '.join(drafter.server_flags())}, one slot "
                "(-np 1), and that no other client sends it requests while the analysis runs"
            )
        left_out[drafter.label] = f"{found}; {advice}"
    return left_out


def _leave_out(servers: list[Server], outcomes: Sequence[PromptOutcome], left_out: dict[str, str]) -> None:
    """Stop and remove the servers of the settings ``left_out`` names, and their outcomes from every prompt."""
    labels = [s.drafter.label for s in outcomes[0].settings]
    for index in sorted((labels.index(label) for label in left_out), reverse=True):
        servers.pop(index + 1).stop()
        for outcome in outcomes:
            outcome.settings.pop(index)
