"""The run queue: chunks claimed once each and in order, stale chunks claimed again, a run finished
once, and a worker thread executing a queued run."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import select

from analyzer.analysis.chunks import ClaimedChunk, chunk_progress, claim_chunk, complete, renew
from analyzer.analysis.run_records import RunParams, create_run
from analyzer.analysis.worker import Worker
from analyzer.db import make_session_factory, utcnow
from analyzer.orm import AnalysisRun, RunChunk
from analyzer.prompts.prompt_sets import import_prompt_file


def _queue(session, n: int, target: str = "hf:/nowhere/target", **params) -> list[int]:
    import_prompt_file(session, "q", b"hello\nworld\n", "q.txt")
    return [
        create_run(session, "q", target, "ngram", RunParams(max_new_tokens=4, gamma_max=2, **params)).id
        for _ in range(n)
    ]


def _claims(sessions, workers: list[str]) -> list[tuple[int, str] | None]:
    claimed = [claim_chunk(sessions, w) for w in workers]
    return [(c.run_id, c.kind) if c else None for c in claimed]


def test_chunks_are_claimed_once_each_in_order_and_the_run_finishes_once(engine):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        first, second = _queue(session, 2, chunk_size=1, validate=1)
    # each run: its profile first (the measurements wait for it), one chunk per prompt, then validation
    assert _claims(sessions, ["w0", "w1", "w2"]) == [(first, "profile"), (second, "profile"), None]
    with sessions() as session:
        chunks = list(
            session.scalars(select(RunChunk).where(RunChunk.run_id == first).order_by(RunChunk.position))
        )
        assert [(c.kind, c.prompt_ids, c.status) for c in chunks] == [
            ("profile", [], "claimed"),
            ("measure", [1], "pending"),
            ("measure", [2], "pending"),
            ("validate", [], "pending"),
        ]
        assert session.get(AnalysisRun, first).status == "running" and chunks[0].worker_id == "w0"
    profile = ClaimedChunk(chunks[0].id, first, 0, "profile", (), 4)
    assert not complete(sessions, profile, "w0")
    measured = [claim_chunk(sessions, w) for w in ("w3", "w4")]
    assert [(c.kind, c.prompt_ids) for c in measured] == [("measure", (1,)), ("measure", (2,))]
    assert claim_chunk(sessions, "w5") is None  # validation waits for both measurements
    assert not complete(sessions, measured[0], "w3") and not complete(sessions, measured[1], "w4")
    validation = claim_chunk(sessions, "w5")
    assert validation.kind == "validate"
    assert complete(sessions, validation, "w5") and not complete(sessions, validation, "w5")  # finished once
    with sessions() as session:
        run = session.get(AnalysisRun, first)
        assert run.status == "done" and run.finished_at is not None
        assert chunk_progress(session, first) == {"chunks": 4, "done": 4, "claimed": 0, "workers": 4}


def test_a_run_whose_stored_parameters_cannot_be_read_fails_alone(engine):
    """A run row edited by hand to a parameter of the wrong type fails with the words of the one parser
    of run inputs; the other queued run is claimed as usual (the bad row once stopped every claim)."""
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        broken, fine = _queue(session, 2)
        session.get(AnalysisRun, broken).params = {"max_new_tokens": "lots", "gamma_max": 2}
    assert _claims(sessions, ["w0"]) == [(fine, "profile")]
    with sessions() as session:
        run = session.get(AnalysisRun, broken)
        assert run.status == "failed" and run.finished_at is not None
        assert (
            run.error.startswith("its stored parameters cannot be read: ") and "max_new_tokens" in run.error
        )
        assert session.scalars(select(RunChunk).where(RunChunk.run_id == broken)).all() == []


def test_a_chunk_whose_worker_stopped_is_claimed_again_and_the_old_worker_lets_go(engine):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run_id = _queue(session, 1)[0]
    held = claim_chunk(sessions, "dead")
    assert claim_chunk(sessions, "alive", stale_after_s=600) is None  # the profile is held, not stale
    assert renew(sessions, held, "dead")
    with sessions() as session, session.begin():
        session.get(RunChunk, held.id).heartbeat_at = utcnow() - timedelta(minutes=30)
    again = claim_chunk(sessions, "alive", stale_after_s=600)
    assert (again.id, again.run_id) == (held.id, run_id)
    assert not renew(sessions, held, "dead") and renew(sessions, again, "alive")
    with sessions() as session:
        assert session.get(RunChunk, held.id).attempts == 2


def test_worker_thread_executes_a_queued_run_and_records_its_failure(engine, tmp_path):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run_id = _queue(session, 1)[0]
    worker = Worker(sessions, cache_dir=tmp_path, poll_s=0.05).start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with sessions() as session:
                run = session.get(AnalysisRun, run_id)
                if run.status not in ("queued", "running"):
                    break
            time.sleep(0.05)
    finally:
        worker.stop()
    assert (
        run.status == "failed" and "/nowhere/target" in run.error
    )  # the model does not exist: failed, recorded


def test_a_long_profile_or_validation_renews_its_chunks_heartbeat_as_it_reports_progress(engine):
    from analyzer.analysis.chunks import HEARTBEAT_EVERY_S, renewing_heartbeat

    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        _queue(session, 1)
    held = claim_chunk(sessions, "w0")
    assert held.kind == "profile"
    old = utcnow() - timedelta(minutes=30)

    def heartbeat():
        with sessions() as session:
            return session.get(RunChunk, held.id).heartbeat_at.replace(tzinfo=None)

    with sessions() as session, session.begin():
        session.get(RunChunk, held.id).heartbeat_at = old
    now = {"s": 0.0}
    reported = []
    report = renewing_heartbeat(sessions, held, "w0", lambda *a: reported.append(a), clock=lambda: now["s"])
    report(5, 300, "machine busy: waiting")
    assert heartbeat() == old.replace(tzinfo=None)  # not yet due
    now["s"] = HEARTBEAT_EVERY_S
    report(35, 300, "machine busy: waiting")
    assert heartbeat() > old.replace(tzinfo=None) + timedelta(minutes=29)
    assert claim_chunk(sessions, "w1", stale_after_s=600) is None  # so nobody takes it over
    assert reported == [(5, 300, "machine busy: waiting"), (35, 300, "machine busy: waiting")]
