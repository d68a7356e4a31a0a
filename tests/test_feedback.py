"""Engine feedback: payload normalisation (counts, llama.cpp timings), errors naming the field, and
the task estimate moving under the active policy set."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.decide.feedback import FeedbackError, normalise, parse_feedback, record_feedback
from router.decide.route_ids import new_route_id, parse_route_id
from router.orm import FeedbackEvent, TaskEstimate
from router.policies.policy import publish_policies
from tests.factories import make_done_run


def test_normalise_counts_and_llama_cpp_timings():
    counts = normalise({"rounds": 10, "drafted": 30, "accepted": 12, "output_tokens": 22})
    assert (counts.engine, counts.rounds, counts.drafted, counts.accepted, counts.output_tokens) == (
        "counts",
        10,
        30,
        12,
        22,
    )
    llama = normalise({"timings": {"draft_n": 40, "draft_n_accepted": 25, "predicted_n": 64}})
    assert (llama.engine, llama.rounds, llama.drafted, llama.accepted, llama.output_tokens) == (
        "llama.cpp",
        39,
        40,
        25,
        64,
    )


def test_normalise_vllm_per_request_metrics():
    named = normalise(
        {
            "speculative_decoding": {
                "num_drafts": 20,
                "num_draft_tokens": 80,
                "num_accepted_tokens": 50,
                "num_output_tokens": 70,
            }
        }
    )
    assert (named.engine, named.rounds, named.drafted, named.accepted, named.output_tokens) == (
        "vllm",
        20,
        80,
        50,
        70,
    )
    aliases = normalise(
        {
            "speculative_decoding": {
                "num_spec_steps": 20,
                "num_draft_tokens": 80,
                "num_accepted_draft_tokens": 50,
            }
        }
    )
    assert (aliases.rounds, aliases.drafted, aliases.accepted) == (20, 80, 50)
    per_position = normalise(
        {
            "speculative_decoding": {
                "num_drafts": 10,
                "num_draft_tokens": 40,
                "num_accepted_tokens_per_pos": [9, 7, 4, 2],
            }
        }
    )
    assert per_position.accepted == 22
    # h[j] = rounds accepting exactly j of 4 drafts: 3 rounds x0, 2 x1, 0 x2, 1 x3, 4 x4
    histogram = normalise({"speculative_decoding": {"acceptance_histogram": [3, 2, 0, 1, 4]}})
    assert (histogram.rounds, histogram.drafted, histogram.accepted) == (10, 40, 2 + 3 + 16)


def test_normalise_sglang_meta_info():
    exact = normalise(
        {
            "meta_info": {
                "spec_verify_ct": 12,
                "completion_tokens": 40,
                "spec_num_correct_drafts": 27,
                "spec_num_proposed_drafts": 48,
            }
        }
    )
    assert (exact.engine, exact.rounds, exact.drafted, exact.accepted, exact.output_tokens) == (
        "sglang",
        12,
        48,
        27,
        40,
    )
    # without the draft counts: accepted = completion - verifications (one bonus token per verification),
    # drafted from the acceptance rate, else from the gamma the server ran with
    from_rate = normalise(
        {"meta_info": {"spec_verify_ct": 10, "completion_tokens": 34, "spec_accept_rate": 0.6}}
    )
    assert (from_rate.rounds, from_rate.accepted, from_rate.drafted) == (10, 24, 40)
    from_gamma = normalise(
        {"gamma": 4, "meta_info": {"spec_verify_ct": 10, "completion_tokens": 34, "spec_accept_length": 3.4}}
    )
    assert (from_gamma.rounds, from_gamma.accepted, from_gamma.drafted) == (10, 24, 40)


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"rounds": 1, "drafted": 2}, "field 'accepted' is missing"),
        ({"task_type": "qa"}, "give counts {rounds, drafted, accepted}, llama.cpp 'timings'"),
        (
            {"speculative_decoding": {"num_drafts": 3, "num_draft_tokens": 9}},
            "speculative_decoding.num_accepted_tokens' is missing",
        ),
        (
            {"speculative_decoding": {"acceptance_histogram": [1, -2]}},
            "field 'speculative_decoding.acceptance_histogram[1]' must be an integer from 0 to 1,000,000,000, got -2",
        ),
        ({"speculative_decoding": 5}, "field 'speculative_decoding' must be an object"),
        ({"meta_info": {"completion_tokens": 5}}, "field 'meta_info.spec_verify_ct' is missing"),
        (
            {"meta_info": {"spec_verify_ct": 2, "completion_tokens": 5}},
            "spec_num_proposed_drafts' is missing",
        ),
        (
            {"rounds": -1, "drafted": 2, "accepted": 1},
            "field 'rounds' must be an integer from 0 to 1,000,000,000",
        ),
        (
            {"rounds": 1, "drafted": True, "accepted": 1},
            "field 'drafted' must be an integer from 0 to 1,000,000,000",
        ),
        (
            {"rounds": 1, "drafted": 2**70, "accepted": 1},
            "field 'drafted' must be an integer from 0 to 1,000,000,000",
        ),
        ({"rounds": 1, "drafted": 2, "accepted": 3}, "accepted (3) cannot exceed drafted (2)"),
        (
            {"timings": {"draft_n": 2, "draft_n_accepted": "x", "predicted_n": 3}},
            "field 'timings.draft_n_accepted'",
        ),
        ({"timings": [1]}, "field 'timings' must be an object"),
    ],
)
def test_bad_payloads_name_the_field(payload, message):
    with pytest.raises(FeedbackError, match=re.escape(message)):
        normalise(payload)


def record(session, payload):
    return record_feedback(session, parse_feedback(payload)).estimate


def test_feedback_moves_the_task_estimate_and_is_stored(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1})
        with pytest.raises(FeedbackError, match="no active policy set"):
            record(session, {"task_type": "code", "rounds": 1, "drafted": 1, "accepted": 1})
        policy_set = publish_policies(session, run.id)
        route_id = new_route_id(policy_set.version, "code")  # no stored decision needed
        first = record(session, {"route_id": route_id, "rounds": 16, "drafted": 64, "accepted": 48})
        assert first.task_type == "code" and first.events == 1 and first.speculate
        alpha_before = first.beta_a / (first.beta_a + first.beta_b)
        for _ in range(30):  # the engine now sees almost no acceptance for code
            estimate = record(session, {"task_type": "code", "rounds": 60, "drafted": 64, "accepted": 4})
        assert estimate.events == 31 and estimate.total_drafted == 64 * 31
        assert estimate.beta_a / (estimate.beta_a + estimate.beta_b) < alpha_before - 0.3
        assert not estimate.speculate
        with pytest.raises(FeedbackError, match="unknown route_id 'nope'"):
            record(session, {"route_id": "nope", "rounds": 1, "drafted": 1, "accepted": 1})
        with pytest.raises(FeedbackError, match="give 'route_id'"):
            record(session, {"rounds": 1, "drafted": 1, "accepted": 1})
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 31
        assert session.scalar(select(func.count()).select_from(TaskEstimate)) == 1
        for made_up in (
            "poetry",
            "*",
            "astrology",
        ):  # no policy, not a classifier label: refused, nothing stored
            with pytest.raises(
                FeedbackError,
                match=rf"unknown task_type '{re.escape(made_up)}': name a task type with "
                r"a published policy or one the classifier predicts \(code, qa\)",
            ):
                record(session, {"task_type": made_up, "rounds": 5, "drafted": 5, "accepted": 5})
        assert session.scalar(select(func.count()).select_from(TaskEstimate)) == 1
        texts = [f"write a poem about the sea number {i}" for i in range(3)] + [
            f"def f{i}(): pass" for i in range(3)
        ]
        train_classifier(
            session, make_training_data(texts, ["poetry"] * 3 + ["code"] * 3, "t"), cross_validate=False
        )
        learned = record(session, {"task_type": "poetry", "rounds": 5, "drafted": 5, "accepted": 5})
        assert (
            learned.task_type == "poetry"
        )  # a classifier label without a policy: the workload-wide fallback


def test_a_route_id_names_its_policy_set_and_task():
    route_id = new_route_id(12, "customer support: de")
    assert parse_route_id(route_id) == (12, "customer support: de") and len(route_id) <= 128
    assert parse_route_id(new_route_id(None, "*")) == (0, "*")
    for bad in (
        "nope",
        "v1-xyz-code",
        "v1-" + "a" * 32 + "-",
        "v-" + "a" * 32 + "-code",
        "v1-" + "a" * 32 + "-" + "t" * 65,
        "v1-" + "a" * 32 + "-code",  # well-formed, made up: its MAC does not verify
        route_id.replace("-customer", "-Customer"),  # another task under the same MAC
        "v13" + route_id[3:],  # another policy set
    ):
        assert parse_route_id(bad) is None


def test_a_forged_route_id_is_refused_and_moves_nothing(client_with_key):
    """Route ids are signed with the server's secret key: feedback naming a well-formed route id that
    this server did not sign (or one signed with another key) is 404 unknown_route_id."""
    client, key = client_with_key
    assert parse_route_id(new_route_id(3, "code", b"k" * 32), b"k" * 32) == (3, "code")
    assert parse_route_id(new_route_id(3, "code", b"k" * 32), b"j" * 32) is None
    forged = new_route_id(1, "code", b"another server's key that is long")
    answer = client.post("/v1/feedback", json={"route_id": forged, "rounds": 4, "drafted": 8, "accepted": 8})
    assert answer.status_code == 404 and answer.get_json()["error"]["code"] == "unknown_route_id"
    made_up = "v1-" + "0123456789abcdef" * 2 + "-code"
    answer = client.post("/v1/feedback", json={"route_id": made_up, "rounds": 4, "drafted": 8, "accepted": 8})
    assert (
        answer.status_code == 404
        and "signed with the server's secret key" in answer.get_json()["error"]["message"]
    )
    genuine = new_route_id(None, "*", key)  # verifies, then meets the missing policy set: 409, not 404
    answer = client.post("/v1/feedback", json={"route_id": genuine, "rounds": 4, "drafted": 8, "accepted": 8})
    assert answer.status_code == 409 and answer.get_json()["error"]["code"] == "no_active_policy"


@pytest.fixture
def client_with_key(engine, db_url):
    from router.decide.route_ids import route_key
    from webui.app import create_app

    secret = "a-long-random-secret-key-for-this-test-0123456789"
    app = create_app(
        {"database_url": db_url, "secret_key": secret, "ui_worker": False, "router_refresh_s": 0}
    )
    yield app.test_client(), route_key(secret)
    app.extensions["specroute.close"]()


def test_feedback_by_route_id_moves_the_estimate_of_the_policy_set_that_decided(session):
    from router.decide.feedback import NoActivePolicy, UnknownRouteId

    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1})
        with pytest.raises(NoActivePolicy):  # decided before any policy set, none active now
            record(session, {"route_id": new_route_id(None, "*"), "rounds": 1, "drafted": 1, "accepted": 1})
        old = publish_policies(session, run.id)
        new = publish_policies(session, run.id)  # now active
        moved = record(
            session,
            {"route_id": new_route_id(old.version, "code"), "rounds": 16, "drafted": 64, "accepted": 48},
        )
        assert moved.policy_set_id == old.id and moved.task_type == "code" and moved.events == 1
        assert (
            session.scalar(
                select(func.count()).select_from(TaskEstimate).where(TaskEstimate.policy_set_id == new.id)
            )
            == 0
        )
        fallback = record(
            session, {"route_id": new_route_id(new.version, "*"), "rounds": 4, "drafted": 8, "accepted": 2}
        )
        assert fallback.policy_set_id == new.id and fallback.task_type == "*"
        with pytest.raises(UnknownRouteId, match="policy set v9 does not exist"):
            record(session, {"route_id": new_route_id(9, "code"), "rounds": 1, "drafted": 1, "accepted": 1})
        with pytest.raises(UnknownRouteId, match="has no task 'astrology'"):
            record(
                session,
                {
                    "route_id": new_route_id(new.version, "astrology"),
                    "rounds": 1,
                    "drafted": 1,
                    "accepted": 1,
                },
            )
        event = session.scalars(select(FeedbackEvent).order_by(FeedbackEvent.id)).first()
        assert event.route_id.startswith(f"v{old.version}-") and event.policy_set_id == old.id


def test_llama_server_timings_without_draft_counts_count_nothing_drafted():
    from router.decide.feedback import normalise

    counts = normalise({"timings": {"predicted_n": 40, "predicted_ms": 400.0, "prompt_n": 12, "cache_n": 3}})
    assert (counts.rounds, counts.drafted, counts.accepted, counts.output_tokens) == (40, 0, 0, 40)
    assert (counts.prompt_tokens, counts.decode_ms) == (15, 400.0)
    with pytest.raises(FeedbackError, match="'timings.predicted_ms' must be a number >= 0, got"):
        normalise({"timings": {"predicted_n": 40, "predicted_ms": "fast"}})
