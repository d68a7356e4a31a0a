"""Calibration of an analysis in llama-server: the prompts chosen to span the workload
(:func:`calibration_choice`), the machine's noise from each pass's pair of plain runs (:func:`measured_noise`),
the step costs per drafter family fitted from the servers' ``timings`` (:func:`fit_costs`) and checked on prompts
they were not fitted on, measured again once where a fit misses its bound (:func:`calibrate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.analysis.server_outcomes import Progress, PromptOutcome, ServerAnalysisError
from analyzer.analysis.server_passes import PassLog, ServerHistory
from analyzer.engine.llama_server_process import Server
from analyzer.measuring.calibration_choice import spanning_choice
from analyzer.measuring.noise import NoiseFloor, noise_floor
from analyzer.measuring.request_work import plain_work
from analyzer.pricing.context_cost import fit_error_bound, fit_problem
from analyzer.pricing.server_cost import Sample, ServerCost, fit_server_cost

FALLBACK_RUN_ERROR = 0.05  # one run's relative noise assumed where the calibration pairs could not tell


def calibration_choice(outcomes: Sequence[PromptOutcome], count: int) -> list[PromptOutcome]:
    """``count`` prompts that span the workload: by the log of their mean context (prompt plus half the
    output), the share of their output the settings draft and the share they accept (means over the
    settings' replays); in the workload's order."""
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
    return [outcomes[i] for i in spanning_choice(np.asarray(features), count)]


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
class Calibration:
    """What calibration found: the step costs per drafter family, the machine's noise over its passes, the
    bound the fits were checked against, how many passes it made, and why advice is withheld (None: it is
    not)."""

    costs: dict[str, ServerCost]
    noise: NoiseFloor
    bound: float
    passes: int
    withheld: str | None


def calibrate(
    servers: Sequence[Server],
    outcomes: Sequence[PromptOutcome],
    chosen: Sequence[PromptOutcome],
    history: ServerHistory,
    say: Progress,
    pass_log: PassLog | None = None,
) -> Calibration:
    """Run the chosen prompts on every server (checking first that each server runs its setting,
    :func:`_check_settings`), fit each drafter family's costs and check them on prompts they were not fitted
    on (:func:`analyzer.pricing.context_cost.fit_error_bound`, from the noise the pass measured); a family
    that misses its bound is measured once more (every chosen prompt again) and refitted on both passes; one
    that still misses it withholds the advice. ``pass_log``: the earlier attempt's passes, kept."""
    pass_log = pass_log or PassLog(history)
    for number, outcome in enumerate(chosen, 1):
        kept = pass_log.run(servers, outcome, history, "calibration", 1)
        say(f"calibrated {number}/{len(chosen)} ({outcome.prompt.key}){' (kept)' if kept else ''}")
    _check_settings(servers, chosen)
    noise = measured_noise(chosen)
    bound = fit_error_bound(noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR)
    costs = fit_costs(chosen)
    failing = [family for family, cost in costs.items() if cost.checked_error > bound]
    passes = 1
    if failing:
        passes = 2
        for number, outcome in enumerate(chosen, 1):
            kept = pass_log.run(servers, outcome, history, "calibration", 2)
            say(
                f"re-measured {number}/{len(chosen)} ({outcome.prompt.key}): the {', '.join(failing)} fit missed"
                + (" (kept)" if kept else "")
            )
        noise = measured_noise(chosen)
        bound = fit_error_bound(noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR)
        costs = fit_costs(chosen)
    problems = [
        f"{problem}, measured {passes} times"
        for family, cost in costs.items()
        if (problem := fit_problem(cost.checked_error, bound, family, heldout=cost.heldout_mare is not None))
    ]
    return Calibration(costs, noise, bound, passes, "; ".join(problems) or None)


def fit_costs(chosen: Sequence[PromptOutcome]) -> dict[str, ServerCost]:
    """The step costs per drafter family (what calibration fits, and what a benchmark re-prices a measured
    analysis with), all from the chosen prompts' calibration passes: the plain step and its context term
    from their plain runs, the rounds from that family's settings' runs (undisturbed ones, each priced from the
    replay of the output it served; a draft model's runs whose output left plain greedy only where there is
    nothing else). The generation pass is left out: its plain runs follow each
    other on one server, with its weights warm in the CPU's caches, and ran 7.5% faster per step than the
    same server's runs interleaved with the other servers' (52 prompts, a 2-core Xeon), which is how every
    speculating run is timed."""
    plain: list[Sample] = []
    for outcome in chosen:
        runs = [run for pair in outcome.plain_pairs for run in pair]
        plain += [
            (outcome.prompt.key, plain_work(len(outcome.prompt_ids), int(r.completion.timings["predicted_n"])),
             r.completion.predicted_ms)
            for r in runs
            if not r.disturbed
        ]  # fmt: skip
    costs = {}
    families = sorted({s.drafter.family for o in chosen for s in o.settings})
    for family in families:
        settings = [(o.prompt.key, s) for o in chosen for s in o.settings if s.drafter.family == family]
        trials = [(k, s, t) for k, s in settings for t in s.quiet_trials] or [
            (k, s, t) for k, s in settings for t in s.trials
        ]
        served = [(k, s, t) for k, s, t in trials if s.replayed_as_served(t)]
        samples: list[Sample] = [
            (key, s.trial_replay(t).work(), t.measured.completion.predicted_ms)
            for key, s, t in (served or trials)
        ]
        try:
            costs[family] = fit_server_cost(plain, samples, fit_step=family == "draft model")
        except ValueError:
            labels = ", ".join(sorted({s.drafter.label for _, s in settings}))
            raise ServerAnalysisError(
                f"none of the {len(chosen)} calibration prompts drafted anything with {labels}, so no round could "
                "be timed: raise --calibration, or add prompts that repeat their input (extraction, code edits)"
            ) from None
    return costs


def _check_settings(servers: Sequence[Server], outcomes: Sequence[PromptOutcome]) -> None:
    """ServerAnalysisError where a server's own draft counts over the calibration prompts show it does not
    run the setting it stands for: a plain server that drafted, or a setting's server that drafted nothing
    where the replay drafted (a user's server started without the setting's flags, say)."""
    if any(o.plain.completion.timings.get("draft_n", 0) for o in outcomes):
        raise ServerAnalysisError(
            f"the plain server at {servers[0].client.url} drafted: start it without --spec-type"
        )
    for index, server in enumerate(servers[1:]):
        settings = [o.settings[index] for o in outcomes if o.settings[index].measured is not None]
        replayed = sum(s.replay.draft_n for s in settings)
        served = sum(s.measured.completion.timings.get("draft_n", 0) for s in settings if s.measured)
        if replayed > 0 and served == 0:
            drafter = settings[0].drafter
            raise ServerAnalysisError(
                f"the server at {server.client.url} for {drafter.label} drafted nothing on the calibration "
                f"prompts, where the replay drafted {replayed} tokens: start it with "
                f"{' '.join(drafter.server_flags())}"
            )
