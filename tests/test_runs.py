"""Analysis runs end to end on tiny real models loaded through hf:<folder>: the report's JSON shape,
per-gamma counts, validation, cost-profile reuse, resume after an interruption, failure recording,
tokenizer mismatch, sampling mode."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sqlalchemy import func, select

from analyzer.analysis.run_records import RunParams, create_run
from analyzer.analysis.runs import execute_run
from analyzer.db import make_session_factory
from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.measuring.noise import MAX_NOISE_FLOOR, MAX_STEAL_SHARE
from analyzer.orm import AnalysisRun, CostProfile, PromptResult
from analyzer.pricing.speedup import recommendation_tier
from analyzer.prompts.prompt_sets import import_prompt_file
from tests.factories import another_writer
from tests.tiny_tokenizer import save_tiny_model_folder
from webui.cli import cli

PROMPTS = [
    {"prompt": "write code for the sum of a list of numbers", "task": "code", "id": "c1"},
    {"prompt": "def sum of numbers return the sum of numbers", "task": "code", "id": "c2"},
    {"prompt": "translate hello world to French", "task": "translation", "id": "t1"},
    {"prompt": "tell me a short story about the cat and the dog", "id": "s1"},
]


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = save_tiny_model_folder(root / "target", seed=3)
    draft = save_tiny_model_folder(root / "draft", seed=4, noise_std=0.02, base_model=target)
    other = save_tiny_model_folder(root / "other", seed=5, vocab_size=120)
    return {"target": target, "draft": draft, "other": other}


@pytest.fixture
def cli_db(runner, tmp_path):
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    source = tmp_path / "mix.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    assert runner.invoke(cli, ["prompts", "import", str(source)]).exit_code == 0
    return runner


def _analyze(runner, *args):
    return runner.invoke(
        cli,
        ["analyze", "--prompts", "mix", "--max-new-tokens", "12", "--gamma-max", "4", "--json", *args],
        catch_exceptions=False,
    )


def test_model_draft_run_report_shape_counts_and_validation(cli_db, model_folders):
    result = _analyze(
        cli_db,
        "--target",
        f"hf:{model_folders['target']}",
        "--draft",
        f"hf:{model_folders['draft']}",
        "--validate",
        "2",
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"run_id", "target", "draft", "params", "cost_profile", "prompts", "tasks"} <= set(report)
    assert report["status"] == "done" and report["progress"] == {"done": 4, "total": 4}
    # gamma_max 4 needs k <= 5; transformers' defaults (up to 20 drafts) are priced too, so k <= 21
    assert len(report["cost_profile"]["target_k_s"]) == 21 and report["cost_profile"]["draft_s"] > 0
    # scaled to the target's forwards in the overhead's real generate() calls: at least the 33 plain steps'
    # (a k whose ratio falls outside GENERATE_RATIO_RANGE is left out: with a tiny model's microsecond forwards,
    # timing noise can drop any k, k = 1 included, so which ones remain is not asserted)
    ratio = report["cost_profile"]["generate_ratio"] or {}
    assert set(ratio) <= {str(k) for k in range(1, 6)}
    assert all(0.67 <= r <= 1.5 for r in ratio.values()), ratio
    assert [p["external_id"] for p in report["prompts"]] == ["c1", "c2", "t1", "s1"]
    assert [p["task"] for p in report["prompts"]] == ["code", "code", "translation", "unlabelled"]
    for prompt in report["prompts"]:
        assert set(prompt["per_gamma"]) == {"1", "2", "3", "4"}
        for g, counts in prompt["per_gamma"].items():
            assert {"rounds", "drafted", "accepted", "histogram"} <= set(counts)
            assert len(counts["histogram"]) == int(g) + 1 and sum(counts["histogram"]) == counts["rounds"]
            assert counts["accepted"] <= counts["drafted"]
            assert counts["rounds"] >= -(-prompt["output_tokens"] // (int(g) + 1))
        assert 0.0 <= prompt["alpha"] <= 1.0
        assert set(prompt["predicted_speedup"]) == {"1", "2", "3", "4"}
        # g*: the gamma of the highest predicted speedup, the smallest among equals
        speedups = [prompt["predicted_speedup"][str(g)] for g in range(1, 5)]
        assert prompt["best_gamma"] == 1 + speedups.index(max(speedups))
    code = report["tasks"]["code"]
    assert code["n"] == 2 and code["alpha_var"] is not None
    assert code["alpha_mean"] == pytest.approx(np.mean([p["alpha"] for p in report["prompts"][:2]]))
    assert code["alpha_var"] == pytest.approx(np.var([p["alpha"] for p in report["prompts"][:2]], ddof=1))
    assert code["tier"] == recommendation_tier(
        code["alpha_mean"], code["alpha_var"]
    )  # the seed's rule, from the numbers
    assert (
        report["tasks"]["translation"]["tier"] != "HIGHLY_RECOMMENDED"
    )  # one prompt: no variance, no top tier
    assert code["speculate"] == (code["predicted_speedup"] > 1.05)
    assert report["tasks"]["translation"]["alpha_var"] is None  # one prompt: no sample variance
    defaults = code["assistant_defaults"]  # transformers' defaults, replayed and priced
    assert defaults["settings"] == "num_assistant_tokens 20, constant, threshold 0.4 (adapted)"
    assert (
        defaults["prompts"] == 2 and defaults["speedup"] > 0 and defaults["accepted"] <= defaults["drafted"]
    )
    assert defaults["rounds"] >= -(-code["output_tokens"] // 21)
    assert report["workload"]["assistant_defaults"]["prompts"] == 4
    assert len(report["validation"]) == 2
    for validation in report["validation"]:
        assert validation["outputs_identical"] is True
        assert validation["measured_speedup"] > 0
        prompt = next(p for p in report["prompts"] if p["prompt_id"] == validation["prompt_id"])
        assert validation["target_forward_passes"] == prompt["per_gamma"][str(validation["gamma"])]["rounds"]
    assert sum(report["entropy_table"]["positions"]) == sum(
        max(p["output_tokens"] - 1, 0) for p in report["prompts"]
    )
    # each validated prompt ran greedy and speculative twice on this CPU: its two greedy runs are one pair of
    # identical work, the machine's noise beside the validation's figures
    for validation in report["validation"]:
        assert len(validation["greedy_times_s"]) == len(validation["speculative_times_s"]) == 2
        assert validation["greedy_time_s"] == pytest.approx(np.median(validation["greedy_times_s"]))
    summary = report["validation_summary"]["run"]
    assert summary["noise_pairs"] == 2
    # the floor: the mean |log ratio| of each prompt's two greedy runs; noisy over 15% (or a hypervisor's steal
    # over 10%); the aggregate missed where its error is over the bound every fit is held to
    floor = np.mean([abs(np.log(a / b)) for a, b in (v["greedy_times_s"] for v in report["validation"])])
    assert summary["noise_floor_pct"] == pytest.approx(100 * floor)
    noisy = floor > MAX_NOISE_FLOOR or (summary["steal_pct"] or 0.0) > 100 * MAX_STEAL_SHARE
    assert summary["noise_verdict"] == ("noisy" if noisy else "quiet")
    assert summary["aggregate_missed"] == (summary["aggregate_error_pct"] > summary["aggregate_bound_pct"])
    greedy = sum(v["greedy_time_s"] for v in report["validation"])
    assert summary["aggregate_measured"] == pytest.approx(
        greedy / sum(v["speculative_time_s"] for v in report["validation"])
    )
    # the three routing numbers: per task and "all", the oracle the ceiling of the other two, none below off
    routing = report["routing"]
    assert [r["group"] for r in routing] == ["code", "translation", "unlabelled", "all"]
    for row in routing:
        assert 1.0 - 1e-9 <= row["by_task"] <= row["oracle"] + 1e-9 and row["static"] <= row["oracle"] + 1e-9
        assert row["oracle_interval"][0] <= row["oracle_interval"][1]
    assert routing[-1]["prompts"] == 4


def test_ngram_run_reuses_the_cost_profile_unless_reprofile(cli_db, model_folders, tmp_path):
    args = ["--target", f"hf:{model_folders['target']}", "--draft", "ngram:max_ngram=3", "--limit", "2"]
    first = json.loads(_analyze(cli_db, *args).stdout)
    second = json.loads(_analyze(cli_db, *args).stdout)
    assert first["draft"] == "ngram:max_ngram=3"
    assert first["cost_profile"] == second["cost_profile"]
    third = json.loads(_analyze(cli_db, *args, "--reprofile").stdout)
    assert third["progress"]["done"] == 2
    listed = json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert [r["status"] for r in listed] == ["done", "done", "done"]
    csv_out = cli_db.invoke(cli, ["report", str(first["run_id"]), "--format", "csv"]).stdout.splitlines()
    assert csv_out[0].startswith("prompt_id,external_id,task") and len(csv_out) == 3
    text = cli_db.invoke(cli, ["report", str(first["run_id"])]).stdout
    assert "task" in text and "code" in text


def test_tokenizer_mismatch_fails_with_a_clear_message(cli_db, model_folders):
    result = cli_db.invoke(
        cli,
        [
            "analyze",
            "--prompts",
            "mix",
            "--target",
            f"hf:{model_folders['target']}",
            "--draft",
            f"hf:{model_folders['other']}",
            "--max-new-tokens",
            "4",
        ],
    )
    assert result.exit_code == 1
    assert "tokenizer" in result.stderr.lower()
    runs = json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert runs[0]["status"] == "failed" and "Tokenizer" in runs[0]["error"]


def test_interrupted_run_resumes_without_redoing_or_duplicating(engine, model_folders, tmp_path):
    factory = make_session_factory(engine)
    with factory() as session, session.begin():
        import_prompt_file(
            session, "mix", "".join(json.dumps(p) + "\n" for p in PROMPTS).encode(), "mix.jsonl"
        )
        run_id = create_run(
            session, "mix", f"hf:{model_folders['target']}", "ngram", RunParams(max_new_tokens=8, gamma_max=3)
        ).id

    def stop_after_two(done, total, phase):
        if phase == "measuring" and done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_run(factory, run_id, cache_dir=tmp_path, progress=stop_after_two)
    with factory() as session:
        run = session.get(AnalysisRun, run_id)
        assert run.status == "failed" and "interrupted" in run.error and run.progress_done == 2
        kept = {r.prompt_id: (r.id, r.output_token_ids) for r in session.scalars(select(PromptResult))}
    assert len(kept) == 2
    execute_run(factory, run_id, cache_dir=tmp_path)
    with factory() as session:
        run = session.get(AnalysisRun, run_id)
        assert (run.status, run.progress_done, run.error) == ("done", 4, None)
        rows = list(session.scalars(select(PromptResult)))
        assert len(rows) == 4 and len({r.prompt_id for r in rows}) == 4
        for row in rows:
            if row.prompt_id in kept:
                assert (row.id, row.output_token_ids) == kept[row.prompt_id]
        assert session.scalar(select(func.count()).select_from(CostProfile)) == 1


def test_sampling_mode_stores_expectations(cli_db, model_folders):
    result = _analyze(
        cli_db,
        "--target",
        f"hf:{model_folders['target']}",
        "--draft",
        f"hf:{model_folders['draft']}",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--limit",
        "2",
    )
    report = json.loads(result.stdout)
    assert report["mode"].startswith("sampling")
    for prompt in report["prompts"]:
        alpha = prompt["alpha"]
        assert 0.0 < alpha <= 1.0
        for g, counts in prompt["per_gamma"].items():
            assert counts["expected_tokens_per_round"] == pytest.approx(expected_tokens_iid(alpha, int(g)))


def _summary_for_sampling(tasks: dict[str, tuple[int, bool, float]], curves=None):
    """A run summary: task -> (prompts, speculate, predicted speedup); prompts in task order, each prompt's
    predicted speedup curve ``curves[position]`` (default [1.0])."""
    from analyzer.advice.summary import AnalysisSummary, GroupSummary, PromptSummary

    prompts, position = [], 0
    for task, (n, _, _) in tasks.items():
        for _ in range(n):
            prompts.append(
                PromptSummary(
                    prompt_id=100 + position,
                    position=position,
                    task=task,
                    alpha=0.5,
                    speedup_curve=(curves or {}).get(position, [1.0]),
                    best_gamma=1,
                    rounds={1: 10},
                )
            )
            position += 1
    groups = {
        t: GroupSummary(
            n=n,
            speculate=on,
            predicted_speedup=s,
            alpha_mean=0.5,
            alpha_var=0.01,
            alpha_std=0.1,
            tier="CONDITIONAL",
            output_tokens=10 * n,
        )
        for t, (n, on, s) in tasks.items()
    }
    return AnalysisSummary(
        run_id=1,
        gamma_max=1,
        sampling=False,
        margin=0.05,
        cost=None,
        costs={},
        prompts=prompts,
        tasks=groups,
        workload=None,
    )


def test_validation_sample_covers_tasks_speculating_ones_first():
    from analyzer.analysis.run_records import validation_sample

    summary = _summary_for_sampling(
        {
            "code": (5, False, 0.98),
            "creative_writing": (5, True, 1.10),
            "extraction": (1, True, 2.9),
            "qa": (3, False, 0.9),
        }
    )
    tasks = lambda rows: [r.task for r in rows]  # noqa: E731
    assert tasks(validation_sample(summary, 3)) == ["extraction", "creative_writing", "code"]
    assert tasks(validation_sample(summary, 6)) == [
        "extraction",
        "creative_writing",
        "code",
        "qa",
        "creative_writing",
        "code",
    ]
    first = validation_sample(summary, 3)
    assert [r.position for r in first] == [10, 5, 0]  # the first prompt of each task in file order
    # a resumed validation keeps the balance: code and extraction are done, creative_writing comes next
    again = validation_sample(summary, 4, already=[first[0], first[2]])
    assert tasks(again) == ["creative_writing", "qa"]
    assert len(validation_sample(summary, 100)) == 14


def test_within_a_task_validation_takes_the_middle_prediction_then_the_extremes():
    from analyzer.analysis.run_records import validation_sample

    # five code prompts predicted 1.0, 1.5, 1.2, 2.0, 1.1 at gamma 1 and 2: the middle (1.2), then the
    # farthest from it (1.0, then 2.0), then what lies between, as every engine's validation takes them
    curves = {0: [1.0, 1.0], 1: [1.5, 1.6], 2: [1.2, 1.25], 3: [2.0, 2.2], 4: [1.1, 1.1]}
    summary = _summary_for_sampling({"code": (5, True, 1.3)}, curves)
    assert [r.position for r in validation_sample(summary, 5)] == [2, 0, 3, 1, 4]
    first = validation_sample(summary, 2)
    assert [r.position for r in validation_sample(summary, 3, already=first)] == [3]


def test_validate_draws_across_tasks_and_never_calls_one_task_the_workload(cli_db, model_folders):
    result = _analyze(
        cli_db, "--target", f"hf:{model_folders['target']}", "--draft", "ngram", "--validate", "3"
    )
    report = json.loads(result.stdout)
    assert sorted(v["task"] for v in report["validation"]) == ["code", "translation", "unlabelled"]
    assert set(report["validation_summary"]["tasks"]) == {"code", "translation", "unlabelled"}
    assert report["workload"]["measured_tasks"] == ["code", "translation", "unlabelled"]
    assert report["workload"]["measured_speedup"] is not None
    one = json.loads(
        _analyze(
            cli_db, "--target", f"hf:{model_folders['target']}", "--draft", "ngram", "--validate", "1"
        ).stdout
    )
    assert len(one["validation"]) == 1 and one["workload"]["measured_speedup"] is None
    text = cli_db.invoke(cli, ["report", str(one["run_id"])]).stdout
    assert f"validation: 1 prompts all {one['validation'][0]['task']}, so not a workload figure" in text


def _drill_down_marks(report: dict, gammas: tuple[str, ...], monkeypatch) -> dict[tuple[int, str], list[str]]:
    """The marks of each prompt's output tokens on its drill-down page per gamma, read with no
    tokenizer to be had (the page must need only what the run stored)."""
    import transformers

    from webui.app import create_app

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the drill-down loaded a tokenizer")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    app = create_app({"ui_worker": False, "TESTING": True})
    client = app.test_client()
    marks = {}
    try:
        for prompt in report["prompts"]:
            for gamma in gammas:
                page = client.get(f"/runs/{report['run_id']}/prompts/{prompt['prompt_id']}?gamma={gamma}")
                assert page.status_code == 200
                html = page.get_data(as_text=True)
                assert "measured before specroute stored token ids" not in html
                marks[prompt["prompt_id"], gamma] = re.findall(r'<span class="tok (\w+)" title=', html)
    finally:
        app.extensions["specroute.close"]()
    return marks


def _assert_marks_agree_with_counts(report: dict, marks: dict[tuple[int, str], list[str]]) -> int:
    """Per prompt and gamma: one mark per output token, the accepted marks are the stored accepted
    count, and the other marks (one target token per round) the stored rounds, less one when the
    budget ended the last round on accepted drafts. Returns the accepted marks seen."""
    accepted = 0
    for (prompt_id, gamma), shown in marks.items():
        prompt = next(p for p in report["prompts"] if p["prompt_id"] == prompt_id)
        counts = prompt["per_gamma"][gamma]
        assert len(shown) == prompt["output_tokens"]
        assert shown.count("accepted") == counts["accepted"]
        assert counts["rounds"] - (len(shown) - shown.count("accepted")) in (0, 1)
        accepted += counts["accepted"]
    return accepted


def test_the_drill_down_of_an_ngram_run_marks_what_the_counts_say(cli_db, model_folders, monkeypatch):
    """Prompt lookup: the drill-down replays the stored prompt and output ids with the run's n-gram
    size and EOS ids, so its marks agree with the stored counts at every gamma."""
    report = json.loads(
        _analyze(cli_db, "--target", f"hf:{model_folders['target']}", "--draft", "ngram:max_ngram=3").stdout
    )
    marks = _drill_down_marks(report, ("1", "3"), monkeypatch)
    # the prompts repeat themselves enough for prompt lookup to be accepted somewhere
    assert _assert_marks_agree_with_counts(report, marks) > 0


def test_the_drill_down_of_a_model_draft_run_marks_what_the_counts_say(cli_db, model_folders, monkeypatch):
    """A model draft: the drill-down walks the stored draft matches, never the n-gram rule, so its
    marks agree with the stored counts at every gamma."""
    report = json.loads(
        _analyze(
            cli_db, "--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"
        ).stdout
    )
    marks = _drill_down_marks(report, ("1", "2", "4"), monkeypatch)
    assert _assert_marks_agree_with_counts(report, marks) > 0  # the noisy copy agrees with the target in part


def _count_tokenizations(monkeypatch) -> list[str]:
    """Make every tokenizer the run loads count its tokenizations (outermost calls of __call__,
    encode, tokenize and apply_chat_template; nested ones are the same tokenization) into the
    returned list, one entry naming the prompt per call."""
    from analyzer.engine import run_models

    calls: list[str] = []
    depth = [0]

    def counted(method):
        def wrapper(self, *args, **kwargs):
            if depth[0] == 0:
                first = args[0] if args else next(iter(kwargs.values()), None)
                calls.append(first if isinstance(first, str) else json.dumps(first, sort_keys=True))
            depth[0] += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    real_load = run_models.load_model

    def load_counting(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        base = type(loaded.tokenizer)
        names = ("__call__", "encode", "tokenize", "apply_chat_template")
        loaded.tokenizer.__class__ = type(
            f"Counting{base.__name__}", (base,), {n: counted(getattr(base, n)) for n in names}
        )
        return loaded

    monkeypatch.setattr(run_models, "load_model", load_counting)
    return calls


def test_a_run_tokenizes_each_prompt_once_and_stores_the_ids_it_measured(
    cli_db, model_folders, monkeypatch, tmp_path
):
    """Profiling, measuring and validating share one tokenization per prompt; the stored prompt ids
    are a fresh tokenization under the run's rule (chat template, truncation to the context left by
    the output budget), the output ids decode to the stored output, and each stored token text is
    that token decoded alone."""
    from collections import Counter

    from analyzer.db import make_engine
    from analyzer.measuring.prompt_encoding import encode_prompt, eos_token_ids, prompt_token_limit
    from analyzer.models.loading import load_model
    from analyzer.models.specs import parse_spec
    from analyzer.settings import load_settings

    calls = _count_tokenizations(monkeypatch)
    report = json.loads(
        _analyze(
            cli_db,
            "--target",
            f"hf:{model_folders['target']}",
            "--draft",
            f"hf:{model_folders['draft']}",
            "--validate",
            "2",
            "--reprofile",
        ).stdout
    )
    assert len(report["validation"]) == 2 and report["cost_profile"]["target_k_s"]  # all three phases ran
    expected = {json.dumps([{"content": p["prompt"], "role": "user"}], sort_keys=True) for p in PROMPTS}
    assert Counter(calls) == {key: 1 for key in expected}

    target = load_model(parse_spec(f"hf:{model_folders['target']}"), cache_dir=tmp_path)
    tokenizer = target.tokenizer
    limit = prompt_token_limit(target.model, 12)
    engine = make_engine(load_settings().resolved_database_url())
    try:
        with make_session_factory(engine)() as session:
            run = session.get(AnalysisRun, report["run_id"])
            assert (
                run.eos_token_ids
                == eos_token_ids(target.model.generation_config.eos_token_id, tokenizer.eos_token_id)
                == [3]
            )
            results = list(session.scalars(select(PromptResult).where(PromptResult.run_id == run.id)))
            assert len(results) == len(PROMPTS)
            for result in results:
                fresh = encode_prompt(
                    tokenizer, text=result.prompt.text, use_chat_template=True, max_prompt_tokens=limit
                )
                assert result.prompt_token_ids == fresh.ids and result.prompt_tokens == len(fresh.ids)
                assert (
                    tokenizer.decode(result.output_token_ids, skip_special_tokens=False) == result.output_text
                )
                assert result.output_token_texts == [
                    tokenizer.decode([t], skip_special_tokens=False) for t in result.output_token_ids
                ]
                assert len(result.output_token_ids) == result.output_tokens
    finally:
        engine.dispose()


def test_a_resumed_run_reuses_the_stored_ids_of_the_prompts_it_measured(
    engine, model_folders, tmp_path, monkeypatch
):
    factory = make_session_factory(engine)
    with factory() as session, session.begin():
        import_prompt_file(
            session, "mix", "".join(json.dumps(p) + "\n" for p in PROMPTS).encode(), "mix.jsonl"
        )
        run_id = create_run(
            session,
            "mix",
            f"hf:{model_folders['target']}",
            "ngram",
            RunParams(max_new_tokens=8, gamma_max=3, validate=4),
        ).id

    def stop_after_two(done, total, phase):
        if phase == "measuring" and done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_run(factory, run_id, cache_dir=tmp_path, progress=stop_after_two)
    with factory() as session:
        measured = {r.prompt.text for r in session.scalars(select(PromptResult))}
    assert len(measured) == 2
    calls = _count_tokenizations(monkeypatch)
    execute_run(factory, run_id, cache_dir=tmp_path)  # measures two, validates all four
    texts = [json.loads(c)[0]["content"] for c in calls]
    assert sorted(texts) == sorted(p["prompt"] for p in PROMPTS if p["prompt"] not in measured)


@pytest.mark.slow
def test_an_analysis_finishes_while_another_process_writes_the_database(cli_db, model_folders, tmp_path):
    """A write that follows a read in one transaction takes the write lock first: another process's
    writer then only makes it wait. Begun as a plain read, such a transaction failed at once with
    "database is locked" (SQLite refuses a write on a snapshot another writer has overtaken)."""
    with another_writer(tmp_path / "data" / "specroute.db") as commits:
        for draft in ("ngram", f"hf:{model_folders['draft']}"):
            done = _analyze(
                cli_db, "--target", f"hf:{model_folders['target']}", "--draft", draft, "--validate", "1"
            )
            assert done.exit_code == 0, done.output
            assert json.loads(done.stdout)["status"] == "done"
    assert commits[0] > 100  # the other writer was busy throughout


# a long question in Russian, its words apart so the tiny tokenizer gives each a token: 6 + 120 * 7 words
LONG_RUSSIAN = (
    "Прочитайте текст и ответьте на вопрос. "
    + "Городской транспорт должен быть быстрым удобным и доступным. " * 120
    + "Вопрос: как распределить бюджет?"
)


@pytest.fixture
def long_prompt_db(runner, tmp_path):
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    source = tmp_path / "long.jsonl"
    rows = [*PROMPTS[:2], {"prompt": LONG_RUSSIAN, "task": "qa", "id": "ru"}, *PROMPTS[2:]]
    source.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in rows))
    assert runner.invoke(cli, ["prompts", "import", str(source), "--name", "long"]).exit_code == 0
    return runner


def _analyze_long(runner, folders, *args):
    return runner.invoke(
        cli,
        ["analyze", "--prompts", "long", "--target", f"hf:{folders['target']}", "--draft", "ngram",
         "--max-new-tokens", "12", "--gamma-max", "4", "--validate", "0", *args],
    )  # fmt: skip


def test_a_prompt_the_context_cannot_hold_is_left_out_and_named_and_the_others_measured(
    long_prompt_db, model_folders
):
    """The tiny target holds 512 positions: with 12 new tokens, 500 prompt tokens. The long prompt (third in
    the file) is counted before anything is generated, left out with its count in the report's text and JSON,
    and the other four are measured; none of its tokens is stored."""
    from transformers import AutoTokenizer

    chat = AutoTokenizer.from_pretrained(model_folders["target"]).apply_chat_template(
        [{"role": "user", "content": LONG_RUSSIAN}], add_generation_prompt=True, tokenize=True
    )
    tokens = len(chat["input_ids"])
    assert tokens > 500
    analyzed = _analyze_long(long_prompt_db, model_folders, "--json")
    assert analyzed.exit_code == 0, analyzed.stderr
    report = json.loads(analyzed.stdout)
    why = f"{tokens} tokens, where the context holds 500 prompt tokens beside 12 new ones"
    text = long_prompt_db.invoke(cli, ["report", str(report["run_id"])])
    assert f"Left out prompt 3 (qa): {why}" in text.stdout.splitlines()
    assert "Left out: 1 prompt (below)" in text.stdout
    assert report["status"] == "done" and report["progress"] == {"done": 4, "total": 4}
    [left] = report["left_out"]["prompts"]
    assert left == {"prompt_id": left["prompt_id"], "position": 3, "task": "qa", "tokens": tokens, "why": why}
    assert len(report["prompts"]) == 4 and all(p["prompt_id"] != left["prompt_id"] for p in report["prompts"])


def test_refuse_stops_before_generating_and_names_every_long_prompt(long_prompt_db, model_folders):
    """``--long-prompts refuse`` fails the run before its first generation, naming each prompt too long and
    what to change; no prompt's result is stored."""
    result = _analyze_long(long_prompt_db, model_folders, "--long-prompts", "refuse")
    assert result.exit_code == 1
    assert "1 of the 5 prompts do not fit the run's context" in result.stderr
    assert "prompt 3 (qa) has" in result.stderr and "--long-prompts leave-out" in result.stderr
    [run] = json.loads(long_prompt_db.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert run["status"] == "failed" and run["done"] == 0 and "1 of the 5 prompts" in run["error"]


def test_a_context_size_is_refused_for_the_transformers_engine(long_prompt_db, model_folders):
    """transformers holds each model's own context: ``--ctx`` names the engines it applies to."""
    result = _analyze_long(long_prompt_db, model_folders, "--ctx", "1024", "--engine", "transformers")
    assert result.exit_code != 0
    assert "a context size (--ctx) applies to the llama.cpp and llama-server engines" in result.stderr
