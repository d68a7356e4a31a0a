"""A transformers or llama.cpp run's validation stops by the rule every engine's validation shares: its sample
of ``--validate`` prompts taken one at a time until every measured aggregate is within its target (from the
greedy pairs' run noise) or validation has cost half the run's plain generation, both counted in seconds of
generating; ``validate_all`` takes every one. The plan is stored with the run and shown in its report."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import select

from analyzer.advice.report import build_report
from analyzer.advice.report_text import report_text
from analyzer.analysis.run_validation import validate_run
from analyzer.db import make_session_factory
from analyzer.measuring.validate import ValidationMeasurement
from analyzer.measuring.validation_plan import BUDGET, DEFAULT_BUDGET_SHARE, MIN_VALIDATED, TARGET
from analyzer.orm import AnalysisRun, PromptResult, ValidationResult
from tests.factories import make_done_run
from tests.test_engines import _form, web_app  # noqa: F401 (fixtures)

PROMPTS = 24  # three tasks of eight
GENERATION_S = 1.0  # each prompt's plain generation in the run


class Engine:
    """A loaded pair whose every validation runs greedy and speculative twice: greedy ``greedy_s`` and then
    that times ``1 + spread`` (the run noise), speculative ``speculative_s`` each."""

    def __init__(self, greedy_s: float, speculative_s: float, spread: float):
        self.greedy_s, self.speculative_s, self.spread = greedy_s, speculative_s, spread
        self.calls: list[tuple[int, int]] = []

    def validate(self, prompt_ids, params, gamma):
        self.calls.append((len(prompt_ids), gamma))
        greedy = (self.greedy_s, self.greedy_s * (1 + self.spread))
        speculative = (self.speculative_s, self.speculative_s)
        return ValidationMeasurement(
            gamma, [1, 2], [1, 2], sum(greedy) / 2, self.speculative_s, True, 3,
            sum(greedy) / 2 / self.speculative_s, greedy, speculative,
        )  # fmt: skip


@pytest.fixture
def run(engine):
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        found = make_done_run(session, {"code": 0.9, "qa": 0.6, "math": 0.3}, per_task=PROMPTS // 3)
        for result in session.scalars(select(PromptResult).where(PromptResult.run_id == found.id)):
            result.target_time_s = GENERATION_S
            result.prompt_token_ids = list(range(20))
        run_id, params = found.id, found.run_params
    return sessions, run_id, params


def _validated(sessions, run_id) -> list[ValidationResult]:
    with sessions() as session:
        return list(session.scalars(select(ValidationResult).where(ValidationResult.run_id == run_id)))


def test_a_noisy_validation_stops_where_its_budget_would_be_overrun_and_the_run_stores_why(run):
    sessions, run_id, params = run
    pair = Engine(greedy_s=0.2, speculative_s=0.15, spread=0.3)  # 30% noise: never precise
    one = 0.2 + 0.2 * 1.3 + 2 * 0.15  # a prompt's pass: two greedy and two speculative runs
    told: list[str] = []
    plan = validate_run(
        sessions, run_id, pair, replace(params, validate=PROMPTS), lambda done, total, what: told.append(what)
    )
    budget = DEFAULT_BUDGET_SHARE * PROMPTS * GENERATION_S
    assert plan is not None and plan.stopped == BUDGET and plan.budget_s == pytest.approx(budget)
    # progress tells the budget unspent: 12 s before the first pass, 12 - 0.76 after it
    assert told[:2] == [
        f"validating with real speculative decoding, about {budget:.0f} s left",
        f"validating with real speculative decoding, about {budget - one:.0f} s left",
    ]
    assert told[-1] == f"validated {plan.why}"
    # every pass's seconds learned from the first: the passes that fit the budget and not one more
    assert len(plan.chosen) == int(budget // one) and plan.spent_s == pytest.approx(one * len(plan.chosen))
    assert plan.spent_s <= budget < plan.spent_s + one
    assert len(_validated(sessions, run_id)) == len(plan.chosen) == len(pair.calls)
    with sessions() as session:
        assert session.get(AnalysisRun, run_id).validation_plan == plan.as_json()
        report = build_report(session, run_id)
    assert report["validation_plan"]["stopped"] == BUDGET
    assert f"  validated {plan.why}" in report_text(report).splitlines()
    assert plan.why.startswith(f"{len(plan.chosen)} of {PROMPTS} held-out prompts")


def test_a_quiet_validation_stops_at_the_minimum_once_every_aggregate_is_precise(run):
    sessions, run_id, params = run
    pair = Engine(greedy_s=0.2, speculative_s=0.15, spread=0.0)  # identical greedy runs: no run noise
    plan = validate_run(sessions, run_id, pair, replace(params, validate=PROMPTS), None)
    assert plan is not None and plan.stopped == TARGET and len(plan.chosen) == MIN_VALIDATED
    assert plan.half_width == 0.0 and len(_validated(sessions, run_id)) == MIN_VALIDATED
    # the sample spans the tasks: the four come from all three
    validated = {v.prompt_id for v in _validated(sessions, run_id)}
    with sessions() as session:
        rows = session.scalars(select(PromptResult).where(PromptResult.run_id == run_id))
        assert {r.task_type for r in rows if r.prompt_id in validated} == {"code", "qa", "math"}


@pytest.mark.parametrize("asked", [3, 10])
def test_validate_all_validates_every_prompt_asked_with_no_budget(run, asked):
    sessions, run_id, params = run
    pair = Engine(greedy_s=2.0, speculative_s=1.5, spread=0.3)  # each pass costs more than the budget
    plan = validate_run(sessions, run_id, pair, replace(params, validate=asked, validate_all=True), None)
    assert plan is not None and len(plan.chosen) == asked == len(_validated(sessions, run_id))
    assert plan.as_json()["budget_s"] is None and plan.stopped == "passes"


@pytest.mark.parametrize(("box", "expected"), [(None, False), ("true", True)])
def test_the_new_run_forms_box_asks_to_validate_every_prompt(web_app, box, expected):
    client = web_app.test_client()
    page = client.get("/runs/new").get_data(as_text=True)
    assert '<input type="checkbox" name="validate_all" value="true" >' in page
    form = {**_form(client), "target": "hf:/models/target", "validate": "5"}
    queued = client.post("/runs", data={**form, **({"validate_all": box} if box else {})})
    assert queued.status_code == 302
    with web_app.extensions["specroute.sessions"]() as session:
        [stored] = session.scalars(select(AnalysisRun)).all()
        assert (stored.run_params.validate, stored.run_params.validate_all) == (5, expected)
