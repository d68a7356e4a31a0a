"""The cost profiles a run predicts speedups with: for each batch size of the run, the newest stored
profile of its pair on its device in its dtype that covers k <= gamma_max + 1 and was not judged
noisy, or one measured now on a prompt of median length (with the generation machinery's overhead),
linked to the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from analyzer.orm import AnalysisRun, CostProfile, RunCostProfile
from analyzer.run_models import RunModels
from analyzer.run_records import ProgressCallback, RunParams

if TYPE_CHECKING:
    from analyzer.llamacpp_run import LlamaCppRunModels


def profile_run_costs(session_factory: sessionmaker, run_id: int, models: RunModels | LlamaCppRunModels,
                      params: RunParams, prompt_ids: list[list[int]], progress: ProgressCallback | None) -> int:
    """For each batch size of the run, reuse the newest cost profile of this pair on this device in
    this dtype at that batch size covering k <= gamma_max + 1 (unless ``reprofile``; never one judged
    noisy: it is passed over, and progress says so), or measure one on the prompt of median length
    among ``prompt_ids`` (the run's prompts, already tokenized); link them to the run and return the
    smallest batch size's id. The machinery overhead is measured once (at batch 1) for the profiles
    measured now. Profiles are the run's engine's: measured by it (``models``), reused only from it."""
    device, dtype = models.device_text(), models.dtype_text()
    if models.engine == "transformers":
        placement = models.target.placement
        where, machinery, sizes = f"{placement.device} in {dtype}", "generate()", params.batch_sizes(placement)
    else:
        where, machinery, sizes = f"{device}, weights {dtype}", "llama.cpp's Llama.generate()", (1,)
    k_max = params.gamma_max + 1
    chosen: dict[int, int] = {}
    passed_over: list[str] = []
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        for link in run.batch_profiles:
            chosen[link.batch_size] = link.cost_profile_id  # a resumed run keeps its profiles
        if not params.reprofile:
            for batch_size in sizes:
                if batch_size in chosen:
                    continue
                for profile in session.scalars(
                    select(CostProfile)
                    .where(CostProfile.pair_id == run.pair_id, CostProfile.device == device,
                           CostProfile.dtype == dtype, CostProfile.batch_size == batch_size,
                           CostProfile.engine == models.engine)
                    .order_by(CostProfile.id.desc())
                ):
                    if len(profile.target_forward_s) < k_max:
                        continue
                    if profile.quality == "noisy":
                        passed_over.append(f"stored cost profile {profile.id} (batch {batch_size}) was judged noisy "
                                           f"({'; '.join(profile.quality_notes or [])}); not reused")
                        continue
                    chosen[batch_size] = profile.id
                    break
    missing = [b for b in sizes if b not in chosen]
    for note in passed_over:
        if progress:
            progress(0, 0, note)
    if missing:
        encoded = sorted(prompt_ids, key=len)
        context = list(encoded[len(encoded) // 2] if encoded else [models.pad_id] * 32)
        if progress:
            progress(0, 0, f"profiling the machinery overhead of {machinery} on {where}")
        overhead = models.measure_overhead(context, params)
        for number, batch_size in enumerate(missing, start=1):
            phase = (f"profiling the cost of drafting and verifying at batch size {batch_size} "
                     f"({number} of {len(missing)}) on {where}")
            passes = {"done": 0, "planned": 6 * (2 if models.draft is not None else 1)}  # 1 warm-up + 5 repeats

            def tick() -> None:
                passes["done"] += 1
                passes["planned"] = max(passes["planned"], passes["done"])  # re-measurements add passes
                if progress:
                    progress(passes["done"], passes["planned"], phase)

            if progress:
                progress(0, passes["planned"], phase)
            measured = models.measure_costs(context, k_max, batch_size, tick)
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                profile = CostProfile(
                    pair_id=run.pair_id,
                    device=measured.device,
                    dtype=dtype,
                    engine=models.engine,
                    batch_size=batch_size,
                    threads=measured.threads,
                    context_tokens=measured.context_tokens,
                    repeats=measured.repeats,
                    target_forward_s=list(measured.target_forward_s),
                    draft_step_s=measured.draft_step_s,
                    target_prefill_s=measured.target_prefill_s,
                    draft_prefill_s=measured.draft_prefill_s,
                    round_overhead_s=overhead.round_s,
                    decode_overhead_s=overhead.decode_s,
                    target_forward_spread=measured.quality.spread if measured.quality else None,
                    quality="noisy" if overhead.busy else measured.quality.verdict if measured.quality else None,
                    quality_notes=([overhead.busy] if overhead.busy else []) + (measured.quality.notes if measured.quality else []),
                    library_versions=models.library_versions(),
                )
                session.add(profile)
                session.flush()
                chosen[batch_size] = profile.id
            if progress and measured.quality and measured.quality.verdict != "clean":
                progress(0, 0, f"cost profile at batch size {batch_size}: {measured.quality.verdict} — "
                               + "; ".join(measured.quality.notes))
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        linked = {link.batch_size for link in run.batch_profiles}
        for batch_size, profile_id in sorted(chosen.items()):
            if batch_size not in linked:
                run.batch_profiles.append(RunCostProfile(batch_size=batch_size, cost_profile_id=profile_id))
        run.cost_profile_id = chosen[min(chosen)]
        return run.cost_profile_id


def library_versions() -> dict:
    """The versions of torch, transformers and numpy doing the measuring (stored with runs and profiles)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}
