"""Policies published from an analysis, and the routing decision with its rules."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.decide.decision import Router, RouterConfig, router_from_database
from router.orm import PolicySet
from router.policies.policy import (
    FALLBACK_TASK,
    PolicyContract,
    PolicyError,
    PolicySnapshot,
    activate_policy_set,
    publish_policies,
    published_pools,
)
from tests.factories import make_done_run
from webui.cli import cli


def test_publish_builds_per_task_policies_and_a_fallback_and_keeps_one_active(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1})
        first = publish_policies(session, run.id)
        policies = {p.task_type: p for p in first.policies}
        assert set(policies) == {"code", "qa", FALLBACK_TASK}
        code, qa = policies["code"], policies["qa"]
        assert code.speculate and code.gamma >= 2 and code.expected_speedup > 1.05
        assert not qa.speculate and qa.expected_speedup < 1.05
        assert code.alpha_mean > 0.8 and qa.alpha_mean < 0.2 and code.n_prompts == 4
        assert code.tier == "HIGHLY_RECOMMENDED" and qa.tier == "NOT_RECOMMENDED"
        assert policies[FALLBACK_TASK].is_fallback and policies[FALLBACK_TASK].n_prompts == 8
        assert len(code.speedup_curve) == 8 and max(code.speedup_curve) == pytest.approx(
            code.expected_speedup
        )
        # the same curve over options as a llama-server set's policy: one per gamma, the interval at g*
        curve = code.option_curve
        assert [o["label"] for o in curve["options"]] == [f"gamma {g}" for g in range(1, 9)]
        assert [o["speedup"] for o in curve["options"]] == code.speedup_curve
        assert curve["chosen"] == f"gamma {code.gamma}" and qa.option_curve["chosen"] is None
        at_best = curve["options"][code.gamma - 1]
        assert (at_best["low"], at_best["high"]) == (code.speedup_low, code.speedup_high)
        assert at_best["low"] is not None and all(
            o["low"] is None for g, o in enumerate(curve["options"], 1) if g != code.gamma
        )
        assert (curve["code"], curve["basis"]) == ("clears", "task")
        publish_policies(session, run.id, notes="again")
    with session.begin():
        assert [
            (s.version, s.is_active) for s in session.scalars(select(PolicySet).order_by(PolicySet.version))
        ] == [(1, False), (2, True)]
        activate_policy_set(session, 1)
    with session.begin():
        assert session.scalar(select(PolicySet.version).where(PolicySet.is_active.is_(True))) == 1
        with pytest.raises(PolicyError, match="no policy set version 9"):
            activate_policy_set(session, 9)


def test_publish_refuses_unfinished_or_unknown_runs(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9})
        run.status = "running"
        with pytest.raises(PolicyError, match="is running; only a finished run"):
            publish_policies(session, run.id)
        with pytest.raises(PolicyError, match="no analysis run 999"):
            publish_policies(session, 999)


def test_a_policy_set_publishes_its_pools_and_they_win_over_the_servers_setting():
    """The pools are part of the contract: a name for "off" and every gamma to gamma_max (adaptation may
    move a task to any), the publisher's names first; a set published before pools were (None) is named
    by the serving process's SPECROUTE_ROUTER_POOLS."""
    published = published_pools({"k2": "vllm-spec2", "k12": "vllm-spec12"}, 3)
    assert published == {
        "off": "spec-off",
        "k1": "spec-k1",
        "k2": "vllm-spec2",
        "k3": "spec-k3",
        "k12": "vllm-spec12",
    }
    server = {"off": "server-plain", "k2": "server-spec2"}
    assert PolicyContract(pools=published).pool(True, 2, server) == "vllm-spec2"
    assert PolicyContract(pools=published).pool(False, 0, server) == "spec-off"
    assert PolicyContract(pools=None).pool(False, 0, server) == "server-plain"
    assert PolicyContract(pools=None).pool(True, 5, server) == "spec-k5"


def _snapshot(task, speculate, gamma, speedup, alpha=0.8):
    return PolicySnapshot(task, speculate, gamma, alpha, 0.01, 10, speedup, "RECOMMENDED", (speedup,) * 8)


def test_route_rules_short_outputs_batches_and_fallback():
    policies = {FALLBACK_TASK: _snapshot(FALLBACK_TASK, True, 3, 1.3, alpha=0.6)}
    router = Router(
        None,
        policies,
        policy_version=4,
        draft_kind="ngram",
        ngram_max=3,
        contract=PolicyContract(priced_by="transformers", measured_by="llama.cpp"),
        config=RouterConfig(min_output_tokens=20, max_batch_size=8, pools={"k3": "vllm-spec3"}),
    )
    decision = router.route("anything at all", max_new_tokens=256, batch_size=1)
    assert (decision.speculate, decision.gamma, decision.task_type, decision.policy_version) == (
        True,
        3,
        "unlabelled",
        4,
    )
    assert decision.to_data()["engine"] == {
        "transformers": {"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 3},
        "llama.cpp": {"pool": "vllm-spec3", "speculative": {"draft": "prompt-lookup", "n_max": 3}},
        "pool": "vllm-spec3",
        "priced_by": "transformers",
        "measured_by": "llama.cpp",
    }
    assert decision.predicted_acceptance == 0.6 and decision.expected_speedup == 1.3
    short = router.route("anything", max_new_tokens=10)
    assert (short.speculate, short.gamma, short.to_data()["engine"]["pool"]) == (False, 0, "spec-off")
    assert [r.as_dict() for r in short.reason_codes if r.code == "short_output"] == [
        {"code": "short_output", "max_new_tokens": 10, "min_output_tokens": 20}
    ]
    batched = router.route("anything", batch_size=32)
    assert not batched.speculate and batched.codes[-1] == "batch_not_profiled"
    assert batched.reason_codes[-1].params == {"batch_size": 32, "max_batch_size": 8}
    assert short.route_id != batched.route_id


def test_route_with_no_policy_is_off():
    decision = Router(None, {}, policy_version=None).route("hello")
    assert (decision.speculate, decision.gamma, decision.to_data()["engine"]["transformers"]) == (
        False,
        0,
        {"assistant_model": False},
    )
    assert decision.codes == ["no_policy"]


def test_route_uses_the_task_policy_when_confident_and_model_draft_settings(session):
    with session.begin():
        run = make_done_run(session, {"translation": 0.9, "customer_support": 0.05})
        publish_policies(session, run.id)
        texts = [f"Translate German to English: Satz Nummer {i} ist hier." for i in range(6)] + [
            f"My card payment number {i} failed, please help me with my account" for i in range(6)
        ]
        train_classifier(
            session, make_training_data(texts, ["translation"] * 6 + ["customer_support"] * 6, "t")
        )
        router = router_from_database(session, RouterConfig(min_confidence=0.5))
    decision = router.route("Translate German to English: Guten Tag.", max_new_tokens=100)
    assert decision.task_type == "translation" and decision.confidence >= 0.5
    assert decision.speculate and decision.gamma >= 2
    assert decision.to_data()["engine"]["transformers"]["assistant_generation_config"] == {
        "num_assistant_tokens": decision.gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    support = router.route("My card payment failed, please help with my account", max_new_tokens=100)
    assert support.task_type == "customer_support" and not support.speculate


def test_policies_and_route_commands(runner, engine, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    from analyzer.db import make_session_factory

    with make_session_factory(engine)() as session, session.begin():
        run_id = make_done_run(session, {"code": 0.9, "qa": 0.1}).id
    published = runner.invoke(
        cli, ["policies", "publish", "--run", str(run_id), "--json"], catch_exceptions=False
    )
    assert published.exit_code == 0, published.stderr
    data = json.loads(published.stdout)
    assert data["version"] == 1 and data["active"]
    assert {p["task_type"]: p["speculate"] for p in data["policies"]} == {
        "code": True,
        "qa": False,
        "*": False,
    }
    assert "policy set v1 (active)" in runner.invoke(cli, ["policies", "list"]).stdout
    decision = json.loads(
        runner.invoke(cli, ["route", "some prompt", "--max-new-tokens", "5", "--json"]).stdout
    )
    assert decision["speculate"] is False and decision["policy_version"] == 1
    monkeypatch.setenv("SPECROUTE_ROUTER_POOLS", "{bad json")
    bad = runner.invoke(cli, ["route", "x"])
    assert bad.exit_code == 1 and "SPECROUTE_ROUTER_POOLS: not valid JSON" in bad.stderr
    missing = runner.invoke(cli, ["policies", "publish", "--run", "77"])
    assert missing.exit_code == 1 and "no analysis run 77" in missing.stderr
