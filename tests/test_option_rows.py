"""Per prompt and drafting option, one table for every engine's analysis: a run stores its
gamma rows with its summary and a llama-server analysis its setting rows when stored; both print them per
prompt in one shape (``options``), and the rows follow the run as its summary changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from analyzer.advice.option_rows import OptionRow, prompt_options, replace_options
from analyzer.advice.report import build_report
from analyzer.advice.summary_store import store_summary
from analyzer.analysis.server_store import server_analysis_json
from analyzer.db import make_session_factory
from analyzer.orm import AnalysisRun, OptionResult, ValidationResult
from tests.factories import make_done_run, make_server_analysis

KEYS = ["label", "rounds", "drafted", "accepted", "predicted_speedup", "measured_speedup"]


@pytest.fixture
def sessions(engine):
    return make_session_factory(engine)


def _count(session, **owner) -> int:
    ((column, value),) = owner.items()
    return session.scalar(select(func.count(OptionResult.id)).where(getattr(OptionResult, column) == value))


def test_a_run_stores_its_gamma_rows_with_its_summary_and_its_report_prints_them(sessions):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        assert _count(session, run_id=run.id) == 0  # nothing until the summary is stored
        report = build_report(session, run.id)
        assert _count(session, run_id=run.id) == 6 * run.run_params.gamma_max
        for row in report["prompts"]:
            options = row["options"]
            assert [o["label"] for o in options] == [
                f"gamma {g}" for g in range(1, run.run_params.gamma_max + 1)
            ]
            assert all(list(o) == KEYS for o in options)
            for gamma, option in enumerate(options, start=1):
                counts = row["per_gamma"][str(gamma)]
                assert (option["rounds"], option["drafted"], option["accepted"]) == (
                    counts["rounds"], counts["drafted"], counts["accepted"],
                )  # fmt: skip
                assert option["predicted_speedup"] == pytest.approx(row["predicted_speedup"][str(gamma)])
                assert option["measured_speedup"] is None
        # a high-acceptance task's prompts speed up more than a low one's at their best gamma
        best = {r["task"]: max(o["predicted_speedup"] for o in r["options"]) for r in report["prompts"]}
        assert best["code"] > best["qa"]


def test_a_validation_and_a_new_summary_replace_the_rows_and_never_add_to_them(sessions):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8}, per_task=3)
        build_report(session, run.id)
        prompt_id = min(prompt_options(session, run_id=run.id))
        session.add(
            ValidationResult(
                run_id=run.id,
                prompt_id=prompt_id,
                gamma=2,
                greedy_time_s=1.0,
                speculative_time_s=0.5,
                measured_speedup=2.0,
                predicted_speedup=1.9,
                outputs_identical=True,
            )  # fmt: skip
        )
        store_summary(session, session.get(AnalysisRun, run.id))
        rows = prompt_options(session, run_id=run.id)
        assert [o.measured_speedup for o in rows[prompt_id]] == [None, 2.0] + [None] * (
            run.run_params.gamma_max - 2
        )
        assert sum(len(r) for r in rows.values()) == 3 * run.run_params.gamma_max
        stored = session.get(AnalysisRun, run.id)
        stored.summary = None
        store_summary(session, stored)  # computed anew: its rows replace the ones before
        assert _count(session, run_id=run.id) == 3 * run.run_params.gamma_max


def test_a_llama_server_analysis_stores_its_setting_rows_and_its_json_reads_them(sessions):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        assert _count(session, server_analysis_id=record.id) == 6 * 2
        data = server_analysis_json(session, record)
        for row, stored in zip(data["prompts"], record.prompts):
            assert [o["label"] for o in row["options"]] == ["ngram-simple 3/8", "ngram-mod 16 2-16"]
            assert all(list(o) == KEYS for o in row["options"])
            for option, setting in zip(row["options"], stored["settings"]):
                assert (option["rounds"], option["drafted"], option["accepted"]) == (
                    setting["rounds"], setting["draft_n"], setting["draft_n_accepted"],
                )  # fmt: skip
                assert option["predicted_speedup"] == pytest.approx(setting["predicted_speedup"])
        # "copy" answers draft; the other task's answers are new tokens: nothing drafts there
        drafted = {r["task"]: sum(o["drafted"] for o in r["options"]) for r in data["prompts"]}
        assert drafted["code"] > 0 and drafted["qa"] == 0
        assert _count(session, run_id=run.id) == 0  # the run's rows are its own


def test_a_row_names_exactly_one_analysis(sessions):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8}, per_task=3)
        row = OptionRow(run.prompt_set.prompts[0].id, "code", "gamma 1", 1, 3, 3, 2, 1.1, None)
        assert replace(row, predicted_speedup=float("nan")).as_json()["predicted_speedup"] is None  # no NaN
        with pytest.raises(ValueError, match="name one analysis"):
            replace_options(session, [row])
        with pytest.raises(ValueError, match="name one analysis"):
            replace_options(session, [row], run_id=run.id, server_analysis_id=1)
        assert replace_options(session, [row, replace(row, option="gamma 2", position=2)], run_id=run.id) == 2
    with sessions() as session:
        session.add(
            OptionResult(prompt_id=row.prompt_id, option="x", position=1, rounds=1, drafted=1, accepted=1)
        )  # no analysis at all
        with pytest.raises(IntegrityError):
            session.flush()


def test_one_report_command_and_one_listing_for_both_kinds_of_analysis(runner, tmp_path):
    """``specroute report`` prints a run or a llama-server analysis (text, JSON, CSV, and per prompt and option
    the same CSV columns for both); ``specroute runs list`` lists both kinds, and a queued llama-server job."""
    import csv
    import io
    import json

    from analyzer.analysis.server_jobs import ServerJobParams, create_server_job
    from analyzer.db import make_engine
    from webui.cli import cli

    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'specroute.db'}")
    with make_session_factory(engine)() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        job = create_server_job(session, run.prompt_set, ServerJobParams(limit=2))
        run_id, analysis_id, job_id, gammas = run.id, record.id, job.id, run.run_params.gamma_max
    engine.dispose()

    def table(*args) -> list[dict]:
        result = runner.invoke(cli, ["report", *args])
        assert result.exit_code == 0, result.output
        return list(csv.DictReader(io.StringIO(result.stdout)))

    run_rows = table(str(run_id), "--format", "options-csv")
    server_rows = table("--llama-server-analysis", str(analysis_id), "--format", "options-csv")
    assert list(run_rows[0]) == list(server_rows[0])  # one shape
    assert len(run_rows) == 6 * gammas and len(server_rows) == 6 * 2
    assert table("--llama-server-analysis", str(analysis_id), "--format", "csv") == server_rows
    assert {r["option"] for r in server_rows} == {"ngram-simple 3/8", "ngram-mod 16 2-16"}
    as_json = json.loads(
        runner.invoke(cli, ["report", "--llama-server-analysis", str(analysis_id), "--format", "json"]).stdout
    )
    assert as_json["kind"] == "llama-server" and len(as_json["prompts"]) == 6
    text = runner.invoke(cli, ["report", "--llama-server-analysis", str(analysis_id)])
    assert text.exit_code == 0 and "ngram-simple 3/8" in text.stdout
    for args in ([], [str(run_id), "--llama-server-analysis", str(analysis_id)]):
        refused = runner.invoke(cli, ["report", *args])
        assert refused.exit_code == 2 and "name one analysis" in refused.output
    missing = runner.invoke(cli, ["report", "--llama-server-analysis", "99"])
    assert missing.exit_code == 1 and "99" in missing.output

    listed = json.loads(runner.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert [(r["kind"], r["ref"], r["id"], r["job"], r["status"]) for r in listed] == [
        ("llama-server", f"llama-server-job:{job_id}", None, job_id, "queued"),
        ("llama-server", f"llama-server:{analysis_id}", analysis_id, None, "done"),
        ("run", str(run_id), run_id, None, "done"),
    ]
    shown = runner.invoke(cli, ["runs", "list"]).stdout.splitlines()
    assert [line.split()[0] for line in shown[:3]] == [r["ref"] for r in listed]
    assert (
        shown[3]
        == "report: 'specroute report ANALYSIS'; resume or cancel: 'specroute runs resume|cancel ANALYSIS'"
    )
    # every reference the listing prints is what the report takes: the same output as the kind's own option
    assert table(f"llama-server:{analysis_id}", "--format", "options-csv") == server_rows
    assert table(f"run:{run_id}", "--format", "options-csv") == run_rows
    not_yet = runner.invoke(cli, ["report", f"llama-server-job:{job_id}"])
    assert not_yet.exit_code == 1 and (
        f"llama-server-job:{job_id} has stored no analysis yet: it waits for a worker" in not_yet.stderr
    )
    for bad in ("llama:1", "0", "run:x", "llama-server:"):
        refused = runner.invoke(cli, ["report", bad])
        assert (
            refused.exit_code == 2
            and "names no analysis" in refused.stderr
            and "llama-server:3" in refused.stderr
        )


def test_runs_resume_cancel_and_publish_take_any_analysis_by_its_reference(runner, tmp_path):
    """``specroute runs cancel``, ``runs resume --queue`` and ``policies publish --analysis`` act on a run, an
    analysis in llama-server or its job by the reference ``runs list`` prints; a finished analysis has nothing to
    cancel or resume, and a job publishes the analysis it stored."""
    import json

    from analyzer.analysis.server_jobs import ServerJobParams, create_server_job, get_server_job
    from analyzer.db import make_engine
    from analyzer.orm import AnalysisRun
    from webui.cli import cli

    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'specroute.db'}")
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        job = create_server_job(session, run.prompt_set, ServerJobParams(limit=2))
        done_job = create_server_job(session, run.prompt_set, ServerJobParams(limit=2))
        done_job.status, done_job.analysis_id = "done", record.id
        run_id, analysis_id, job_id, done_id = run.id, record.id, job.id, done_job.id

    cancelled = runner.invoke(cli, ["runs", "cancel", f"llama-server-job:{job_id}"])
    assert cancelled.exit_code == 0 and cancelled.stdout == f"llama-server-job:{job_id}: cancelled\n"
    for verb in ("cancel", "resume"):
        finished = runner.invoke(cli, ["runs", verb, f"llama-server:{analysis_id}"])
        assert (
            finished.exit_code == 1 and f"llama-server:{analysis_id} is a stored analysis" in finished.stderr
        )
    resumed = runner.invoke(cli, ["runs", "resume", f"llama-server-job:{job_id}", "--queue", "--json"])
    assert resumed.exit_code == 0 and json.loads(resumed.stdout) == {"job_id": job_id, "status": "queued"}
    with sessions() as session:
        assert get_server_job(session, job_id).status == "queued"
    # a failed run queued again for the workers, its error cleared; a finished one refused
    with sessions() as session, session.begin():
        failed = session.get_one(AnalysisRun, run_id)
        failed.status, failed.error = "failed", "the disk was full"
    requeued = runner.invoke(cli, ["runs", "resume", str(run_id), "--queue", "--json"])
    assert requeued.exit_code == 0 and json.loads(requeued.stdout) == {"run_id": run_id, "status": "queued"}
    with sessions() as session:
        again = session.get_one(AnalysisRun, run_id)
        assert (again.status, again.error) == ("queued", None)
    # without --queue it is executed here, as 'analyze --resume' does (this run's models are not on disk)
    here = runner.invoke(cli, ["runs", "resume", str(run_id)])
    assert here.exit_code == 1 and "model folder /models/target does not exist" in here.stderr
    with sessions() as session, session.begin():
        again = session.get_one(AnalysisRun, run_id)
        assert again.status == "failed" and "/models/target" in again.error
        again.status = "done"
    for queue in ([], ["--queue"]):
        done = runner.invoke(cli, ["runs", "resume", str(run_id), *queue])
        assert done.exit_code == 1 and f"run {run_id} is done: there is nothing to resume" in done.stderr
    # publishing by reference: a run, and a job through the analysis it stored
    by_run = json.loads(
        runner.invoke(cli, ["policies", "publish", "--analysis", str(run_id), "--json"]).stdout
    )
    by_job = runner.invoke(
        cli, ["policies", "publish", "--analysis", f"llama-server-job:{done_id}", "--json"]
    )
    assert by_job.exit_code == 0, by_job.output
    assert (by_run["run_id"], json.loads(by_job.stdout)["server_analysis_id"]) == (run_id, analysis_id)
    both = runner.invoke(cli, ["policies", "publish", "--analysis", str(run_id), "--run", str(run_id)])
    assert both.exit_code == 2 and "give one of --analysis, --run or --llama-server-analysis" in both.stderr
    engine.dispose()


def test_the_runs_and_start_pages_list_both_kinds_and_both_reports_export_the_same_option_columns(
    session, client
):
    import csv
    import io

    from analyzer.analysis.server_jobs import ServerJobParams, create_server_job

    run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
    record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
    job = create_server_job(session, run.prompt_set, ServerJobParams(limit=2))
    session.commit()
    page = client.get("/runs").get_data(as_text=True)
    # each analysis by the reference the command line takes
    assert f'href="/runs/{run.id}">{run.id}<' in page
    assert f'href="/llama-server/{record.id}">llama-server:{record.id}<' in page
    assert f'href="/llama-server/jobs/{job.id}">llama-server-job:{job.id}<' in page
    assert page.index(f"llama-server-job:{job.id}") < page.index(f'href="/runs/{run.id}"')  # newest first
    home = client.get("/").get_data(as_text=True)  # the start page counts and lists them as one concept
    assert "Start an analysis</a> (3 so far)" in home and "Latest analyses" in home
    assert f'href="/llama-server/{record.id}">llama-server:{record.id}<' in home
    assert home.index(f"llama-server-job:{job.id}") < home.index(f'href="/runs/{run.id}">{run.id}<')

    def rows(url: str) -> list[dict]:
        answer = client.get(url)
        assert answer.status_code == 200 and answer.mimetype == "text/csv"
        return list(csv.DictReader(io.StringIO(answer.get_data(as_text=True))))

    run_rows, server_rows = (
        rows(f"/runs/{run.id}/options.csv"),
        rows(f"/llama-server/{record.id}/options.csv"),
    )
    assert list(run_rows[0]) == list(server_rows[0])
    assert len(run_rows) == 6 * run.run_params.gamma_max and len(server_rows) == 6 * 2
    assert f"/runs/{run.id}/options.csv" in client.get(f"/runs/{run.id}").get_data(as_text=True)
    shown = client.get(f"/llama-server/{record.id}").get_data(as_text=True)
    assert (
        f"/llama-server/{record.id}/options.csv" in shown
        and f"/llama-server/{record.id}/report.json" in shown
    )
    data = client.get(f"/llama-server/{record.id}/report.json").get_json()
    assert data["analysis_id"] == record.id and len(data["prompts"]) == 6
    assert client.get("/llama-server/99/options.csv").status_code == 404
    assert client.get("/llama-server/99/report.json").status_code == 404


def test_the_runs_page_cancels_and_resumes_every_kind_of_analysis(session, client):
    """One row per analysis, one way to stop and go on: a queued llama-server job and a queued run are
    cancelled, and each resumes (queued again for the workers, finished work kept); a finished one offers
    neither, and a finished run's resume is refused with a message."""
    import re

    from analyzer.analysis.server_jobs import ServerJobParams, create_server_job, get_server_job
    from analyzer.orm import AnalysisRun

    run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
    record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
    job = create_server_job(session, run.prompt_set, ServerJobParams(limit=2))
    run.status = "queued"
    session.commit()

    def actions() -> dict[str, str | None]:
        page = client.get("/runs").get_data(as_text=True)
        found = {}
        for ref in (str(run.id), f"llama-server:{record.id}", f"llama-server-job:{job.id}"):
            row = page.split(f'data-ref="{ref}"')[1].split("</tr>")[0]
            action = re.search(r'data-action="(\w+)"', row)
            found[ref] = action.group(1) if action else None
        return found

    page = client.get("/runs").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert actions() == {
        str(run.id): "cancel",
        f"llama-server:{record.id}": None,
        f"llama-server-job:{job.id}": "cancel",
    }
    assert client.post(f"/runs/{run.id}/cancel", data={"csrf_token": token}).status_code == 302
    assert client.post(f"/llama-server/jobs/{job.id}/cancel", data={"csrf_token": token}).status_code == 302
    assert actions() == {
        str(run.id): "resume",
        f"llama-server:{record.id}": None,
        f"llama-server-job:{job.id}": "resume",
    }
    resumed = client.post(f"/runs/{run.id}/resume", data={"csrf_token": token})
    assert resumed.status_code == 302
    assert client.post(f"/llama-server/jobs/{job.id}/resume", data={"csrf_token": token}).status_code == 302
    session.expire_all()
    assert session.get_one(AnalysisRun, run.id).status == "queued"
    assert get_server_job(session, job.id).status == "queued"
    assert "queued again, its finished prompts kept" in client.get("/runs").get_data(as_text=True)
    session.get_one(AnalysisRun, run.id).status = "done"
    session.commit()
    client.post(f"/runs/{run.id}/resume", data={"csrf_token": token})
    assert f"run {run.id} is done: there is nothing to resume" in client.get("/runs").get_data(as_text=True)
    assert client.post("/runs/999/resume", data={"csrf_token": token}).status_code == 404
