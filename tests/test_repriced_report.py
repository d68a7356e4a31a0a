"""A re-priced run's report says what measured and what priced, each with its own machine: the acceptance's
engine, device and dtype are its source run's; the cost's engine, version, device, dtype and threads are the
imported profile's. Nothing is mixed, and no "None" is printed."""

from __future__ import annotations

import html
import re

import pytest

import migrations
from analyzer.advice.report import build_report
from analyzer.advice.report_text import report_text
from analyzer.analysis.repricing import reprice_run
from analyzer.db import make_engine, make_session_factory
from analyzer.orm import CostProfile
from tests.factories import make_done_run
from webui.app import create_app

CPU = "cpu: AMD EPYC 7B13, llama-cpp-python 0.3.36, 2 threads"
GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture()
def repriced(tmp_path):
    url = f"sqlite:///{tmp_path}/reprice.db"
    engine = make_engine(url)
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        source = make_done_run(session, {"code": 0.9, "qa": 0.3}, engine="llama.cpp")
        source.device, source.dtype = CPU, "Q4_1"
        imported = CostProfile(
            pair=source.pair,
            priced_by="vllm",
            measured_by="imported",
            engine_version="0.11.0",
            source="imported",
            device=GPU,
            dtype="bfloat16",
            batch_size=1,
            context_tokens=0,
            repeats=1,
            target_forward_s=[0.004] * 9,
            draft_step_s=0.0,
        )
        session.add(imported)
        session.flush()
        run_id = reprice_run(session, source.id, [imported.id]).id
    yield url, run_id, tmp_path
    engine.dispose()


def test_the_report_json_keeps_the_measuring_and_the_pricing_machine_apart(repriced):
    url, run_id, _ = repriced
    with make_session_factory(make_engine(url))() as session, session.begin():
        report = build_report(session, run_id)
    assert report["measured_by"] == {"engine": "llama.cpp", "device": CPU, "dtype": "Q4_1"}
    priced = report["priced_by"]
    assert {k: priced[k] for k in ("engine", "engine_version", "source", "device", "dtype", "threads")} == {
        "engine": "vllm",
        "engine_version": "0.11.0",
        "source": "imported",
        "device": GPU,
        "dtype": "bfloat16",
        "threads": None,
    }
    assert priced["note"] == "imported from vllm 0.11.0's own benchmark, not judged here"
    text = report_text(report)
    assert f"measured in llama.cpp, Q4_1 on {CPU}), priced by vllm 0.11.0 on {GPU} in bfloat16" in text
    assert "None" not in text


def test_the_report_page_says_which_engine_and_machine_measured_and_which_priced(repriced):
    url, run_id, folder = repriced
    app = create_app({"database_url": url, "data_dir": str(folder), "ui_worker": False, "TESTING": True})
    page = app.test_client().get(f"/runs/{run_id}").get_data(as_text=True)
    app.extensions["specroute.close"]()
    words = html.unescape(re.sub(r"<[^>]+>", "", page))
    words = re.sub(r"\s+", " ", words)
    assert f"Acceptance measured by llama.cpp on {CPU} in Q4_1 (run #1)." in words
    assert (
        f"Cost priced by vllm 0.11.0 on {GPU} in bfloat16 (cost profile #2, imported from vllm 0.11.0's own "
        "benchmark, not judged here)." in words
    )
    assert f"one target step 4.0 ms on {GPU} in bfloat16." in words
    assert "None" not in words and "older profile" not in words and "not in its benchmark" in words
