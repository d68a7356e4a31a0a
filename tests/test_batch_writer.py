"""The batching writer (router/serve/batch_writer.py) on its own, with an in-memory store: group commit
(everything queued while a batch is stored goes into the next one, at most ``max_batch``), queue
order, drop counting when full, per-item errors, a failed batch retried one item per transaction,
OperationalError failing the batch at once, close storing what is queued. The writer is held inside
its first transaction while the items gather, so the batches do not depend on timing."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from router.serve.batch_writer import BatchWriter


class HeldStore:
    """A store that records each batch (and the thread that stored it) and holds the writer inside
    its first call until ``release`` is set; ``outcome(item, batch)`` gives an item's result (an
    exception instance: that item's error), or raises to fail the whole batch."""

    def __init__(self, outcome=lambda item, batch: item * 10):
        self.outcome = outcome
        self.batches: list[list] = []
        self.threads: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.release.wait(30), "the test never released the writer"
        return [self.outcome(item, items) for item in items]

    def hold(self, writer: BatchWriter, first) -> None:
        """Put ``first`` and wait until the writer is inside its transaction with it."""
        writer.put([first])
        assert self.entered.wait(30)


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _submit_all(writer: BatchWriter, items: list) -> tuple[list[threading.Thread], list]:
    """Submit each item from a thread of its own, in order (each queued before the next starts);
    returns the threads and the answers list: ("ok", result) or ("error", exception) per item."""
    answers: list = [None] * len(items)

    def submit(i: int) -> None:
        try:
            answers[i] = ("ok", writer.submit(items[i]))
        except Exception as exc:  # noqa: BLE001 - the test looks at which error each caller got
            answers[i] = ("error", exc)

    threads = []
    for i in range(len(items)):
        before = writer.pending()
        threads.append(threading.Thread(target=submit, args=(i,)))
        threads[-1].start()
        _wait_until(lambda before=before: writer.pending() > before, "an item did not reach the writer")
    return threads, answers


def test_what_gathers_during_a_batch_is_the_next_batch_in_queue_order():
    store = HeldStore()
    writer = BatchWriter(store, name="numbers", max_batch=4)
    store.hold(writer, 0)
    assert writer.put(range(1, 11)) == 0
    assert writer.pending() == 11  # 1 in the held transaction, 10 queued
    store.release.set()
    writer.flush()
    assert store.batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert (writer.transactions, writer.stored, writer.failed, writer.dropped) == (4, 11, 0, 0)
    assert writer.pending() == 0
    writer.close()


def test_without_a_bound_on_the_batch_everything_queued_is_one_transaction():
    store = HeldStore()
    writer = BatchWriter(store, name="numbers", max_batch=1000)
    store.hold(writer, 0)
    writer.put(range(1, 501))
    store.release.set()
    writer.close()
    assert [len(b) for b in store.batches] == [1, 500]
    assert [i for b in store.batches for i in b] == list(range(501))
    assert writer.transactions == 2 and writer.stored == 501


def test_each_waiter_gets_its_own_result_or_its_own_error_and_hooks_run_in_order():
    def outcome(item, batch):
        return ValueError(f"bad item {item}") if item % 3 == 0 else item * 10

    store = HeldStore(outcome)
    seen: list[tuple] = []
    writer = BatchWriter(store, name="numbers", on_stored=lambda item, result: seen.append((item, result)))
    store.hold(writer, 100)
    threads, answers = _submit_all(writer, list(range(1, 8)))
    store.release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert store.batches == [[100], [1, 2, 3, 4, 5, 6, 7]]
    assert [a[0] for a in answers] == ["ok", "ok", "error", "ok", "ok", "error", "ok"]
    assert [a[1] for a in answers if a[0] == "ok"] == [10, 20, 40, 50, 70]
    assert [str(a[1]) for a in answers if a[0] == "error"] == ["bad item 3", "bad item 6"]
    assert seen == [(100, 1000), (1, 10), (2, 20), (4, 40), (5, 50), (7, 70)]  # stored items only, in order
    assert (writer.transactions, writer.stored, writer.failed) == (2, 6, 2)
    writer.close()


def test_a_failing_hook_does_not_fail_its_item():
    def hook(item, result):
        raise RuntimeError("hook")

    store = HeldStore()
    store.release.set()
    writer = BatchWriter(store, name="numbers", on_stored=hook)
    assert writer.submit(4) == 40
    assert writer.stored == 1 and writer.failed == 0
    writer.close()


def test_put_drops_and_counts_what_does_not_fit_and_never_blocks():
    store = HeldStore()
    lost: list[int] = []
    writer = BatchWriter(store, name="numbers", max_queued=3, on_lost=lost.append)
    store.hold(writer, 0)  # in the transaction: not queued any more
    assert writer.put([1, 2]) == 0
    assert writer.put([3, 4, 5, 6]) == 3  # room for one more: 3 is kept, 4, 5 and 6 are dropped
    assert writer.put([7]) == 1
    assert lost == [3, 1] and writer.dropped == 4
    store.release.set()
    writer.flush()
    assert store.batches == [[0], [1, 2, 3]]
    assert writer.put([8]) == 0  # room again
    writer.close()
    assert store.batches[-1] == [8]
    assert (writer.stored, writer.dropped, writer.failed) == (5, 4, 0)


def test_submit_waits_for_room_when_the_queue_is_full():
    store = HeldStore()
    writer = BatchWriter(store, name="numbers", max_queued=2)
    store.hold(writer, 0)
    threads, answers = _submit_all(writer, [1, 2])
    late = threading.Thread(target=lambda: answers.append(("ok", writer.submit(3))))
    late.start()
    time.sleep(0.2)  # time enough to queue, were it not full
    assert writer.pending() == 3 and late.is_alive()
    store.release.set()
    for thread in [*threads, late]:
        thread.join(timeout=30)
    assert answers == [("ok", 10), ("ok", 20), ("ok", 30)]
    assert store.batches == [[0], [1, 2], [3]] and writer.dropped == 0
    writer.close()


def test_a_batch_that_fails_as_a_whole_is_retried_one_item_per_transaction():
    def outcome(item, batch):
        if item == 3:  # the culprit: its batch fails, and alone it fails too
            raise RuntimeError("cannot store 3")
        return item * 10

    store = HeldStore(outcome)
    lost: list[int] = []
    writer = BatchWriter(store, name="numbers", on_lost=lost.append)
    store.hold(writer, 0)
    threads, answers = _submit_all(writer, [1, 2, 3, 4])
    writer.put([5, 3])  # nobody waits for these: the one that fails is counted and reported
    store.release.set()
    for thread in threads:
        thread.join(timeout=30)
    writer.flush()
    assert store.batches == [[0], [1, 2, 3, 4, 5, 3], [1], [2], [3], [4], [5], [3]]
    assert [a[0] for a in answers] == ["ok", "ok", "error", "ok"]
    assert [a[1] for a in answers if a[0] == "ok"] == [10, 20, 40]
    assert str(answers[2][1]) == "cannot store 3"
    assert (writer.transactions, writer.stored, writer.failed) == (5, 5, 2)  # the first and 4 single ones
    assert lost == [1]
    writer.close()


def test_an_operational_error_fails_the_whole_batch_at_once():
    locked = OperationalError("INSERT ...", {}, Exception("database is locked"))

    def outcome(item, batch):
        if len(batch) > 1:
            raise locked
        return item * 10

    store = HeldStore(outcome)
    lost: list[int] = []
    writer = BatchWriter(store, name="numbers", on_lost=lost.append)
    store.hold(writer, 0)
    threads, answers = _submit_all(writer, [1, 2, 3])
    writer.put([4, 5])
    store.release.set()
    for thread in threads:
        thread.join(timeout=30)
    writer.flush()
    assert store.batches == [[0], [1, 2, 3, 4, 5]]  # no retries
    assert [a[1] for a in answers] == [locked] * 3
    assert (writer.transactions, writer.stored, writer.failed) == (1, 1, 5)
    assert lost == [2]
    writer.close()


def test_a_store_giving_the_wrong_number_of_outcomes_fails_its_batch():
    writer = BatchWriter(lambda items: [1], name="numbers")  # one outcome, whatever the batch
    writer.put([1, 2])
    writer.flush()
    assert writer.stored == 2 and writer.failed == 0  # retried one by one, where one outcome is right
    writer.close()


def test_close_stores_what_is_queued_then_callers_store_their_own():
    store = HeldStore()
    writer = BatchWriter(store, name="numbers", max_batch=50)
    store.hold(writer, 0)
    writer.put(range(1, 121))
    closing = threading.Thread(target=writer.close)
    closing.start()
    store.release.set()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert [len(b) for b in store.batches] == [1, 50, 50, 20]
    assert writer.stored == 121 and writer.pending() == 0
    assert set(store.threads) == {"specroute-writer-numbers"}
    assert writer.submit(7) == 70  # after close: stored in this thread, alone
    writer.put([8, 9])
    assert store.batches[-2:] == [[7], [8, 9]]
    assert store.threads[-2:] == [threading.current_thread().name] * 2
    assert writer.stored == 124


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        BatchWriter(lambda items: items, name="numbers", max_batch=0)
    with pytest.raises(ValueError):
        BatchWriter(lambda items: items, name="numbers", max_queued=0)


def test_a_lingering_writer_stores_what_arrives_within_its_wait_in_one_transaction_and_flush_cuts_it_short():
    """Puts arriving one by one within ``linger_s`` of the first share its transaction (the decision log under
    load); a flush, or a full batch, does not wait out the linger."""
    batches: list[list[int]] = []
    writer = BatchWriter(lambda items: batches.append(list(items)) or [None] * len(items), name="numbers",
                         max_batch=50, linger_s=30.0)  # fmt: skip
    for i in range(10):  # one at a time, as requests arrive: the writer lingers on the first
        writer.put([i])
    writer.flush()  # returns at once: the flush cuts the 30 s linger short
    assert batches == [list(range(10))] and writer.transactions == 1
    writer.put(range(10, 60))  # a full batch is stored without waiting for the linger
    _wait_until(lambda: writer.stored == 60, "a full batch waited for the linger")
    assert batches[1] == list(range(10, 60))
    writer.put([60])
    writer.close()  # closing stores what lingers
    assert batches[-1] == [60] and writer.stored == 61
