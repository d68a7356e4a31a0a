"""The log of routing decisions (table ``route_decisions``), written off the request path.

Answering a route request must not wait for a database write, so decisions go into a bounded queue
and one background thread stores them in batches (one transaction per batch, at most every
``interval_s``); feedback does not read the log (its ``route_id`` names the policy set and task).
When the queue is full (the database cannot keep up) new decisions are dropped from the log,
counted, and still answered.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Sequence

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write, utcnow
from router.decision import Decision
from router.orm import RouteDecision

log = logging.getLogger(__name__)


class DecisionLog:
    """Queue decisions with ``add``; a daemon thread stores them. ``close`` stores what is left."""

    def __init__(self, sessions: sessionmaker[Session], *, max_queued: int = 100_000, batch_size: int = 2_000,
                 interval_s: float = 0.2, on_drop: Callable[[int], None] | None = None):
        self._sessions = sessions
        self._queue: queue.Queue[dict | None] = queue.Queue(maxsize=max_queued)
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._on_drop = on_drop
        self._write_lock = threading.Lock()
        self._closed = threading.Event()
        self.dropped = 0
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="specroute-decision-log", daemon=True)
        self._thread.start()

    def add(self, decisions: Sequence[Decision], *, policy_set_id: int | None, classifier_version_id: int | None) -> None:
        """Queue decisions for storage (never blocks)."""
        now = utcnow()
        dropped = 0
        for d in decisions:
            row = {"route_id": d.route_id, "policy_set_id": policy_set_id, "classifier_version_id": classifier_version_id,
                   "task_type": d.task_type[:64], "confidence": d.confidence, "speculate": d.speculate, "gamma": d.gamma,
                   "expected_speedup": d.expected_speedup, "reasons": list(d.reasons), "created_at": now}
            try:
                self._queue.put_nowait(row)
            except queue.Full:
                dropped += 1
        if dropped:
            self.dropped += dropped
            if self._on_drop is not None:
                self._on_drop(dropped)

    def flush(self) -> None:
        """Store every queued decision now (in the caller's thread)."""
        self._write(self._drain())

    def close(self) -> None:
        """Stop the thread and store what is queued."""
        self._closed.set()
        self._thread.join(timeout=10)
        self.flush()

    def _drain(self) -> list[dict]:
        rows: list[dict] = []
        while len(rows) < self._batch_size:
            try:
                rows.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return rows

    def _write(self, rows: list[dict]) -> None:
        with self._write_lock:
            while rows:
                try:
                    with self._sessions() as session, session.begin():
                        lock_for_write(session)  # queue with the other writers (a file lock on SQLite)
                        session.execute(insert(RouteDecision), rows)
                    self.written += len(rows)
                except Exception:  # the log must never take the service down; say what was lost
                    log.exception("could not store %d routing decisions", len(rows))
                    self.dropped += len(rows)
                    if self._on_drop is not None:
                        self._on_drop(len(rows))
                rows = self._drain()

    def _run(self) -> None:
        while not self._closed.wait(self._interval_s):
            self._write(self._drain())
