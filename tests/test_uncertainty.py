"""Uncertainty in every decision: the bootstrap interval of S(g*) over a task's prompts, the rule
that uses its lower end, tasks too small to decide falling back to the workload's decision (and
saying so in the report, the policies and the router's reasons), and notes wherever the tier and the
decision disagree."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.advice.report import build_report
from analyzer.advice.report_text import report_text
from analyzer.advice.summary import GroupSummary, tier_note
from analyzer.pricing.speedup import Cost, bootstrap_speedup_interval
from router.decide.decision import Router
from router.policies.policy import FALLBACK_TASK, PolicySnapshot, publish_policies
from tests.decision_rule import decide_point
from tests.factories import make_done_run


def test_bootstrap_interval_edge_cases_and_reproducibility():
    assert all(np.isnan(v) for v in bootstrap_speedup_interval([], []))
    assert bootstrap_speedup_interval([2.0], [1.0]) == (2.0, 2.0)  # one prompt: no spread to speak of
    assert bootstrap_speedup_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(
        (2.0, 2.0)
    )  # equal ratios
    greedy, speculative = [1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 0.8, 1.0, 1.2, 0.9]
    first = bootstrap_speedup_interval(greedy, speculative)
    assert first == bootstrap_speedup_interval(greedy, speculative)  # seeded: a report is reproducible
    pooled = sum(greedy) / sum(speculative)
    assert first[0] < pooled < first[1]
    many = bootstrap_speedup_interval(greedy * 10, speculative * 10)  # the same prompts ten times over
    assert many[0] < pooled < many[1] and (many[1] - many[0]) < 0.5 * (
        first[1] - first[0]
    )  # more prompts, narrower
    wider = bootstrap_speedup_interval(greedy, speculative, level=0.99)
    assert wider[0] <= first[0] and wider[1] >= first[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.1, 10.0)), min_size=1, max_size=40))
def test_bootstrap_interval_lies_within_the_prompts_own_speedups(pairs):
    greedy, speculative = np.array(pairs).T
    low, high = bootstrap_speedup_interval(greedy, speculative, resamples=300)
    ratios = greedy / speculative
    assert ratios.min() - 1e-9 <= low <= high <= ratios.max() + 1e-9


@pytest.mark.parametrize(
    "speedup, interval, n, expected, code, fragment",
    [
        (
            1.30,
            (1.10, 1.50),
            2,
            None,
            "too_few_prompts",
            "1.30x [1.10, 1.50], n = 2: too few prompts to decide (fewer than 3), the workload's",
        ),
        (
            1.03,
            (1.00, 1.06),
            9,
            False,
            "below_margin",
            "1.03x [1.00, 1.06], n = 9: S(g*) does not clear 1.05x",
        ),
        (
            1.13,
            (0.97, 1.30),
            5,
            False,
            "interval_reaches_loss",
            "S(g*) clears 1.05x but the interval reaches 0.97x, a possible loss",
        ),
        (
            1.13,
            (1.04, 1.22),
            5,
            True,
            "clears",
            "1.13x [1.04, 1.22], n = 5: S(g*) clears 1.05x and the interval stays above 1.00x",
        ),
    ],
)
def test_the_decision_uses_the_lower_end_and_refuses_to_decide_for_small_tasks(
    speedup, interval, n, expected, code, fragment
):
    decision, reason = decide_point(speedup, interval, n, 0.05)
    assert decision is expected and reason.code == code
    assert fragment in reason.text()  # the sentence rendered from the code


def test_a_task_too_small_to_decide_takes_the_workloads_decision_everywhere(session):
    with session.begin():
        run = make_done_run(
            session, {"code": 0.95, "qa": 0.9, "math": 0.3}, per_task={"code": 8, "qa": 8, "math": 2}
        )
        report = build_report(session, run.id)
        math, workload = report["tasks"]["math"], report["workload"]
        assert math["n"] == 2 and math["decision_basis"] == "workload"
        assert math["speculate"] is workload["speculate"] is True
        # what it shows is what is routed: the workload's gamma and speedup; its reason quotes its own
        assert (math["best_gamma"], math["predicted_speedup"]) == (
            workload["best_gamma"],
            workload["predicted_speedup"],
        )
        assert float(math["decision_reason"].split("x [")[0]) < 1.0
        assert (
            "too few prompts to decide (fewer than 3), the workload's decision applies (speculate at gamma"
            in math["decision_reason"]
        )
        assert report["tasks"]["code"]["decision_basis"] == "task" and report["tasks"]["code"]["speculate"]
        assert all(entry["decision_basis"] == "workload" for entry in math["by_batch"].values())
        text = report_text(report)
        assert "speculate (workload's)" in text and "  math: " in text
        policy_set = publish_policies(session, run.id)
        policies = {p.task_type: p for p in policy_set.policies}
        fallback = policies[FALLBACK_TASK]
        small = policies["math"]
        assert small.decision_basis == "workload" and small.n_prompts == 2 and small.alpha_mean < 0.4
        assert (small.speculate, small.gamma, small.expected_speedup) == (
            fallback.speculate,
            fallback.gamma,
            fallback.expected_speedup,
        )
        assert (small.speedup_low, small.speedup_high) == (fallback.speedup_low, fallback.speedup_high)
        assert small.speedup_curves_by_batch == fallback.speedup_curves_by_batch
        assert policies["code"].decision_basis == "task" and policies["code"].speedup_low > 1.0
        snapshot = PolicySnapshot.of(small)
    router = Router(None, {"math": snapshot, FALLBACK_TASK: PolicySnapshot.of(fallback)}, policy_version=1)
    router.classifier = type(
        "OneTask",
        (),
        {
            "predict": lambda self, texts: [("math", 0.9)] * len(texts),
            "version": 1,
            "threshold": None,
            "rarely_reached": {},
            "catch_all": {},
        },
    )()
    decision = router.route("What is 2 + 2?", max_new_tokens=100)
    assert decision.speculate and decision.gamma == fallback.gamma
    first = decision.reason_codes[0]
    assert first.code == "task_too_few_prompts" and (first.params["task"], first.params["n_prompts"]) == (
        "math",
        2,
    )
    assert first.params["confidence"] == 0.9 and first.params["gamma"] == fallback.gamma


def test_a_mixed_workload_whose_interval_reaches_a_loss_stays_off_and_says_why(session):
    with session.begin():
        run = make_done_run(
            session, {"a": 0.55, "b": 0.85, "c": 0.3, "d": 0.95}, draft_spec="ngram", draft_step_s=0.0005
        )
        report = build_report(session, run.id)
    workload = report["workload"]
    low, high = workload["speedup_interval"]
    assert workload["predicted_speedup"] > 1.05 and low <= 1.0 < high and not workload["speculate"]
    assert "the interval reaches" in workload["decision_reason"]
    assert workload["tier"] == "RECOMMENDED" and workload["tier_note"].startswith(
        "the tier reads alpha alone (0.66); the decision weighs the cost: a round at gamma"
    )
    assert (
        report["tasks"]["d"]["speculate"] and report["tasks"]["d"]["tier_note"] is None
    )  # tier and decision agree
    assert all(
        t["speedup_interval"][0] <= t["predicted_speedup"] <= t["speedup_interval"][1]
        for t in report["tasks"].values()
    )


def test_tier_note_explains_a_speculating_task_with_a_low_tier():
    flat = Cost([0.010, 0.0102, 0.0104, 0.0106, 0.0108], 0.00001, draft_cost_per_token=False)
    summary = GroupSummary(
        tier="NOT_RECOMMENDED",
        speculate=True,
        best_gamma=4,
        alpha_mean=0.28,
        al=1.37,
        decision_basis="task",
        n=5,
        alpha_var=0.01,
        alpha_std=0.1,
        output_tokens=100,
    )
    assert tier_note(summary, flat) == (
        "the tier reads alpha alone (0.28); the decision weighs the cost: a round at "
        "gamma 4 costs 1.08x a decoding step here and yields 1.37 tokens on average"
    )
    assert tier_note(replace(summary, tier="RECOMMENDED"), flat) is None
    assert tier_note(replace(summary, speculate=False), flat) is None
