"""A finished analysis run whose draft matches are simulated instead of measured: each prompt of a
task matches the target's token with that task's probability p (Bernoulli), and the matches are
walked with the real acceptance walk for g = 1..gamma_max, on a fixed cost profile. What the
reports, the published policies and the router make of given acceptance rates per task can then be
seen without loading a model (the tests and the router benchmark build their data with it).
"""

from __future__ import annotations

import json
from typing import cast

import numpy as np
from sqlalchemy.orm import Session

from analyzer.measuring.acceptance import walk_model_draft
from analyzer.orm import (
    AnalysisRun,
    CostProfile,
    GammaCount,
    ModelPair,
    ModelSpec,
    Prompt,
    PromptResult,
    PromptSet,
    RunCostProfile,
)
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.run_params import RunParams

# T_t(k) for k = 1..9: a CPU-like curve (verifying is not free) and a cheap draft step
SIMULATED_COST_CURVE = [0.040, 0.060, 0.070, 0.075, 0.080, 0.085, 0.090, 0.095, 0.100]


def create_simulated_run(
    session: Session,
    tasks: dict[str, float],
    *,
    per_task: int | dict[str, int] = 4,
    gamma_max: int = 8,
    n_tokens: int = 64,
    draft_spec: str = "hf:/models/draft",
    draft_step_s: float = 0.004,
    seed: int = 0,
    name: str = "synthetic",
    batch_curves: dict[int, list[float]] | None = None,
    engine: str = "transformers",
) -> AnalysisRun:
    """A done run over a new prompt set ``name`` with ``per_task`` prompts per task (or {task: count});
    ``tasks`` maps each task to p, and each prompt's draft matches are Bernoulli(p) over ``n_tokens``
    tokens (seeded by ``seed``), walked for g = 1..gamma_max. Its batch-1 profile is
    SIMULATED_COST_CURVE; ``batch_curves`` adds a profile per further batch size ({b: T_t(1..), ...}, same
    draft step)."""
    rng = np.random.default_rng(seed)
    counts = per_task if isinstance(per_task, dict) else {task: per_task for task in tasks}
    prompt_set = _simulated_prompt_set(session, name, tasks, counts)
    prompt_count = sum(counts[task] for task in tasks)
    target = ModelSpec(spec="hf:/models/target", kind="hf", display_name="target")
    draft_kind = "ngram" if draft_spec.startswith("ngram") else "hf"
    draft = ModelSpec(spec=draft_spec, kind=draft_kind, display_name="draft")
    pair = ModelPair(target=target, draft=draft)
    profile = _simulated_profile(pair, engine, SIMULATED_COST_CURVE[: gamma_max + 1], draft_step_s)
    run = AnalysisRun(
        prompt_set=prompt_set,
        pair=pair,
        cost_profile=profile,
        status="done",
        measured_by=engine,
        priced_by=engine,
        params=RunParams(max_new_tokens=n_tokens, gamma_max=gamma_max, engine=engine).to_json(),
        progress_done=prompt_count,
        progress_total=prompt_count,
    )
    run.batch_profiles.append(RunCostProfile(cost_profile=profile, batch_size=1))
    for batch_size, curve in sorted((batch_curves or {}).items()):
        batch_profile = _simulated_profile(pair, engine, list(curve[: gamma_max + 1]), draft_step_s)
        batch_profile.batch_size = batch_size
        run.batch_profiles.append(RunCostProfile(batch_size=batch_size, cost_profile=batch_profile))
    session.add(run)
    session.flush()
    for prompt in prompt_set.prompts:
        # every prompt of the set was written with one of the given tasks
        match_rate = tasks[cast(str, prompt.task)]
        matches = (rng.random(n_tokens) < match_rate).astype(int)
        session.add(_simulated_result(run.id, prompt, matches, gamma_max, n_tokens))
    session.flush()
    return run


def _simulated_prompt_set(
    session: Session, name: str, tasks: dict[str, float], counts: dict[str, int]
) -> PromptSet:
    """A new prompt set ``name`` with ``counts[task]`` numbered prompts per task."""
    lines = [
        {"prompt": f"{task} prompt number {i}", "task": task} for task in tasks for i in range(counts[task])
    ]
    prompt_set, _ = import_prompt_file(
        session, name, "".join(json.dumps(line) + "\n" for line in lines).encode(), f"{name}.jsonl"
    )
    return prompt_set


def _simulated_profile(
    pair: ModelPair, engine: str, target_forward_s: list[float], draft_step_s: float
) -> CostProfile:
    """A cost profile of ``pair`` as ``engine`` on the test device would have measured it."""
    return CostProfile(
        pair=pair,
        priced_by=engine,
        measured_by=engine,
        device="test-device",
        threads=2,
        context_tokens=100,
        repeats=5,
        target_forward_s=target_forward_s,
        draft_step_s=draft_step_s,
    )


def _simulated_result(
    run_id: int, prompt: Prompt, matches: np.ndarray, gamma_max: int, n_tokens: int
) -> PromptResult:
    """The result of ``prompt`` with draft ``matches``, walked for g = 1..gamma_max."""
    result = PromptResult(
        run_id=run_id,
        prompt_id=prompt.id,
        task_type=prompt.task,
        task_source="label",
        prompt_tokens=20,
        output_tokens=n_tokens,
        draft_matches=matches.tolist(),
        entropies=[1.0] * n_tokens,
    )
    for g in range(1, gamma_max + 1):
        walked = walk_model_draft(matches, g, n_tokens)
        result.gamma_counts.append(
            GammaCount(
                gamma=g,
                rounds=walked.rounds,
                drafted=walked.drafted,
                accepted=walked.accepted,
                accepted_hist=walked.accepted_hist.tolist(),
                drafted_hist=walked.drafted_hist.tolist(),
                position_accepted=walked.position_accepted.tolist(),
            )
        )
    return result
