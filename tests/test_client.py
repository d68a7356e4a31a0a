"""The client against a real waitress server: RouterClient's calls and errors, and generate_routed
running transformers as decided (prompt lookup, a draft model, or plain), with exact counts posted
back as feedback."""

from __future__ import annotations

import copy

import pytest
import torch
from sqlalchemy import func, select

from analyzer.measuring.prompt_encoding import encode_prompt
from analyzer.measuring.validate import greedy_generate
from router.client import RouterClient, RouterClientError, generate_routed
from router.orm import FeedbackEvent, TaskEstimate
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from tests.tiny_tokenizer import _seeded_tiny_model, build_tiny_tokenizer, tiny_llama_config
from tests.waitress_thread import waitress_in_a_thread
from webui.app import create_app


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    model = _seeded_tiny_model(tiny_llama_config(len(tokenizer), tokenizer), seed=3)
    return model, tokenizer


@pytest.fixture
def served(engine, db_url):
    """A real waitress server on a free port; yields (client, app)."""
    app = create_app({"database_url": db_url, "router_refresh_s": 0, "ui_worker": False})
    try:
        with waitress_in_a_thread(app) as base:
            yield RouterClient(base), app
    finally:
        app.extensions["specroute.close"]()


def _publish(session, draft_spec: str) -> None:
    with session.begin():
        run = make_done_run(session, {"code": 0.95}, draft_spec=draft_spec)
        publish_policies(session, run.id)


def test_client_calls_and_errors(served, session):
    client, _ = served
    assert client.health().status == "ok"
    with pytest.raises(RouterClientError) as missing:
        client.feedback(task_type="code", rounds=1, drafted=1, accepted=1)
    assert missing.value.status == 409 and missing.value.code == "no_active_policy"
    _publish(session, "ngram")
    decision = client.route("please write a function", max_new_tokens=64)
    assert decision.speculate and decision.engine.transformers["prompt_lookup_num_tokens"] == decision.gamma
    batch = client.route_batch([{"prompt": "a"}, {"prompt": "b", "max_new_tokens": 3}])
    assert [d.speculate for d in batch] == [True, False]
    with pytest.raises(RouterClientError) as bad:
        client.route("")
    assert bad.value.status == 400 and bad.value.code == "empty_prompt"
    assert client.policies().active.version == 1
    with pytest.raises(RouterClientError) as down:
        RouterClient("http://127.0.0.1:9", timeout_s=1).route("x")
    assert down.value.status is None and down.value.code == "unreachable"


def test_generate_routed_with_prompt_lookup_posts_exact_counts(served, session, tiny):
    client, _ = served
    model, tokenizer = tiny
    _publish(session, "ngram:max_ngram=3")
    prompt = "hello world hello world hello world tell me a story about the cat and the dog"
    result = generate_routed(model, tokenizer, prompt, router=client, max_new_tokens=48)
    assert result.decision.speculate and result.decision.engine.transformers["max_matching_ngram_size"] == 3
    ids = encode_prompt(
        tokenizer, text=prompt, max_prompt_tokens=400
    ).ids  # the chat template, as the client does
    plain, _ = greedy_generate(model, ids, 48)
    assert result.output_ids == plain  # greedy speculation is exact
    # every round emits its accepted drafts plus one target token, except that a last round cut by the
    # token budget may end on an accepted draft
    assert result.rounds + result.accepted - len(plain) in (0, 1) and 0 <= result.accepted <= result.drafted
    assert result.feedback.events == 1 and result.feedback.total_rounds == result.rounds
    with session.begin():
        event = session.scalar(select(FeedbackEvent))
        assert (event.engine, event.rounds, event.drafted, event.accepted) == (
            "transformers",
            result.rounds,
            result.drafted,
            result.accepted,
        )
        assert event.route_id == result.decision.route_id


def test_generate_routed_with_a_draft_model_and_plain(served, session, tiny):
    client, _ = served
    model, tokenizer = tiny
    _publish(session, "hf:/models/draft")
    twin = copy.deepcopy(model)  # an identical draft: every draft the budget allows is accepted
    messages = [{"role": "user", "content": "write a short poem about the sun"}]
    result = generate_routed(model, tokenizer, messages, router=client, draft=twin, max_new_tokens=40)
    gamma = result.decision.gamma
    assert result.decision.engine.transformers["assistant_model"] is True and gamma >= 1
    assert (
        result.accepted == result.drafted and result.rounds + result.accepted == len(result.output_ids) == 40
    )
    assert result.rounds == -(-40 // (gamma + 1))
    with pytest.raises(ValueError, match="pass draft="):
        generate_routed(model, tokenizer, messages, router=client, max_new_tokens=40)
    short = generate_routed(model, tokenizer, messages, router=client, draft=twin, max_new_tokens=8)
    assert not short.decision.speculate and short.rounds == 0 and short.feedback is None
    with session.begin():
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 1
        assert session.scalar(select(TaskEstimate.events)) == 1
    torch.testing.assert_close(twin.lm_head.weight, model.lm_head.weight)  # the draft was not modified
