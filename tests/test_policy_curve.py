"""The one policy curve (analyzer/pricing/policy_curve.py) and the decision contract around it: the rule,
interpolation, the online rescaling, the gammas in reach, the policy set's contract reaching the
router and the adaptation, and reasons as codes rendered to text at the edge."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.pricing.policy_curve import BASE, PolicyCurve, acceptance_scale
from analyzer.pricing.speedup import Cost, iid_speedup
from router.decide.adaptation import AdaptationConfig
from router.decide.contract import RouteRequest
from router.decide.decision import Router, RouterConfig
from router.decide.reasons import POLICY_CODES, REASON_CODES, Reason, reason, reason_text
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot
from tests.factories import COST_CURVE

COST = Cost(COST_CURVE, 0.004)


def test_the_rule_needs_the_margin_and_a_lower_end_above_break_even():
    assert PolicyCurve((1.04, 1.06, 1.01)).at().gamma == 2
    assert PolicyCurve((1.04, 1.06, 1.01)).at().speculate  # 1.06 > 1.05, no interval published
    assert not PolicyCurve((1.04, 1.06, 1.01), margin=0.10).at().speculate
    assert not PolicyCurve((1.04, 1.06, 1.01), base_low=0.99).at().speculate  # the spread reaches a loss
    assert PolicyCurve((1.04, 1.06, 1.01), base_low=1.01).at().speculate
    nothing = PolicyCurve((math.nan, math.nan)).at()
    assert nothing.gamma is None and math.isnan(nothing.speedup) and not nothing.speculate


def test_batch_sizes_interpolate_curve_and_lower_end_between_profiled_sizes():
    curve = PolicyCurve((1.2, 1.3), {1: (1.2, 1.3), 16: (1.4, 2.0)}, {1: 1.1, 16: 0.95})
    assert curve.covers(8) and not curve.covers(17) and curve.at(17) is None
    point = curve.at(8)
    weight = 7 / 15
    assert point.gamma == 2 and point.speedup == pytest.approx((1 - weight) * 1.3 + weight * 2.0)
    assert point.low == pytest.approx((1 - weight) * 1.1 + weight * 0.95) and not point.measured
    assert (point.lower_batch, point.upper_batch) == (1, 16)
    assert curve.at(16).measured and curve.at(16).low == 0.95 and not curve.at(16).speculate


@given(alpha=st.floats(0.01, 0.99), prior=st.floats(0.01, 0.99), gamma=st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_rescaling_moves_each_point_by_the_tokens_per_round_under_the_online_alpha(alpha, prior, gamma):
    published = tuple(1.0 + 0.1 * g for g in range(1, 9))
    curve = PolicyCurve(published, prior_alpha=prior)
    expected = published[gamma - 1] * expected_tokens_iid(alpha, gamma) / expected_tokens_iid(prior, gamma)
    assert curve.speedup(gamma, BASE, alpha) == pytest.approx(expected)
    assert curve.curve(BASE, alpha)[gamma - 1] == pytest.approx(expected)
    assert curve.speedup(gamma) == published[gamma - 1]  # no alpha: the published curve itself
    assert acceptance_scale(prior, prior, gamma) == pytest.approx(1.0)


def test_gammas_in_reach_follow_gamma_max_and_the_cost_curve():
    published = tuple(1.0 + 0.01 * g for g in range(1, 31))
    assert PolicyCurve(published, gamma_max=24).top_gamma == 24
    assert len(PolicyCurve(published, gamma_max=24).curve()) == 24
    assert PolicyCurve(published, gamma_max=24, cost=COST).top_gamma == len(COST_CURVE) - 1  # k <= K priced
    assert math.isnan(PolicyCurve(published, gamma_max=24).speedup(25))
    assert PolicyCurve(published, gamma_max=24).speedup(24) == published[23]


def test_without_a_published_curve_the_iid_formula_prices_it():
    curve = PolicyCurve((), gamma_max=8, prior_alpha=0.6, cost=COST)
    assert curve.curve() == pytest.approx(tuple(iid_speedup(0.6, g, COST) for g in range(1, 9)))
    assert PolicyCurve((), gamma_max=8).curve() == ()  # nor a cost: nothing to say


def test_the_policy_sets_contract_reaches_the_router_and_its_adaptation():
    policy = PolicySnapshot(
        "*", True, 20, 0.95, 0.01, 10, 3.0, "RECOMMENDED", tuple(1.0 + 0.1 * g for g in range(1, 25))
    )
    router = Router(
        None,
        {FALLBACK_TASK: policy},
        policy_version=1,
        contract=PolicyContract(24, 0.2, "llama.cpp"),
        cost=Cost([0.04] * 25, 0.001),
        adaptation=AdaptationConfig(prior_strength=10),
    )
    assert router.adaptation.prior_strength == 10
    assert router.curve_of("code").gamma_max == 24 and router.curve_of("code").margin == 0.2
    decision = router.route("x", max_new_tokens=100)
    assert decision.gamma == 20 and decision.expected_speedup == pytest.approx(
        3.0
    )  # the curve's S(20), not NaN
    assert decision.to_data()["engine"]["priced_by"] == "llama.cpp"


def test_every_reason_code_renders_and_unknown_codes_are_refused():
    with pytest.raises(ValueError, match="unknown reason code"):
        Reason(code="made_up")
    assert (
        reason_text(reason("short_output", max_new_tokens=5, min_output_tokens=20))
        == "expected output 5 tokens < 20: off"
    )
    assert reason("no_policy").as_dict() == {"code": "no_policy"}
    assert set(REASON_CODES) >= {
        "task_policy",
        "workload_policy",
        "batch_size_curve",
        "online_estimate",
        "probe",
    }


_SNAPSHOT = st.builds(
    lambda speculate, gamma, alpha, n, speedup, low, curve, basis: PolicySnapshot(
        "*",
        speculate,
        gamma,
        alpha,
        0.01,
        n,
        speedup,
        "CONDITIONAL",
        tuple(curve),
        {1: tuple(curve), 16: tuple(s * 1.3 for s in curve)},
        (low, speedup + 0.1) if low is not None else (None, None),
        basis,
        {1: low, 16: low} if low is not None else {},
    ),
    st.booleans(),
    st.integers(1, 8),
    st.floats(0.01, 0.99),
    st.integers(1, 50),
    st.floats(0.5, 3.0),
    st.one_of(st.none(), st.floats(0.5, 3.0)),
    st.lists(st.floats(0.5, 3.0), min_size=8, max_size=8),
    st.sampled_from(["task", "workload"]),
)


@given(
    snapshot=_SNAPSHOT,
    max_new_tokens=st.one_of(st.none(), st.integers(1, 300)),
    batch_size=st.one_of(st.none(), st.integers(1, 40)),
    temperature=st.one_of(st.none(), st.floats(0, 2)),
    with_cost=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_decisions_carry_codes_whose_text_is_the_reasons_and_every_number_is_json(
    snapshot, max_new_tokens, batch_size, temperature, with_cost
):
    router = Router(
        None,
        {FALLBACK_TASK: snapshot, "code": snapshot},
        policy_version=3,
        cost=Cost(COST_CURVE, 0.004) if with_cost else None,
        config=RouterConfig(),
    )
    decision = router.route(
        "x", max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature
    )
    data = decision.to_data()
    assert data["reasons"] == [reason_text(Reason.model_validate(r)) for r in data["reason_codes"]]
    json.dumps(data, allow_nan=False)  # raises on NaN or infinity anywhere
    assert data["gamma"] == 0 if not data["speculate"] else 1 <= data["gamma"] <= 8
    assert "workload_policy" in decision.codes  # no classifier: the workload-wide policy decided


class _Classifier:
    """A stand-in classifier that says what the test draws (task, confidence), with a threshold, the
    tasks it rarely reaches and its catch-all tasks."""

    def __init__(self, answers, threshold, rarely, catch_all=()):
        self.answers, self.threshold, self.rarely_reached, self.version = answers, threshold, rarely, 7
        self.catch_all = {task: 0.3 for task in catch_all}

    def predict(self, texts):
        return [self.answers[i % len(self.answers)] for i in range(len(texts))]


_TASKS = ("code", "qa", "math")


@given(
    published=st.sets(st.sampled_from(_TASKS)),
    fallback=st.booleans(),
    answers=st.lists(
        st.tuples(st.sampled_from(_TASKS + ("translation",)), st.floats(0, 1)), min_size=1, max_size=6
    ),
    classifier=st.booleans(),
    threshold=st.floats(0, 1),
    rarely=st.sets(st.sampled_from(_TASKS)),
    few=st.sets(st.sampled_from(_TASKS)),
    catch_all=st.sets(st.sampled_from(_TASKS)),
    batch_size=st.one_of(st.none(), st.integers(1, 40)),
    max_new_tokens=st.one_of(st.none(), st.integers(1, 300)),
    with_cost=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_exactly_one_reason_says_which_policy_decided(
    published,
    fallback,
    answers,
    classifier,
    threshold,
    rarely,
    few,
    catch_all,
    batch_size,
    max_new_tokens,
    with_cost,
):
    def snapshot(task):
        curve = tuple(1.0 + 0.05 * g for g in range(1, 9))
        return PolicySnapshot(
            task,
            True,
            3,
            0.8,
            0.01,
            2 if task in few else 10,
            1.2,
            "RECOMMENDED",
            curve,
            {1: curve, 16: tuple(s * 1.2 for s in curve)},
            (1.05, 1.3),
            "workload" if task in few else "task",
        )

    policies = {task: snapshot(task) for task in published}
    if fallback or published:  # a published set always has its fallback
        policies[FALLBACK_TASK] = snapshot(FALLBACK_TASK)
    router = Router(
        _Classifier(answers, threshold, {t: "recall 0.10" for t in rarely}, catch_all)
        if classifier
        else None,
        policies,
        policy_version=2,
        cost=Cost(COST_CURVE, 0.004) if with_cost else None,
    )
    for decision in router.route_many(
        [RouteRequest.of("x", max_new_tokens=max_new_tokens, batch_size=batch_size)] * len(answers)
    ):
        deciding = [r for r in decision.reason_codes if r.code in POLICY_CODES]
        assert len(deciding) == 1, decision.codes
        decided_by = decision.route_id.rsplit("-", 1)[1]  # the task whose policy decided ("*": the fallback)
        if deciding[0].code in ("task_policy", "task_too_few_prompts"):
            assert decided_by == decision.task_type and decision.task_type in published
            assert decision.confidence >= router.min_confidence and decision.task_type not in catch_all
        elif deciding[0].code == "workload_policy":
            assert decided_by == FALLBACK_TASK
            cause = deciding[0].params["cause"]
            assert (cause == "low_confidence") == (classifier and decision.confidence < router.min_confidence)
            assert (cause == "catch_all") == (
                classifier
                and decision.confidence >= router.min_confidence
                and decision.task_type in catch_all
            )
            assert (cause == "no_classifier") == (not classifier)
        else:
            assert not policies and decided_by == FALLBACK_TASK
        rarely_said = "rarely_reached" in decision.codes
        assert rarely_said == (classifier and decision.task_type in rarely)
