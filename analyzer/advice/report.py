"""The recommendation report of one run as a JSON-ready dict (documented shape): the run's analysis
summary (analyzer/advice/summary.py: per prompt, per task type and for the workload) serialised, with the
raw per-prompt counts, the cost profiles, replay fidelity, validation and the entropy table. CSV and
text are in analyzer.advice.report_text, HTML in the web UI's templates; all are made from this dict."""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.advice.option_rows import OptionRow, by_prompt, prompt_options, run_option_rows
from analyzer.advice.routing_ceiling import routing_ceiling
from analyzer.advice.summary import (
    UNLABELLED,
    AnalysisSummary,
    GroupSummary,
    finite,
    load_results,
    prompt_times,
)
from analyzer.advice.summary_store import run_summary
from analyzer.engine.engines import engine_named, measuring_engine, pricing_entry
from analyzer.errors import SpecrouteError
from analyzer.measuring.entropy import long_run_by_entropy
from analyzer.measuring.interference import disturbed
from analyzer.models.devices import guarantee_sentence
from analyzer.names import ENTROPY_EDGES_NATS
from analyzer.orm import AnalysisRun, CostProfile, PromptResult, ValidationResult
from analyzer.run_params import RunParams


class ReportError(SpecrouteError, LookupError):
    """The run does not exist or has nothing to report yet."""

    status, code = 404, "report_not_found"


def validation_summary(rows: list[dict]) -> dict | None:
    """Real speculative decoding against the replay for a group of validation rows: how many, outputs
    identical to plain greedy and to the analysed output, the mean absolute error of target passes
    against replayed rounds (%), and over the rows timed on a quiet machine (``timed``; the
    ``disturbed`` ones, measured while other processes used the machine, are left out) the mean
    predicted and measured speedup and their mean absolute relative error (%, None without such
    rows), with :func:`_above_noise`'s figures; None for no rows."""
    if not rows:
        return None
    errors = [r["passes_error_pct"] for r in rows if r.get("passes_error_pct") is not None]
    quiet = [r for r in rows if not r.get("disturbed")]
    predicted = np.array([r["predicted_speedup"] for r in quiet], dtype=np.float64)
    measured = np.array([r["measured_speedup"] for r in quiet], dtype=np.float64)
    replay_known = [r["replay_identical"] for r in rows if r.get("replay_identical") is not None]
    return {
        "validated": len(rows),
        "identical": int(sum(bool(r["outputs_identical"]) for r in rows)),
        "replay_identical": int(sum(replay_known)) if replay_known else None,
        "passes_error_pct": finite(float(np.mean(np.abs(errors)))) if errors else None,
        "passes_equal_rounds": int(sum(1 for e in errors if e == 0)),
        "timed": len(quiet),
        "disturbed": len(rows) - len(quiet),
        "predicted_speedup": finite(float(predicted.mean())) if quiet else None,
        "measured_speedup": finite(float(measured.mean())) if quiet else None,
        "speedup_error_pct": finite(float(np.mean(np.abs(predicted - measured) / measured) * 100))
        if quiet
        else None,
        **_above_noise(quiet),
    }


def _above_noise(quiet: list[dict]) -> dict:
    """The machine's run-to-run noise and predicted against measured beside it, over the quiet rows: the
    noise floor (``noise_floor_pct``: the mean |log ratio| of consecutive greedy runs of the same prompt,
    ``noise_pairs`` of them), the hypervisor's mean steal over the validations (``steal_pct``) and the
    verdict (``noise_verdict``: quiet, noisy over a 15% floor or 10% steal, unknown; ``noise_notes`` why);
    the time-weighted aggregate, measured (summed greedy over summed speculative time) and predicted (summed
    greedy over summed greedy / predicted speedup), and its error
    (``aggregate_error_pct``); the share of prompts whose error is within the floor for their number of
    runs plus PER_PROMPT_MARGIN (``within_noise``); the correlation of predicted and measured speedup
    (None under 3 prompts or without spread); and :func:`_aggregate_check`'s bound."""
    from analyzer.measuring.noise import PER_PROMPT_MARGIN, noise_floor

    pairs = [
        (a, b)
        for r in quiet
        for a, b in zip(r.get("greedy_times_s") or [], (r.get("greedy_times_s") or [])[1:])
    ]
    steals = [r["steal_share"] for r in quiet if r.get("steal_share") is not None]
    steal = float(np.mean(steals)) if steals else None
    noise = noise_floor([a for a, _ in pairs], [b for _, b in pairs], steal=steal)
    greedy = np.array([r["greedy_time_s"] for r in quiet], dtype=np.float64)
    speculative = np.array([r["speculative_time_s"] for r in quiet], dtype=np.float64)
    predicted = np.array([r["predicted_speedup"] for r in quiet], dtype=np.float64)
    measured = np.array([r["measured_speedup"] for r in quiet], dtype=np.float64)
    aggregate_measured = greedy.sum() / speculative.sum() if quiet and speculative.sum() > 0 else None
    aggregate_predicted = (
        greedy.sum() / (greedy / predicted).sum() if quiet and (predicted > 0).all() else None
    )
    within = None
    if noise.floor is not None and quiet:
        runs = [max(len(r.get("greedy_times_s") or []), 1) for r in quiet]
        bars = np.array([(noise.floor_for(n) or 0.0) + PER_PROMPT_MARGIN for n in runs])
        within = float(np.mean(np.abs(predicted - measured) / measured <= bars))
    spread = len(quiet) >= 3 and predicted.std() > 0 and measured.std() > 0
    return {
        "noise_floor_pct": finite(noise.floor * 100) if noise.floor is not None else None,
        "noise_pairs": noise.pairs,
        "steal_pct": finite(steal * 100) if steal is not None else None,
        "noise_verdict": noise.verdict,
        "noise_notes": noise.notes,
        "aggregate_predicted": finite(float(aggregate_predicted)) if aggregate_predicted else None,
        "aggregate_measured": finite(float(aggregate_measured)) if aggregate_measured else None,
        "aggregate_error_pct": finite(abs(aggregate_predicted / aggregate_measured - 1) * 100)
        if aggregate_predicted and aggregate_measured
        else None,
        "within_noise": within,
        "correlation": finite(float(np.corrcoef(predicted, measured)[0, 1])) if spread else None,
        **_aggregate_check(aggregate_predicted, aggregate_measured, noise.run_error),
    }


def _aggregate_check(predicted: float | None, measured: float | None, run_error: float | None) -> dict:
    """Whether the time-weighted aggregate missed by more than the bound every fit is held to
    (:func:`analyzer.pricing.context_cost.fit_error_bound`: 5 points beyond one run's noise on this machine):
    ``aggregate_bound_pct`` and ``aggregate_missed`` (None: nothing to check)."""
    from analyzer.pricing.context_cost import fit_error_bound

    bound = fit_error_bound(run_error)
    if not predicted or not measured:
        return {"aggregate_bound_pct": finite(bound * 100), "aggregate_missed": None}
    return {
        "aggregate_bound_pct": finite(bound * 100),
        "aggregate_missed": bool(abs(predicted / measured - 1) > bound),
    }


ADVICE_WITHHELD = "Advice withheld: measured on a busy machine"


def advice_withheld(cost_profiles: dict[str, dict]) -> str | None:
    """Why the run's advice is withheld, when a cost profile it is priced with was judged noisy
    (measured on a busy machine): a sentence leading with :data:`ADVICE_WITHHELD`, naming the batch
    sizes, what was seen and the fix; None when every profile is trustworthy."""
    noisy = {batch: p for batch, p in cost_profiles.items() if p.get("quality") == "noisy"}
    if not noisy:
        return None
    seen = "; ".join(withheld_notes(noisy.values()))  # each k list said once
    return (
        f"{ADVICE_WITHHELD} (the cost profile at batch size {', '.join(noisy)} was judged noisy: {seen}). "
        "The speedups and gammas below may be wrong; measure again on a quiet machine: "
        "specroute analyze ... --reprofile (or specroute demo --reprofile)."
    )


_REMEASURED = re.compile(r"^(?:(?P<label>[^:]+): )?k = (?P<ks>\d+(?:, \d+)*) re-measured: (?P<why>.+)$")
_STILL = re.compile(
    r"^(?:(?P<label>[^:]+): )?k = (?P<ks>\d+(?:, \d+)*) still spread up to (?P<pct>\S+) across repeats "
    r"after re-measuring$"
)


def withheld_notes(noisy_profiles) -> list[str]:
    """What was seen in the noisy cost profiles, one list item a note, each said once over every batch
    size: the note that k = ... were re-measured and the one that the same k still spread afterwards
    become one item, so the k list is given once, and a run of consecutive k reads ``1..17``."""
    notes = list(dict.fromkeys(note for p in noisy_profiles for note in p.get("quality_notes") or []))
    still = {(m["label"], m["ks"]): m for m in map(_STILL.match, notes) if m}
    remeasured = {(m["label"], m["ks"]) for m in map(_REMEASURED.match, notes) if m}
    items = []
    for note in notes:
        if found := _REMEASURED.match(note):
            key = (found["label"], found["ks"])
            after = f", they still spread up to {still[key]['pct']}" if key in still else ""
            items.append(f"{_label(found)}k = {_k_ranges(found['ks'])}: {found['why']}; re-measured{after}")
        elif found := _STILL.match(note):
            if (found["label"], found["ks"]) not in remeasured:  # else said with its re-measuring
                items.append(
                    f"{_label(found)}k = {_k_ranges(found['ks'])} still spread up to {found['pct']} across "
                    "repeats after re-measuring"
                )
        else:
            items.append(note)
    return items


def _label(found: re.Match) -> str:
    return f"{found['label']}: " if found["label"] else ""


def _k_ranges(ks: str) -> str:
    """``1, 2, 3, 5, 7, 8`` as ``1..3, 5, 7, 8``: runs of three or more consecutive k shortened."""
    values = [int(k) for k in ks.split(", ")]
    runs: list[list[int]] = []
    for k in values:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(
        f"{run[0]}..{run[-1]}" if len(run) >= 3 else ", ".join(str(k) for k in run) for run in runs
    )


def routing_numbers(results: list[PromptResult], summary: AnalysisSummary) -> list[dict] | None:
    """How much a finer router could still win (:mod:`analyzer.advice.routing_ceiling`), per task and for
    "all" (last): the best single gamma for every prompt, each task on its own best gamma, and each prompt on
    its own (the per-prompt oracle), each predicted from the exact replays at the run's first batch size,
    time-weighted, with 95% intervals; a gamma is chosen for a task or the workload only where it beats plain
    by the run's margin. None for a sampling run (its curves are expectations, not replays) or without a cost."""
    with_output = [r for r in results if r.output_tokens > 0]
    if summary.sampling or summary.cost is None or not with_output:
        return None
    gammas = range(1, summary.gamma_max + 1)
    plain = [float(t) for t in prompt_times(with_output, summary.cost, False, 1)[0]]
    options = np.column_stack([prompt_times(with_output, summary.cost, False, g)[1] for g in gammas])
    labels = [f"gamma {g}" for g in gammas]

    def decided(group: GroupSummary | None) -> str | None:  # the one rule's decision at batch 1
        if group is None or not group.speculate or group.best_gamma is None:
            return None
        return labels[group.best_gamma - 1] if group.best_gamma <= len(labels) else None

    task_names = [r.task_type or UNLABELLED for r in with_output]
    ceilings = routing_ceiling(
        task_names,
        plain,
        options,
        labels,
        min_speedup=1.0 + summary.margin,
        decided={t: decided(summary.tasks.get(t)) for t in set(task_names)},
        static_decided=decided(summary.workload),
    )
    return [c.as_dict() for c in ceilings]


def run_advice_withheld(run: AnalysisRun) -> str | None:
    """:func:`advice_withheld` for a stored run (publishing and the policies page ask it)."""
    return advice_withheld(_cost_profile_fields(run)["cost_profiles"])


def build_report(session: Session, run_id: int) -> dict:
    """The report of run ``run_id`` (docs/report-json.md has the shape): the run's
    stored :class:`~analyzer.advice.summary.AnalysisSummary` (:func:`~analyzer.advice.summary.run_summary`)
    serialised, with the raw per-prompt counts, the cost profiles, the entropy table and the
    validation rows. The caller commits: a summary computed here (a run from before summaries were
    stored) is stored with the run."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise ReportError(f"no analysis run {run_id}")
    results = load_results(session, run_id)
    validations = list(session.scalars(select(ValidationResult).where(ValidationResult.run_id == run_id)))
    summary = run_summary(session, run, results=results, validations=validations)
    validation_rows = _validation_rows(validations, results, summary)
    profiles = _cost_profile_fields(run)
    own = profiles["cost_profile"]
    return {
        **_run_fields(run, summary, validation_rows),
        **profiles,
        # how the profile that priced the run timed its steps (None: llama.cpp's or an imported engine's own)
        "cost_mode": own["cost_mode"]
        if own
        else engine_named(run.measured_by).report_cost_mode(run.run_params),
        "priced_by": _priced_by(run, own),
        "advice_withheld": advice_withheld(profiles["cost_profiles"]),
        "routing": routing_numbers(results, summary),
        "prompts": _prompt_rows(results, summary, validations, _run_options(session, run, summary)),
        "tasks": {task: s.as_dict() for task, s in summary.tasks.items()},
        "workload": summary.workload.as_dict() if summary.workload else None,
        "entropy_table": _entropy_table(results, run.run_params) if not summary.sampling else None,
        "validation": validation_rows,
        "validation_plan": run.validation_plan,
        "validation_summary": {
            "run": validation_summary(validation_rows),
            "tasks": {task: validation_summary(rows) for task, rows in _rows_by_task(validation_rows)},
        },
    }


def _run_fields(run: AnalysisRun, summary: AnalysisSummary, validation_rows: list[dict]) -> dict:
    """The run's identity, status, parameters (every one, the defaults filled in), engine, device
    and dtype, how it measured (``mode``) and what that guarantees."""
    dtype = run.dtype or "float32"
    measured_in = run.measured_by  # the engine that measured acceptance (run.priced_by priced it)
    measured_by = measuring_engine(measured_in)
    sampling = summary.sampling
    run_fidelity = dict(summary.workload.fidelity or {}) if summary.workload else {}
    run_fidelity.update(validation_summary(validation_rows) or {})
    return {
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "progress": {"done": run.progress_done, "total": run.progress_total},
        "left_out": run.left_out,
        "prompt_set": run.prompt_set.name,
        "target": run.pair.target.spec,
        "draft": run.pair.draft.spec,
        "mode": "sampling (expectations under i.i.d. acceptance)"
        if sampling
        else measured_by.replay_mode(dtype)
        or ("greedy (exact replay)" if dtype == "float32" else f"greedy (replay estimate in {dtype})"),
        "params": _plain_params(run.run_params),
        "engine": run.priced_by,
        "measured_in": measured_in,
        # what measured the acceptance: for a re-priced run, its source run's engine and machine
        "measured_by": {"engine": measured_in, "device": run.device, "dtype": dtype},
        "repriced_from": run.repriced_from_run_id,
        "device": run.device,
        "dtype": dtype,
        "guarantee": guarantee_sentence(
            dtype,
            sampling=sampling,
            fidelity=run_fidelity,
            estimate_opening=measured_by.estimate_opening(dtype),
            repriced_from=run.repriced_from_run_id,
        ),
    }


def _plain_params(params: RunParams) -> dict:
    """The parameters as JSON-ready data (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.to_json().items()}


def _priced_by(run: AnalysisRun, own: dict | None) -> dict:
    """What priced the run: its engine and, once a cost profile is linked, that profile's engine
    version, source, device, dtype, threads and id (never the acceptance's machine)."""
    fields = {"engine": run.priced_by, "engine_version": None, "source": None, "device": None, "dtype": None}
    if own:
        fields.update({key: own[key] for key in ("engine_version", "source", "device", "dtype")})
        fields.update(threads=own["threads"], cost_profile=own["id"], note=own["note"])
    return fields


def _cost_profile_fields(run: AnalysisRun) -> dict:
    """``cost_profile`` (the smallest batch size's) and ``cost_profiles`` (per batch size; runs from
    before batch sizes were profiled have their one profile there)."""
    profile = run.cost_profile
    return {
        "cost_profile": profile_dict(profile) if profile else None,
        "cost_profiles": {
            str(link.batch_size): profile_dict(link.cost_profile) for link in run.batch_profiles
        }
        or ({str(profile.batch_size or 1): profile_dict(profile)} if profile else {}),
    }


def _run_options(session: Session, run: AnalysisRun, summary: AnalysisSummary) -> dict[int, list[OptionRow]]:
    """The run's rows per prompt and option as stored with its summary (analyzer/advice/option_rows.py); a run not
    finished has none stored yet: its rows from the results so far."""
    return prompt_options(session, run_id=run.id) or by_prompt(
        run_option_rows(session, run.id, summary.prompts)
    )


def _prompt_rows(
    results: list[PromptResult],
    summary: AnalysisSummary,
    validations: list[ValidationResult],
    options: dict[int, list[OptionRow]],
) -> list[dict]:
    """One row per prompt: its raw counts at every g, what the summary found for it, and its options in the
    shape every engine's analysis prints them (``options``)."""
    found = {p.prompt_id: p for p in summary.prompts}
    measured = {v.prompt_id: v.measured_speedup for v in validations}
    return [
        {
            "prompt_id": result.prompt_id,
            "external_id": result.prompt.external_id,
            "position": result.prompt.position,
            "task": result.task_type,
            "prompt_tokens": result.prompt_tokens,
            "prompt_truncated": result.prompt_truncated,
            "output_tokens": result.output_tokens,
            "per_gamma": {
                str(g.gamma): {
                    "rounds": g.rounds,
                    "drafted": g.drafted,
                    "accepted": g.accepted,
                    "histogram": g.accepted_hist,
                    "drafted_histogram": g.drafted_hist,
                    "position_accepted": g.position_accepted,
                    "expected_tokens_per_round": finite(g.expected_tokens_per_round),
                }
                for g in result.gamma_counts
            },
            "alpha": found[result.prompt_id].alpha,
            "predicted_speedup": {
                str(g): v for g, v in enumerate(found[result.prompt_id].speedup_curve, start=1)
            },
            "best_gamma": found[result.prompt_id].best_gamma,
            "options": [o.as_json() for o in options.get(result.prompt_id, [])],
            "measured_speedup": finite(measured.get(result.prompt_id)),
            "replay_mismatch_share": finite(result.replay_mismatches / result.output_tokens)
            if result.replay_mismatches is not None and result.output_tokens
            else None,
        }
        for result in results
    ]


def _validation_rows(
    validations: list[ValidationResult], results: list[PromptResult], summary: AnalysisSummary
) -> list[dict]:
    """One row per validated prompt: predicted against measured, outputs identical, and target
    forward passes against the replayed rounds (``passes_error_pct``)."""
    task_of = {r.prompt_id: r.task_type or UNLABELLED for r in results}
    rounds_at = {(p.prompt_id, g): rounds for p in summary.prompts for g, rounds in p.rounds.items()}
    rows = []
    for v in validations:
        replayed = (
            v.replayed_rounds if v.replayed_rounds is not None else rounds_at.get((v.prompt_id, v.gamma))
        )
        rows.append(
            {
                "prompt_id": v.prompt_id,
                "task": task_of.get(v.prompt_id),
                "gamma": v.gamma,
                "predicted_speedup": v.predicted_speedup,
                "measured_speedup": v.measured_speedup,
                "outputs_identical": v.outputs_identical,
                "replay_identical": v.replay_identical,
                "greedy_time_s": v.greedy_time_s,
                "speculative_time_s": v.speculative_time_s,
                "target_forward_passes": v.target_forward_passes,
                "replayed_rounds": replayed,
                "passes_error_pct": 100.0 * (v.target_forward_passes - replayed) / replayed
                if v.target_forward_passes is not None and replayed
                else None,
                "others_cpu": v.others_cpu,
                "disturbed": disturbed(v.others_cpu),
                "greedy_times_s": v.greedy_times_s,
                "speculative_times_s": v.speculative_times_s,
                "steal_share": v.steal_share,
            }
        )
    return rows


def _rows_by_task(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row)
    return sorted(by_task.items())


def _entropy_table(results: list[PromptResult], params: RunParams) -> dict:
    """P(long accepted run | the target's entropy) over every greedy result, in the run's buckets."""
    edges = params.entropy_edges or ENTROPY_EDGES_NATS
    return long_run_by_entropy(
        [r.draft_matches or [] for r in results],
        [r.entropies or [] for r in results],
        edges=[float("inf") if e is None else e for e in edges],
    )


def profile_dict(profile: CostProfile) -> dict:
    """A stored cost profile as JSON-ready data, in seconds: the report's, `specroute costs list`'s and
    the Cost profiles page's one description of it."""
    found: dict = {
        "target_k_s": list(profile.target_forward_s),
        "draft_s": profile.draft_step_s,
        "target_prefill_s": profile.target_prefill_s,
        "draft_prefill_s": profile.draft_prefill_s,
        "round_overhead_s": profile.round_overhead_s,
        "decode_overhead_s": profile.decode_overhead_s,
        "engine": profile.priced_by,
        "priced_by": profile.priced_by,
        "measured_by": profile.measured_by,
        "engine_version": profile.engine_version,
        "source": profile.source or "measured",
        "cost_mode": profile.cost_mode,
        "id": profile.id,
        "device": profile.device,
        "dtype": profile.dtype or "float32",
        "batch_size": profile.batch_size or 1,
        "quality": profile.quality,
        "quality_notes": list(profile.quality_notes or []),
        "spread": list(profile.target_forward_spread) if profile.target_forward_spread is not None else None,
        "threads": profile.threads,
        "context_tokens": profile.context_tokens,
        "long_context_tokens": profile.long_context_tokens,
        "context_slope_s": list(profile.context_slope_s) if profile.context_slope_s is not None else None,
        "draft_context_slope_s": profile.draft_context_slope_s,
        "generate_ratio": dict(profile.generate_ratio) if profile.generate_ratio is not None else None,
        "target": profile.pair.target.spec,
        "draft": profile.pair.draft.spec,
        "created_at": profile.created_at.isoformat(timespec="seconds"),
    }
    # what the entry that priced with it says of its quality (an imported profile: not judged here)
    found["note"] = pricing_entry(found["engine"], found["source"]).profile_note(found)
    return found
