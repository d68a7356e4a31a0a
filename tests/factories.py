"""Small factory helpers for tests: a finished analysis run built from synthetic match sequences
with the real walk (:mod:`analyzer.analysis.simulated_run`), so reports and policies can be tested without
loading models, and a routing database built on one."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from analyzer.analysis.simulated_run import SIMULATED_COST_CURVE as COST_CURVE
from analyzer.analysis.simulated_run import create_simulated_run as make_done_run

__all__ = ["COST_CURVE", "make_done_run", "make_routing_database", "routing_test_app"]


def make_routing_database(url: str):
    """A migrated database at ``url`` with an active policy set (code speculates, qa does not) and a
    classifier telling code from qa; returns its engine."""
    import migrations
    from analyzer.db import make_engine, make_session_factory
    from router.classify.training import train_classifier
    from router.classify.training_data import make_training_data
    from router.policies.policy import publish_policies

    engine = make_engine(url)
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.2})
        publish_policies(session, run.id)
        texts = [f"def f{i}(x): return x + {i}  # fix this python function" for i in range(6)] + [
            f"What is the capital of country number {i}? Answer briefly." for i in range(6)
        ]
        train_classifier(
            session, make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"), cross_validate=False
        )
    return engine


def routing_test_app(folder, **config):
    """(app, its test client, the session factory, the form's CSRF token, the database engine, its URL):
    a web app over a routing database in ``folder`` (no UI worker, no router refresh), for tests that
    post to every surface. The caller closes ``app.extensions["specroute.close"]`` and disposes the engine."""
    import re

    from analyzer.db import make_session_factory
    from webui.app import create_app

    url = f"sqlite:///{folder}/routing.db"
    engine = make_routing_database(url)
    app = create_app(
        {
            "database_url": url,
            "data_dir": str(folder),
            "router_refresh_s": 0,
            "ui_worker": False,
            "TESTING": True,
        }
        | config
    )
    client = app.test_client()
    token = re.search(
        r'name="csrf_token" value="([^"]+)"', client.get("/prompts").get_data(as_text=True)
    ).group(1)
    return app, client, make_session_factory(engine), token, engine, url


def _answer(kind, ids, n, number):
    """A synthetic greedy answer of ``n`` tokens to a prompt of ``ids``: "copy" repeats the prompt, "chunks"
    copies four prompt tokens at a time from spread offsets with a new token between, anything else is new
    tokens only."""
    if kind == "copy":
        return (ids * (n // len(ids) + 1))[:n]
    if kind == "chunks":
        tokens = []
        while len(tokens) < n:
            start = (len(tokens) * 7) % max(len(ids) - 4, 1)
            tokens += [*ids[start : start + 4], 3000 + len(tokens)]
        return tokens[:n]
    return [5000 + number * 50 + i for i in range(n)]


def make_server_analysis(
    session, prompt_set, answers, drafters=("ngram-simple 3/8", "ngram-mod 16 2-16"), withheld=None, refits=()
):
    """A stored llama-server analysis of ``prompt_set`` made by the real replay, pricing and store on
    synthetic greedy outputs (no server runs): ``answers`` maps a task to how its prompts answer ("copy":
    the prompt repeated, where long n-gram drafts pay; "chunks": short copied runs, where short drafts pay);
    any other task answers new tokens only (nothing to draft). The step costs are a CPU-like fixed fit: a
    plain step 10 ms, a round 11 ms + 0.5 ms per drafted token, no context term. ``withheld``: the reason the
    analysis' advice is withheld (None: it is not); ``refits``: the fit's leave-one-prompt-out fits
    (StepCost), whose spread the decision counts (none: no spread)."""
    from dataclasses import replace

    from analyzer.analysis.server_outcomes import (
        PromptOutcome,
        ServerAnalysis,
        SettingOutcome,
        TimedCompletion,
    )
    from analyzer.analysis.server_replay import replay_all
    from analyzer.analysis.server_store import server_prompts, store_server_analysis
    from analyzer.engine.llama_server_process import Completion
    from analyzer.measuring.server_drafting import parse_drafter
    from analyzer.pricing.server_cost import ServerCost

    n_predict, n_ctx = 48, 4096
    outcomes = []
    for number, prompt in enumerate(server_prompts(prompt_set)):
        text = prompt.messages[-1]["content"]
        ids = [100 + (ord(c) * 7 + i) % 900 for i, c in enumerate(text[:40])] + [1, 2, 3, 4, 5]
        tokens = _answer(answers.get(prompt.task), ids, n_predict, number)
        timings = {"predicted_ms": 10.0 * (len(tokens) - 1), "predicted_n": len(tokens)}
        plain = TimedCompletion(Completion(tokens, "limit", timings, ""), 0.0)
        outcomes.append(PromptOutcome(prompt, ids, plain))
    chosen = [parse_drafter(d) for d in drafters]
    cost = replace(
        ServerCost(10.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 6, 0.02, 0.03, 6, 0.01, 0.02, False),
        refits=tuple(refits),
    )
    for drafter in chosen:
        for outcome, replay in zip(outcomes, replay_all(drafter, outcomes, n_predict=n_predict, n_ctx=n_ctx)):
            outcome.settings.append(SettingOutcome(drafter, replay, cost.speedup(replay)))
    families = {d.family: cost for d in chosen}
    analysis = ServerAnalysis(
        chosen, outcomes, families, n_predict, 2, 1.0, 0.5, 3, 0.0, n_ctx, withheld=withheld,
        calibration_why="the fit held on prompts it was not fitted on after 4 prompts (worst error 3.0%, bound "
        "9.0%; at most 8)",
    )  # fmt: skip
    return store_server_analysis(
        session, prompt_set, analysis, model="/models/target.gguf", server_build="test"
    )


@contextmanager
def another_writer(database: Path) -> Iterator[list[int]]:
    """A second SQLite connection on ``database`` that commits a row to a table of its own every
    millisecond while the block runs, as another process's writer (the web server's worker, feedback)
    would; yields a list whose only item counts its commits."""
    stop, commits = threading.Event(), [0]

    def write() -> None:
        connection = sqlite3.connect(database, timeout=60, isolation_level=None)
        connection.execute("CREATE TABLE IF NOT EXISTS other_writer (x INTEGER)")
        while not stop.is_set():
            connection.execute("INSERT INTO other_writer VALUES (1)")
            commits[0] += 1
            time.sleep(0.001)
        connection.close()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield commits
    finally:
        stop.set()
        thread.join(timeout=10)
