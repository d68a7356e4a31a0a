"""Work the web UI starts and does not wait for: task suggestions for an uploaded prompt set (the
teacher takes seconds to a minute) and classifier training (cross-validation takes minutes). Each job
runs in a daemon thread of the server under a key ("suggest:<set>", "train"); at most one per key at a
time. Pages show a running job with its age and last progress line, and the outcome (a message, or
the error) once it ends. Each job does its database work in its own transaction: all or nothing.
State is per process (with several server processes, the page served by another one shows no running
job, but the stored result once it is there)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from analyzer.errors import SpecrouteError

log = logging.getLogger(__name__)

Job = Callable[[Callable[[str], None]], str]  # takes a progress callback, returns the outcome message


class JobCancelled(BaseException):
    """Raised by a job's progress callback once the server is shutting down (:meth:`BackgroundJobs.close`):
    the job unwinds at its next progress line, its transaction rolls back. A BaseException, so that no
    ``except Exception`` in the job's own code swallows it."""


@dataclass(frozen=True)
class JobState:
    """A job as a page shows it: running (since, progress) or ended (message or error)."""

    running: bool
    seconds: int = 0
    progress: str | None = None
    message: str | None = None
    error: str | None = None


class BackgroundJobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[str, float] = {}
        self._progress: dict[str, str] = {}
        self._outcome: dict[str, tuple[str | None, str | None]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._closing = threading.Event()

    def start(self, key: str, job: Job) -> bool:
        """Start ``job`` under ``key``; False when a job with that key is running."""
        with self._lock:
            if key in self._started:
                return False
            self._started[key] = time.time()
            self._outcome.pop(key, None)
            thread = threading.Thread(target=self._run, args=(key, job), name=f"specroute {key}", daemon=True)
            self._threads[key] = thread
        thread.start()
        return True

    def _run(self, key: str, job: Job) -> None:
        message = error = None
        try:
            message = job(lambda line: self._report(key, line))
        except JobCancelled:
            error = "cancelled: the server shut down before it ended; nothing was stored"
        except SpecrouteError as exc:  # a refusal the user can act on (no encoder, no labels, ...)
            error = str(exc)
        except Exception as exc:  # logged; the page says it failed, nothing was stored
            log.exception("background job %s failed", key)
            error = f"failed: {exc}"
        finally:
            with self._lock:
                self._started.pop(key, None)
                self._progress.pop(key, None)
                self._outcome[key] = (message, error)

    def _report(self, key: str, line: str) -> None:
        if self._closing.is_set():
            raise JobCancelled(key)
        self._progress[key] = line

    def state(self, key: str) -> JobState | None:
        """The job's state, or None when none ran under ``key`` in this process."""
        with self._lock:
            if key in self._started:
                return JobState(True, int(time.time() - self._started[key]), self._progress.get(key))
            if key in self._outcome:
                message, error = self._outcome[key]
                return JobState(False, message=message, error=error)
        return None

    def wait(self, key: str, timeout_s: float = 600.0) -> None:
        """Block until the job under ``key`` (if any) ends (tests)."""
        thread = self._threads.get(key)
        if thread is not None:
            thread.join(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel running jobs and wait for them (up to ``timeout_s``) before the database goes away: each
        stops at its next progress line (a classifier's next fold) and rolls back, so none goes on
        computing after its server (or a test's app) is gone."""
        self._closing.set()
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads.values()):
            thread.join(max(deadline - time.monotonic(), 0.0))
