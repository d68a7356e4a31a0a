"""What an analysis in llama-server found, in figures: per task each setting's predicted and measured speedup
and the chosen setting; per setting predicted against measured over the validated prompts (per prompt, in
aggregate, their correlation among runs that draft, and the machine's noise floor beside them); and the three
numbers of :mod:`analyzer.advice.routing_ceiling` (best static setting, routing by task, per-prompt oracle).

Aggregates are time-weighted: summed plain time over summed speculative time. Predicted and measured cover
the same prompts, each prompt weighted by its undisturbed passes, so an error compares like with like.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from analyzer.advice.routing_ceiling import Ceiling, routing_ceiling
from analyzer.analysis.server_analysis import MIN_SPEEDUP
from analyzer.analysis.server_outcomes import ServerAnalysis, SettingOutcome, Trial, aggregate_noise
from analyzer.measuring.noise import PER_PROMPT_MARGIN
from analyzer.measuring.server_drafting import ServerDrafter, ServerReplay
from analyzer.pricing.option_curve import FitSpread, OptionCurve, fit_spread, task_option_curves
from analyzer.pricing.server_cost import ServerCost


@dataclass(frozen=True)
class TaskChoice:
    """One task: each setting's predicted speedup over all its prompts, and predicted / measured over those
    that ran on the servers (calibration prompts included; ngram-mod's first pass of each, where its server
    met the prompt as the advice assumes), time-weighted; its curve over the settings with their intervals
    and the one rule's decision (:mod:`analyzer.pricing.option_curve`); the setting the task should use
    (None: off, and always off where the analysis' advice is withheld)."""

    task: str
    prompts: int
    predicted: dict[str, float]
    measured: dict[str, float | None]
    checked: dict[str, float | None]  # predicted over the prompts that were measured
    best: ServerDrafter | None
    curve: OptionCurve


def _totals(
    cost: ServerCost, runs: Iterable[tuple[ServerReplay, Trial]]
) -> tuple[float, float, float, float]:
    """(predicted plain, predicted speculative, measured plain, measured speculative) summed over ``runs``, each a
    trial with the replay that prices it; a trial's measured plain time is its bracketing plain runs' time per
    step times the speculative run's steps."""
    pred_plain = pred_spec = meas_plain = meas_spec = 0.0
    for replay, trial in runs:
        pred_plain += cost.plain_ms(replay)
        pred_spec += cost.speculative_ms(replay)
        meas_plain += trial.plain_step_ms * trial.measured.steps
        meas_spec += trial.measured.completion.predicted_ms
    return pred_plain, pred_spec, meas_plain, meas_spec


def _paired_totals(
    cost: ServerCost, settings: Sequence[SettingOutcome], advice: bool = False
) -> tuple[float, float, float, float]:
    """:func:`_totals` over the undisturbed trials of ``settings`` (``advice``: their
    :attr:`SettingOutcome.advice_trials`), each priced from the replay of the output its server served."""
    return _totals(
        cost,
        ((s.trial_replay(t), t) for s in settings for t in (s.advice_trials if advice else s.quiet_trials)),
    )


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def option_times(analysis: ServerAnalysis) -> tuple[list[str], np.ndarray, np.ndarray, FitSpread | None]:
    """(each prompt's task, its predicted plain time (n,), its predicted time under each setting (n, m), the
    same times under the costs' leave-one-out fits), priced by the setting's family cost from the replay of
    plain greedy output."""
    tasks = [o.prompt.task for o in analysis.prompts]
    plain_cost = analysis.cost_of(analysis.drafters[0])
    plain = np.asarray([plain_cost.plain_ms(o.settings[0].replay) for o in analysis.prompts])
    options = np.asarray(
        [
            [
                analysis.cost_of(d).speculative_ms(o.settings[i].replay)
                for i, d in enumerate(analysis.drafters)
            ]
            for o in analysis.prompts
        ]
    )
    spread = fit_spread(
        [plain_cost.refit_plain_ms(o.settings[0].replay) for o in analysis.prompts],
        [
            [
                analysis.cost_of(d).refit_speculative_ms(o.settings[i].replay)
                for i, d in enumerate(analysis.drafters)
            ]
            for o in analysis.prompts
        ],
    )
    return tasks, plain, options, spread


def task_choices(analysis: ServerAnalysis) -> list[TaskChoice]:
    """Per task, its curve over the settings and the setting the one rule chooses
    (:func:`analyzer.pricing.option_curve.task_option_curves`: the best setting where its speedup clears
    1 + margin and its interval's lower end clears 1.0; a task of fewer than MIN_TASK_PROMPTS prompts takes
    the workload's decision), off everywhere when the analysis' advice is withheld."""
    tasks, plain, options, spread = option_times(analysis)
    curves, _ = task_option_curves(tasks, plain, options, [d.label for d in analysis.drafters], spread=spread)
    choices = []
    for task, curve in curves.items():
        group = [o for o in analysis.prompts if o.prompt.task == task]
        measured: dict[str, float | None] = {}
        checked: dict[str, float | None] = {}
        for index, drafter in enumerate(analysis.drafters):
            settings = [o.settings[index] for o in group]
            pred_plain, pred_spec, meas_plain, meas_spec = _paired_totals(
                analysis.cost_of(drafter), settings, advice=True
            )
            measured[drafter.label] = _ratio(meas_plain, meas_spec)
            checked[drafter.label] = _ratio(pred_plain, pred_spec)
        chosen = curve.chosen if analysis.withheld is None else None
        best = next((d for d in analysis.drafters if d.label == chosen), None)
        predicted = dict(zip(curve.labels, curve.speedups))
        choices.append(TaskChoice(task, len(group), predicted, measured, checked, best, curve))
    return choices


@dataclass(frozen=True)
class ValidationFigures:
    """Predicted against measured over the validated prompts of one setting: ``runs`` prompts validated in
    ``trials`` passes in all, ``disturbed`` of them left out; the share whose output equals plain greedy
    (``output_equal``) and the share whose draft counts equal the replay of the output the server served
    (``counts_equal``, over the prompts replayed as served); the mean absolute relative error of the
    per-prompt speedup predicted from that replay (``mare``: the cost model, pricing the work each server
    did) and of the advice's own prediction, from plain greedy output (``advice_mare``: the cost model and
    any drift of the speculative output from plain greedy); ``aggregate_predicted``
    and ``aggregate_measured``, time-weighted over the same passes, and their relative error
    (``aggregate_error``) with the 95% half-width run noise leaves on the measured one
    (``aggregate_noise``); ``within_noise``, the share of prompts whose error is within their noise floor
    (the machine's floor for that many passes) plus PER_PROMPT_MARGIN; ``correlation``, Pearson's r of
    predicted and measured speedup over the ``drafting`` prompts the replay drafted on; and ``controls``,
    prompts where neither replay nor server drafted (the same work as plain): their mean |measured - 1|.

    The aggregate above prices the work each server served; the advice a user follows is priced on plain
    greedy output's replay and compared with the passes that measured what it predicts
    (:attr:`SettingOutcome.advice_trials`: the first pass for a drafter whose state carries across requests,
    every pass otherwise): ``advice_predicted``, ``advice_measured`` and their relative error
    ``advice_error``. ``per_pass`` holds the work served's aggregate pass by pass (``pass``, ``prompts``,
    ``predicted``, ``measured``, ``error``)."""

    setting: str
    runs: int
    trials: int
    disturbed: int
    output_equal: float | None
    counts_equal: float | None
    mare: float | None
    advice_mare: float | None
    aggregate_predicted: float | None
    aggregate_measured: float | None
    aggregate_error: float | None
    aggregate_noise: float | None
    within_noise: float | None
    correlation: float | None
    drafting: int
    controls: int
    control_error: float | None
    advice_predicted: float | None = None
    advice_measured: float | None = None
    advice_error: float | None = None
    per_pass: tuple[dict[str, object], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _advice_totals(cost: ServerCost, settings: Sequence[SettingOutcome]) -> tuple[float | None, float | None]:
    """(predicted, measured) aggregate speedup of the advice: each setting outcome's prediction from plain
    greedy output's replay against its :attr:`SettingOutcome.advice_trials`, time-weighted."""
    pred_plain, pred_spec, meas_plain, meas_spec = _totals(
        cost, ((s.replay, t) for s in settings for t in s.advice_trials)
    )
    return _ratio(pred_plain, pred_spec), _ratio(meas_plain, meas_spec)


def _per_pass(cost: ServerCost, settings: Sequence[SettingOutcome]) -> tuple[dict[str, object], ...]:
    """The work served's aggregate pass by pass: per pass number its undisturbed prompts, predicted and
    measured speedup and their relative error."""
    rows: list[dict[str, object]] = []
    for number in range(max((len(s.trials) for s in settings), default=0)):
        runs = [
            (s.trial_replay(s.trials[number]), s.trials[number])
            for s in settings
            if number < len(s.trials) and not s.trials[number].disturbed
        ]
        pred_plain, pred_spec, meas_plain, meas_spec = _totals(cost, runs)
        predicted, measured = _ratio(pred_plain, pred_spec), _ratio(meas_plain, meas_spec)
        error = abs(predicted / measured - 1.0) if predicted and measured else None
        rows.append(
            {
                "pass": number + 1,
                "prompts": len(runs),
                "predicted": predicted,
                "measured": measured,
                "error": error,
            }
        )
    return tuple(rows)


def _pairs(cost: ServerCost, settings: Sequence[SettingOutcome]) -> list[tuple[float, float, int]]:
    """(validated prediction, measured speedup, undisturbed passes) of each setting outcome that has both."""
    pairs = []
    for setting in settings:
        predicted, measured = setting.validated_prediction(cost), setting.measured_speedup
        if predicted is not None and measured is not None:
            pairs.append((predicted, measured, len(setting.quiet_trials)))
    return pairs


def _mare(cost: ServerCost, settings: Sequence[SettingOutcome]) -> float | None:
    errors = [abs(p - m) / m for p, m, _ in _pairs(cost, settings)]
    return float(np.mean(errors)) if errors else None


def _advice_mare(settings: Sequence[SettingOutcome]) -> float | None:
    """The advice's per-prompt error: its prediction (from plain greedy output) against the speedup measured
    where the server met the prompt as the advice assumes (:attr:`SettingOutcome.advice_trials`)."""
    errors = [abs(s.predicted_speedup - m) / m for s in settings if (m := s.advised_speedup) is not None]
    return float(np.mean(errors)) if errors else None


def _correlation(cost: ServerCost, settings: Sequence[SettingOutcome]) -> float | None:
    pairs = np.asarray([(p, m) for p, m, _ in _pairs(cost, settings)])
    if len(pairs) < 3 or np.std(pairs[:, 0]) == 0 or np.std(pairs[:, 1]) == 0:
        return None
    return float(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1])


def validation_figures(analysis: ServerAnalysis) -> list[ValidationFigures]:
    """:class:`ValidationFigures` per setting over the validated prompts."""
    noise = analysis.noise
    figures = []
    for index, drafter in enumerate(analysis.drafters):
        cost = analysis.cost_of(drafter)
        runs = [o.settings[index] for o in analysis.prompts if not o.settings[index].calibration]
        runs = [s for s in runs if s.trials]
        quiet = [s for s in runs if s.quiet_trials]
        served = [s for s in runs if s.counts_equal is not None]
        pred_plain, pred_spec, meas_plain, meas_spec = _paired_totals(cost, quiet)
        predicted, measured = _ratio(pred_plain, pred_spec), _ratio(meas_plain, meas_spec)
        within = None
        if noise is not None and noise.floor is not None and quiet:
            hits = [
                abs(p - m) / m <= (noise.floor_for(n) or 0.0) + PER_PROMPT_MARGIN
                for p, m, n in _pairs(cost, quiet)
            ]
            within = float(np.mean(hits)) if hits else None
        spread = None
        if noise is not None and noise.run_error is not None:
            spread = aggregate_noise(cost, quiet, noise.run_error)
        controls = [
            s
            for s in quiet
            if all(s.trial_replay(t).draft_n == 0 and _served_drafts(t) == 0 for t in s.quiet_trials)
        ]
        control_errors = [abs(m - 1.0) for s in controls if (m := s.measured_speedup) is not None]
        drafting = [s for s in quiet if any(s.trial_replay(t).draft_n > 0 for t in s.quiet_trials)]
        advice_predicted, advice_measured = _advice_totals(cost, quiet)
        figures.append(
            ValidationFigures(
                drafter.label,
                len(runs),
                sum(len(s.trials) for s in runs),
                sum(len(s.trials) - len(s.quiet_trials) for s in runs),
                sum(1 for s in runs if s.output_equal) / len(runs) if runs else None,
                sum(1 for s in served if s.counts_equal) / len(served) if served else None,
                _mare(cost, quiet),
                _advice_mare(quiet),
                predicted,
                measured,
                abs(predicted / measured - 1.0) if predicted and measured else None,
                spread,
                within,
                _correlation(cost, drafting),
                len(drafting),
                len(controls),
                float(np.mean(control_errors)) if control_errors else None,
                advice_predicted,
                advice_measured,
                abs(advice_predicted / advice_measured - 1.0)
                if advice_predicted and advice_measured
                else None,
                _per_pass(cost, runs),
            )
        )
    return figures


def _served_drafts(trial: Trial) -> int:
    return int(trial.measured.completion.timings.get("draft_n", 0))


def ceilings(analysis: ServerAnalysis) -> list[Ceiling]:
    """The best static setting, routing by task and the per-prompt oracle, per task and overall (last), from
    every prompt's replays priced by the fitted costs."""
    if not analysis.prompts or not analysis.drafters:
        return []
    tasks, plain, options, spread = option_times(analysis)
    labels = [d.label for d in analysis.drafters]
    curves, workload = task_option_curves(tasks, plain, options, labels, spread=spread)
    withheld = analysis.withheld is not None  # advice withheld: every decision is off
    return routing_ceiling(
        tasks,
        plain,
        options,
        labels,
        min_speedup=MIN_SPEEDUP,
        decided={task: None if withheld else curve.chosen for task, curve in curves.items()},
        static_decided=None if withheld else workload.chosen,
    )
