"""Group commit for feedback: one writer thread per server process stores every pending feedback
event in one transaction.

A feedback event is a read-modify-write of its task's estimate row, so it needs the write lock (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: ``SELECT ... FOR UPDATE`` of the row). Taken once per event, the lock
makes every event wait for all the events before it, each with its own commit. Here a request thread
hands its checked event to the writer and waits; the writer takes every event queued by then (at
most ``max_batch``), stores them with ``record_feedback_batch`` in one transaction (one lock
acquisition, each estimate row locked once, events of a task applied in arrival order), commits, and
wakes each request with its own result, the estimate right after its event, or its own error (an
event that fails its checks fails alone). While one batch commits the next one gathers, so the
batches grow with the load and no event waits for a timer.

When a whole batch fails (an unexpected error, e.g. two processes creating the same new estimate
row at once), its events are stored again one transaction each, so that only the culprit fails; a
database that does not answer or stays locked (``OperationalError``) fails the batch at once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from router.adaptation import AdaptationConfig
from router.feedback import FeedbackError, FeedbackRequest, PolicyContext, Recorded, record_feedback_batch

log = logging.getLogger(__name__)


class _Pending:
    """One event waiting for its batch to commit."""

    __slots__ = ("request", "context", "done", "recorded", "error")

    def __init__(self, request: FeedbackRequest, context: PolicyContext | None):
        self.request, self.context = request, context
        self.done = threading.Event()
        self.recorded: Recorded | None = None
        self.error: BaseException | None = None


class FeedbackWriter:
    """``submit`` a checked event and get its Recorded (or its error raised) once its batch commits.
    The thread starts with the first event; ``close`` stores what is queued and stops it.
    ``on_recorded(request, recorded)`` runs in the writer's thread after each commit, in event order.
    ``transactions`` and ``events`` count the committed transactions and the events they stored."""

    def __init__(self, sessions: sessionmaker[Session], config: AdaptationConfig, *, max_batch: int = 256,
                 on_recorded: Callable[[FeedbackRequest, Recorded], None] | None = None):
        self._sessions = sessions
        self._config = config
        self._max_batch = max_batch
        self._on_recorded = on_recorded
        self._queue: deque[_Pending] = deque()
        self._ready = threading.Condition()
        self._store_lock = threading.Lock()  # the thread, or a caller after close
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pending = 0
        self.transactions = 0
        self.events = 0

    def submit(self, request: FeedbackRequest, context: PolicyContext | None) -> Recorded:
        """Store one event with whatever else is pending; blocks until its transaction commits and
        returns what it did, or raises its FeedbackError (or the batch's database error)."""
        pending = _Pending(request, context)
        with self._ready:
            self._pending += 1
            closed = self._closed
            if not closed:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="specroute-feedback-writer", daemon=True)
                    self._thread.start()
                self._queue.append(pending)
                self._ready.notify()
        if closed:  # no thread any more: store it in this one, alone
            self._store([pending])
        pending.done.wait()
        with self._ready:
            self._pending -= 1
        if pending.error is not None:
            raise pending.error
        assert pending.recorded is not None
        return pending.recorded

    def pending(self) -> int:
        """Events submitted and not answered yet (queued, or in the batch being stored)."""
        with self._ready:
            return self._pending

    def close(self) -> None:
        """Store every queued event, then stop the thread; later events are stored by their caller."""
        with self._ready:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            self._store(batch)

    def _store(self, batch: list[_Pending]) -> None:
        with self._store_lock:
            try:
                with self._sessions() as session, session.begin():
                    lock_for_write(session)  # one lock for the whole batch; other processes' writers wait
                    outcomes = record_feedback_batch(session, [(p.request, p.context) for p in batch], self._config)
            except Exception as exc:
                if len(batch) == 1 or isinstance(exc, OperationalError):
                    for p in batch:
                        p.error = exc
                        p.done.set()
                    return
                log.warning("a batch of %d feedback events failed (%s); storing them one at a time", len(batch), exc)
                retry = True
            else:
                retry = False
                self.transactions += 1
                self.events += sum(1 for o in outcomes if not isinstance(o, FeedbackError))
        if retry:
            for p in batch:
                self._store([p])
            return
        for p, outcome in zip(batch, outcomes):
            if isinstance(outcome, FeedbackError):
                p.error = outcome
            else:
                p.recorded = outcome
                if self._on_recorded is not None:
                    try:
                        self._on_recorded(p.request, outcome)
                    except Exception:  # the event is stored; a failing hook must not fail its request
                        log.exception("feedback hook failed")
            p.done.set()
