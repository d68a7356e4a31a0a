"""A run spread over many workers: its work is planned as chunks (the cost profile, slices of
``chunk_size`` prompts, the validation), and any worker claims the next one it may take.

- Claiming locks candidate rows with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so workers on many
  machines never wait on each other nor take the same chunk; on SQLite the claim runs under the
  write lock (``BEGIN IMMEDIATE``): one claimer at a time.
- Order: the profile chunk first (the measurement chunks wait for it, so a profile is never timed
  beside a measurement on the same machine, and is measured once per pair, device and dtype: later
  runs reuse it), then the measurement chunks in file order, then the validation chunk once every
  prompt is measured.
- A worker renews its chunk's heartbeat before each batch; a chunk whose heartbeat is older than the
  claimer's ``stale_after_s`` (the setting of that name, 600 s by default) is claimed again (the
  results stored from it stay: the new claimer measures only the rest), and a worker whose chunk was
  taken over stops working on it.
- The run finishes exactly once: the transaction that marks the last chunk done also moves the run
  from running to done (a conditional UPDATE, so two finishers cannot both win).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, Update, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from analyzer.analysis.run_records import get_run, selected_prompts
from analyzer.db import claimable, lock_for_write, utcnow
from analyzer.orm import AnalysisRun, PromptResult, RunChunk
from analyzer.run_params import RunError, RunInputError
from analyzer.settings import STALE_AFTER_S


@dataclass(frozen=True)
class ClaimedChunk:
    """A chunk a worker holds: its id, run, kind and (measurement) prompt ids."""

    id: int
    run_id: int
    position: int
    kind: str
    prompt_ids: tuple[int, ...]
    chunks_in_run: int


def plan_chunks(session: Session, run: AnalysisRun) -> list[RunChunk]:
    """Create the chunks of ``run`` (none when it has them): the profile, the prompts not yet
    measured in slices of the run's ``chunk_size``, and the validation when the run validates."""
    existing = list(session.scalars(select(RunChunk).where(RunChunk.run_id == run.id)))
    if existing:
        return existing
    params = run.run_params
    size = params.chunk_size
    measured = set(session.scalars(select(PromptResult.prompt_id).where(PromptResult.run_id == run.id)))
    pending = [p.id for p in selected_prompts(session, run) if p.id not in measured]
    chunks = [RunChunk(run_id=run.id, position=0, kind="profile", prompt_ids=[])]
    chunks += [
        RunChunk(run_id=run.id, position=i // size + 1, kind="measure", prompt_ids=pending[i : i + size])
        for i in range(0, len(pending), size)
    ]
    if params.validate and not params.sampling:
        chunks.append(RunChunk(run_id=run.id, position=len(chunks), kind="validate", prompt_ids=[]))
    session.add_all(chunks)
    session.flush()
    return chunks


def _claimable(session: Session, chunk: RunChunk) -> bool:
    """Whether ``chunk`` may start now: measurement after the profile, validation after the rest."""
    if chunk.kind == "profile":
        return True
    before = ("profile",) if chunk.kind == "measure" else ("profile", "measure")
    waiting = session.scalar(
        select(func.count())
        .select_from(RunChunk)
        .where(RunChunk.run_id == chunk.run_id, RunChunk.kind.in_(before), RunChunk.status != "done")
    )
    return waiting == 0


def claim_chunk(
    sessions: sessionmaker[Session],
    worker_id: str,
    *,
    run_id: int | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> ClaimedChunk | None:
    """Claim the next chunk this worker may take (of run ``run_id``, or of any queued or running
    run, oldest first): pending, or claimed by a worker whose heartbeat is older than
    ``stale_after_s``. Plans the chunks of a run that has none (runs queued before chunks existed).
    None when nothing may be taken now."""
    now = utcnow()
    cutoff = now - timedelta(seconds=stale_after_s)
    with sessions() as session, session.begin():
        lock_for_write(session)
        _plan_unplanned_runs(session, run_id)
        live = select(AnalysisRun.id).where(
            AnalysisRun.status.in_(("queued", "running")), AnalysisRun.cancel_requested.is_(False)
        )
        if run_id is not None:
            live = live.where(AnalysisRun.id == run_id)
        candidates = claimable(
            session, RunChunk, cutoff=cutoff, waiting="pending", taken="claimed",
            where=(RunChunk.run_id.in_(live),), order_by=(RunChunk.run_id, RunChunk.position), limit=8,
        )  # fmt: skip
        for chunk in candidates:
            if _claimable(session, chunk):
                return _claim(session, chunk, worker_id, now)
    return None


def _plan_unplanned_runs(session: Session, run_id: int | None) -> None:
    """Plan the chunks of every live run (or run ``run_id``) that has none, locking each run's row."""
    runs = select(AnalysisRun).where(
        AnalysisRun.status.in_(("queued", "running")), AnalysisRun.cancel_requested.is_(False)
    )
    if run_id is not None:
        runs = runs.where(AnalysisRun.id == run_id)
    unplanned = runs.where(~select(RunChunk.id).where(RunChunk.run_id == AnalysisRun.id).exists())
    for run in session.scalars(unplanned.with_for_update(skip_locked=True)):
        try:
            plan_chunks(session, run)
        except RunInputError as exc:  # a stored parameter of the wrong type (a row edited by hand)
            # the run fails alone: raised here, it would stop every worker's claims on every other run
            run.status, run.finished_at = "failed", utcnow()
            run.error = f"its stored parameters cannot be read: {exc}"


def _claim(session: Session, chunk: RunChunk, worker_id: str, now: datetime) -> ClaimedChunk:
    """Mark ``chunk`` claimed by ``worker_id`` and its run running, with both heartbeats at ``now``."""
    chunk.status, chunk.worker_id, chunk.claimed_at, chunk.heartbeat_at = (
        "claimed",
        worker_id,
        now,
        now,
    )
    chunk.attempts += 1
    run = session.get_one(AnalysisRun, chunk.run_id)  # the candidates are chunks of live runs
    if run.status == "queued":
        run.status, run.started_at = "running", run.started_at or now
    run.worker_id, run.heartbeat_at, run.error = worker_id, now, None
    count = session.execute(
        select(func.count()).select_from(RunChunk).where(RunChunk.run_id == chunk.run_id)
    ).scalar_one()
    return ClaimedChunk(chunk.id, chunk.run_id, chunk.position, chunk.kind, tuple(chunk.prompt_ids), count)


def renew(sessions: sessionmaker[Session], chunk: ClaimedChunk, worker_id: str) -> bool:
    """Renew the chunk's (and its run's) heartbeat; False when the chunk is no longer this worker's
    (another worker took it over after the heartbeat went stale) or its run stopped running."""
    now = utcnow()
    with sessions() as session, session.begin():
        lock_for_write(session)
        held = _rows_matched(
            session,
            update(RunChunk)
            .where(RunChunk.id == chunk.id, RunChunk.worker_id == worker_id, RunChunk.status == "claimed")
            .values(heartbeat_at=now),
        )
        running = _rows_matched(
            session,
            update(AnalysisRun)
            .where(
                AnalysisRun.id == chunk.run_id,
                AnalysisRun.status == "running",
                AnalysisRun.cancel_requested.is_(False),
            )
            .values(heartbeat_at=now),
        )
    return bool(held and running)


def _rows_matched(session: Session, statement: Update) -> int:
    """The number of rows an UPDATE matched (``Session.execute`` is typed as returning a plain
    ``Result``; for a DML statement it is a ``CursorResult``, which has the row count)."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount


def complete(sessions: sessionmaker[Session], chunk: ClaimedChunk, worker_id: str) -> bool:
    """Mark the chunk done; when it was the run's last, finish the run (done) in the same
    transaction. Returns whether this call finished the run (exactly one call does)."""
    now = utcnow()
    with sessions() as session, session.begin():
        lock_for_write(session)
        # completions of one run take turns (PostgreSQL: the run's row lock), so the last one sees
        # every other chunk done and finishes the run
        session.execute(select(AnalysisRun.id).where(AnalysisRun.id == chunk.run_id).with_for_update())
        session.execute(
            update(RunChunk)
            .where(RunChunk.id == chunk.id, RunChunk.status != "done")
            .values(status="done", done_at=now, heartbeat_at=now)
        )
        left = session.scalar(
            select(func.count())
            .select_from(RunChunk)
            .where(RunChunk.run_id == chunk.run_id, RunChunk.status != "done")
        )
        if left:
            return False
        results = session.scalar(
            select(func.count()).select_from(PromptResult).where(PromptResult.run_id == chunk.run_id)
        )
        finished = _rows_matched(
            session,
            update(AnalysisRun)
            .where(AnalysisRun.id == chunk.run_id, AnalysisRun.status == "running")
            .values(
                status="done",
                finished_at=now,
                phase=None,
                cancel_requested=False,
                error=None,
                progress_done=results,
            ),
        )
        return bool(finished)


def chunk_progress(session: Session, run_id: int) -> dict[str, int]:
    """{"chunks", "done", "claimed", "workers"}: how a run's chunks stand and how many workers hold one."""
    rows = session.execute(select(RunChunk.status, RunChunk.worker_id).where(RunChunk.run_id == run_id)).all()
    return {
        "chunks": len(rows),
        "done": sum(1 for s, _ in rows if s == "done"),
        "claimed": sum(1 for s, _ in rows if s == "claimed"),
        "workers": len({w for s, w in rows if w is not None}),
    }


def take_over(session: Session, run_id: int) -> None:
    """Make every unfinished chunk of a run pending again (``specroute analyze --resume``: the
    workers that held them are gone)."""
    session.execute(
        update(RunChunk)
        .where(RunChunk.run_id == run_id, RunChunk.status == "claimed")
        .values(status="pending", worker_id=None)
    )


def requeue_run(session: Session, run_id: int) -> AnalysisRun:
    """Queue a failed or cancelled run again for the workers (``specroute runs resume RUN --queue``): its
    finished prompts are kept, the rest planned in chunks as a resume does; a queued run, or a running one
    (an interrupted one's chunks are claimed again once their heartbeat is stale), stays as it is. RunError
    for a finished run."""
    run = get_run(session, run_id)
    if run.status == "done":
        raise RunError(f"run {run_id} is done: there is nothing to resume")
    if run.status in ("failed", "cancelled"):
        run.status, run.finished_at = "queued", None
        run.error, run.cancel_requested = None, False
        plan_chunks(session, run)
        take_over(session, run_id)
    return run


# a profile or validation chunk renews its heartbeat at most this often while it reports progress
HEARTBEAT_EVERY_S = 30.0


def renewing_heartbeat(
    session_factory: sessionmaker,
    chunk: ClaimedChunk,
    worker_id: str,
    progress: Callable[[int, int, str], None],
    *,
    clock=time.monotonic,
) -> Callable[[int, int, str], None]:
    """``progress`` that also renews the chunk's heartbeat (:func:`renew`) when
    HEARTBEAT_EVERY_S have passed since the last renewal: a profile or a validation reports progress
    all along (a quiet wait every few seconds, every timed pass) but renews nothing else between its
    start and its end, and may take longer than the stale limit, after which another worker would take
    the chunk over and do it again."""
    renewed = [clock()]

    def report(done: int, total: int, phase: str) -> None:
        if clock() - renewed[0] >= HEARTBEAT_EVERY_S:
            renewed[0] = clock()
            renew(session_factory, chunk, worker_id)
        progress(done, total, phase)

    return report
