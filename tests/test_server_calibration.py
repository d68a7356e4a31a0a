"""Calibration's check that each setting's server did what its replay says, on synthetic greedy outputs and
server runs (no server): the server's counts are compared with the replay of the history that server had, not
with the workload's replay; a setting whose server disagrees is left out with a reason that says what to check
(a user's server) or what went wrong (one specroute started), and the other settings go on. Validation compares
the advice with the passes that measured what it predicts, apart from the work the servers served."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from analyzer.analysis.server_calibration import _leave_out, disagreeing_settings
from analyzer.analysis.server_outcomes import (
    PromptOutcome,
    ServerAnalysisError,
    ServerPrompt,
    SettingOutcome,
    TimedCompletion,
)
from analyzer.analysis.server_passes import PassRuns, ServerHistory, _add_pass
from analyzer.analysis.server_replay import replay_all
from analyzer.engine.llama_server_process import Completion
from analyzer.measuring.server_drafting import parse_drafter

N_PREDICT, N_CTX = 48, 4096
# a 20-token phrase both answers open with (as GSM8K answers open alike), then tokens of their own
PHRASE = list(range(700, 720))


@dataclass
class _Client:
    url: str


@dataclass
class _Server:
    """A server as calibration sees it: an address, and whether it was stopped."""

    client: _Client
    stopped: list[bool] = field(default_factory=list)

    def stop(self) -> None:
        self.stopped.append(True)


def _run(tokens: list[int], draft_n: int = 0, accepted: int = 0) -> TimedCompletion:
    timings = {"predicted_ms": 10.0 * (len(tokens) - 1), "predicted_n": len(tokens)}
    if draft_n:
        timings |= {"draft_n": draft_n, "draft_n_accepted": accepted}
    return TimedCompletion(Completion(tokens, "limit", timings, ""), 0.0)


def _workload(labels: tuple[str, ...], repeating: bool = False) -> list[PromptOutcome]:
    """Two prompts whose greedy answers open with the same phrase: the second's answer repeats the first's
    opening, so a server that saw the first drafts it back on the second, and one that did not cannot.
    ``repeating``: each answer then repeats a motif of its own, which any n-gram drafter drafts."""
    outcomes = []
    for number in range(2):
        ids = [100 + 10 * number + i for i in range(30)]
        own = [900 + 40 * number + i % (6 if repeating else N_PREDICT) for i in range(N_PREDICT)]
        output = (PHRASE + own)[:N_PREDICT]
        prompt = ServerPrompt(str(number + 1), "math", [{"role": "user", "content": f"question {number}"}])
        outcomes.append(PromptOutcome(prompt, ids, _run(output)))
    for label in labels:
        drafter = parse_drafter(label)
        for outcome, replay in zip(outcomes, replay_all(drafter, outcomes, n_predict=N_PREDICT, n_ctx=N_CTX)):
            outcome.settings.append(SettingOutcome(drafter, replay))
    return outcomes


def _calibrate_on(outcome: PromptOutcome, served: list[TimedCompletion]) -> None:
    """One calibration pass of ``outcome`` through fresh servers that return ``served``, one per setting."""
    history = ServerHistory(N_PREDICT, N_CTX)
    _add_pass(outcome, PassRuns(outcome.plain, served, outcome.plain), history)


def test_a_setting_is_checked_against_the_history_its_server_had_not_the_workloads():
    """ngram-mod's workload replay drafts the shared opening on the second prompt (its table holds the first
    prompt's output); a server that only met the second prompt drafts nothing there, and that agrees with the
    replay of its own history: no setting is left out."""
    outcomes = _workload(("ngram-mod 16 8-32",))
    second = outcomes[1]
    assert (
        second.settings[0].replay.draft_n > 0
    )  # the workload's replay drafts from the first prompt's output
    _calibrate_on(second, [_run(second.plain.completion.tokens)])
    assert second.settings[0].trials[0].replay.draft_n == 0
    servers = [_Server(_Client("http://plain")), _Server(_Client("http://mod"))]
    assert disagreeing_settings(servers, [second]) == {}


def test_a_server_that_disagrees_with_its_replay_is_left_out_and_the_others_go_on():
    """A server that drafted where the replay of its own history drafts nothing is left out: its server
    stopped and removed, its outcome taken from every prompt, the reason naming the counts; the setting that
    agreed stays."""
    outcomes = _workload(("ngram-simple 2/4", "ngram-mod 16 8-32"))
    second = outcomes[1]
    tokens = second.plain.completion.tokens
    simple = second.settings[0]
    _calibrate_on(
        second, [_run(tokens, simple.replay.draft_n, simple.replay.draft_n_accepted), _run(tokens, 9, 9)]
    )
    servers = [
        _Server(_Client("http://plain")),
        _Server(_Client("http://simple")),
        _Server(_Client("http://mod")),
    ]
    left_out = disagreeing_settings(servers, [second])
    assert list(left_out) == ["ngram-mod 16 8-32"]
    assert left_out["ngram-mod 16 8-32"].startswith(
        "its server drafted 9 tokens (9 accepted) on the 1 calibration prompts where the replay of what it "
        "served drafted 0 (0 accepted); 1 of 1 requests differ; specroute started that server itself with "
        "--spec-type ngram-mod --spec-ngram-mod-n-match 16"
    )
    _leave_out(servers, outcomes, left_out)  # type: ignore[arg-type]
    assert [s.client.url for s in servers] == ["http://plain", "http://simple"]
    assert [o.settings[0].drafter.label for o in outcomes] == ["ngram-simple 2/4"] * 2
    assert all(len(o.settings) == 1 for o in outcomes)


def test_a_users_server_that_drafted_nothing_is_told_what_to_check():
    """A user's server that drafted nothing where the replay drafted is left out with what to check: the
    setting's flags, one slot and no other client."""
    outcomes = _workload(("ngram-simple 2/4",), repeating=True)
    second = outcomes[1]
    assert second.settings[0].replay.draft_n > 0
    _calibrate_on(second, [_run(second.plain.completion.tokens)])
    servers = [_Server(_Client("http://plain")), _Server(_Client("http://10.0.0.5:8082"))]
    why = disagreeing_settings(servers, [second], started_here=False)["ngram-simple 2/4"]
    assert why.endswith(
        "check that the server at http://10.0.0.5:8082 runs --spec-type ngram-simple --spec-ngram-simple-size-n 2 "
        "--spec-ngram-simple-size-m 4, one slot (-np 1), and that no other client sends it requests while the "
        "analysis runs"
    )


def test_a_plain_server_that_drafted_stops_the_analysis():
    outcomes = _workload(("ngram-simple 2/4",))
    second = outcomes[1]
    drafted = _run(second.plain.completion.tokens, 4, 2)
    second.plain = drafted
    _calibrate_on(second, [drafted])
    servers = [_Server(_Client("http://plain")), _Server(_Client("http://simple"))]
    with pytest.raises(
        ServerAnalysisError, match="the plain server at http://plain drafted: start it without"
    ):
        disagreeing_settings(servers, [second], started_here=False)


def _validated(outcome: PromptOutcome, speedups: list[float]) -> None:
    """Validation passes of ``outcome``'s only setting, served as plain greedy output, each at a given speedup:
    the plain runs take 10 ms a step, the speculating run 10 / speedup ms."""
    tokens = outcome.plain.completion.tokens
    setting = outcome.settings[0]
    history = ServerHistory(N_PREDICT, N_CTX)
    for speedup in speedups:
        timings = {"predicted_ms": 10.0 * (len(tokens) - 1) / speedup, "predicted_n": len(tokens)}
        replay = setting.replay
        if replay.draft_n:
            timings |= {"draft_n": replay.draft_n, "draft_n_accepted": replay.draft_n_accepted}
        served = TimedCompletion(Completion(tokens, "limit", timings, ""), 0.0)
        _add_pass(outcome, PassRuns(outcome.plain, [served], outcome.plain), history)


@pytest.mark.parametrize(
    "label, advised, per_prompt",
    [("ngram-mod 16 8-32", 1.0, 1.0), ("ngram-simple 2/4", 2 / (1 + 1 / 1.96), 1.4)],
)
def test_the_advice_is_compared_with_the_passes_that_measured_what_it_predicts(label, advised, per_prompt):
    """For ngram-mod, whose table carries each pass's outputs into the next, the advice is compared with the
    first pass alone (a second pass finds the prompt's own output in the table and runs far faster); for a
    stateless setting with every pass. Each prompt's option row (what --json prints per prompt) carries that
    speedup, the validation figures give the advice's aggregate apart from the work served's, and the work
    served's aggregate is given pass by pass. Aggregates are time-weighted; a prompt's speedup over its passes is
    their geometric mean."""
    from analyzer.advice.option_rows import server_option_rows
    from analyzer.analysis.server_figures import validation_figures
    from analyzer.analysis.server_outcomes import ServerAnalysis
    from analyzer.analysis.server_store import _setting_dict
    from analyzer.pricing.server_cost import ServerCost

    outcomes = _workload((label,), repeating=True)
    for outcome in outcomes:
        _validated(outcome, [1.0, 1.96])
    cost = ServerCost(10.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 6, 0.02, 0.03, 6, 0.01, 0.02, False)
    for outcome in outcomes:
        outcome.settings[0].predicted_speedup = cost.speedup(outcome.settings[0].replay)
    analysis = ServerAnalysis([parse_drafter(label)], outcomes, {"n-gram": cost}, N_PREDICT, 2, 1.0, 0.5, 0)
    (figures,) = validation_figures(analysis)
    assert figures.advice_measured == pytest.approx(advised, rel=1e-9)
    assert [p["pass"] for p in figures.per_pass] == [1, 2]
    assert [p["measured"] for p in figures.per_pass] == pytest.approx([1.0, 1.96])
    assert figures.aggregate_measured == pytest.approx(2 / (1 + 1 / 1.96))  # the work served: both passes
    rows = [{"prompt_id": 1, "task": "math", "settings": [_setting_dict(outcomes[0].settings[0], cost)]}]
    assert server_option_rows(rows)[0].measured_speedup == pytest.approx(per_prompt, rel=1e-9)
