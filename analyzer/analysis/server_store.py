"""Analyses in llama-server, stored and read back: a prompt set's prompts as the analysis takes them,
one :class:`analyzer.orm.ServerAnalysisRecord` per finished analysis (written in the caller's
transaction, all or nothing), and the plain dict the CLI, the report page and the pool plan read.

A stored analysis is what its pools are planned from: per task the chosen setting (or off), and per
setting the llama-server command-line flags that start a pool running it."""

from __future__ import annotations

import os
import shlex
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.advice.option_rows import prompt_options, replace_options, server_option_rows
from analyzer.analysis.server_calibration import PriorFit
from analyzer.analysis.server_figures import ceilings, task_choices, validation_figures
from analyzer.analysis.server_outcomes import (
    ServerAnalysis,
    ServerPrompt,
    SettingOutcome,
    TimedCompletion,
)
from analyzer.engine.llama_server_process import server_command
from analyzer.errors import SpecrouteError
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.devices import cpu_model_name
from analyzer.orm import PromptSet, ServerAnalysisRecord
from analyzer.pricing.server_cost import ServerCost

UNLABELLED = "unlabelled"


class ServerAnalysisNotFound(SpecrouteError, LookupError):
    """No stored llama-server analysis has the id asked for."""

    status, code = 404, "server_analysis_not_found"


def server_prompts(prompt_set: PromptSet) -> list[ServerPrompt]:
    """The set's prompts in order, as chat messages (a text prompt is one user message); an unlabelled
    prompt's task is "unlabelled"."""
    prompts = []
    for prompt in prompt_set.prompts:
        messages = prompt.messages or [{"role": "user", "content": prompt.text or ""}]
        prompts.append(ServerPrompt(str(prompt.id), prompt.task or UNLABELLED, list(messages)))
    return prompts


def first_per_task(prompts: list[ServerPrompt], per_task: int) -> list[ServerPrompt]:
    """The first ``per_task`` prompts of each task, in the given order."""
    seen: dict[str, int] = {}
    chosen = []
    for prompt in prompts:
        seen[prompt.task] = seen.get(prompt.task, 0) + 1
        if seen[prompt.task] <= per_task:
            chosen.append(prompt)
    return chosen


def _run_dict(run: TimedCompletion | None) -> dict[str, Any] | None:
    if run is None:
        return None
    timings = run.completion.timings
    return {
        "ms": run.completion.predicted_ms,
        "tokens": len(run.completion.tokens),
        "draft_n": timings.get("draft_n", 0),
        "draft_n_accepted": timings.get("draft_n_accepted", 0),
        "others_cpu": run.others_cpu,
        "steal": run.steal,
        "disturbed": run.disturbed,
    }


def _setting_dict(setting: SettingOutcome, cost: ServerCost) -> dict[str, Any]:
    replay = setting.replay
    return {
        "setting": setting.drafter.label,
        "predicted_speedup": setting.predicted_speedup,
        "predicted_ms": cost.speculative_ms(replay),
        "refit_ms": cost.refit_speculative_ms(replay),
        "validated_prediction": setting.validated_prediction(cost),
        "rounds": len(replay.rounds),
        "plain_steps": replay.plain_steps,
        "draft_n": replay.draft_n,
        "draft_n_accepted": replay.draft_n_accepted,
        "calibration": setting.calibration,
        "measured": _run_dict(setting.measured),
        "paired_plain": _run_dict(setting.plain),
        "measured_speedup": setting.measured_speedup,
        # what the advice's prediction is compared with: the first pass for a drafter whose state carries
        # across requests (ngram-mod), every undisturbed pass otherwise
        "advised_speedup": setting.advised_speedup,
        "passes": [
            {
                "plain_step_ms": t.plain_step_ms,
                "ms": t.measured.completion.predicted_ms,
                "speedup": t.speedup,
                "disturbed": t.disturbed,
            }
            for t in setting.trials
        ],  # fmt: skip
        "output_equal": setting.output_equal if setting.measured else None,
        "counts_equal": setting.counts_equal,
    }


def store_server_analysis(
    session: Session,
    prompt_set: PromptSet,
    analysis: ServerAnalysis,
    *,
    model: str,
    server_build: str,
    draft_model: str | None = None,
) -> ServerAnalysisRecord:
    """Add the finished analysis to ``session`` (the caller commits) and return its row."""
    prompts = _prompt_dicts(analysis)
    record = ServerAnalysisRecord(
        prompt_set_id=prompt_set.id,
        model=model,
        draft_model=draft_model,
        server_build=server_build,
        machine=_machine(),
        threads=analysis.threads,
        n_ctx=analysis.n_ctx,
        n_predict=analysis.n_predict,
        drafters=[d.label for d in analysis.drafters],
        cost={
            family: {**cost.as_dict(), "bound": analysis.fit_bound, "fitted_in": analysis.fit_from}
            for family, cost in analysis.costs.items()
        },
        prompts=prompts,
        tasks=_task_dicts(analysis),
        validation=[f.as_dict() for f in validation_figures(analysis)],
        calibration_prompts=analysis.calibration_prompts,
        seconds=analysis.seconds,
        validation_seconds=analysis.validation_seconds,
        plain_generation_seconds=analysis.plain_generation_seconds,
        noise=analysis.noise.as_dict() if analysis.noise is not None else None,
        advice_withheld=analysis.withheld,
        validation_repeats=analysis.validation_repeats,
        routing=[c.as_dict() for c in ceilings(analysis)],
        left_out=(
            {"settings": analysis.left_out_settings, "prompts": analysis.left_out_prompts}
            if analysis.left_out_settings or analysis.left_out_prompts
            else None
        ),
        validation_plan=analysis.validation_plan,
        calibration_why=analysis.calibration_why,
    )
    session.add(record)
    session.flush()
    replace_options(session, server_option_rows(prompts), server_analysis_id=record.id)
    return record


def _prompt_dicts(analysis: ServerAnalysis) -> list[dict]:
    """Each prompt of ``analysis`` as stored: its task, tokens, plain run and pairs, and each setting's replay,
    prediction and measurement."""
    return [
        {
            "prompt_id": int(o.prompt.key),
            "task": o.prompt.task,
            "prompt_tokens": len(o.prompt_ids),
            "output_tokens": len(o.plain.completion.tokens),
            "stopped_at_eos": o.plain.completion.stopped_at_eos,
            "calibration": o.calibration,
            "plain": _run_dict(o.plain),
            "predicted_plain_ms": analysis.cost_of(analysis.drafters[0]).plain_ms(o.settings[0].replay)
            if o.settings
            else None,
            "refit_plain_ms": analysis.cost_of(analysis.drafters[0]).refit_plain_ms(o.settings[0].replay)
            if o.settings
            else [],
            "plain_pairs": [[a.step_ms, b.step_ms] for a, b in o.plain_pairs],
            "settings": [_setting_dict(s, analysis.cost_of(s.drafter)) for s in o.settings],
        }
        for o in analysis.prompts
    ]


def _task_dicts(analysis: ServerAnalysis) -> list[dict]:
    """Each task's choice as stored: its prompts, predicted and measured speedup per setting, and the curve."""
    return [
        {
            "task": c.task,
            "prompts": c.prompts,
            "predicted": c.predicted,
            "measured": c.measured,
            "checked": c.checked,
            "chosen": c.best.label if c.best else None,
            "curve": c.curve.as_dict(),
        }
        for c in task_choices(analysis)
    ]


def prior_fit(
    session: Session, *, model: str, server_build: str, threads: int, n_ctx: int, draft_model: str | None
) -> PriorFit | None:
    """The newest fit an analysis stored on this machine for this model, server build, threads, context and
    draft model whose advice was not withheld, with the analysis that fitted it (None: there is none)."""
    machine = _machine()
    found = session.scalars(
        select(ServerAnalysisRecord)
        .where(
            ServerAnalysisRecord.machine == machine,
            ServerAnalysisRecord.model == model,
            ServerAnalysisRecord.server_build == server_build,
            ServerAnalysisRecord.threads == threads,
            ServerAnalysisRecord.n_ctx == n_ctx,
            ServerAnalysisRecord.draft_model.is_(None)
            if draft_model is None
            else ServerAnalysisRecord.draft_model == draft_model,
            ServerAnalysisRecord.advice_withheld.is_(None),
        )
        .order_by(ServerAnalysisRecord.id.desc())
        .limit(1)
    ).first()
    if found is None or not found.cost:
        return None
    costs = {family: ServerCost.from_stored(stored) for family, stored in found.cost.items()}
    origin = next(iter(found.cost.values())).get("fitted_in") or found.id
    return PriorFit(costs, int(origin))


def _machine() -> str:
    """This machine as an analysis stores it: its CPU model and cores."""
    return f"{cpu_model_name()}, {os.cpu_count()} cores"[:300]


def get_server_analysis(session: Session, analysis_id: int) -> ServerAnalysisRecord:
    """The stored analysis ``analysis_id``, or :class:`ServerAnalysisNotFound`."""
    record = session.get(ServerAnalysisRecord, analysis_id)
    if record is None:
        raise ServerAnalysisNotFound(f"no llama-server analysis #{analysis_id}")
    return record


def list_server_analyses(session: Session) -> list[ServerAnalysisRecord]:
    """Every stored analysis, newest first."""
    return list(session.scalars(select(ServerAnalysisRecord).order_by(ServerAnalysisRecord.id.desc())))


def pool_plan(record: ServerAnalysisRecord) -> dict[str, Any]:
    """The pools the analysis' choices need: per distinct chosen setting (and "off" where a task chose
    none) a pool name and its llama-server flags, and per task the pool it goes to."""
    pools: dict[str, dict[str, Any]] = {}
    routes: dict[str, str] = {}
    for task in record.tasks:
        label = task["chosen"]
        name = (
            "llama-server-off"
            if label is None
            else "llama-server-" + label.replace(" ", "-").replace("/", "-")
        )
        drafter = parse_drafter(label) if label is not None else None
        flags = [] if drafter is None else drafter.server_flags()
        if drafter is not None and drafter.needs_draft_model:
            flags = ["-md", str(record.draft_model), *flags]
        pools.setdefault(name, {"setting": label or "off", "flags": flags, "tasks": []})["tasks"].append(
            task["task"]
        )
        routes[task["task"]] = name
    return {"pools": pools, "routes": routes}


def pool_plan_text(record: ServerAnalysisRecord, first_port: int) -> str:
    """The pools' command lines and the task -> pool table."""
    plan = pool_plan(record)
    lines = [
        f"# pools for llama-server analysis #{record.id} ({record.threads} threads, context {record.n_ctx})"
    ]
    for offset, (name, pool) in enumerate(plan["pools"].items()):
        command = server_command(
            "llama-server", record.model, port=first_port + offset, threads=record.threads, n_ctx=record.n_ctx,
            flags=pool["flags"],
        )  # fmt: skip
        lines += [f"# {name}: {pool['setting']} for {', '.join(pool['tasks'])}", shlex.join(command)]
    lines.append("# task -> pool")
    lines += [f"{task}: {name}" for task, name in plan["routes"].items()]
    return "\n".join(lines)


def server_analysis_json(session: Session, record: ServerAnalysisRecord) -> dict[str, Any]:
    """A stored analysis as ``specroute analyze --engine llama-server --json`` prints it: per prompt its id,
    task and, per option (setting), the label, the replay's rounds, drafted and accepted counts and the
    predicted and measured speedups, read from the table every engine shares (analyzer/advice/option_rows.py); per
    task its curve over the options with intervals and the one rule's decision."""
    options = prompt_options(session, server_analysis_id=record.id)
    return {
        "kind": "llama-server",
        "analysis_id": record.id,
        "prompt_set_id": record.prompt_set_id,
        "model": record.model,
        "draft_model": record.draft_model,
        "machine": record.machine,
        "n_predict": record.n_predict,
        "advice_withheld": record.advice_withheld,
        "noise": record.noise,
        "left_out": record.left_out or {"settings": {}, "prompts": []},
        "validation_plan": record.validation_plan,
        "calibration": record.calibration_why,
        "prompts": [
            {
                "prompt_id": row["prompt_id"],
                "task": row["task"],
                "prompt_tokens": row["prompt_tokens"],
                "output_tokens": row["output_tokens"],
                "calibration": row["calibration"],
                "options": [o.as_json() for o in options.get(int(row["prompt_id"]), [])],
            }
            for row in record.prompts
        ],
        "tasks": [
            {
                "task": t["task"],
                "prompts": t["prompts"],
                **(
                    t.get("curve")
                    or {"options": [{"label": d, "speedup": v} for d, v in t["predicted"].items()]}
                ),
                "chosen": t["chosen"],  # the stored decision (withheld advice: off)
                "measured": t["measured"],
            }
            for t in record.tasks
        ],
        "validation": record.validation,
        "routing": record.routing,
    }
