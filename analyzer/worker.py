"""Background execution of queued analysis runs.

Runs started from the web UI are stored as ``queued``; a worker claims one at a time with an atomic
``UPDATE ... WHERE status = 'queued'`` (so several workers, threads or ``specroute worker``
processes, never take the same run) and executes it, resuming from the prompts already stored. A run
left ``running`` by a worker that died (no heartbeat for ``stale_after_s``) is put back in the queue,
so a server restart never loses a run.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import utcnow
from analyzer.models import AnalysisRun

log = logging.getLogger(__name__)

STALE_AFTER_S = 600.0


def requeue_stale(sessions: sessionmaker[Session], stale_after_s: float = STALE_AFTER_S) -> list[int]:
    """Put ``running`` runs whose heartbeat is older than ``stale_after_s`` back in the queue."""
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    with sessions() as session, session.begin():
        stale = list(session.scalars(select(AnalysisRun.id).where(
            AnalysisRun.status == "running", AnalysisRun.heartbeat_at < cutoff)))
        for run_id in stale:
            session.execute(update(AnalysisRun).where(AnalysisRun.id == run_id, AnalysisRun.status == "running")
                            .values(status="queued", worker_id=None))
    return stale


def claim_next_run(sessions: sessionmaker[Session], worker_id: str) -> int | None:
    """Atomically take the oldest queued run for ``worker_id``; None when the queue is empty."""
    with sessions() as session, session.begin():
        candidates = list(session.scalars(select(AnalysisRun.id).where(AnalysisRun.status == "queued")
                                          .order_by(AnalysisRun.id).limit(5)))
        for run_id in candidates:
            taken = session.execute(update(AnalysisRun).where(AnalysisRun.id == run_id, AnalysisRun.status == "queued")
                                    .values(status="running", worker_id=worker_id, heartbeat_at=utcnow()))
            if taken.rowcount == 1:
                return run_id
    return None


def run_queued(sessions: sessionmaker[Session], *, cache_dir: Path, worker_id: str, allow_network: bool = False) -> int | None:
    """Claim and execute one queued run; returns its id (None when nothing was queued). A failing run
    is recorded as failed by ``execute_run`` and does not stop the worker."""
    run_id = claim_next_run(sessions, worker_id)
    if run_id is None:
        return None
    from analyzer.runs import execute_run  # torch and transformers load with the first run, not with the server

    try:
        execute_run(sessions, run_id, cache_dir=cache_dir, worker_id=worker_id, allow_network=allow_network)
    except Exception:
        log.exception("analysis run %s failed", run_id)
    return run_id


class Worker:
    """A daemon thread that executes queued runs until ``stop()``; polls every ``poll_s`` seconds."""

    def __init__(self, sessions: sessionmaker[Session], *, cache_dir: Path, allow_network: bool = False,
                 poll_s: float = 1.0, stale_after_s: float = STALE_AFTER_S, name: str = "thread"):
        self.sessions, self.cache_dir, self.allow_network = sessions, cache_dir, allow_network
        self.poll_s, self.stale_after_s = poll_s, stale_after_s
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"specroute-worker-{name}", daemon=True)

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        work(self.sessions, cache_dir=self.cache_dir, worker_id=self.worker_id, allow_network=self.allow_network,
             poll_s=self.poll_s, stale_after_s=self.stale_after_s, stop=self._stop)


def work(sessions: sessionmaker[Session], *, cache_dir: Path, worker_id: str, allow_network: bool = False,
         poll_s: float = 1.0, stale_after_s: float = STALE_AFTER_S, stop: threading.Event | None = None,
         once: bool = False, on_run: Callable[[int], None] | None = None) -> None:
    """The worker loop of the server's thread and of ``specroute worker`` alike: put stale runs back
    in the queue, claim and execute the next queued run (``on_run`` is told its id when it ends), wait
    ``poll_s`` when there was none; until ``stop`` is set, or after one attempt with ``once``. A
    database hiccup is logged and does not end the loop."""
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            requeue_stale(sessions, stale_after_s)
            ran = run_queued(sessions, cache_dir=cache_dir, worker_id=worker_id, allow_network=allow_network)
        except Exception:
            log.exception("worker loop")
            ran = None
        if ran is not None and on_run is not None:
            on_run(ran)
        if once:
            return
        if ran is None:
            stop.wait(poll_s)
