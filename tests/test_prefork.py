"""``specroute serve --workers 2`` as a real subprocess (gunicorn, webui/prefork.py) on a SQLite file:
the port 0 it printed answers; each worker process answers on its own; a worker killed with SIGKILL
is replaced while the server keeps answering, and the analysis worker thread, which runs in exactly
one process, moves to the replacement; after a reload (SIGHUP) one of the new processes runs it;
SIGTERM stops every process with exit status 0; each process is served by waitress (webui.prefork.WaitressWorker)
as one process is: its Server header, and a chunked body over the size limit gets 413."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from analyzer.analysis.run_records import RunParams, create_run
from analyzer.db import lock_for_write, make_session_factory
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_sets import import_prompt_file
from tests.factories import make_routing_database

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the process tree from /proc"
)

ROOT = Path(__file__).resolve().parent.parent
API_LIMIT = 4096
SERVING = re.compile(r"specroute serving on http://127\.0\.0\.1:(\d+) \(2 threads, 2 processes\)")


class Served:
    """The server process, its port and log, and the database it serves."""

    def __init__(self, process: subprocess.Popen, port: int, log: Path, sessions, missing_model: Path):
        self.process, self.port, self.log, self.sessions = process, port, log, sessions
        self.missing_model = missing_model

    def workers(self) -> set[int]:
        pid = self.process.pid
        return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}

    def wait_for_workers(self, condition, timeout_s: float = 60.0) -> set[int]:
        deadline = time.monotonic() + timeout_s
        while True:
            workers = self.workers()
            if len(workers) == 2 and condition(workers):
                return workers
            assert time.monotonic() < deadline, f"workers {workers}; log:\n{self.log.read_text()}"
            time.sleep(0.05)

    def request(self, method: str, path: str, payload: dict | None = None, *, chunked: bool = False) -> int:
        """One request on a new connection (so any live worker may take it); the status. ``chunked``:
        the body in two chunks, with no Content-Length."""
        body = None if payload is None else json.dumps(payload).encode()
        if chunked:
            body = iter([body[: len(body) // 2], body[len(body) // 2 :]])
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(
                method, path, body=body, headers={"Content-Type": "application/json"}, encode_chunked=chunked
            )
            response = connection.getresponse()
            self.last_body, self.last_server = response.read(), response.getheader("Server")
            return response.status
        finally:
            connection.close()

    def route(self) -> int:
        return self.request(
            "POST", "/v1/route", {"prompt": "def f(x): return x + 1  # fix this python function"}
        )

    def queue_runs(self, count: int) -> list[int]:
        """Runs whose target does not exist: a worker claims one (its pid goes in worker_id) and fails it."""
        with self.sessions() as session, session.begin():
            lock_for_write(
                session
            )  # the servers write too: wait for their transactions, not a stale snapshot
            return [
                create_run(
                    session,
                    "p",
                    f"hf:{self.missing_model}",
                    "ngram",
                    RunParams(max_new_tokens=4, gamma_max=2),
                ).id
                for _ in range(count)
            ]

    def claimed_by(self, run_ids: list[int], timeout_s: float = 120.0) -> list[int]:
        """The pid of the process whose analysis thread took each run, once every one has finished."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.sessions() as session:
                runs = list(
                    session.scalars(
                        select(AnalysisRun).where(AnalysisRun.id.in_(run_ids)).order_by(AnalysisRun.id)
                    )
                )
            if all(r.status in ("done", "failed") for r in runs):
                return [int(r.worker_id.split(":")[-2]) for r in runs]
            assert time.monotonic() < deadline, [(r.id, r.status, r.worker_id) for r in runs]
            time.sleep(0.2)

    def stop(self) -> int:
        """SIGTERM; the exit status, once the process has ended."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
def served(db_url, tmp_path):
    engine = make_routing_database(db_url)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        import_prompt_file(session, "p", b"say hello\nsay goodbye", "p.txt")
    env = {
        **os.environ,
        "SPECROUTE_DATABASE_URL": db_url,
        "SPECROUTE_UI_WORKER": "true",
        "OMP_NUM_THREADS": "1",
        "SPECROUTE_API_MAX_BODY_BYTES": str(API_LIMIT),
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "webui.cli", "serve", "--port", "0", "--workers", "2", "--threads", "2"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while not (found := SERVING.search(log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        server = Served(process, int(found.group(1)), log, sessions, tmp_path / "no-such-model")
        while True:  # the printed port is the real one: it answers
            try:
                if server.request("GET", "/healthz") == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        engine.dispose()


def _wait_until_stopped(pid: int) -> None:
    """Until every thread of ``pid`` has stopped: kill() only queues SIGSTOP, and a thread still running
    may accept the next connection first (its client then waits for an answer that never comes)."""
    deadline = time.monotonic() + 10
    while True:
        states = {
            Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
            for t in os.listdir(f"/proc/{pid}/task")
        }
        if states <= {"T", "t"}:
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.01)


def _assert_gone(pids: set[int]) -> None:
    """No process left behind: the arbiter reaped every worker before it exited."""
    deadline = time.monotonic() + 5
    while (alive := {pid for pid in pids if Path(f"/proc/{pid}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: gunicorn's workers, their replacement and the queue's claims
def test_each_worker_answers_a_killed_one_is_replaced_and_sigterm_stops_all(served):
    first = served.wait_for_workers(lambda w: True)
    for answering in first:  # the other paused: every answer comes from this process
        paused = first - {answering}
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
            _wait_until_stopped(pid)
        try:
            statuses = [served.route() for _ in range(5)] + [served.request("GET", "/healthz")]
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        assert statuses == [200] * 6, answering
        assert (
            served.last_server == "specroute"
        )  # waitress' ident, as with one process (gunicorn's: "gunicorn")

    # two runs queued at once: the second would go to another process if two ran an analysis thread
    holder = set(served.claimed_by(served.queue_runs(2)))
    assert len(holder) == 1 and holder <= first
    (holder,) = holder

    os.kill(holder, signal.SIGKILL)
    deadline = time.monotonic() + 60
    answered = []
    while True:  # the other process answers while the arbiter forks a replacement
        answered.append(served.route())
        if len(workers := served.workers()) == 2 and holder not in workers:
            break
        assert time.monotonic() < deadline, served.log.read_text()
    replacement = workers - first
    assert set(answered) == {200} and len(replacement) == 1 and workers - replacement == first - {holder}
    assert served.route() == 200

    assert set(served.claimed_by(served.queue_runs(2))) == replacement  # the analysis thread moved over

    assert served.stop() == 0
    _assert_gone(first | workers)


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: gunicorn's workers, their replacement and the queue's claims
def test_after_a_reload_one_new_worker_runs_the_analysis_thread(served):
    old = served.wait_for_workers(lambda w: True)
    assert len(set(served.claimed_by(served.queue_runs(1)))) == 1
    os.kill(served.process.pid, signal.SIGHUP)  # new workers start, then the old ones stop
    new = served.wait_for_workers(lambda w: not w & old)
    claimed = set(served.claimed_by(served.queue_runs(2)))
    assert len(claimed) == 1 and claimed <= served.workers() and not claimed & old
    assert served.route() == 200
    assert served.stop() == 0
    _assert_gone(old | new | claimed)


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: gunicorn's workers, their replacement and the queue's claims
def test_a_chunked_body_is_measured_like_one_with_a_length(served):
    # waitress reads a chunked body whole and gives the app its length, so the app's size limits answer 413;
    # gunicorn's own workers stream it, and the app would read it up to its limit and answer 400 (a JSON
    # document cut short) instead
    requests = {
        "/v1/route": {"prompt": "def f(x): return x + 1"},  # the fast path
        "/v1/feedback": {"task_type": "code", "rounds": 2, "drafted": 4, "accepted": 1},
    }  # Flask's view
    for path, payload in requests.items():
        assert served.request("POST", path, payload, chunked=True) == 200, served.last_body
        for chunked in (True, False):
            assert (
                served.request("POST", path, {**payload, "padding": " " * API_LIMIT}, chunked=chunked) == 413
            )
            assert json.loads(served.last_body)["error"]["code"] == "body_too_large"
    assert served.stop() == 0
