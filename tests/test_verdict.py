"""The verdict that opens a llama-server analysis' report, on stored analyses made by the real replay, pricing and
store on synthetic outputs: per task the decision and setting with its interval or off, the workload routed, off
and with the best single setting, whether the advice is withheld, the machine and its noise, and what was left
out; at most eight lines, and the same lines at the top of the text report and the page."""

from __future__ import annotations

import re

import pytest

from analyzer.advice.verdict import server_verdict
from analyzer.db import make_session_factory
from tests.factories import make_done_run, make_server_analysis

SPEEDUP = r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\]"


@pytest.fixture
def sessions(engine):
    return make_session_factory(engine)


def test_a_task_that_pays_is_named_with_its_setting_and_the_others_are_off(sessions):
    from webui.cli.server_analysis import server_analysis_text

    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        record.noise = {
            "floor": 0.045,
            "pairs": 8,
            "p10": 0.95,
            "p90": 1.05,
            "run_error": 0.032,
            "verdict": "quiet",
        }
        record.machine = "Example CPU, 2 cores"
        lines = server_verdict(record).lines()
        code = next(t for t in record.tasks if t["task"] == "code")
        assert (
            code["chosen"] is not None
            and next(t for t in record.tasks if t["task"] == "qa")["chosen"] is None
        )
        assert lines[0] == "Verdict: speculate on 1 of 2 tasks"
        assert re.fullmatch(rf"  on: code with {re.escape(code['chosen'])}, {SPEEDUP}", lines[1])
        assert lines[2] == "  off: qa"
        assert re.fullmatch(
            rf"The workload, predicted \(95% interval over prompts\): routed by task {SPEEDUP}; off 1\.00x; "
            rf"the best single setting \(ngram-(simple 3/8|mod 16 2-16)\) {SPEEDUP}",
            lines[3],
        )
        routed = float(lines[3].split("routed by task ")[1].split("x")[0])
        assert routed > 1.05  # the copying task's speedup carries the routed workload
        assert lines[4:] == [
            "Advice: not withheld",
            "Machine: Example CPU, 2 cores, 2 threads; two identical runs differ by 4.5% (quiet)",
        ]
        assert server_analysis_text(record).splitlines()[: len(lines)] == lines


def test_withheld_advice_and_left_out_work_are_said_in_the_verdict(sessions):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(
            session, run.prompt_set, {"code": "copy"}, withheld="the fit missed by 12%"
        )
        record.left_out = {
            "settings": {"ngram-mod 16 2-16": "its server drafted 9 tokens ..."},
            "prompts": [{"prompt_id": "3", "task": "qa", "tokens": 5000, "why": "too long"}],
        }
        lines = server_verdict(record).lines()
    assert lines[0] == "Verdict: speculate on 0 of 2 tasks; every task off: the advice is withheld"
    assert lines[1] == "  off: code, qa"
    assert "Advice withheld: the fit missed by 12%" in lines
    assert lines[-1] == "Left out: 1 setting, 1 prompt (below)" and len(lines) <= 8


def test_the_report_page_opens_with_the_same_verdict(sessions, engine, db_url):
    """The report page of a llama-server analysis and of a run show the verdict's lines, in order."""
    from markupsafe import escape

    from analyzer.advice.report import build_report
    from analyzer.advice.verdict import run_verdict
    from webui.app import create_app

    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        server_lines = server_verdict(record).lines()
        run_lines = run_verdict(build_report(session, run.id)).lines()
        pages = {f"/llama-server/{record.id}": server_lines, f"/runs/{run.id}": run_lines}
    app = create_app({"database_url": db_url, "ui_worker": False, "TESTING": True})
    try:
        client = app.test_client()
        for path, lines in pages.items():
            page = client.get(path).get_data(as_text=True)
            verdict = page.split('id="verdict-lines">')[1].split("</div>")[0]
            assert re.findall(r"<p[^>]*>(.*?)</p>", verdict) == [str(escape(line)) for line in lines]
    finally:
        app.extensions["specroute.close"]()
