"""Task suggestions for uploaded prompt sets, computed in a background thread of the web server (the
teacher takes seconds to a minute; the upload answers at once). The prompt set page shows a set as
"suggesting" while its thread runs, and the suggestions once they are stored. Suggesting is one
transaction: a set has all its new suggestions or none."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from router.suggestions import TeacherUnavailable, suggest_tasks

log = logging.getLogger(__name__)


class Suggester:
    """One thread per prompt set being suggested; at most one at a time per set."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}
        self._threads: dict[str, threading.Thread] = {}
        self.last_error: dict[str, str] = {}
        self.progress: dict[str, str] = {}

    def start(self, name: str) -> bool:
        """Start suggesting for the set; False when it is already being suggested."""
        with self._lock:
            if name in self._running:
                return False
            self._running[name] = time.time()
            self.last_error.pop(name, None)
            thread = threading.Thread(target=self._run, args=(name,), name=f"suggest {name}", daemon=True)
            self._threads[name] = thread
        thread.start()
        return True

    def _run(self, name: str) -> None:
        try:
            with self.sessions() as session, session.begin():
                suggest_tasks(session, [name], lambda line: self.progress.__setitem__(name, line))
        except TeacherUnavailable as exc:
            self.last_error[name] = str(exc)
        except Exception as exc:  # shown on the page and logged; the set stays as uploaded
            log.exception("suggesting tasks for prompt set %s failed", name)
            self.last_error[name] = f"suggesting tasks failed: {exc}"
        finally:
            with self._lock:
                self._running.pop(name, None)
                self.progress.pop(name, None)

    def running_since(self, name: str) -> float | None:
        with self._lock:
            return self._running.get(name)

    def close(self, timeout_s: float = 60.0) -> None:
        """Wait (bounded) for running suggestions before the database goes away."""
        for thread in list(self._threads.values()):
            thread.join(timeout_s)

    def wait(self, name: str, timeout_s: float = 300.0) -> None:
        """Block until the set's suggestion thread (if any) ends (tests, shutdown)."""
        thread = self._threads.get(name)
        if thread is not None:
            thread.join(timeout_s)
