"""Background jobs of the web UI stop with their server: closing cancels a running job at its next
progress line, so no job goes on computing after its app is gone (a classifier's cross-validation left
running beside the next test crashed the interpreter, llama.cpp and scipy computing at once)."""

from __future__ import annotations

import threading
import time

from webui.background import BackgroundJobs


def test_closing_cancels_a_running_job_at_its_next_progress_line_and_waits_for_it():
    jobs, started, steps = BackgroundJobs(), threading.Event(), []

    def endless(progress) -> str:
        started.set()
        while True:  # a job that would never end alone
            steps.append(1)
            progress(f"step {len(steps)}")
            time.sleep(0.01)

    assert jobs.start("train", endless)
    assert started.wait(5)
    before = time.monotonic()
    jobs.close(timeout_s=10)
    assert time.monotonic() - before < 5  # it stopped at its next progress line, not at the timeout
    state = jobs.state("train")
    assert state is not None and not state.running
    assert state.error == "cancelled: the server shut down before it ended; nothing was stored"
    count = len(steps)
    time.sleep(0.05)
    assert len(steps) == count  # nothing runs any more
    assert not jobs._threads["train"].is_alive()


def test_a_job_that_ends_keeps_its_outcome_and_close_returns_at_once():
    jobs = BackgroundJobs()
    assert jobs.start("suggest:x", lambda progress: "done")
    jobs.wait("suggest:x", 5)
    before = time.monotonic()
    jobs.close()
    assert time.monotonic() - before < 1
    assert jobs.state("suggest:x").message == "done"
