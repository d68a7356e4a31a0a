"""Where a policy set's costs come from decides how its tasks' estimates start, decide and move
(router/decide/estimators.py): a run's set with a cost profile moves its acceptance posterior over the gammas, a
llama-server set moves each published setting by the pools' timings, a set with neither takes no feedback. The
decision, the feedback and the service ask the set's estimator and never tell the kinds apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analyzer.prompts.prompt_sets import import_sample
from router.decide.adaptation import AdaptationConfig
from router.decide.decision import router_from_database
from router.decide.estimators import CurveEstimator, TimingEstimator, UnknownSetting, estimator_of
from router.decide.feedback import PolicyNotAdaptive, parse_feedback, policy_context, record_feedback
from router.decide.feedback_formats import FeedbackError
from router.policies.policy import PolicyContract, PolicySnapshot, publish_policies
from router.policies.server_policy import publish_server_policies
from tests.factories import make_done_run, make_server_analysis

ROOT = Path(__file__).resolve().parents[1]
# the modules that decide, take feedback and serve: they ask the estimator, whatever the set's analysis
KIND_BLIND = ("router/decide/decision.py", "router/decide/feedback.py", "router/serve/service.py")
KIND_NAMES = {"by_setting", "plain_cost", "server_analysis_id", "run_id", "CurveEstimator", "TimingEstimator"}
KIND_NAMES |= {"initial_server_state", "apply_server_feedback", "choose_setting", "apply_feedback"}


def test_each_set_gets_the_estimator_of_where_its_costs_come_from(session):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2})
    publish_policies(session, run.id, pools={})
    session.flush()
    router = router_from_database(session)
    assert isinstance(router.estimator, CurveEstimator) and router.estimator.option_pools is None
    context = policy_context(session)
    assert context is not None and isinstance(context.estimator, CurveEstimator)
    # the run's policies start from their published gamma, the analysis' alpha as the prior
    code = context.policy("code")
    state = context.initial_state("code", AdaptationConfig())
    assert (state.speculate, state.gamma, state.setting) == (code.speculate, max(code.gamma, 1), None)

    prompt_set, _ = import_sample(session)
    record = make_server_analysis(session, prompt_set, {"extraction": "copy"})
    server_set = publish_server_policies(session, record.id, pools={})
    session.flush()
    router = router_from_database(session)
    assert isinstance(router.estimator, TimingEstimator)
    assert router.estimator.option_pools == server_set.pools  # a pool's feedback names its setting by them
    extraction = next(p for p in server_set.policies if p.task_type == "extraction")
    state = policy_context(session).initial_state("extraction", AdaptationConfig())
    assert extraction.speculate and (state.speculate, state.setting) == (True, extraction.setting)

    # a set priced by nothing takes no feedback, and feedback to it says which analysis it came from
    snapshot = PolicySnapshot("*", True, 3, 0.8, 0.01, 10, 1.3, "RECOMMENDED", (1.1, 1.2, 1.3))
    assert estimator_of(PolicyContract(), {"*": snapshot}, None) is None
    unpriced = publish_policies(session, run.id, pools={})
    unpriced.cost = None
    session.flush()
    assert router_from_database(session).estimator is None and policy_context(session) is None
    counts = {"task_type": "code", "rounds": 4, "drafted": 8, "accepted": 5}
    with pytest.raises(
        PolicyNotAdaptive, match=f"policy set v3 was published from analysis {run.id} without a cost"
    ):
        record_feedback(session, parse_feedback(counts))


def test_a_llama_server_sets_estimator_refuses_a_setting_it_publishes_no_pool_for(session):
    prompt_set, _ = import_sample(session)
    record = make_server_analysis(session, prompt_set, {"extraction": "copy"})
    server_set = publish_server_policies(session, record.id, pools={})
    session.flush()
    decision = router_from_database(session).route("x", max_new_tokens=64)
    timings = {"draft_n": 8, "draft_n_accepted": 4, "predicted_n": 64, "predicted_ms": 500.0, "prompt_n": 100}
    with pytest.raises(UnknownSetting, match="unknown setting 'ngram-simple 9/9': policy set v1 publishes"):
        record_feedback(
            session,
            parse_feedback(
                {"route_id": decision.route_id, "timings": timings, "setting": "ngram-simple 9/9"}
            ),
        )
    # timings without the served time cannot be priced against plain decoding
    chosen = next(p.setting for p in server_set.policies if p.speculate)
    with pytest.raises(FeedbackError, match="field 'timings.predicted_ms' is missing"):
        record_feedback(
            session,
            parse_feedback(
                {
                    "task_type": "extraction",
                    "timings": {k: v for k, v in timings.items() if k != "predicted_ms"},
                    "setting": chosen,
                }
            ),
        )


@pytest.mark.parametrize("path", KIND_BLIND)
def test_the_decision_the_feedback_and_the_service_never_tell_the_kinds_of_set_apart(path):
    tree = ast.parse((ROOT / path).read_text())
    named = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    named |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    named |= {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert not named & KIND_NAMES, sorted(named & KIND_NAMES)
