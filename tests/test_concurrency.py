"""Concurrent writers against a real multi-process server (``specroute serve --workers 2``): 8 client
processes post 1,000 feedback events each and the database holds exactly those events, with every
task's running totals equal to the sums sent (no lost read-modify-write updates); feedback naming a
route_id decided by the other server process is found."""

from __future__ import annotations

import http.client
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from router.orm import FeedbackEvent, TaskEstimate
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from tests.feedback_client import POSTS, TASKS, feedback_writer, post

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(engine, db_url, session, tmp_path):
    with session.begin():
        run = make_done_run(session, {t: 0.3 + 0.1 * i for i, t in enumerate(TASKS)})
        publish_policies(session, run.id)
    port = _free_port()
    env = {
        **os.environ,
        "SPECROUTE_DATABASE_URL": db_url,
        "SPECROUTE_UI_WORKER": "false",
        "OMP_NUM_THREADS": "1",
        "SPECROUTE_ROUTER_REFRESH_S": "0.5",
    }
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "webui.cli", "serve", "--port", str(port), "--workers", "2", "--threads", "4"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"the server did not start: {(tmp_path / 'server.log').read_text()}")
        time.sleep(0.3)
    try:
        yield port
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
        log.close()


@pytest.mark.slow
@pytest.mark.parallel
def test_eight_processes_of_feedback_lose_nothing(server, session):
    queue = multiprocessing.get_context("spawn").Queue()
    clients = [
        multiprocessing.get_context("spawn").Process(target=feedback_writer, args=(server, seed, queue))
        for seed in range(CLIENTS)
    ]
    for c in clients:
        c.start()
    reports = [queue.get(timeout=600) for _ in clients]
    for c in clients:
        c.join(timeout=60)
    assert [r[2] for r in reports] == [0] * CLIENTS, [r[1] for r in reports]
    sent = {t: np.sum([r[0][t] for r in reports], axis=0).tolist() for t in TASKS}
    assert sum(s[0] for s in sent.values()) == CLIENTS * POSTS
    assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == CLIENTS * POSTS
    for task in TASKS:
        stored = session.execute(
            select(
                func.count(),
                func.sum(FeedbackEvent.rounds),
                func.sum(FeedbackEvent.drafted),
                func.sum(FeedbackEvent.accepted),
            ).where(FeedbackEvent.task_type == task)
        ).one()
        assert list(stored) == sent[task], task
        estimate = session.scalar(select(TaskEstimate).where(TaskEstimate.task_type == task))
        # the read-modify-write totals: any lost update would leave them below the sums
        assert [
            estimate.events,
            estimate.total_rounds,
            estimate.total_drafted,
            estimate.total_accepted,
        ] == sent[task]


@pytest.mark.slow
@pytest.mark.parallel
def test_feedback_finds_a_decision_made_by_the_other_process(server):
    connections = [http.client.HTTPConnection("127.0.0.1", server, timeout=30) for _ in range(4)]
    for i in range(40):  # separate connections land on either process
        status, decision = post(
            connections[i % 4], "/v1/route", {"prompt": f"question {i}: what is {i} + {i}?"}
        )
        assert status == 200
        status, body = post(
            connections[(i + 1) % 4],
            "/v1/feedback",
            {"route_id": decision["route_id"], "rounds": 3, "drafted": 6, "accepted": 4},
        )
        assert status == 200, body
