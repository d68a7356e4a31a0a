"""Crash safety: ``kill -9`` the process analysing a run mid-way; the run is shown as interrupted once
its heartbeat is stale, a worker claims its chunk again, finishes it, and the prompts finished before the
kill keep their results exactly, never duplicated (one row per run and prompt)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from analyzer.analysis.run_records import RunParams, create_run, shown_status
from analyzer.analysis.worker import work
from analyzer.db import make_session_factory, utcnow
from analyzer.orm import AnalysisRun, GammaCount, PromptResult, RunChunk
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.settings import STALE_AFTER_S
from tests.tiny_tokenizer import save_tiny_model_folder
from webui.cli import cli

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = 120


def _results(sessions, run_id: int) -> dict[int, tuple]:
    with sessions() as session:
        rows = session.scalars(select(PromptResult).where(PromptResult.run_id == run_id))
        return {
            r.prompt_id: (
                r.id,
                r.output_tokens,
                tuple(r.draft_matches),
                tuple(
                    (c.gamma, c.rounds, c.drafted, c.accepted)
                    for c in sorted(r.gamma_counts, key=lambda c: c.gamma)
                ),
            )
            for r in rows
        }


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: it kills after the 10th of 120 prompts and checks what was kept
def test_kill_9_mid_analysis_then_resume(engine, db_url, tmp_path):
    sessions = make_session_factory(engine)
    target = save_tiny_model_folder(tmp_path / "tiny", seed=2)
    lines = "\n".join(
        f"question {i}: say the numbers from {i} to {i + 9}, then say them again" for i in range(PROMPTS)
    )
    with sessions() as session, session.begin():
        import_prompt_file(session, "many", lines.encode(), "many.txt")
        run_id = create_run(
            session, "many", f"hf:{target}", "ngram", RunParams(max_new_tokens=24, gamma_max=4)
        ).id
    env = {**os.environ, "SPECROUTE_DATABASE_URL": db_url, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "webui.cli", "analyze", "--resume", str(run_id)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    done = 0
    while time.monotonic() < deadline and process.poll() is None:
        with sessions() as session:
            done = session.get(AnalysisRun, run_id).progress_done
        if done >= 10:
            break
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()[-2000:]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    before = _results(sessions, run_id)
    assert 10 <= len(before) < PROMPTS  # killed in the middle
    with sessions() as session:
        run = session.get(AnalysisRun, run_id)
        assert run.status == "running" and shown_status(run) == "running"  # the heartbeat is still fresh
        assert shown_status(run, now=utcnow() + timedelta(seconds=STALE_AFTER_S - 60)) == "running"
        assert shown_status(run, now=utcnow() + timedelta(seconds=STALE_AFTER_S + 60)) == "interrupted"
    with sessions() as session, session.begin():  # time passes: the dead worker's heartbeats go stale
        session.get(AnalysisRun, run_id).heartbeat_at = utcnow() - timedelta(minutes=15)
        for chunk in session.scalars(
            select(RunChunk).where(RunChunk.run_id == run_id, RunChunk.status == "claimed")
        ):
            chunk.heartbeat_at = utcnow() - timedelta(minutes=15)
    listed = CliRunner(env={"SPECROUTE_DATABASE_URL": db_url}).invoke(
        cli, ["runs", "list", "--json"], catch_exceptions=False
    )
    assert [r["status"] for r in json.loads(listed.output) if r["id"] == run_id] == ["interrupted"]
    finished = []  # another worker claims the dead one's chunk and the ones left, and finishes the run
    work(sessions, cache_dir=tmp_path / "cache", worker_id="second", once=True, on_run=finished.append)
    assert finished == [run_id]
    after = _results(sessions, run_id)
    with sessions() as session:
        run = session.get(AnalysisRun, run_id)
        assert run.status == "done" and run.progress_done == PROMPTS
        assert (
            session.scalar(
                select(func.count()).select_from(PromptResult).where(PromptResult.run_id == run_id)
            )
            == PROMPTS
        )
        assert (
            session.scalar(
                select(func.count(func.distinct(PromptResult.prompt_id))).where(PromptResult.run_id == run_id)
            )
            == PROMPTS
        )
        assert (
            session.scalar(
                select(func.count())
                .select_from(GammaCount)
                .join(PromptResult)
                .where(PromptResult.run_id == run_id)
            )
            == PROMPTS * 4
        )
    assert {k: after[k] for k in before} == before  # finished prompts untouched: same rows, same numbers
