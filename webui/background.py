"""Work the web UI starts and does not wait for: task suggestions for an uploaded prompt set (the teacher
takes seconds to a minute) and classifier training (cross-validation takes minutes), as jobs on the database
(router/serve/jobs.py). A page queues one under a key ("suggest:<set>", "train"): at most one per key is
queued or running across every server process; this process runs it at once in a daemon thread and stores
its progress and outcome, so any process's page shows them. Closing the app (its server shutting down) stops a
running job at its next progress line and queues it again: the next worker (the server's worker thread, or
``specroute worker``) runs it from the start, as it does a job whose process died."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from analyzer.settings import STALE_AFTER_S
from router.serve.jobs import JobState, claim_job, execute_job, job_state, queue_job

__all__ = ["BackgroundJobs", "JobState"]


class BackgroundJobs:
    """This process's side of the background jobs: queue and run one at once (:meth:`start`), read a key's
    state (:meth:`state`), wait for one (tests) and stop them with the server (:meth:`close`)."""

    def __init__(self, sessions: sessionmaker[Session], *, stale_after_s: float = STALE_AFTER_S) -> None:
        self.sessions, self.stale_after_s = sessions, stale_after_s
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:web"
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self.closing = threading.Event()  # set by close(): every job this process runs stops

    def start(
        self,
        key: str,
        kind: str,
        params: Mapping[str, Any],
        *,
        on_done: Callable[[str], object] | None = None,
    ) -> bool:
        """Queue a job of ``kind`` with ``params`` under ``key`` and run it here; False when a job with that key
        is queued or running (in any process). ``on_done`` is told the kind when it succeeds."""
        job_id = queue_job(self.sessions, key, kind, params, stale_after_s=self.stale_after_s)
        if job_id is None:
            return False
        claimed = claim_job(self.sessions, self.worker_id, stale_after_s=self.stale_after_s, job_id=job_id)
        if claimed is None:  # a worker took it first: it runs there
            return True
        thread = threading.Thread(
            target=execute_job,
            args=(self.sessions, claimed, self.worker_id),
            kwargs={"closing": self.closing, "on_done": on_done},
            name=f"specroute {key}",
            daemon=True,
        )
        with self._lock:
            self._threads[key] = thread
        thread.start()
        return True

    def state(self, key: str) -> JobState | None:
        """The latest job's state under ``key`` (None when none ever ran)."""
        with self.sessions() as session:
            return job_state(session, key)

    def wait(self, key: str, timeout_s: float = 600.0) -> None:
        """Block until the job this process runs under ``key`` (if any) ends (tests)."""
        with self._lock:
            thread = self._threads.get(key)
        if thread is not None:
            thread.join(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop running jobs and wait for them (up to ``timeout_s``) before the database goes away: each stops at
        its next progress line (a classifier's next fold), rolls back and is queued again for the next worker,
        so none goes on computing after its server (or a test's app) is gone."""
        self.closing.set()
        with self._lock:
            threads = list(self._threads.values())
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
