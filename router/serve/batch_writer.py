"""One batching writer for everything the server stores off (or beside) the request path: the decision
log and feedback. Group commit, one writer thread per writer object.

- Items wait in one FIFO queue. The writer thread takes every item queued when the previous batch
  has finished (at most ``max_batch``) and hands them to ``store``, which stores the list in one
  transaction and returns one outcome per item: its result, or an exception instance for an item
  that failed its own checks (it fails alone; the others are stored). While one batch commits the next
  one gathers, so batches are one item each when the load is light and grow with it. A writer whose
  items nobody waits for (the decision log) may also ``linger``: once an item arrives, the thread waits up
  to that long for more (or for ``max_batch`` of them) before it stores, so that a steady stream of
  requests costs a transaction per batch, not per request; ``flush`` and ``close`` cut the wait short.
- Two ways to hand an item over. ``submit(item)`` waits until the item's transaction has committed
  and returns its result or raises its error (feedback: the answer is the estimate right after the
  event). ``put(items)`` never blocks and returns at once (the decision log: a route request must not
  wait for the database).
- Bounded: with ``max_queued`` items queued, ``put`` drops what does not fit and counts it
  (``dropped``, ``on_lost``); ``submit`` blocks until there is room, since its caller waits anyway.
- Failures: when ``store`` raises for a whole batch, its items are stored again one transaction each,
  so that only the culprit fails; an error of a type in ``fail_batch_on`` (by default SQLAlchemy's
  ``OperationalError``: the database does not answer or stays locked, so retrying each item would
  only wait longer) fails the whole batch at once, as does any error of a single item's
  transaction. A waiting caller gets its item's error raised; an item that was ``put`` is counted
  in ``failed``, reported to ``on_lost`` and logged.
- Order: items are stored, and ``on_stored(item, result)`` is called (in the writer's thread, after
  the commit, before the waiter wakes), in queue order; one transaction at a time per writer.
- ``flush`` waits until everything queued so far is stored; ``close`` stores what is queued and stops
  the thread. Items handed over after ``close`` are stored in their caller's thread, alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Entry(Generic[Item, Result]):
    """One queued item; ``done`` is set once its outcome is known (None: nobody waits for it)."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: Item, waited: bool):
        self.item = item
        self.done: threading.Event | None = threading.Event() if waited else None
        self.result: Result | None = None
        self.error: BaseException | None = None


class BatchWriter(Generic[Item, Result]):
    """Group commit of items through ``store`` (see the module docstring). ``name`` (plural, e.g.
    "routing decisions") names the thread and the log lines. Counters: ``transactions`` committed,
    ``stored`` items stored, ``failed`` items whose storage failed, ``dropped`` items ``put`` while
    the queue was full."""

    def __init__(
        self,
        store: Callable[[list[Item]], Sequence[Result | BaseException]],
        *,
        name: str,
        max_batch: int = 256,
        max_queued: int | None = None,
        fail_batch_on: tuple[type[BaseException], ...] = (OperationalError,),
        on_stored: Callable[[Item, Result], None] | None = None,
        on_lost: Callable[[int], None] | None = None,
        linger_s: float = 0.0,
    ):
        if max_batch < 1 or (max_queued is not None and max_queued < 1):
            raise ValueError("max_batch and max_queued must be at least 1")
        if linger_s < 0:
            raise ValueError("linger_s must not be negative")
        self.name = name
        self._store_items = store
        self._max_batch = max_batch
        self._max_queued = max_queued
        self._fail_batch_on = fail_batch_on
        self._on_stored = on_stored
        self._on_lost = on_lost
        self._linger_s = linger_s
        self._hurry = 0  # callers of flush waiting: the thread stores without lingering
        self._queue: deque[_Entry[Item, Result]] = deque()
        self._changed = threading.Condition()  # queue, in-flight count, closed
        self._store_lock = threading.Lock()  # one transaction at a time (the thread's; callers' after close)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._in_flight = 0
        self.transactions = 0
        self.stored = 0
        self.failed = 0
        self.dropped = 0

    def submit(self, item: Item) -> Result:
        """Store ``item`` with whatever else is queued; blocks (also while the queue is full) until
        its transaction commits, then returns its result or raises its error."""
        entry: _Entry[Item, Result] = _Entry(item, waited=True)
        with self._changed:
            while not self._closed and self._max_queued is not None and len(self._queue) >= self._max_queued:
                self._changed.wait()
            closed = self._closed
            if not closed:
                self._enqueue([entry])
        if closed:
            self._store([entry])
        assert entry.done is not None
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]  # set with done when there is no error

    def put(self, items: Iterable[Item]) -> int:
        """Queue ``items`` for storage without waiting; those that do not fit in the queue are dropped,
        counted and reported to ``on_lost``. Returns how many were dropped."""
        entries: list[_Entry[Item, Result]] = [_Entry(item, waited=False) for item in items]
        with self._changed:
            closed = self._closed
            if not closed:
                room = len(entries) if self._max_queued is None else self._max_queued - len(self._queue)
                kept = entries[: max(0, room)]
                lost = len(entries) - len(kept)
                self._enqueue(kept)
                self.dropped += lost
        if closed:
            self._store(entries)
            return 0
        if lost and self._on_lost is not None:
            self._on_lost(lost)
        return lost

    def pending(self) -> int:
        """Items queued or in the batch being stored."""
        with self._changed:
            return len(self._queue) + self._in_flight

    def flush(self) -> None:
        """Wait until every item queued before this call is stored (or has failed)."""
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
            try:
                while self._queue or self._in_flight:
                    self._changed.wait()
            finally:
                self._hurry -= 1

    def close(self, timeout_s: float = 60.0) -> None:
        """Store every queued item, then stop the thread; later items are stored by their caller."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout_s)

    def _enqueue(self, entries: list[_Entry[Item, Result]]) -> None:
        """Append to the queue and wake the thread (started with the first item); holds ``_changed``."""
        if not entries:
            return
        if self._thread is None:
            name = "specroute-writer-" + self.name.replace(" ", "-")
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        was_empty = not self._queue
        self._queue.extend(entries)
        if was_empty or not self._linger_s or len(self._queue) >= self._max_batch:
            self._changed.notify_all()  # lingering, the thread needs waking only for a full batch

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                self._linger()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
                self._in_flight = len(batch)
                self._changed.notify_all()  # room for callers blocked on a full queue
            try:
                self._store(batch)
            except Exception as exc:  # a bug here must not stop the thread nor leave anyone waiting forever
                log.exception("the %s writer failed", self.name)
                for entry in batch:
                    if entry.done is not None and not entry.done.is_set():
                        entry.error = exc
                        entry.done.set()
            finally:
                with self._changed:
                    self._in_flight = 0
                    self._changed.notify_all()

    def _linger(self) -> None:
        """Wait (holding ``_changed``) up to ``linger_s`` for the queue to fill a batch, unless the writer is
        closing or someone flushes."""
        deadline = time.monotonic() + self._linger_s
        while self._queue and len(self._queue) < self._max_batch and not self._closed and not self._hurry:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.wait(left)

    def _store(self, batch: list[_Entry[Item, Result]]) -> None:
        if batch:
            with self._store_lock:
                self._store_locked(batch)

    def _store_locked(self, batch: list[_Entry[Item, Result]]) -> None:
        try:
            outcomes = list(self._store_items([e.item for e in batch]))
            if len(outcomes) != len(batch):
                raise RuntimeError(f"storing {len(batch)} {self.name} gave {len(outcomes)} outcomes")
        except Exception as exc:  # noqa: BLE001 - whatever fails the batch is its items' error
            if len(batch) == 1 or isinstance(exc, self._fail_batch_on):
                self._resolve(batch, [exc] * len(batch), batch_error=True)
                return
            log.warning(
                "a batch of %d %s failed (%s); storing them one at a time", len(batch), self.name, exc
            )
            for entry in batch:
                self._store_locked([entry])
            return
        self.transactions += 1
        self._resolve(batch, outcomes, batch_error=False)

    def _resolve(self, batch: list[_Entry[Item, Result]], outcomes: list, *, batch_error: bool) -> None:
        """Give each entry its outcome, in order: run ``on_stored`` for the stored ones, count and
        report the lost ones that nobody waits for, wake the waiters."""
        lost: list[BaseException] = []
        for entry, outcome in zip(batch, outcomes):
            if isinstance(outcome, BaseException):
                entry.error = outcome
                self.failed += 1
                if entry.done is None:
                    lost.append(outcome)
            else:
                entry.result = outcome
                self.stored += 1
                if self._on_stored is not None:
                    try:
                        self._on_stored(entry.item, outcome)
                    except Exception:  # the item is stored; a failing hook must not fail it
                        log.exception("the %s writer's on_stored hook failed", self.name)
            if entry.done is not None:
                entry.done.set()
        if lost:
            error = lost[0]
            log.error(
                "could not store %d %s: %s",
                len(lost),
                self.name,
                error,
                exc_info=(type(error), error, error.__traceback__) if batch_error else None,
            )
            if self._on_lost is not None:
                self._on_lost(len(lost))
