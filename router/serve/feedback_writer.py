"""Group commit for feedback: one writer thread per server process (a
:class:`router.serve.batch_writer.BatchWriter`) stores every pending feedback event in one transaction.

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

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from router.decide.adaptation import AdaptationConfig
from router.decide.feedback import (
    FeedbackError,
    FeedbackRequest,
    PolicyContext,
    Recorded,
    record_feedback_batch,
)
from router.serve.batch_writer import BatchWriter

Event = tuple[FeedbackRequest, PolicyContext | None]  # an event and the policy set it was checked against


class FeedbackWriter:
    """``submit`` a checked event and get its Recorded (or its error raised) once its batch commits.
    The thread starts with the first event; ``close`` stores what is queued and stops it.
    ``on_recorded(request, recorded)`` runs in the writer's thread after each commit, in event order.
    ``transactions`` and ``events`` count the committed transactions and the events they stored."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: AdaptationConfig,
        *,
        max_batch: int = 256,
        on_recorded: Callable[[FeedbackRequest, Recorded], None] | None = None,
    ):
        self._sessions = sessions
        self._config = config
        on_stored = None if on_recorded is None else lambda event, recorded: on_recorded(event[0], recorded)
        self._writer: BatchWriter[Event, Recorded] = BatchWriter(
            self._store, name="feedback events", max_batch=max_batch, on_stored=on_stored
        )

    @property
    def transactions(self) -> int:
        return self._writer.transactions

    @property
    def events(self) -> int:
        return self._writer.stored

    def submit(self, request: FeedbackRequest, context: PolicyContext | None) -> Recorded:
        """Store one event with whatever else is pending; blocks until its transaction commits and
        returns what it did, or raises its FeedbackError (or the batch's database error)."""
        return self._writer.submit((request, context))

    def pending(self) -> int:
        """Events submitted and not answered yet (queued, or in the batch being stored)."""
        return self._writer.pending()

    def close(self) -> None:
        """Store every queued event, then stop the thread; later events are stored by their caller."""
        self._writer.close()

    def _store(self, events: list[Event]) -> list[Recorded | FeedbackError]:
        with self._sessions() as session, session.begin():
            lock_for_write(session)  # one lock for the whole batch; other processes' writers wait
            return record_feedback_batch(session, events, self._config)
