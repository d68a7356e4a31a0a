"""The web UI's background jobs on the database: one job per key across server processes,
progress and outcome visible from any of them, a job stopped by its server's shutdown queued again and run to
the end by the next worker, and one whose process died taken over once its heartbeat is stale. Closing still
stops a running job at its next progress line, so no job goes on computing after its app is gone (a
classifier's cross-validation left running beside the next test crashed the interpreter)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from analyzer.db import make_session_factory, utcnow
from analyzer.errors import SpecrouteError
from router.orm import BackgroundJob
from router.serve import jobs as jobs_module
from router.serve.jobs import INTERRUPTED, claim_job, queue_job, run_next_job
from webui.background import BackgroundJobs


@pytest.fixture
def sessions(engine):
    return make_session_factory(engine)


@pytest.fixture
def steps(monkeypatch) -> dict[str, list]:
    """Test kinds of job: "count" counts to its ``n`` (a progress line each, waiting on ``gate`` first when
    given), "refuse" raises a SpecrouteError; each step appended to ``steps[kind]``."""
    seen: dict[str, list] = {"count": [], "refuse": []}
    gate = threading.Event()

    def count(sessions, params, progress) -> str:
        for i in range(params["n"]):
            if params.get("gate"):
                gate.wait(10)
            seen["count"].append(i)
            progress(f"step {i + 1} of {params['n']}")
            time.sleep(params.get("sleep", 0))
        return f"counted to {params['n']}"

    def refuse(sessions, params, progress) -> str:
        seen["refuse"].append(1)
        raise SpecrouteError("no labels to train on")

    monkeypatch.setitem(jobs_module.RUNNERS, "count", count)
    monkeypatch.setitem(jobs_module.RUNNERS, "refuse", refuse)
    seen["gate"] = [gate]
    return seen


def _rows(sessions) -> list[tuple[str, str, int]]:
    with sessions() as session:
        return [
            (j.key, j.status, j.attempts)
            for j in session.scalars(select(BackgroundJob).order_by(BackgroundJob.id))
        ]


def test_one_job_per_key_across_processes_and_its_outcome_is_seen_by_all(sessions, steps):
    first, second = BackgroundJobs(sessions), BackgroundJobs(sessions)  # two server processes, one database
    assert first.start("train", "count", {"n": 3, "gate": True})
    assert not second.start("train", "count", {"n": 1})  # the other process refuses a second one
    assert second.start("suggest:x", "count", {"n": 1})  # another key runs beside it
    second.wait("suggest:x", 10)
    running = second.state("train")
    assert running is not None and running.running  # the other process sees it running
    steps["gate"][0].set()
    first.wait("train", 10)
    assert second.state("train").message == "counted to 3" and not second.state("train").running
    assert _rows(sessions) == [("train", "done", 1), ("suggest:x", "done", 1)]
    assert first.start("train", "refuse", {})  # the key is free again once it ended
    first.wait("train", 10)
    refused = second.state("train")
    assert refused.error == "no labels to train on" and refused.message is None
    first.close()
    second.close()


def test_closing_stops_a_job_at_its_next_line_and_the_next_worker_runs_it_from_the_start(sessions, steps):
    server = BackgroundJobs(sessions)
    assert server.start("train", "count", {"n": 200, "sleep": 0.01})
    deadline = time.monotonic() + 10
    while not steps["count"] and time.monotonic() < deadline:
        time.sleep(0.01)
    server.close(timeout_s=10)
    # it stopped at a progress line: a job that went on would count all 200 steps (2 s of sleeps) well within
    # close's 10 s wait
    stopped = len(steps["count"])
    assert 0 < stopped < 200
    time.sleep(0.05)
    assert len(steps["count"]) == stopped  # nothing runs any more
    state = BackgroundJobs(sessions).state("train")
    assert state.running and state.progress == INTERRUPTED  # queued again, not lost
    assert _rows(sessions) == [("train", "queued", 1)]
    # after the restart, a worker takes it and runs it from the start to the end
    assert run_next_job(sessions, "host:2:thread", stale_after_s=600)
    assert steps["count"][stopped:] == list(range(200))
    assert BackgroundJobs(sessions).state("train").message == "counted to 200"
    assert _rows(sessions) == [("train", "done", 2)]
    assert not run_next_job(sessions, "host:2:thread", stale_after_s=600)  # nothing left


def test_a_job_whose_process_died_is_taken_over_once_its_heartbeat_is_stale(sessions, steps):
    job_id = queue_job(sessions, "train", "count", {"n": 2}, stale_after_s=600)
    assert claim_job(sessions, "host:1:web", stale_after_s=600, job_id=job_id) == job_id  # then kill -9
    assert queue_job(sessions, "train", "count", {"n": 1}, stale_after_s=600) is None  # still held
    assert not run_next_job(sessions, "host:2:thread", stale_after_s=600)  # its heartbeat is fresh
    with sessions() as session, session.begin():
        session.get(BackgroundJob, job_id).heartbeat_at = utcnow() - timedelta(seconds=700)
    assert run_next_job(sessions, "host:2:thread", stale_after_s=600)  # stale: taken over
    assert steps["count"] == [0, 1]
    with sessions() as session:
        job = session.get(BackgroundJob, job_id)
        assert (job.status, job.worker_id, job.attempts, job.message) == (
            "done",
            "host:2:thread",
            2,
            "counted to 2",
        )
    # a stale running job does not block a new one either: it is failed with the reason first
    other = queue_job(sessions, "suggest:x", "count", {"n": 1}, stale_after_s=600)
    claim_job(sessions, "host:1:web", stale_after_s=600, job_id=other)
    with sessions() as session, session.begin():
        session.get(BackgroundJob, other).heartbeat_at = utcnow() - timedelta(seconds=700)
    assert queue_job(sessions, "suggest:x", "count", {"n": 1}, stale_after_s=600) is not None
    with sessions() as session:
        failed = session.get(BackgroundJob, other)
        assert failed.status == "failed" and "host:1:web" in failed.error
    with pytest.raises(ValueError, match="unknown job kind 'nope'"):
        queue_job(sessions, "x", "nope", {}, stale_after_s=600)


def test_the_worker_loop_takes_a_queued_job_when_no_run_waits(sessions, steps, tmp_path):
    from analyzer.analysis.worker import work

    queue_job(sessions, "train", "count", {"n": 2}, stale_after_s=600)  # left queued by a server that stopped
    work(
        sessions, cache_dir=tmp_path, worker_id="host:3:cli", once=True, poll_s=0.01,
        also=lambda worker_id: run_next_job(sessions, worker_id, stale_after_s=600),
    )  # fmt: skip
    assert steps["count"] == [0, 1] and _rows(sessions) == [("train", "done", 1)]
    assert BackgroundJobs(sessions).state("train").message == "counted to 2"


def _queue_racing(sessions, monkeypatch) -> list[int | None]:
    """Queue "train" twice where the second process read the key's jobs before the first one's committed (it
    saw none): the database's unique index over the active jobs refuses the second."""
    first = queue_job(sessions, "train", "train", {}, stale_after_s=60)
    with monkeypatch.context() as racing:
        racing.setattr(jobs_module, "_active", lambda session, key: [])  # the racing read saw no job yet
        second = queue_job(sessions, "train", "train", {}, stale_after_s=60)
    return [first, second]


def test_two_processes_queueing_one_key_at_once_get_one_job(sessions, monkeypatch):
    first, second = _queue_racing(sessions, monkeypatch)
    assert first is not None and second is None and _rows(sessions) == [("train", "queued", 0)]
    assert queue_job(sessions, "suggest:1", "suggest", {"set": 1}, stale_after_s=60) is not None  # other keys


def test_a_job_another_worker_is_claiming_is_skipped_and_one_key_queued_once_on_postgresql(
    postgres_url, monkeypatch
):
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.factories import make_routing_database

    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    name = f"jobs_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    make_routing_database(url).dispose()
    # a claim that waited on a locked row would fail here after 2 s instead of hanging the test
    engine = create_engine(url, connect_args={"options": "-c lock_timeout=2000"})
    try:
        sessions = make_session_factory(engine)
        first = queue_job(sessions, "train", "train", {}, stale_after_s=60)
        second = queue_job(sessions, "suggest", "suggest", {}, stale_after_s=60)
        # two processes queueing "train" at once: reading the active jobs locks nothing here, the index refuses
        with monkeypatch.context() as racing:
            racing.setattr(jobs_module, "_active", lambda session, key: [])
            assert queue_job(sessions, "train", "train", {}, stale_after_s=60) is None
        assert _rows(sessions) == [("train", "queued", 0), ("suggest", "queued", 0)]
        with engine.connect() as claiming:  # another worker in the middle of claiming the oldest job
            claiming.execute(select(BackgroundJob.id).where(BackgroundJob.id == first).with_for_update())
            assert claim_job(sessions, "this worker", stale_after_s=60) == second
            claiming.rollback()
        assert claim_job(sessions, "this worker", stale_after_s=60) == first  # released: taken next
    finally:
        engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()
