"""Analysis runs, their bookkeeping: parameters, create a run (queued), choose its prompts, cancel
it, show its status, record its phase, finish it, and pick the prompts to validate. No model is
loaded here (nothing imports torch), so the web server and the CLI's listing commands use this
module; executing a run is :mod:`analyzer.analysis.runs`.
"""

from __future__ import annotations

import logging
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.advice.summary import AnalysisSummary, PromptSummary
from analyzer.advice.summary_store import store_summary
from analyzer.db import lock_for_write, utcnow
from analyzer.engine.engines import check_run, measuring_engine
from analyzer.measuring.calibration_choice import spanning_order
from analyzer.models.specs import ModelSpecRef, display_name, parse_spec
from analyzer.orm import AnalysisRun, ModelPair, ModelSpec, Prompt
from analyzer.progress import ProgressCallback
from analyzer.prompts.prompt_sets import get_prompt_set
from analyzer.run_params import RunError, RunNotFound, RunParams  # noqa: F401  (importers name them here)
from analyzer.settings import STALE_AFTER_S

UNLABELLED = "unlabelled"
log = logging.getLogger(__name__)


def _get_or_create_spec(session: Session, ref: ModelSpecRef) -> ModelSpec:
    spec = session.scalar(select(ModelSpec).where(ModelSpec.spec == ref.canonical))
    if spec is None:
        spec = ModelSpec(
            spec=ref.canonical, kind=ref.kind, display_name=display_name(ref), details=dict(ref.options)
        )
        session.add(spec)
        session.flush()
    return spec


def get_or_create_pair(session: Session, target: ModelSpecRef, draft: ModelSpecRef) -> ModelPair:
    """The stored pair for these specs, created on first use."""
    target_spec, draft_spec = _get_or_create_spec(session, target), _get_or_create_spec(session, draft)
    pair = session.scalar(
        select(ModelPair).where(ModelPair.target_id == target_spec.id, ModelPair.draft_id == draft_spec.id)
    )
    if pair is None:
        pair = ModelPair(target=target_spec, draft=draft_spec)
        session.add(pair)
        session.flush()
    return pair


def create_run(
    session: Session, prompt_set_name: str, target: str, draft: str, params: RunParams
) -> AnalysisRun:
    """Queue an analysis of the named prompt set with ``target`` and ``draft`` spec strings."""
    check_run(params)
    target_ref, draft_ref = parse_spec(target), parse_spec(draft)
    if target_ref.kind == "ngram":
        raise RunError("the target must be a model, not 'ngram'")
    measuring_engine(params.engine).check_specs(target_ref, draft_ref)
    prompt_set = get_prompt_set(session, prompt_set_name)
    pair = get_or_create_pair(session, target_ref, draft_ref)
    total = prompt_set.prompt_count if params.limit is None else min(params.limit, prompt_set.prompt_count)
    run = AnalysisRun(
        prompt_set=prompt_set,
        pair=pair,
        status="queued",
        params=params.to_json(),
        progress_total=total,
        measured_by=params.engine,
        priced_by=params.engine,
    )
    session.add(run)
    session.flush()
    return run


def selected_prompts(session: Session, run: AnalysisRun) -> list[Prompt]:
    """The run's prompts in file order (the first ``limit`` of the set)."""
    query = select(Prompt).where(Prompt.prompt_set_id == run.prompt_set_id).order_by(Prompt.position)
    limit = run.run_params.limit
    if limit:
        query = query.limit(limit)
    return list(session.scalars(query))


def get_run(session: Session, run_id: int) -> AnalysisRun:
    """The analysis run ``run_id``, or :class:`RunNotFound` (404 ``run_not_found``)."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise RunNotFound(f"no analysis run {run_id}")
    return run


def request_cancel(session: Session, run_id: int) -> AnalysisRun:
    """Ask a queued or running run to stop after the prompt it is on."""
    run = get_run(session, run_id)
    if run.status == "queued":
        run.status, run.finished_at = "cancelled", utcnow()
    elif run.status == "running":
        run.cancel_requested = True
    return run


def shown_status(
    run: AnalysisRun, now: datetime | None = None, *, stale_after_s: float = STALE_AFTER_S
) -> str:
    """The status to show: "interrupted" for a run stored as running whose worker has not written a
    heartbeat for ``stale_after_s`` (the setting; it died or was killed: from then on any worker
    claims its chunk again, and ``specroute analyze --resume RUN`` takes it over at once), else the
    stored status."""
    if run.status == "running" and run.heartbeat_at is not None:
        heartbeat = (
            run.heartbeat_at if run.heartbeat_at.tzinfo else run.heartbeat_at.replace(tzinfo=timezone.utc)
        )
        if ((now or utcnow()) - heartbeat).total_seconds() > stale_after_s:
            return "interrupted"
    return run.status


def recording_phases(
    session_factory: sessionmaker, run_id: int, progress: ProgressCallback | None
) -> ProgressCallback:
    """A progress callback that also stores each new phase text on the run (with a heartbeat), so
    that the web UI shows what a worker is doing while it loads models or profiles, then calls
    ``progress``."""
    last: list[str | None] = [None]

    def record(done: int, total: int, phase: str) -> None:
        if phase != last[0]:
            last[0] = phase
            with session_factory() as session, session.begin():
                lock_for_write(session)
                run = session.get(AnalysisRun, run_id)
                run.phase, run.heartbeat_at = phase[:300], utcnow()
        if progress:
            progress(done, total, phase)

    return record


def run_status(session_factory: sessionmaker, run_id: int) -> str | None:
    """The stored status of a run (None when there is no such run)."""
    with session_factory() as session:
        return session.scalar(select(AnalysisRun.status).where(AnalysisRun.id == run_id))


def cancelled(session_factory: sessionmaker, run_id: int) -> bool:
    with session_factory() as session:
        return bool(session.scalar(select(AnalysisRun.cancel_requested).where(AnalysisRun.id == run_id)))


def finish(session_factory: sessionmaker, run_id: int, status: str, error: str | None = None) -> AnalysisRun:
    """Record the end of a run (done, failed or cancelled, with the error text), then store its
    analysis summary (:func:`store_finished_summary`). Returns the run."""
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        run.status, run.error, run.finished_at = status, error, utcnow()
        run.cancel_requested, run.phase = False, None
        session.flush()
    store_finished_summary(session_factory, run_id)
    return run


def store_finished_summary(session_factory: sessionmaker, run_id: int) -> None:
    """Compute and store the analysis summary of a run that just finished, over the results it kept,
    once: the report, publishing and the pages read it. Its own transaction, after the one that
    recorded the end (which stays recorded if this fails, and holds no lock while it computes). A
    failure here is logged, not raised: the run's outcome stands, and its first reader computes and
    stores the summary instead."""
    try:
        with session_factory() as session, session.begin():
            lock_for_write(session)
            store_summary(session, session.get(AnalysisRun, run_id))
    except Exception:  # noqa: BLE001 - the summary is derived data; the run's own outcome must not change
        log.exception("run %s: storing its summary failed; its first reader computes it", run_id)


def error_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt); rerun to resume"
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def validation_sample(
    summary: AnalysisSummary, count: int, *, already: Sequence[PromptSummary] = ()
) -> list[PromptSummary]:
    """Up to ``count`` prompts of a run's summary to validate (minus those ``already`` validated),
    stratified: one prompt per task in turn, the tasks predicted to speculate first (highest
    predicted speedup first), then the others (most prompts first); within a task in file order. So
    a sample of N covers min(N, number of tasks) tasks, and the decisions that matter most (where
    speculation is switched on) are checked first. Within a task the prompts come in
    :func:`~analyzer.measuring.calibration_choice.spanning_order` over their predicted speedup curves (the
    order validation takes in every engine: the extremes early). A prompt with no predicted speedup (an
    empty output) is never chosen."""
    tasks = summary.tasks
    order = sorted(
        tasks,
        key=lambda t: (
            not tasks[t].speculate,
            -(tasks[t].predicted_speedup or 0.0) if tasks[t].speculate else -tasks[t].n,
            t,
        ),
    )
    done = {p.prompt_id for p in already}
    queues = {}
    for t in order:
        members = [
            p
            for p in sorted(summary.prompts, key=lambda p: p.position)
            # a prompt without a predicted S(g) (an empty output: NaN) has nothing to compare with
            if p.task == t and None not in p.speedup_curve
        ]
        width = max((len(p.speedup_curve) for p in members), default=0)
        curves = np.array([list(p.speedup_curve) + [1.0] * (width - len(p.speedup_curve)) for p in members])
        spanned = [members[i] for i in spanning_order(curves.reshape(len(members), width))] if members else []
        queues[t] = [p for p in spanned if p.prompt_id not in done]
    taken = {t: sum(1 for p in already if p.task == t) for t in order}
    chosen: list[PromptSummary] = []
    while len(chosen) + len(done) < count and any(queues.values()):
        # the task with the fewest validated so far, ties broken by the order above
        task = min((t for t in order if queues[t]), key=lambda t: (taken[t], order.index(t)))
        chosen.append(queues[task].pop(0))
        taken[task] += 1
    return chosen
