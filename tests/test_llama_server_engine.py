"""An analysis in the real llama-server (issue 33, point 2): greedy output from a plain server, the drafting
rules replayed, step costs fitted from the servers' timings, and validation through speculating servers.

The exactness test: wherever a speculating server's output equals plain greedy output, its own
``draft_n`` and ``draft_n_accepted`` must equal the replay's, for ngram-simple at two sizes and for
ngram-mod with its table carried across requests. Runs on the embedded SmolLM2 GGUF; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.analysis.server_analysis import (
    ServerPrompt,
    ServerSetup,
    analyze_in_llama_server,
    task_choices,
    validation_figures,
)
from analyzer.engine.llama_server_process import LlamaServerError, LlamaServerProcess
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.specs import parse_spec

SAMPLE = Path(__file__).resolve().parents[1] / "analyzer" / "sample_data" / "sample_prompts.jsonl"
# tasks whose answers copy their input draft often; a chat task drafts little
TASKS = ("extraction", "translation", "roleplay", "code", "general")


def _prompts(per_task: int) -> list[ServerPrompt]:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    chosen = [r for task in TASKS for r in [r for r in rows if r["task"] == task][:per_task]]
    return [ServerPrompt(r["id"], r["task"], [{"role": "user", "content": r["prompt"]}]) for r in chosen]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return gguf_file(parse_spec("builtin:smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def analysis(llama_server_binary, model_path):
    drafters = [parse_drafter(d) for d in ("ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod 16 2-16")]
    setup = ServerSetup(llama_server_binary, model_path, threads=2, n_ctx=4096)
    lines: list[str] = []
    result = analyze_in_llama_server(
        setup, _prompts(2), drafters, n_predict=48, calibration_prompts=3, validate=True, say=lines.append
    )
    return result, lines


def test_server_draft_counts_equal_the_replay_wherever_output_equals_plain(analysis):
    result, lines = analysis
    assert lines[0] == f"generated 1/10 ({result.prompts[0].prompt.key})" and lines[-1].startswith(
        "validated 7/7"
    )
    compared = drafted = 0
    for outcome in result.prompts:
        for setting in outcome.settings:
            assert (
                setting.measured is not None and setting.plain is not None
            )  # every prompt ran on every server
            if setting.measured.completion.tokens != setting.plain.completion.tokens:
                continue
            timings = setting.measured.completion.timings
            assert (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)) == (
                setting.replay.draft_n,
                setting.replay.draft_n_accepted,
            ), (outcome.prompt.key, setting.drafter.label)
            compared += 1
            drafted += setting.replay.draft_n > 0
    # most runs reproduce plain greedy output, and most of those drafted: the comparison is not vacuous
    assert compared >= 20 and drafted >= 15


def test_costs_predictions_and_task_choices_come_from_the_servers(analysis):
    result, _ = analysis
    cost = result.cost
    assert cost.plain_step_ms > 0 and cost.samples >= 6 and 0 <= cost.fit_mare < 1
    assert cost.round_cost_ms(4) > cost.round_cost_ms(1) >= cost.round_ms >= 0
    for outcome in result.prompts:
        for setting in outcome.settings:
            replay = setting.replay
            assert replay.output_tokens == len(outcome.plain.completion.tokens)
            expected = cost.plain_ms(replay.output_tokens) / cost.speculative_ms(replay)
            assert setting.predicted_speedup == pytest.approx(expected)
            if not replay.rounds:  # nothing drafted: the prediction is plain decoding
                assert setting.predicted_speedup == pytest.approx(1.0)
    choices = task_choices(result)
    assert [c.task for c in choices] == sorted(TASKS)
    for choice in choices:
        best = max(choice.predicted.values())
        assert (choice.best is None) == (best <= 1.0)
        if choice.best is not None:
            assert choice.predicted[choice.best.label] == best
    figures = validation_figures(result)
    assert [f.setting for f in figures] == [d.label for d in result.drafters]
    assert all(f.runs == 7 for f in figures)  # the 3 calibration prompts are not validated
    assert all(f.counts_equal == 1.0 for f in figures if f.counts_equal is not None)


def test_a_server_that_cannot_start_says_why(llama_server_binary, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    with pytest.raises(LlamaServerError, match="exited with .* at start"):
        LlamaServerProcess(llama_server_binary, broken, threads=1, n_ctx=256).start(timeout_s=60)
