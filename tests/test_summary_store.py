"""The analysis summary is computed once per finished run and stored with it: it reads back equal,
finishing a run stores it, the report, publishing and the pages read the stored one (the bootstrap
runs once), a stored summary whose run changed since is computed again, and the decision's reason
is a code whose rendered sentence is the one the decision rule has always written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

import analyzer.advice.summary as summary_module
from analyzer.advice.report import build_report
from analyzer.advice.summary import (
    DECISION_CODES,
    cost_for_run,
    load_results,
    summarize_groups,
    summarize_run,
)
from analyzer.advice.summary_store import run_summary, store_summary, summary_from_json, summary_to_json
from analyzer.analysis.run_records import finish
from analyzer.db import make_session_factory
from analyzer.names import DEFAULT_MARGIN
from analyzer.orm import AnalysisRun, PromptResult, ValidationResult
from analyzer.pricing.speedup import MIN_TASK_PROMPTS, clears_break_even
from router.policies.policy import publish_policies
from tests.decision_rule import decide_point
from tests.factories import make_done_run

BATCH_CURVES = {
    4: [0.050, 0.070, 0.085, 0.095, 0.105, 0.115, 0.125, 0.135, 0.145],
    16: [0.080, 0.130, 0.180, 0.230, 0.280, 0.330, 0.380, 0.430, 0.480],
}
REPORT_JSON_PAGE = (Path(__file__).resolve().parents[1] / "docs" / "report-json.md").read_text("utf-8")


@pytest.fixture
def sessions(engine):
    return make_session_factory(engine)


@pytest.fixture
def bootstraps(monkeypatch) -> list[int]:
    """Counts the calls of the bootstrap (one entry per call) the summary makes."""
    calls: list[int] = []
    real = summary_module.bootstrap_speedup_interval

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(summary_module, "bootstrap_speedup_interval", counted)
    return calls


def _running_run(sessions, tasks: dict[str, float], **options) -> int:
    """A simulated run whose results are all stored but which has not finished yet."""
    with sessions() as session, session.begin():
        run = make_done_run(session, tasks, **options)
        run.status, run.summary = "running", None
        return run.id


# ---------------------------------------------------------------- reading back


@pytest.mark.parametrize(
    "options",
    [
        dict(batch_curves=BATCH_CURVES),  # a task too small to decide, several batch sizes
        dict(per_task={"code": 1, "qa": 1, "math": 0}),  # the workload decided on S(g*) alone
        dict(draft_spec="ngram:max_ngram=2", draft_step_s=0.001, gamma_max=4),
    ],
)
def test_a_summary_reads_back_equal_from_its_json(session, options):
    options = dict(options)
    per_task = options.pop("per_task", {"code": 5, "qa": 4, "math": 2})
    run = make_done_run(session, {"code": 0.92, "qa": 0.3, "math": 0.8}, per_task=per_task, **options)
    session.add(
        ValidationResult(
            run_id=run.id,
            prompt_id=run.prompt_set.prompts[0].id,
            gamma=3,
            greedy_time_s=1.0,
            speculative_time_s=0.5,
            measured_speedup=2.0,
            predicted_speedup=1.9,
            outputs_identical=True,
        )
    )
    session.flush()
    summary = summarize_run(session, run)
    data = summary_to_json(summary)
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # plain JSON: no NaN, no tuples, string keys
    assert summary_from_json(data) == summary
    assert summary.tasks["code"].measured_speedup == 2.0 and summary.cost is not None
    codes = {g.decision_code for g in [*summary.tasks.values(), summary.workload]}
    assert codes <= set(DECISION_CODES) and len(codes) >= 2


def test_a_run_without_a_cost_profile_reads_back_equal(session):
    run = make_done_run(session, {"code": 0.9}, per_task=3)
    run.cost_profile, run.batch_profiles = None, []
    session.flush()
    summary = summarize_run(session, run)
    assert summary.cost is None and summary.workload.decision_code == "nothing_measured"
    assert summary.workload.decision_reason == "nothing measured"
    assert summary_from_json(summary_to_json(summary)) == summary


# ---------------------------------------------------------------- computed once


def _groups_times_batches(summary) -> int:
    return (len(summary.tasks) + 1) * len(summary.costs)


def test_the_bootstrap_runs_once_per_finished_run(sessions, bootstraps):
    run_id = _running_run(
        sessions, {"code": 0.9, "qa": 0.3, "rag": 0.7}, per_task=3, batch_curves=BATCH_CURVES
    )
    finish(sessions, run_id, "done")
    once = len(bootstraps)
    with sessions() as session:
        stored = session.get(AnalysisRun, run_id).summary
        expected = _groups_times_batches(summary_from_json(stored["summary"]))
    assert expected == 4 * 3 and once == expected  # 3 tasks + the workload, at batch sizes 1, 4 and 16
    for _ in range(2):
        with sessions() as session, session.begin():
            report = build_report(session, run_id)
    with sessions() as session, session.begin():
        published = publish_policies(session, run_id)
        reasons = {p.task_type: p.decision_reason for p in published.policies}
    assert len(bootstraps) == expected  # nothing computed it again
    assert reasons["code"] == report["tasks"]["code"]["decision_reason"]
    assert reasons["*"] == report["workload"]["decision_reason"]


def test_a_run_finished_by_its_last_chunk_is_summarised_once_by_its_first_reader(sessions, bootstraps):
    from analyzer.analysis.chunks import claim_chunk, complete

    run_id = _running_run(sessions, {"code": 0.9, "qa": 0.3}, per_task=3)
    while (chunk := claim_chunk(sessions, "w1", run_id=run_id)) is not None:
        complete(sessions, chunk, "w1")
    with sessions() as session:
        assert session.get(AnalysisRun, run_id).status == "done"
    for _ in range(2):
        with sessions() as session, session.begin():
            build_report(session, run_id)
    with sessions() as session, session.begin():
        publish_policies(session, run_id)
        summary = run_summary(session, session.get(AnalysisRun, run_id))
    assert len(bootstraps) == _groups_times_batches(summary) == 3


def test_the_pages_read_the_stored_summary(app, client, sessions, bootstraps):
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.2}, per_task=3)
        run_id, prompt_id, gamma_max = run.id, run.prompt_set.prompts[0].id, run.run_params.gamma_max
    # a run from before summaries were stored: the first page computes it and keeps it
    assert client.get(f"/runs/{run_id}").status_code == 200
    with sessions() as session:
        summary = summary_from_json(session.get(AnalysisRun, run_id).summary["summary"])
    once = len(bootstraps)
    assert once == _groups_times_batches(summary)
    for url in (f"/runs/{run_id}", f"/runs/{run_id}/report.json", f"/runs/{run_id}/prompts/{prompt_id}"):
        assert client.get(url).status_code == 200
    assert len(bootstraps) == once
    detail = client.get(f"/runs/{run_id}/prompts/{prompt_id}").get_data(as_text=True)
    best = summary.tasks["code"].best_gamma
    assert best is not None and 1 <= best <= gamma_max
    assert f"At gamma {best}:" in detail  # the drill-down opens at its task's g*, from the stored summary


def test_a_stored_summary_is_computed_again_when_its_run_changed(sessions, bootstraps):
    with sessions() as session, session.begin():
        run_id = make_done_run(session, {"code": 0.9, "qa": 0.3}, per_task=3).id
    with sessions() as session, session.begin():
        first = run_summary(session, session.get(AnalysisRun, run_id))
    computed = len(bootstraps)
    with sessions() as session, session.begin():
        assert run_summary(session, session.get(AnalysisRun, run_id)) == first  # stored, read back
    assert len(bootstraps) == computed
    with sessions() as session, session.begin():  # a validation added since: its measured speedup shows
        prompt_id = session.get(AnalysisRun, run_id).prompt_set.prompts[0].id
        session.add(
            ValidationResult(
                run_id=run_id,
                prompt_id=prompt_id,
                gamma=2,
                greedy_time_s=1.0,
                speculative_time_s=0.8,
                measured_speedup=1.25,
                predicted_speedup=1.3,
                outputs_identical=True,
            )
        )
    with sessions() as session, session.begin():
        again = run_summary(session, session.get(AnalysisRun, run_id))
    assert again.tasks["code"].measured_speedup == 1.25 and first.tasks["code"].measured_speedup is None
    assert again.workload.measured_speedup is None  # one task's sample says nothing about the workload
    assert len(bootstraps) == computed  # a validation measures, it does not price: no bootstrap again
    with sessions() as session:
        assert (
            summarize_run(session, session.get(AnalysisRun, run_id)) == again
        )  # what computing it all gives
    computed = len(bootstraps)  # summarize_run above priced it all once more
    with sessions() as session, session.begin():  # stored: the results' task types are not read again
        run = session.get(AnalysisRun, run_id)
        for result in session.scalars(select(PromptResult).where(PromptResult.run_id == run_id)):
            result.task_type = "code"
        session.flush()
        assert store_summary(session, run) == again and len(bootstraps) == computed
        run.summary = None  # none stored: computed from the results as they are
        assert set(store_summary(session, run).tasks) == {"code"} and len(bootstraps) > computed


def test_an_unfinished_run_is_summarised_but_nothing_is_stored(sessions):
    run_id = _running_run(sessions, {"code": 0.9}, per_task=3)
    with sessions() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        assert run_summary(session, run).workload.n == 3
    with sessions() as session:
        assert session.scalar(select(AnalysisRun.summary).where(AnalysisRun.id == run_id)) is None


# ---------------------------------------------------------------- the reason as a code


def _sentence_before_codes(
    speedup: float,
    interval: tuple[float, float],
    n: int,
    margin: float = DEFAULT_MARGIN,
    min_prompts: int = MIN_TASK_PROMPTS,
) -> tuple[bool | None, str]:
    """The decision and its sentence as analyzer.pricing.speedup.decide wrote them before decisions carried
    codes (kept here as the reference the rendered reasons must equal)."""
    low, high = interval
    shown = (
        f"{speedup:.2f}x [{low:.2f}, {high:.2f}], n = {n}" if np.isfinite(low) else f"{speedup:.2f}x, n = {n}"
    )
    if n < min_prompts:
        return (
            None,
            f"{shown}: too few prompts to decide (fewer than {min_prompts}), the workload's decision applies",
        )
    if not np.isfinite(speedup):
        return False, "nothing measured"
    if speedup <= 1.0 + margin:
        return False, f"{shown}: S(g*) does not clear {1 + margin:.2f}x"
    if not clears_break_even(speedup, low, margin):
        return (
            False,
            f"{shown}: S(g*) clears {1 + margin:.2f}x but the interval reaches {low:.2f}x, a possible loss",
        )
    return True, f"{shown}: S(g*) clears {1 + margin:.2f}x and the interval stays above 1.00x"


@settings(max_examples=400, deadline=None)
@given(
    speedup=st.one_of(st.floats(0.0, 4.0), st.just(float("nan"))),
    low=st.one_of(st.floats(0.0, 4.0), st.just(float("nan"))),
    width=st.floats(0.0, 2.0),
    n=st.integers(1, 12),
    margin=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
)
def test_the_rendered_reason_is_the_decision_rules_sentence(speedup, low, width, n, margin):
    interval = (low, low + width) if not math.isnan(low) else (float("nan"), float("nan"))
    speculate, reason = decide_point(speedup, interval, n, margin)
    assert (speculate, reason.text()) == _sentence_before_codes(speedup, interval, n, margin)
    assert reason.code in DECISION_CODES and (reason.code == "too_few_prompts") == (n < MIN_TASK_PROMPTS)


def test_a_task_too_small_and_a_workload_decided_alone_say_so(session):
    run = make_done_run(session, {"code": 0.92, "math": 0.9}, per_task={"code": 1, "math": 1})
    one = load_results(session, run.id)[:1]
    _, alone = summarize_groups(one, cost_for_run(run), gamma_max=run.run_params.gamma_max)
    assert (alone.decision_code, alone.decision_basis) == ("point_estimate", "point estimate")
    assert alone.decision_reason.endswith(": too few prompts for an interval; decided on S(g*) alone")
    summary = summarize_run(session, run)
    workload, math_task = summary.workload, summary.tasks["math"]
    # two prompts have an interval: the workload decided alone still applies its lower end, as the router does
    assert workload.decision_basis == "point estimate" and workload.speedup_interval[0] is not None
    assert workload.decision_code == ("clears" if workload.speculate else "interval_reaches_loss")
    assert (math_task.decision_code, math_task.decision_basis) == ("too_few_prompts", "workload")
    assert (math_task.best_gamma, math_task.predicted_speedup) == (
        workload.best_gamma,
        workload.predicted_speedup,
    )
    taken = f"(speculate at gamma {workload.best_gamma})" if workload.speculate else "(off)"
    assert math_task.decision_reason.endswith(
        f"too few prompts to decide (fewer than 3), the workload's decision applies {taken}"
    )


def test_the_report_and_the_docs_name_every_decision_code(session):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, batch_curves=BATCH_CURVES)
    report = build_report(session, run.id)
    for group in [*report["tasks"].values(), report["workload"]]:
        assert group["decision_code"] in DECISION_CODES and group["decision_reason"]
        assert all(entry["decision_code"] in DECISION_CODES for entry in group["by_batch"].values())
    for code in DECISION_CODES:
        assert f"`{code}`" in REPORT_JSON_PAGE, f"decision code {code} is not in docs/report-json.md"
