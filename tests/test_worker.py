"""The run queue: atomic claims, stale runs put back, and a worker thread executing a queued run."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import select

from analyzer.db import make_session_factory, utcnow
from analyzer.models import AnalysisRun
from analyzer.prompt_sets import import_prompt_file
from analyzer.run_records import RunParams, create_run
from analyzer.worker import Worker, claim_next_run, requeue_stale


def _queue(session, n: int, target: str = "hf:/nowhere/target") -> list[int]:
    import_prompt_file(session, "q", b"hello\nworld\n", "q.txt")
    return [create_run(session, "q", target, "ngram", RunParams(max_new_tokens=4, gamma_max=2)).id for _ in range(n)]


def test_claims_are_exclusive_and_in_order(engine):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        ids = _queue(session, 3)
    assert [claim_next_run(sessions, f"w{i}") for i in range(4)] == ids + [None]
    with sessions() as session:
        assert [r.worker_id for r in session.scalars(select(AnalysisRun).order_by(AnalysisRun.id))] == ["w0", "w1", "w2"]


def test_stale_running_runs_go_back_to_the_queue(engine):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        old, fresh = _queue(session, 2)
    claim_next_run(sessions, "dead"), claim_next_run(sessions, "alive")
    with sessions() as session, session.begin():
        session.get(AnalysisRun, old).heartbeat_at = utcnow() - timedelta(minutes=30)
    assert requeue_stale(sessions, stale_after_s=600) == [old]
    with sessions() as session:
        assert session.get(AnalysisRun, old).status == "queued" and session.get(AnalysisRun, fresh).status == "running"


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
    assert run.status == "failed" and "/nowhere/target" in run.error  # the model does not exist: failed, recorded
