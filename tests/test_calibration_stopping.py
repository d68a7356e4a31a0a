"""Calibration's stopping rule (analyzer/analysis/server_calibration.py ``calibrate``), on synthetic greedy
outputs and servers whose times a known step cost gives (no llama-server): where the times are what a fit can
price, calibration stops at its minimum; where they are not, it measures one more prompt at a time, the one
nearest the prompt the fit missed most, up to the most asked, and then withholds the advice naming that
prompt."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from analyzer.analysis import server_passes
from analyzer.analysis.server_calibration import (
    MIN_CALIBRATION,
    REUSE_CHECK,
    PriorFit,
    calibrate,
    calibration_features,
)
from analyzer.analysis.server_outcomes import PromptOutcome, ServerPrompt, SettingOutcome, TimedCompletion
from analyzer.analysis.server_passes import PassLog, ServerHistory
from analyzer.analysis.server_replay import replay_all
from analyzer.engine.llama_server_process import Completion
from analyzer.measuring.calibration_choice import nearest_untaken, spanning_order
from analyzer.measuring.request_work import plain_work
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.pricing.context_cost import StepCost
from analyzer.pricing.server_cost import ServerCost

N_PREDICT, N_CTX = 48, 4096
COST = StepCost(step_ms=20.0, per_context_ms=0.004, round_ms=2.0, per_draft_ms=0.5, per_accepted_ms=-0.2)
DRAFTER = parse_drafter("ngram-simple 2/4")


@dataclass
class _Client:
    url: str


@dataclass
class _Server:
    """A server as calibration sees it: an address and the setting it serves (None: plain)."""

    client: _Client
    setting: int | None

    def stop(self) -> None:
        pass


def _workload(count: int = 12) -> list[PromptOutcome]:
    """``count`` prompts of 20 to 900 tokens whose answers repeat motifs of 3 to 48 tokens: contexts and
    draft rates that spread."""
    outcomes = []
    for number in range(count):
        ids = [100 + i for i in range(20 + (number * 73) % 880)]
        motif = (3, 5, 8, 12, 20, 48)[number % 6]
        output = [2000 + 50 * number + i % motif for i in range(N_PREDICT)]
        timings = {"predicted_ms": 1.0, "predicted_n": N_PREDICT}
        prompt = ServerPrompt(f"p{number}", "code", [{"role": "user", "content": str(number)}])
        outcomes.append(
            PromptOutcome(prompt, ids, TimedCompletion(Completion(output, "limit", timings, ""), 0.0))
        )
    for outcome, replay in zip(outcomes, replay_all(DRAFTER, outcomes, n_predict=N_PREDICT, n_ctx=N_CTX)):
        outcome.settings.append(SettingOutcome(DRAFTER, replay))
    return outcomes


def _serve(monkeypatch, outcomes: list[PromptOutcome], slower: dict[str, float]) -> list[_Server]:
    """Servers whose every request takes what COST prices (a speculating request of prompt key k that long
    times ``slower[k]``), with the replay's draft counts."""
    by_ids = {tuple(o.prompt_ids): o for o in outcomes}

    def timed_complete(server, ids, n_predict):
        outcome = by_ids[tuple(ids)]
        tokens = outcome.plain.completion.tokens
        if server.setting is None:
            ms = COST.plain_ms(plain_work(len(ids), len(tokens)))
            timings = {"predicted_ms": ms, "predicted_n": len(tokens)}
        else:
            replay = outcome.settings[server.setting].replay
            ms = COST.request_ms(replay.work()) * slower.get(outcome.prompt.key, 1.0)
            timings = {"predicted_ms": ms, "predicted_n": len(tokens), "draft_n": replay.draft_n}
            timings["draft_n_accepted"] = replay.draft_n_accepted
        return TimedCompletion(Completion(tokens, "limit", timings, ""), 0.0)

    monkeypatch.setattr(server_passes, "timed_complete", timed_complete)
    return [_Server(_Client("http://plain"), None), _Server(_Client("http://spec"), 0)]


def test_a_fit_that_holds_stops_calibration_at_its_minimum(monkeypatch):
    outcomes = _workload()
    servers = _serve(monkeypatch, outcomes, {})
    lines: list[str] = []
    history = ServerHistory(N_PREDICT, N_CTX)
    found = calibrate(servers, outcomes, history, lines.append, PassLog(history), at_most=8)
    first = spanning_order(calibration_features(outcomes))[:MIN_CALIBRATION]
    assert [o.prompt.key for o in found.chosen] == [outcomes[i].prompt.key for i in first]
    assert sum(o.calibration for o in outcomes) == MIN_CALIBRATION and found.withheld is None
    assert found.costs["n-gram"].checked_error < 0.01  # the times are what the model prices
    # one fit without each calibration prompt, in the order measured: exact times, so each prices the prompts
    # it was fitted on exactly; three prompts leave the round terms loose, and the other prompts' prices spread
    refits = found.costs["n-gram"].refits
    assert len(refits) == MIN_CALIBRATION
    assert all(r.step_ms == pytest.approx(COST.step_ms, rel=1e-3) for r in refits)
    for left_out, refit in zip(found.chosen, refits, strict=True):
        for outcome in found.chosen:
            work = outcome.settings[0].replay.work()
            if outcome is not left_out:
                assert refit.request_ms(work) == pytest.approx(COST.request_ms(work), rel=1e-3)
    assert found.why.startswith(
        f"the fit held on prompts it was not fitted on after {MIN_CALIBRATION} prompts"
    )
    assert lines[-1] == f"calibration: {found.why}"


def test_a_fit_that_misses_measures_the_prompt_nearest_its_miss_and_withholds_at_the_most_asked(monkeypatch):
    outcomes = _workload()
    # every other prompt's speculating runs take 40% longer than any step cost prices: no fit holds
    slower = {o.prompt.key: 1.4 for o in outcomes[1::2]}
    servers = _serve(monkeypatch, outcomes, slower)
    lines: list[str] = []
    history = ServerHistory(N_PREDICT, N_CTX)
    found = calibrate(servers, outcomes, history, lines.append, PassLog(history), at_most=7)
    assert len(found.chosen) == 7 and sum(o.calibration for o in outcomes) == 7
    features = calibration_features(outcomes)
    keys = [o.prompt.key for o in outcomes]
    taken = [keys.index(o.prompt.key) for o in found.chosen[:MIN_CALIBRATION]]
    added = [line for line in lines if line.startswith("calibrated ") and ": the n-gram fit's" in line]
    assert len(added) == 7 - MIN_CALIBRATION
    for line, outcome in zip(added, found.chosen[MIN_CALIBRATION:], strict=True):
        missed = line.split(" missed ")[1].split(" by ")[0]
        # the prompt measured next is the one nearest the prompt the fit missed most
        assert keys.index(outcome.prompt.key) == nearest_untaken(features, taken, keys.index(missed))
        assert line.startswith(f"calibrated {len(taken) + 1} (at most 7): {outcome.prompt.key}: ")
        taken.append(keys.index(outcome.prompt.key))
    assert found.withheld is not None and "the n-gram step costs miss the measured time by" in found.withheld
    assert "missed most: the n-gram fit's rounds missed p" in found.withheld
    assert found.why.startswith("the fit still missed after 7 prompts, the most asked")
    # the fits without each of the 7 prompts disagree where the runs do: their round costs spread
    refits = found.costs["n-gram"].refits
    priced = np.asarray([[r.request_ms(o.settings[0].replay.work()) for o in outcomes] for r in refits])
    assert priced.shape == (7, len(outcomes)) and np.max(priced.max(axis=0) / priced.min(axis=0)) > 1.05


@pytest.mark.parametrize("at_most", [1, 3])
def test_fewer_prompts_than_the_minimum_asked_are_all_measured_once(monkeypatch, at_most):
    outcomes = _workload(6)
    servers = _serve(monkeypatch, outcomes, {})
    history = ServerHistory(N_PREDICT, N_CTX)
    found = calibrate(servers, outcomes, history, lambda line: None, PassLog(history), at_most=at_most)
    assert len(found.chosen) == at_most and all(len(o.plain_pairs) == 1 for o in found.chosen)
    assert np.isfinite(found.costs["n-gram"].plain_step_ms)


def _prior(scale: float = 1.0) -> PriorFit:
    """A fit made earlier on this setup: COST's terms times ``scale`` (1.0: the servers' own)."""
    terms = {name: getattr(COST, name) * scale for name in ("step_ms", "per_context_ms", "round_ms")}
    terms |= {"per_draft_ms": COST.per_draft_ms * scale, "per_accepted_ms": COST.per_accepted_ms * scale}
    cost = ServerCost(
        terms["step_ms"], terms["per_context_ms"], terms["round_ms"], terms["per_draft_ms"],
        terms["per_accepted_ms"], 0.0, 0.0, 30, 0.01, 0.02, 30, 0.01, 0.02, True,
    )  # fmt: skip
    return PriorFit({"n-gram": cost}, analysis_id=7)


def test_an_earlier_fit_that_prices_the_first_prompts_is_reused_without_a_fit(monkeypatch):
    outcomes = _workload()
    servers = _serve(monkeypatch, outcomes, {})
    lines: list[str] = []
    history = ServerHistory(N_PREDICT, N_CTX)
    found = calibrate(servers, outcomes, history, lines.append, PassLog(history), at_most=8, prior=_prior())
    assert len(found.chosen) == REUSE_CHECK and found.reused_from == 7 and found.withheld is None
    assert found.costs["n-gram"] == _prior().costs["n-gram"]  # the earlier analysis' terms, as they were
    assert found.why.startswith(
        f"reused the fit of llama-server analysis #7 (this machine, model, threads, context and server build), "
        f"checked on {REUSE_CHECK} prompts of this workload: error 0.0%"
    )


def test_an_earlier_fit_that_misses_is_set_aside_and_the_workload_fitted_from_the_prompts_measured(
    monkeypatch,
):
    outcomes = _workload()
    servers = _serve(monkeypatch, outcomes, {})
    lines: list[str] = []
    history = ServerHistory(N_PREDICT, N_CTX)
    # another machine's speed: every term 30% slower than what the servers do
    found = calibrate(
        servers, outcomes, history, lines.append, PassLog(history), at_most=8, prior=_prior(1.3)
    )
    assert found.reused_from is None and len(found.chosen) == MIN_CALIBRATION
    first = spanning_order(calibration_features(outcomes))[:MIN_CALIBRATION]
    assert [o.prompt.key for o in found.chosen] == [
        outcomes[i].prompt.key for i in first
    ]  # the checked ones kept
    missed = [line for line in lines if line.startswith("the fit of llama-server analysis #7 missed")]
    assert len(missed) == 1 and missed[0].endswith(": fitting anew") and " by 30.0% (bound 5.0%)" in missed[0]
    assert found.costs["n-gram"].plain_step_ms == pytest.approx(COST.step_ms, rel=0.01)


def test_the_fit_to_reuse_is_the_newest_on_the_same_setup_whose_advice_was_not_withheld(session):
    from analyzer.analysis.server_store import prior_fit
    from tests.factories import make_done_run, make_server_analysis

    prompt_set = make_done_run(session, {"code": 0.9}, per_task=3).prompt_set
    setup = dict(model="/models/target.gguf", server_build="test", threads=2, n_ctx=4096, draft_model=None)
    assert prior_fit(session, **setup) is None  # nothing stored yet
    first = make_server_analysis(session, prompt_set, {"code": "copy"})
    make_server_analysis(session, prompt_set, {"code": "copy"}, withheld="the fit missed")  # never reused
    session.flush()
    found = prior_fit(session, **setup)
    assert found is not None and found.analysis_id == first.id
    stored = first.cost["n-gram"]
    assert found.costs["n-gram"].plain_step_ms == stored["plain_step_ms"] and set(found.costs) == set(
        first.cost
    )
    # a fit reused by a later analysis keeps naming the analysis that fitted it
    later = make_server_analysis(session, prompt_set, {"code": "copy"})
    later.cost = {family: {**cost, "fitted_in": first.id} for family, cost in later.cost.items()}
    session.flush()
    assert prior_fit(session, **setup).analysis_id == first.id
    for other in (
        {"threads": 4},
        {"server_build": "b2"},
        {"n_ctx": 2048},
        {"model": "/m.gguf"},
        {"draft_model": "/d"},
    ):
        assert prior_fit(session, **(setup | other)) is None, other


def test_validation_budgets_estimates_and_counts_a_pass_in_the_same_server_seconds(monkeypatch):
    """The budget (a share of the plain generation), each pass's estimate and its spending all count the
    server's seconds of reading the prompt and generating: with prompts that cost more to read than to
    answer, the estimate before a pass is what the pass then takes, and the spending stops within the budget."""
    from analyzer.analysis.server_analysis import ValidationAsk, _pass_seconds, _validate
    from analyzer.measuring.time_left import TimeLeft
    from analyzer.measuring.validation_plan import BUDGET, validation_order

    outcomes = _workload(40)  # half their generation pays for more passes than the minimum

    def prompt_ms(ids) -> float:
        return 0.5 * len(ids)  # 10 to 450 ms a prompt: as much as or more than its 48 tokens' generation

    for outcome in outcomes:
        plain = COST.plain_ms(plain_work(len(outcome.prompt_ids), N_PREDICT))
        outcome.plain.completion.timings.update(predicted_ms=plain, prompt_ms=prompt_ms(outcome.prompt_ids))
    servers = _serve(monkeypatch, outcomes, {})
    served = server_passes.timed_complete

    def with_prompt(server, ids, n_predict):
        timed = served(server, ids, n_predict)
        timed.completion.timings["prompt_ms"] = prompt_ms(ids)
        return timed

    monkeypatch.setattr(server_passes, "timed_complete", with_prompt)
    history = ServerHistory(N_PREDICT, N_CTX)
    pass_log = PassLog(history)
    found = calibrate(servers, outcomes, history, lambda line: None, pass_log, at_most=4)
    for outcome in outcomes:
        for setting in outcome.settings:
            setting.predicted_speedup = found.costs[setting.drafter.family].speedup(setting.replay)
    held_out = [o for o in outcomes if not o.calibration]
    lines: list[str] = []
    plan = _validate(
        servers, outcomes, held_out, history, found.costs, ValidationAsk(1, half_width=0.0, budget_share=0.5),
        lines.append, pass_log, TimeLeft(),
    )  # fmt: skip
    generation_s = sum(
        (o.plain.completion.predicted_ms + o.plain.completion.timings["prompt_ms"]) / 1000 for o in outcomes
    )
    assert plan.budget_s == pytest.approx(0.5 * generation_s)
    spent = []
    for index in plan.chosen:
        outcome = held_out[index]
        runs = [*outcome.plain_pairs[-1], *(s.trials[-1].measured for s in outcome.settings)]
        seconds = sum((r.completion.predicted_ms + r.completion.timings["prompt_ms"]) / 1000 for r in runs)
        assert _pass_seconds(outcome) == pytest.approx(seconds, rel=0.02)  # the estimate is the pass
        spent.append(seconds)
    assert plan.spent_s == pytest.approx(sum(spent))
    assert plan.stopped == BUDGET and len(plan.chosen) < len(held_out)
    assert plan.spent_s <= plan.budget_s
    predicted = np.array([[s.predicted_speedup for s in o.settings] for o in held_out])
    order = validation_order([o.prompt.task for o in held_out], predicted)
    assert plan.chosen == order[: len(plan.chosen)]
    following = held_out[order[len(plan.chosen)]]  # the pass it did not run would have overrun the budget
    assert plan.spent_s + _pass_seconds(following) > plan.budget_s
