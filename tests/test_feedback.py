"""Engine feedback: payload normalisation (counts, llama.cpp timings), errors naming the field, and
the task estimate moving under the active policy set."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from router.classifier import make_training_data, train_classifier
from router.feedback import FeedbackError, normalise, record_feedback
from router.models import FeedbackEvent, RouteDecision, TaskEstimate
from router.policy import publish_policies
from tests.factories import make_done_run


def test_normalise_counts_and_llama_cpp_timings():
    counts = normalise({"rounds": 10, "drafted": 30, "accepted": 12, "output_tokens": 22})
    assert (counts.engine, counts.rounds, counts.drafted, counts.accepted, counts.output_tokens) == ("counts", 10, 30, 12, 22)
    llama = normalise({"timings": {"draft_n": 40, "draft_n_accepted": 25, "predicted_n": 64}})
    assert (llama.engine, llama.rounds, llama.drafted, llama.accepted, llama.output_tokens) == ("llama.cpp", 39, 40, 25, 64)


def test_normalise_vllm_per_request_metrics():
    named = normalise({"speculative_decoding": {"num_drafts": 20, "num_draft_tokens": 80, "num_accepted_tokens": 50,
                                                "num_output_tokens": 70}})
    assert (named.engine, named.rounds, named.drafted, named.accepted, named.output_tokens) == ("vllm", 20, 80, 50, 70)
    aliases = normalise({"speculative_decoding": {"num_spec_steps": 20, "num_draft_tokens": 80,
                                                  "num_accepted_draft_tokens": 50}})
    assert (aliases.rounds, aliases.drafted, aliases.accepted) == (20, 80, 50)
    per_position = normalise({"speculative_decoding": {"num_drafts": 10, "num_draft_tokens": 40,
                                                       "num_accepted_tokens_per_pos": [9, 7, 4, 2]}})
    assert per_position.accepted == 22
    # h[j] = rounds accepting exactly j of 4 drafts: 3 rounds x0, 2 x1, 0 x2, 1 x3, 4 x4
    histogram = normalise({"speculative_decoding": {"acceptance_histogram": [3, 2, 0, 1, 4]}})
    assert (histogram.rounds, histogram.drafted, histogram.accepted) == (10, 40, 2 + 3 + 16)


def test_normalise_sglang_meta_info():
    exact = normalise({"meta_info": {"spec_verify_ct": 12, "completion_tokens": 40, "spec_num_correct_drafts": 27,
                                     "spec_num_proposed_drafts": 48}})
    assert (exact.engine, exact.rounds, exact.drafted, exact.accepted, exact.output_tokens) == ("sglang", 12, 48, 27, 40)
    # without the draft counts: accepted = completion - verifications (one bonus token per verification),
    # drafted from the acceptance rate, else from the gamma the server ran with
    from_rate = normalise({"meta_info": {"spec_verify_ct": 10, "completion_tokens": 34, "spec_accept_rate": 0.6}})
    assert (from_rate.rounds, from_rate.accepted, from_rate.drafted) == (10, 24, 40)
    from_gamma = normalise({"gamma": 4, "meta_info": {"spec_verify_ct": 10, "completion_tokens": 34,
                                                      "spec_accept_length": 3.4}})
    assert (from_gamma.rounds, from_gamma.accepted, from_gamma.drafted) == (10, 24, 40)


@pytest.mark.parametrize("payload, message", [
    ({"rounds": 1, "drafted": 2}, "give counts"),
    ({"speculative_decoding": {"num_drafts": 3, "num_draft_tokens": 9}}, "speculative_decoding.num_accepted_tokens' is missing"),
    ({"speculative_decoding": {"acceptance_histogram": [1, -2]}}, "speculative_decoding.acceptance_histogram' must be"),
    ({"speculative_decoding": 5}, "field 'speculative_decoding' must be an object"),
    ({"meta_info": {"completion_tokens": 5}}, "field 'meta_info.spec_verify_ct' must be"),
    ({"meta_info": {"spec_verify_ct": 2, "completion_tokens": 5}}, "spec_num_proposed_drafts' is missing"),
    ({"rounds": -1, "drafted": 2, "accepted": 1}, "field 'rounds' must be an integer from 0 to 1,000,000,000"),
    ({"rounds": 1, "drafted": True, "accepted": 1}, "field 'drafted' must be an integer from 0 to 1,000,000,000"),
    ({"rounds": 1, "drafted": 2**70, "accepted": 1}, "field 'drafted' must be an integer from 0 to 1,000,000,000"),
    ({"rounds": 1, "drafted": 2, "accepted": 3}, "accepted (3) cannot exceed drafted (2)"),
    ({"timings": {"draft_n": 2, "draft_n_accepted": "x", "predicted_n": 3}}, "field 'timings.draft_n_accepted'"),
    ({"timings": [1]}, "field 'timings' must be an object"),
])
def test_bad_payloads_name_the_field(payload, message):
    with pytest.raises(FeedbackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        normalise(payload)


def test_feedback_moves_the_task_estimate_and_is_stored(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1})
        with pytest.raises(FeedbackError, match="no active policy set"):
            record_feedback(session, {"task_type": "code", "rounds": 1, "drafted": 1, "accepted": 1})
        policy_set = publish_policies(session, run.id)
        session.add(RouteDecision(route_id="r-1", policy_set_id=policy_set.id, task_type="code", confidence=0.9,
                                  speculate=True, gamma=4, expected_speedup=1.5))
        first = record_feedback(session, {"route_id": "r-1", "rounds": 16, "drafted": 64, "accepted": 48})
        assert first.task_type == "code" and first.events == 1 and first.speculate
        alpha_before = first.beta_a / (first.beta_a + first.beta_b)
        for _ in range(30):  # the engine now sees almost no acceptance for code
            estimate = record_feedback(session, {"task_type": "code", "rounds": 60, "drafted": 64, "accepted": 4})
        assert estimate.events == 31 and estimate.total_drafted == 64 * 31
        assert estimate.beta_a / (estimate.beta_a + estimate.beta_b) < alpha_before - 0.3
        assert not estimate.speculate
        with pytest.raises(FeedbackError, match="unknown route_id 'nope'"):
            record_feedback(session, {"route_id": "nope", "rounds": 1, "drafted": 1, "accepted": 1})
        with pytest.raises(FeedbackError, match="give 'route_id'"):
            record_feedback(session, {"rounds": 1, "drafted": 1, "accepted": 1})
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 31
        assert session.scalar(select(func.count()).select_from(TaskEstimate)) == 1
        for made_up in ("poetry", "*", "astrology"):  # no policy, not a classifier label: refused, nothing stored
            with pytest.raises(FeedbackError, match=rf"unknown task_type '{re.escape(made_up)}': name a task type with "
                                                    r"a published policy or one the classifier predicts \(code, qa\)"):
                record_feedback(session, {"task_type": made_up, "rounds": 5, "drafted": 5, "accepted": 5})
        assert session.scalar(select(func.count()).select_from(TaskEstimate)) == 1
        texts = [f"write a poem about the sea number {i}" for i in range(3)] + [f"def f{i}(): pass" for i in range(3)]
        train_classifier(session, make_training_data(texts, ["poetry"] * 3 + ["code"] * 3, "t"), cross_validate=False)
        learned = record_feedback(session, {"task_type": "poetry", "rounds": 5, "drafted": 5, "accepted": 5})
        assert learned.task_type == "poetry"  # a classifier label without a policy: the workload-wide fallback
