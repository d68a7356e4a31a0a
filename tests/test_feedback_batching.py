"""Group commit of feedback (router/serve/feedback_writer.py): events posted concurrently to one app are
stored in fewer transactions than events, each exactly once, with every task's estimate equal to
applying the stored events one after the other in their stored order and each answer the estimate
right after its own event; a bad event in a batch fails alone with its own 4xx. On SQLite and on
PostgreSQL. The writer is held at the database's write lock while the events gather, so the batches
do not depend on timing."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import router.serve.feedback_writer
from analyzer.db import lock_for_write, make_engine
from router.decide.adaptation import AdaptationConfig, apply_feedback, initial_state
from router.decide.feedback import policy_context
from router.decide.route_ids import new_route_id
from router.orm import FeedbackEvent, TaskEstimate
from tests.factories import make_routing_database
from webui.app import create_app

TASKS = ("code", "qa")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """A routing database (tests.factories.make_routing_database) on a SQLite file, or in a fresh
    database of the session's throw-away PostgreSQL server."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'batch.db'}"
        make_routing_database(url).dispose()
        yield url
        return
    server_url = request.getfixturevalue("postgres_url")
    name = f"batch_{uuid.uuid4().hex[:12]}"
    admin = make_engine(server_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    make_routing_database(url).dispose()
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def app(database_url):
    app = create_app(
        {
            "database_url": database_url,
            "router_refresh_s": 0,
            "ui_worker": False,
            "TESTING": True,
            "sqlite_busy_timeout_ms": 60_000,
        }
    )
    yield app
    app.extensions["specroute.close"]()


def _counts(i: int) -> dict:
    rounds = 5 + i % 7
    drafted = 3 * rounds + i
    return {"rounds": rounds, "drafted": drafted, "accepted": (drafted * (i % 5)) // 5}


def _post_while_locked(app, groups: list[list[dict]]) -> list[tuple[int, dict]]:
    """Post each group's bodies from threads of their own while another transaction holds the write
    lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: every estimate row FOR UPDATE), waiting after each group
    until all of its events are with the writer; then let go. Returns (status, JSON) per body, in order."""
    writer = app.extensions["specroute.router"].feedback_writer
    bodies = [b for group in groups for b in group]
    answers: list[tuple[int, dict] | None] = [None] * len(bodies)

    def post(i: int) -> None:
        response = app.test_client().post("/v1/feedback", json=bodies[i])
        answers[i] = (response.status_code, response.get_json())

    threads = []
    with Session(app.extensions["specroute.engine"]) as blocker:
        lock_for_write(blocker)
        assert len(blocker.scalars(select(TaskEstimate).with_for_update()).all()) == len(TASKS)
        for group in groups:
            for _ in group:
                threads.append(threading.Thread(target=post, args=(len(threads),)))
                threads[-1].start()
            deadline = time.monotonic() + 30
            while writer.pending() < len(threads):
                assert time.monotonic() < deadline, "the events did not reach the writer"
                time.sleep(0.01)
        blocker.rollback()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def _replay(session, task: str) -> list:
    """The task's states after each of its stored events, applied one after the other in id order."""
    context = policy_context(session)
    policy, config = context.policy(task), AdaptationConfig()
    state = initial_state(policy.alpha_mean, policy.speculate, policy.gamma, config)
    curve = policy.curve(context.contract, context.cost)  # the policy's own curve, priced by the set's cost
    states = []
    for e in session.scalars(
        select(FeedbackEvent).where(FeedbackEvent.task_type == task).order_by(FeedbackEvent.id)
    ):
        state = apply_feedback(state, e.rounds, e.drafted, e.accepted, curve, config)
        states.append(state)
    return states


def test_concurrent_feedback_is_committed_in_batches_and_a_bad_event_fails_alone(app):
    service = app.extensions["specroute.router"]
    writer = service.feedback_writer
    client = app.test_client()
    for task in TASKS:  # the estimate rows exist, so that the blocker can lock them on PostgreSQL too
        assert client.post("/v1/feedback", json={"task_type": task, **_counts(0)}).status_code == 200
    version, key = service.router.policy_version, service.config.route_key  # ids signed as the server signs
    commits = []
    event.listen(app.extensions["specroute.engine"], "commit", lambda connection: commits.append(1))
    transactions_before = writer.transactions
    good = [
        {"task_type": TASKS[i % 2], **_counts(i)}
        if i % 3
        else {"route_id": new_route_id(version, TASKS[i % 2], key), **_counts(i)}
        for i in range(1, 41)
    ]
    bad = [
        {"task_type": "astrology", **_counts(1)},
        {"route_id": new_route_id(version + 7, "code", key), **_counts(2)},
    ]
    answers = _post_while_locked(app, [good[:20], bad + good[20:]])

    assert [status for status, _ in answers] == [200] * 20 + [400, 404] + [200] * 20
    assert answers[20][1]["error"]["code"] == "invalid_feedback"
    assert answers[20][1]["error"]["message"].startswith("unknown task_type 'astrology'")
    assert answers[21][1]["error"] == {
        "code": "unknown_route_id",
        "details": {},
        "message": f"unknown route_id '{bad[1]['route_id']}': policy set v{version + 7} does not exist",
    }
    # 42 events (40 stored): the first batch took what had reached the writer, the second all the rest
    transactions = writer.transactions - transactions_before
    assert 1 <= transactions <= 2 and len(commits) == transactions

    ok = [body["estimate"] for status, body in answers if status == 200]
    sent = [b for b in good]
    with Session(app.extensions["specroute.engine"]) as session:
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == len(TASKS) + 40
        assert (
            session.scalar(
                select(func.count()).select_from(FeedbackEvent).where(FeedbackEvent.task_type == "astrology")
            )
            == 0
        )
        for task in TASKS:
            mine = sorted((e for e in ok if e["task_type"] == task), key=lambda e: e["events"])
            bodies = [b for b in sent if b.get("task_type", b.get("route_id", "").rsplit("-", 1)[-1]) == task]
            assert [e["events"] for e in mine] == list(range(2, len(bodies) + 2))  # each event applied once
            states = _replay(session, task)
            assert len(states) == len(bodies) + 1
            for answer in mine:  # each answer is the estimate right after its own event, in stored order
                after = states[answer["events"] - 1]
                assert answer["alpha"] == pytest.approx(
                    after.beta_a / (after.beta_a + after.beta_b), rel=1e-12
                )
                assert (answer["total_drafted"], answer["gamma"], answer["speculate"]) == (
                    after.total_drafted,
                    after.gamma,
                    after.speculate,
                )
            stored = session.scalar(select(TaskEstimate).where(TaskEstimate.task_type == task))
            final = states[-1]
            assert (
                stored.total_drafted
                == _counts(0)["drafted"] + sum(b["drafted"] for b in bodies)
                == final.total_drafted
            )
            assert (stored.events, stored.gamma, stored.speculate) == (
                final.events,
                final.gamma,
                final.speculate,
            )
            assert (stored.beta_a, stored.beta_b) == pytest.approx((final.beta_a, final.beta_b), rel=1e-12)
            assert service.router.states[task].events == final.events  # the serving Router took the last one

    service.close()  # the writer's thread stops; feedback after that is stored by its caller
    assert (
        client.post("/v1/feedback", json={"task_type": "qa", **_counts(3)}).get_json()["estimate"]["events"]
        == 22
    )


def test_a_batch_that_fails_as_a_whole_is_stored_one_event_at_a_time(app, monkeypatch):
    real = router.serve.feedback_writer.record_feedback_batch

    def fails_for_batches(session, items, config=None):
        if len(items) > 1:
            real(session, items, config)  # writes, then fails: the transaction must roll all of it back
            raise RuntimeError("simulated failure of a whole batch")
        return real(session, items, config)

    client = app.test_client()
    for task in TASKS:
        assert client.post("/v1/feedback", json={"task_type": task, **_counts(0)}).status_code == 200
    monkeypatch.setattr(router.serve.feedback_writer, "record_feedback_batch", fails_for_batches)
    writer = app.extensions["specroute.router"].feedback_writer
    before = writer.transactions
    bodies = [{"task_type": TASKS[i % 2], **_counts(i)} for i in range(1, 11)]
    answers = _post_while_locked(app, [bodies[:5], bodies[5:]])
    assert [status for status, _ in answers] == [200] * 10
    assert writer.transactions - before == 10  # every event stored again in its own transaction
    with Session(app.extensions["specroute.engine"]) as session:
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 12
        for task in TASKS:
            stored = session.scalar(select(TaskEstimate).where(TaskEstimate.task_type == task))
            assert stored.events == 6
            assert (
                stored.total_drafted
                == sum(b["drafted"] for b in bodies if b["task_type"] == task) + _counts(0)["drafted"]
            )
