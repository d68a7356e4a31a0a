"""The web UI's background jobs on the database (``background_jobs``): classifier training and task
suggestions, which take minutes and which a page starts and does not wait for.

A job is queued under a key ("train", "suggest:<set>"); while one with that key is queued or running (its
heartbeat fresh), another is refused, whichever server process asks. The process that queued it claims it at
once and runs it in a thread (webui/background.py), storing each progress line and renewing its heartbeat as
it goes; the outcome (a message, or the error) is stored when it ends, its database work in its own
transactions. A job whose process shut down is queued again; one whose process died keeps a heartbeat that
stops: the workers (the server's worker thread, ``specroute worker``) take over a queued job or a stale one and
run it from the start. Pages read the state from the table, so every server process shows the same job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import claimable, lock_for_write, utcnow
from analyzer.errors import SpecrouteError
from router.orm import BackgroundJob

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
Runner = Callable[[sessionmaker[Session], Mapping[str, Any], Progress], str]
INTERRUPTED = "interrupted: its server shut down; a worker takes it again from the start"


class JobCancelled(BaseException):
    """Raised by a job's progress callback once its server is shutting down: the job unwinds at its next
    progress line, its transaction rolls back, and the job is queued again. A BaseException, so that no
    ``except Exception`` in the job's own code swallows it."""


@dataclass(frozen=True)
class JobState:
    """A job as a page shows it: queued or running (since, progress), or ended (message or error)."""

    running: bool
    seconds: int = 0
    progress: str | None = None
    message: str | None = None
    error: str | None = None


def _train(sessions: sessionmaker[Session], params: Mapping[str, Any], progress: Progress) -> str:
    from analyzer.settings import load_settings
    from router.classify.pipeline import fold_jobs
    from router.classify.training import train_classifier_apart, trained_message
    from router.classify.training_request import training_data_apart

    adapt, features = list(params.get("adapt") or ()), params["features"]
    data = training_data_apart(
        sessions, params["source"], params.get("names") or None, adapt=adapt, progress=progress
    )
    version = train_classifier_apart(
        sessions, data, features=features, force_activate=bool(params.get("force_activate")),
        progress=progress, jobs=fold_jobs(load_settings().classifier_jobs, features),
    )  # fmt: skip
    return trained_message(version, data.source, adapt)


def _suggest(sessions: sessionmaker[Session], params: Mapping[str, Any], progress: Progress) -> str:
    from router.classify.suggestions import suggest_tasks_apart

    done = suggest_tasks_apart(sessions, [params["set"]], progress)
    return f"suggested a task for {done.total} unlabelled prompts"


# what each kind of job runs: (sessions, its parameters, a progress callback) -> the outcome message
RUNNERS: dict[str, Runner] = {"train": _train, "suggest": _suggest}


def queue_job(
    sessions: sessionmaker[Session], key: str, kind: str, params: Mapping[str, Any], *, stale_after_s: float
) -> int | None:
    """Queue a job of ``kind`` under ``key``; None when a job with that key is queued, or running with a fresh
    heartbeat (one whose heartbeat is older than ``stale_after_s`` is failed first: its process died)."""
    if kind not in RUNNERS:
        raise ValueError(f"unknown job kind {kind!r}")
    try:
        with sessions() as session, session.begin():
            lock_for_write(session)  # read-then-write: one after the other on SQLite
            for job in _active(session, key):
                if job.status == "queued" or not _stale(job, stale_after_s):
                    return None
                job.status, job.finished_at = "failed", utcnow()
                job.error = f"its worker ({job.worker_id}) stopped sending heartbeats"
            session.flush()  # the stale job leaves the key's unique index before the new one enters it
            job = BackgroundJob(key=key, kind=kind, params=dict(params), status="queued")
            session.add(job)
            session.flush()
            return job.id
    except IntegrityError:  # another process queued one under the key since this read (PostgreSQL)
        return None


def _active(session: Session, key: str) -> list[BackgroundJob]:
    """The jobs queued or running under ``key`` (at most one: the key's unique index over them)."""
    return list(
        session.scalars(
            select(BackgroundJob).where(
                BackgroundJob.key == key, BackgroundJob.status.in_(("queued", "running"))
            )
        )
    )


def _stale(job: BackgroundJob, stale_after_s: float) -> bool:
    return job.heartbeat_at is None or job.heartbeat_at < utcnow() - timedelta(seconds=stale_after_s)


def claim_job(
    sessions: sessionmaker[Session], worker_id: str, *, stale_after_s: float, job_id: int | None = None
) -> int | None:
    """Claim job ``job_id`` (None: the oldest queued job, or a running one whose heartbeat is older than
    ``stale_after_s``) for ``worker_id``; its id, or None when there is none to claim."""
    with sessions() as session, session.begin():
        # job_id: that job while queued; else the oldest queued job or one whose worker stopped
        where = (BackgroundJob.id == job_id, BackgroundJob.status == "queued") if job_id is not None else ()
        cutoff = utcnow() - timedelta(seconds=stale_after_s)
        found = claimable(session, BackgroundJob, cutoff=cutoff, where=where)
        if not found:
            return None
        job = found[0]
        now = utcnow()
        job.status, job.worker_id, job.heartbeat_at, job.started_at = "running", worker_id, now, now
        job.attempts += 1
        job.progress, job.message, job.error, job.finished_at = None, None, None, None
        return job.id


def execute_job(
    sessions: sessionmaker[Session],
    job_id: int,
    worker_id: str,
    *,
    closing: threading.Event | None = None,
    on_done: Callable[[str], object] | None = None,
) -> JobState:
    """Run claimed job ``job_id``: each progress line is stored with a fresh heartbeat (JobCancelled once
    ``closing`` is set: the job is queued again for another worker); the outcome is stored when it ends.
    ``on_done`` is told the kind of a job that succeeded (the server reloads its classifier). Returns its
    state."""
    with sessions() as session:
        job = session.get(BackgroundJob, job_id)
        if job is None:
            raise ValueError(f"no background job {job_id}")
        kind, params = job.kind, dict(job.params)

    def progress(line: str) -> None:
        if closing is not None and closing.is_set():
            raise JobCancelled(job_id)
        _store(sessions, job_id, worker_id, progress=line[:2000], heartbeat_at=utcnow())

    message = error = None
    status = "done"
    try:
        message = RUNNERS[kind](sessions, params, progress)
    except JobCancelled:  # queued again, for the next worker: it starts over
        _store(sessions, job_id, worker_id, status="queued", progress=INTERRUPTED, worker_id=None)
        return JobState(False, progress=INTERRUPTED, error=INTERRUPTED)
    except SpecrouteError as exc:  # a refusal the user can act on (no encoder, no labels, ...)
        status, error = "failed", str(exc)
    except Exception as exc:  # logged; the page says it failed, nothing was stored
        log.exception("background job %s (%s) failed", job_id, kind)
        status, error = "failed", f"failed: {exc}"
    _store(sessions, job_id, worker_id, status=status, message=message, error=error, finished_at=utcnow())
    if status == "done" and on_done is not None:
        on_done(kind)
    return JobState(False, message=message, error=error)


def _store(sessions: sessionmaker[Session], job_id: int, holder: str, **values: Any) -> None:
    """Write ``values`` to the job while ``holder`` holds it (a job another worker took over is left to it)."""
    with sessions() as session, session.begin():
        lock_for_write(session)
        session.execute(
            update(BackgroundJob)
            .where(BackgroundJob.id == job_id, BackgroundJob.worker_id == holder)
            .values(**values)
        )


def run_next_job(
    sessions: sessionmaker[Session],
    worker_id: str,
    *,
    stale_after_s: float,
    closing: threading.Event | None = None,
    on_done: Callable[[str], object] | None = None,
) -> bool:
    """For a worker loop: claim and run the next queued or stale job (as :func:`execute_job`); whether there was
    one."""
    job_id = claim_job(sessions, worker_id, stale_after_s=stale_after_s)
    if job_id is None:
        return False
    execute_job(sessions, job_id, worker_id, closing=closing, on_done=on_done)
    return True


def job_state(session: Session, key: str) -> JobState | None:
    """The state of the latest job under ``key`` (None: none ever ran)."""
    job = session.scalars(
        select(BackgroundJob).where(BackgroundJob.key == key).order_by(BackgroundJob.id.desc()).limit(1)
    ).first()
    if job is None:
        return None
    if job.status in ("queued", "running"):
        since = job.started_at or job.created_at
        line = job.progress or ("queued: a worker takes it" if job.status == "queued" else None)
        return JobState(True, int((utcnow() - since).total_seconds()), line)
    return JobState(False, message=job.message, error=job.error)
