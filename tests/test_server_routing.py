"""Routing to llama-server pools: a policy set published from a llama-server analysis
names per task the drafter setting and its pool, the router's decision names that pool and its flags,
``specroute pools plan`` prints each pool's command line and the SPECROUTE_ROUTER_POOLS mapping, and
``specroute pools start`` runs them; requests routed to live pools reach the server running their setting.

The analysis here is made by the real replay, pricing and store on synthetic greedy outputs
(tests/factories.py, make_server_analysis): what it chooses is computed, not written down."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from sqlalchemy import select

from analyzer.analysis.analysis_ref import parse_analysis_ref
from analyzer.db import make_session_factory
from analyzer.engine.llama_server_process import LlamaServerClient, free_port
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.orm import PromptSet
from analyzer.prompts.prompt_sets import import_sample
from analyzer.settings import Settings, SettingsError
from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.decide.adaptation import AdaptationConfig
from router.decide.decision import router_from_database
from router.decide.feedback import FeedbackError, parse_feedback, record_feedback
from router.decide.server_adaptation import PlainCost, estimate, option_priors, prior_weight_ms
from router.policies.policy import PolicyError, publish_policies, router_pools
from router.policies.publishing import publish_analysis
from router.policies.records import policy_set_dict
from router.policies.server_policy import policy_set_plan, publish_server_policies, workload_choice
from tests.factories import make_done_run, make_server_analysis

ANSWERS = {"extraction": "copy", "code": "chunks"}  # how the synthetic analysis' answers copy their prompt
COPY_TASKS = set(ANSWERS)
ROUTED = ("extraction", "code", "general")  # the classifier's tasks: two settings and off
DRAFTERS = ("ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod 16 2-16")


def _free_port_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports nobody listens on, below the kernel's ephemeral
    range, so that no outgoing connection of this run takes one of them before its server binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        ephemeral_low = int(ports.read().split()[0])
    for _ in range(200):
        first = random.randrange(10_000, ephemeral_low - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports below {ephemeral_low}")


def _texts(prompt_set: PromptSet, task: str) -> list[str]:
    return [p.text or p.messages[-1]["content"] for p in prompt_set.prompts if p.task == task]


def _setup(session, first_port: int = 8081, pools=None):
    """The sample set, its simulated llama-server analysis published as the active set, and a classifier
    telling extraction from general chat."""
    prompt_set, _ = import_sample(session)
    record = make_server_analysis(session, prompt_set, ANSWERS, DRAFTERS)
    policy_set = publish_server_policies(session, record.id, first_port=first_port, pools=pools or {})
    texts = {task: _texts(prompt_set, task) for task in ROUTED}
    train_classifier(
        session,
        make_training_data(
            [text for t in ROUTED for text in texts[t]], [t for t in ROUTED for _ in texts[t]], "test"
        ),
        cross_validate=False,
    )
    return prompt_set, record, policy_set, texts


def test_a_set_from_a_llama_server_analysis_names_each_tasks_setting_and_its_pool(session):
    prompt_set, record, policy_set, _ = _setup(session)
    chosen = {t["task"]: t["chosen"] for t in record.tasks}
    # the copying tasks speculate (the replay drafted and accepted their copies), the others do not
    assert {task for task, label in chosen.items() if label} == COPY_TASKS
    policies = {p.task_type: p for p in policy_set.policies}
    assert policy_set.server_analysis_id == record.id and policy_set.run_id is None
    assert (policy_set.measured_by, policy_set.priced_by, policy_set.cost) == (
        "llama-server",
        "llama-server",
        None,
    )
    for task, label in chosen.items():
        policy = policies[task]
        assert (policy.speculate, policy.setting) == (label is not None, label)
        if label is not None:
            assert policy.expected_speedup == pytest.approx(
                next(t for t in record.tasks if t["task"] == task)["predicted"][label]
            )
            assert policy.gamma == parse_drafter(label).max_draft
            index = record.drafters.index(label)
            rates = [
                row["settings"][index]["draft_n_accepted"] / row["settings"][index]["draft_n"]
                for row in record.prompts
                if row["task"] == task and row["settings"][index]["draft_n"]
            ]
            assert policy.alpha_mean == pytest.approx(float(np.mean(rates)))
            # a whole copy is accepted in full; short copied runs only in part
            assert policy.alpha_mean == 1.0 if ANSWERS[task] == "copy" else 0.2 < policy.alpha_mean < 0.9
    predicted, best = workload_choice(record)
    fallback = policies["*"]
    assert fallback.setting == best and set(predicted) == set(record.drafters)
    # one plain pool and one per distinct setting, on consecutive local ports in that order
    settings = sorted({label for label in [*chosen.values(), best] if label})
    assert list(policy_set.pools) == ["off", *settings]
    assert list(policy_set.pools.values()) == [
        f"http://127.0.0.1:{8081 + i}" for i in range(len(settings) + 1)
    ]


def test_an_analysis_whose_advice_is_withheld_advises_nothing_and_publishes_inactive(
    session, runner, tmp_path
):
    # the same copying prompts as above, but the step-cost fit missed its bound twice: nothing is advised
    prompt_set, _ = import_sample(session)
    reason = (
        "the n-gram step costs miss the measured time by 21.0% on prompts it was not fitted on (bound 9.0%)"
    )
    record = make_server_analysis(session, prompt_set, ANSWERS, DRAFTERS, withheld=reason)
    assert record.advice_withheld == reason
    assert all(t["chosen"] is None for t in record.tasks)  # every task off, though the copies would pay
    assert max(max(t["predicted"].values()) for t in record.tasks if t["task"] in COPY_TASKS) > 1.05
    predicted, best = workload_choice(record)
    assert best is None and max(predicted.values()) > 1.05
    policy_set = publish_server_policies(session, record.id, pools={})
    assert not policy_set.is_active and not any(p.speculate for p in policy_set.policies)
    assert publish_server_policies(
        session, record.id, pools={}, activate=True
    ).is_active  # an explicit choice
    # published by its reference, as 'specroute policies publish --analysis' does: inactive, saying why
    published = publish_analysis(session, parse_analysis_ref(f"llama-server:{record.id}"))
    assert not published.policy_set.is_active and published.withheld == f"Advice withheld: {reason}."
    forced = publish_analysis(session, parse_analysis_ref(f"llama-server:{record.id}"), activate=True)
    assert forced.policy_set.is_active and forced.withheld is None
    # the routing numbers are stored from the same replays: the oracle is the ceiling of any router
    overall = record.routing[-1]
    assert overall["group"] == "all" and overall["oracle"] >= overall["by_task"] >= 1.0


def test_the_decision_names_the_pool_running_the_tasks_setting(session):
    prompt_set, record, policy_set, texts = _setup(session, pools={"off": "http://plain.internal:9000"})
    router = router_from_database(session)
    setting = next(p.setting for p in policy_set.policies if p.task_type == "extraction")
    copy = router.route(texts["extraction"][0], max_new_tokens=64)
    assert (copy.task_type, copy.speculate) == ("extraction", True)
    assert (
        copy.to_data()["engine"]["pool"]
        == policy_set.pools[setting]
        == copy.to_data()["engine"]["llama-server"]["pool"]
    )
    assert copy.to_data()["engine"]["llama-server"]["setting"] == setting
    assert copy.to_data()["engine"]["llama-server"]["flags"][:2] == ["--spec-type", setting.split()[0]]
    assert (
        "transformers" not in copy.to_data()["engine"] and "llama.cpp" not in copy.to_data()["engine"]
    )  # they cannot run this setting
    chat = router.route(texts["general"][0], max_new_tokens=64)
    assert (chat.task_type, chat.speculate, chat.gamma) == ("general", False, 0)
    assert (
        chat.to_data()["engine"]["pool"] == "http://plain.internal:9000"
    )  # the publisher's SPECROUTE_ROUTER_POOLS
    assert chat.to_data()["engine"]["llama-server"] == {
        "pool": "http://plain.internal:9000",
        "setting": "off",
        "flags": [],
    }
    short = router.route(texts["extraction"][0], max_new_tokens=4)  # a short output runs plain
    assert not short.speculate and short.to_data()["engine"]["pool"] == "http://plain.internal:9000"
    # feedback prices a pool's request against plain decoding: bare counts cannot, and are refused with why
    with pytest.raises(FeedbackError, match="'timings.predicted_ms' is missing"):
        record_feedback(
            session, parse_feedback({"route_id": copy.route_id, "rounds": 3, "drafted": 9, "accepted": 6})
        )


def _timings(produced: int, drafted: int, accepted: int, predicted_ms: float, prompt: int = 120) -> dict:
    """A llama-server pool's ``timings`` for one request."""
    return {
        "predicted_n": produced,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "predicted_ms": predicted_ms,
        "prompt_n": prompt,
    }


def _prior(priors, label):
    return next(p for p in priors if p.label == label)


def test_feedback_from_the_pools_moves_a_task_to_another_pool_and_probes_bring_it_back(session):
    _, record, policy_set, texts = _setup(session)
    cost = PlainCost.from_json(policy_set.plain_cost)
    assert cost is not None and cost.step_ms == pytest.approx(
        next(iter(record.cost.values()))["plain_step_ms"]
    )
    extraction = next(p for p in policy_set.policies if p.task_type == "extraction")
    first = extraction.setting
    assert extraction.speculate and first in policy_set.pools
    # the policy carries its curve over every setting the analysis compared, decided by the one rule
    assert [o["label"] for o in extraction.option_curve["options"]] == record.drafters
    assert extraction.option_curve["chosen"] == first and extraction.option_curve["code"] == "clears"
    assert extraction.speedup_low is not None and extraction.speedup_low > 1.0
    plain_ms = cost.plain_ms(120, 64)
    decision = router_from_database(session).route(texts["extraction"][0], max_new_tokens=64)
    assert decision.to_data()["engine"]["llama-server"]["setting"] == first
    # every pool now serves extraction slower than plain decoding (its prompts stopped repeating themselves)
    priors = option_priors(extraction.option_curve, policy_set.pools)
    assert len(priors) >= 2 and {p.label for p in priors} <= set(policy_set.pools)
    weight = prior_weight_ms(cost, AdaptationConfig())
    visited, state = [first], None
    for _ in range(40):
        slow = _timings(64, 40, 2, plain_ms / 0.7)
        recorded = record_feedback(session, parse_feedback({"route_id": decision.route_id, "timings": slow}))
        before, state = state, recorded.state
        used = visited[-1]
        if before is not None:  # the setting that served moved down, the others did not move
            assert (
                estimate(_prior(priors, used), state, weight)[0]
                < estimate(_prior(priors, used), before, weight)[0]
            )
        if state.setting != used:
            estimates = {p.label: estimate(p, state, weight) for p in priors}
            if (
                state.setting is None
            ):  # off: nothing published clears the rule, and the one in force fell below 1
                assert estimates[used][0] < 1.0 and all(
                    e[0] <= 1.05 or e[1] <= 1.0 for e in estimates.values()
                )
                break
            # another pool: a published setting now estimated higher than the one in force, clearing the rule
            assert state.setting in policy_set.pools and state.setting not in visited
            assert (
                estimates[state.setting][0] > max(1.05, estimates[used][0])
                and estimates[state.setting][1] > 1.0
            )
            visited.append(state.setting)
    assert state is not None and state.setting is None and not state.speculate, visited
    # both published settings paid for extraction's copies: it tried the other pool before going off
    assert visited == [first, next(p.label for p in priors if p.label != first)]
    moved = None
    session.commit()
    router = router_from_database(session)
    now = router.route(texts["extraction"][0], max_new_tokens=64)
    assert now.to_data()["engine"]["pool"] == policy_set.pools[moved or "off"]
    assert any(r.code == "online_estimate" for r in now.reason_codes)
    if moved is None:  # off: every probe_every-th request probes the best published setting
        routed = [router.route(texts["extraction"][0], max_new_tokens=64) for _ in range(40)]
        probes = [d for d in routed if d.speculate]
        assert len(probes) == 2 and all(any(r.code == "probe" for r in d.reason_codes) for d in probes)
        probed = probes[0].to_data()["engine"]["llama-server"]["setting"]
        # the probes find it fast again: the task goes back to that pool under the whole rule
        for _ in range(30):
            fast = _timings(64, 48, 44, plain_ms / 2.5)
            recorded = record_feedback(
                session, parse_feedback({"route_id": probes[0].route_id, "setting": probed, "timings": fast})
            )
            if recorded.state.setting is not None:
                break
        assert recorded.state.setting == probed and recorded.state.speculate
    # a request the off pool served (nothing drafted, no setting named) is counted and moves no setting
    before = recorded.state
    plain = record_feedback(
        session,
        parse_feedback(
            {"task_type": "extraction", "setting": "off", "timings": _timings(64, 0, 0, plain_ms)}
        ),
    )
    assert plain.state.options == before.options and plain.state.events == before.events + 1


def test_a_set_from_a_run_keeps_its_gamma_pools_and_has_no_llama_server_plan(session):
    run = make_done_run(session, {"code": 0.9, "qa": 0.2})
    policy_set = publish_policies(session, run.id, pools={})
    assert policy_set.pools["off"] == "spec-off" and "llama-server" not in json.dumps(policy_set.pools)
    # the option and its pool, in the terms a llama-server set uses: "gamma g" (its pool k<g>), or off
    listed = policy_set_dict(policy_set)
    assert listed["analysis"] == str(run.id)
    options = {p["task_type"]: (p["option"], p["pool"]) for p in listed["policies"]}
    assert options == {
        p.task_type: (f"gamma {p.gamma}", f"spec-k{p.gamma}") if p.speculate else (None, "spec-off")
        for p in policy_set.policies
    }
    assert options["code"][0] is not None and options["qa"] == (None, "spec-off")
    decision = router_from_database(session).route("def f(x): return x", max_new_tokens=64)
    assert (
        "llama-server" not in decision.to_data()["engine"] and "transformers" in decision.to_data()["engine"]
    )
    with pytest.raises(PolicyError, match=f"published from analysis run {run.id}, not from a llama-server"):
        policy_set_plan(session)


def test_router_pools_take_drafter_labels_and_refuse_other_keys():
    mapping = {"off": "http://a:1", "ngram-mod 16 2-16": "http://a:2", "k3": "spec3"}
    assert router_pools(Settings(router_pools=json.dumps(mapping))) == mapping
    for bad in ("ngram-mod", "ngram-cache 1", "fast"):  # "ngram-mod" alone is not a stored label
        with pytest.raises(SettingsError, match="keys must be 'off', 'k<gamma>' or a llama-server drafter"):
            router_pools(Settings(router_pools=json.dumps({bad: "x"})))


def test_pools_plan_prints_each_pools_command_and_the_mapping(runner, tmp_path):
    from webui.cli import cli

    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    url = f"sqlite:///{tmp_path / 'data' / 'specroute.db'}"
    from analyzer.db import make_engine

    engine = make_engine(url)
    with make_session_factory(engine)() as session, session.begin():
        prompt_set, _ = import_sample(session)
        record = make_server_analysis(session, prompt_set, ANSWERS, DRAFTERS)
    engine.dispose()
    assert runner.invoke(cli, ["pools", "plan"]).stderr == "Error: no active policy set\n"
    both = runner.invoke(cli, ["policies", "publish", "--run", "1", "--llama-server-analysis", "1"])
    assert both.exit_code == 2 and "give one of --analysis, --run or --llama-server-analysis" in both.stderr
    published = runner.invoke(
        cli, ["policies", "publish", "--llama-server-analysis", str(record.id), "--first-port", "9100"]
    )
    assert published.exit_code == 0, published.output
    assert published.stdout.startswith(f"policy set v1 (active) from analysis llama-server:{record.id}")
    plan = runner.invoke(cli, ["pools", "plan"])
    assert plan.exit_code == 0, plan.output
    lines = plan.stdout.splitlines()
    mapping = json.loads(lines[-1].removeprefix("SPECROUTE_ROUTER_POOLS=").strip("'"))
    assert mapping["off"] == "http://127.0.0.1:9100" and len(mapping) >= 2
    commands = [line for line in lines if line.startswith("llama-server ")]
    assert len(commands) == len(mapping)
    for (key, pool_url), command in zip(mapping.items(), commands):
        assert f"--port {pool_url.rsplit(':', 1)[1]}" in command and "-np 1" in command
        assert ("--spec-type" in command) == (key != "off")
        if key != "off":
            assert f"--spec-type {key.split()[0]}" in command
    off_tasks = lines[1].removeprefix("# off -> http://127.0.0.1:9100 for ").split(", ")
    assert "general" in off_tasks and not COPY_TASKS & set(off_tasks)
    assert (
        runner.invoke(cli, ["pools", "plan", "--policies", "5"]).stderr == "Error: no policy set version 5\n"
    )


def _wait_for(stream, text: str, timeout_s: float) -> list[str]:
    """Lines of ``stream`` up to the first containing ``text``."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} not printed: {''.join(seen)}")


@pytest.mark.slow
def test_requests_routed_to_live_pools_reach_the_server_running_their_setting(llama_server_binary, tmp_path):
    """``specroute pools start`` runs the set's pools as llama-server processes; each decision's pool answers,
    and only the pool running the extraction task's setting drafts (its server's own ``timings``)."""
    from analyzer.db import make_engine
    from analyzer.engine.llamacpp_engine import gguf_file
    from analyzer.models.specs import parse_spec

    data_dir, port = tmp_path / "data", _free_port_run(3)
    env = {
        **os.environ,
        "SPECROUTE_DATA_DIR": str(data_dir),
        "SPECROUTE_LLAMA_SERVER": str(llama_server_binary),
    }
    url = f"sqlite:///{data_dir / 'specroute.db'}"
    data_dir.mkdir()
    engine = make_engine(url)
    import migrations

    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        _, record, policy_set, texts = _setup(session, first_port=port)
        record.model = str(gguf_file(parse_spec("builtin:smollm2-135m-instruct")))
        mapping = dict(policy_set.pools)
    assert len(mapping) == 3  # off and the two copying tasks' settings (ports port, port+1, port+2)
    process = subprocess.Popen(
        [sys.executable, "-m", "webui.cli", "pools", "start"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        lines = _wait_for(process.stderr, "ready:", 180)
        assert f"ready: {len(mapping)} pools of policy set v1" in lines[-1]
        with make_session_factory(engine)() as session:
            router = router_from_database(session)
        for task in ROUTED:
            decision = router.route(texts[task][0], max_new_tokens=32)
            assert decision.task_type == task
            client = LlamaServerClient(decision.to_data()["engine"]["pool"])
            # the copying prompt's answer repeats its input, so an n-gram drafter drafts
            text = texts[task][0]
            ids = client.tokenize(client.chat_prompt([{"role": "user", "content": text}]))
            answer = client.complete(ids, 48)
            drafted = answer.timings.get("draft_n", 0)
            if decision.speculate:
                setting = decision.to_data()["engine"]["llama-server"]["setting"]
                assert decision.to_data()["engine"]["pool"] == mapping[setting]
                assert drafted > 0, answer.timings
            else:
                assert decision.to_data()["engine"]["pool"] == mapping["off"] and drafted == 0
        # three tasks, three pools
        assert len({router.route(texts[t][0], max_new_tokens=32).engine.pool for t in ROUTED}) == 3
        _through_the_front_door(url, texts, mapping, engine)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        engine.dispose()
    for pool_url in mapping.values():  # every pool stopped with the command
        assert not LlamaServerClient(pool_url).ready()


def test_the_policies_page_and_the_api_show_each_tasks_setting_and_pool(session, client):
    _, record, policy_set, texts = _setup(session)
    session.commit()
    page = client.get("/policies").get_data(as_text=True)
    assert f'href="/llama-server/{record.id}">llama-server analysis #{record.id}</a>' in page
    # the set's own terms (a setting per task, its prompts), not a run's gamma and acceptance columns
    header = page.split("<thead>")[1].split("</thead>")[0]
    assert "<th>prompts</th>" in header and "<th>gamma</th>" not in header and "alpha (n)" not in header
    for policy in policy_set.policies:
        if policy.speculate:
            pool = policy_set.pools[policy.setting]
            shown = f'<code class="option">{policy.setting}</code> → <code class="pool">{pool}</code>'
        else:
            shown = f'off → <code class="pool">{policy_set.pools["off"]}</code>'
        assert shown in page, policy.task_type
    listed = client.get("/v1/policies").get_json()["active"]
    assert listed["server_analysis_id"] == record.id and listed["run_id"] is None
    assert listed["analysis"] == f"llama-server:{record.id}"
    assert {p["task_type"]: p["setting"] for p in listed["policies"]} == {
        p.task_type: p.setting for p in policy_set.policies
    }
    # the option and its pool, in the terms every set uses: the setting, or off
    assert {p["task_type"]: (p["option"], p["pool"]) for p in listed["policies"]} == {
        p.task_type: (p.setting, policy_set.pools[p.setting])
        if p.speculate
        else (None, policy_set.pools["off"])
        for p in policy_set.policies
    }
    routed = client.post(
        "/v1/route", json={"prompt": texts["extraction"][0], "max_new_tokens": 64}
    ).get_json()
    setting = routed["engine"]["llama-server"]["setting"]
    assert routed["speculate"] and routed["engine"]["pool"] == policy_set.pools[setting]
    refused = client.post(
        "/v1/feedback", json={"route_id": routed["route_id"], "rounds": 2, "drafted": 6, "accepted": 4}
    )
    assert (
        refused.status_code == 400
        and "'timings.predicted_ms' is missing" in refused.get_json()["error"]["message"]
    )
    unknown = client.post(
        "/v1/feedback",
        json={
            "route_id": routed["route_id"],
            "setting": "ngram-simple 9/9",
            "timings": _timings(64, 0, 0, 900.0),
        },
    )
    assert unknown.status_code == 400 and unknown.get_json()["error"]["code"] == "unknown_setting"


def first_setting_moved(estimate, setting: str, timings: dict) -> bool:
    """The estimate's one event is the pool's request: on ``setting``, its served time the pool's own."""
    plain_ms, served_ms, events = estimate.options[setting]
    return estimate.events == 1 and events == 1 and served_ms == timings["predicted_ms"] and plain_ms > 0


def _through_the_front_door(url: str, texts: dict[str, list[str]], mapping: dict[str, str], engine) -> None:
    """specroute's own /v1/chat/completions and /v1/completions forward each request to its pool, whole and
    streamed, and store the pool's timings as the decision's feedback event."""
    from router.orm import FeedbackEvent, TaskEstimate
    from webui.app import create_app

    app = create_app({"database_url": url, "router_refresh_s": 0, "ui_worker": False, "TESTING": True})
    try:
        client = app.test_client()
        chat = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": texts["extraction"][0]}],
                "max_tokens": 48,
                "temperature": 0,
            },
        )
        assert chat.status_code == 200, chat.get_data(as_text=True)
        setting = next(key for key, value in mapping.items() if value == chat.headers["X-Specroute-Pool"])
        assert setting != "off" and chat.headers["X-Specroute-Speculate"] == "true"
        answer = chat.get_json()
        assert answer["choices"][0]["message"]["content"] and answer["timings"]["draft_n"] > 0
        streamed = client.post(
            "/v1/completions",
            json={"prompt": texts["general"][0], "max_tokens": 24, "temperature": 0, "stream": True},
        )
        events = streamed.get_data(as_text=True)
        assert streamed.status_code == 200 and streamed.content_type.startswith("text/event-stream")
        assert streamed.headers["X-Specroute-Pool"] == mapping["off"] and '"timings"' in events
        with make_session_factory(engine)() as session:
            stored = {e.route_id: e for e in session.scalars(select(FeedbackEvent))}
            # the pools' timings moved each task's estimate: extraction's for the setting that served it
            estimates = {e.task_type: e for e in session.scalars(select(TaskEstimate))}
        assert first_setting_moved(estimates["extraction"], setting, answer["timings"])
        assert (
            estimates["general"].events == 1 and not estimates["general"].options
        )  # the plain pool: counted
        first = stored[chat.headers["X-Specroute-Route-Id"]]
        assert (first.drafted, first.accepted) == (
            answer["timings"]["draft_n"],
            answer["timings"]["draft_n_accepted"],
        )
        assert first.task_type == "extraction" and first.output_tokens == answer["timings"]["predicted_n"]
        second = stored[streamed.headers["X-Specroute-Route-Id"]]
        assert (second.task_type, second.drafted, second.accepted) == (
            "general",
            0,
            0,
        ) and second.output_tokens > 0
    finally:
        app.extensions["specroute.close"]()


def test_the_front_door_says_when_a_pool_is_a_name_or_does_not_answer(session, client):
    _, _, policy_set, texts = _setup(
        session, pools={"off": "plain-pool", "ngram-simple 3/8": f"http://127.0.0.1:{free_port()}"}
    )
    session.commit()
    body = {"messages": [{"role": "user", "content": texts["general"][0]}], "max_tokens": 16}
    named = client.post("/v1/chat/completions", json=body)
    assert named.status_code == 503 and named.get_json()["error"]["code"] == "pool_not_addressable"
    assert "'plain-pool' is a name, not a URL" in named.get_json()["error"]["message"]
    assert next(p.setting for p in policy_set.policies if p.task_type == "extraction") == "ngram-simple 3/8"
    body = {"messages": [{"role": "user", "content": texts["extraction"][0]}], "max_tokens": 64}
    down = client.post("/v1/chat/completions", json=body)  # nothing listens on that port
    assert down.status_code == 502 and down.get_json()["error"]["code"] == "pool_unavailable"
    bad = client.post("/v1/chat/completions", json={"prompt": "hi"})
    assert (
        bad.status_code == 400
        and bad.get_json()["error"]["message"] == "field 'messages' is missing: /v1/chat/completions needs it"
    )
    empty = client.post("/v1/completions", json={"prompt": "  "})
    assert empty.status_code == 400 and empty.get_json()["error"]["code"] == "empty_prompt"
    wrong = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0})
    assert wrong.status_code == 400 and "max_tokens" in wrong.get_json()["error"]["message"]


def test_the_analysis_page_publishes_its_choices_as_the_active_set(session, client):
    import re

    from markupsafe import escape

    prompt_set, _ = import_sample(session)
    record = make_server_analysis(session, prompt_set, ANSWERS, DRAFTERS)
    session.commit()
    page = client.get(f"/llama-server/{record.id}").get_data(as_text=True)
    form = (
        page.split('id="publish-server-analysis"')[0].rsplit("<form", 1)[1]
        + page.split('id="publish-server-analysis"')[1].split("</form>")[0]
    )
    # the page's button posts to the one publish form every analysis uses, naming this analysis
    assert (
        'action="/policies/publish"' in form and f'name="analysis" value="llama-server:{record.id}"' in form
    )
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert client.post("/policies/publish").status_code == 400  # no CSRF token: refused
    listed = client.get("/policies").get_data(as_text=True)  # the policies page offers it too
    assert f'<option value="llama-server:{record.id}" selected>llama-server analysis #{record.id}' in listed
    done = client.post(
        "/policies/publish", data={"csrf_token": token, "analysis": f"llama-server:{record.id}"}
    )
    assert done.status_code == 302 and done.headers["Location"].endswith("/policies")
    shown = client.get("/policies").get_data(as_text=True)
    assert (
        str(
            escape(
                f"policy set v1 published from analysis llama-server:{record.id} and active: start its pools with "
                "'specroute pools start'"
            )
        )
        in shown
    )
    assert "as published (no feedback yet)" in shown and "nothing adapts" not in shown
    active = client.get("/v1/policies").get_json()["active"]
    assert active["version"] == 1 and active["server_analysis_id"] == record.id
    # the pools' feedback moves extraction off its published setting: the page shows the setting in force
    published = next(p for p in active["policies"] if p["task_type"] == "extraction")["setting"]
    plain_ms = PlainCost.from_json(active["plain_cost"]).plain_ms(120, 64)
    for _ in range(40):
        body = {"task_type": "extraction", "timings": _timings(64, 40, 2, plain_ms / 0.7)}
        assert client.post("/v1/feedback", json=body).status_code == 200
    estimates = {e["task_type"]: e for e in client.get("/v1/policies").get_json()["active"]["estimates"]}
    assert estimates["extraction"]["setting"] != published
    assert estimates["extraction"]["option"] == estimates["extraction"]["setting"]  # the same name either way
    row = next(r for r in client.get("/policies").get_data(as_text=True).split("<tr>") if ">extraction<" in r)
    in_force = estimates["extraction"]["setting"] or "off"
    assert f'<strong><code class="option">{in_force}</code>' in row or (
        in_force == "off" and "<strong>off → " in row
    )
    assert "changed from the published decision" in row and "after 40 feedback events" in row
    assert client.post("/llama-server/99/publish", data={"csrf_token": token}).status_code == 404
    # the address earlier pages posted to publishes the same way
    again = client.post(f"/llama-server/{record.id}/publish", data={"csrf_token": token})
    assert again.status_code == 302 and f"policy set v2 published from analysis llama-server:{record.id}" in (
        client.get("/policies").get_data(as_text=True)
    )
    unknown = client.post("/policies/publish", data={"csrf_token": token, "analysis": "llama-server:99"})
    assert unknown.status_code == 404  # a reference to nothing: not found, as the analysis page says
    wrong = client.post("/policies/publish", data={"csrf_token": token, "analysis": "last week's"})
    assert wrong.status_code == 302 and "choose a finished analysis" in client.get("/policies").get_data(
        as_text=True
    )


def test_the_route_command_prints_a_llama_server_decision_in_each_serving_engines_terms(
    session, runner, db_url, monkeypatch
):
    from webui.cli import cli

    _, _, policy_set, texts = _setup(session)
    session.commit()
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", db_url)
    shown = runner.invoke(cli, ["route", texts["extraction"][0], "--max-new-tokens", "64"])
    assert shown.exit_code == 0, shown.output
    setting = next(p.setting for p in policy_set.policies if p.task_type == "extraction")
    lines = shown.stdout.splitlines()
    assert f"  pool: {policy_set.pools[setting]}; priced by: llama-server" in lines
    assert any(line.startswith("  llama-server: ") and f'"setting": "{setting}"' in line for line in lines)
    assert not any(
        line.startswith(("  transformers:", "  llama.cpp:")) for line in lines
    )  # they cannot run it
