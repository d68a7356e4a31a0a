"""An analysis in the real llama-server: greedy output from a plain server, the drafting
rules replayed, step costs fitted from the servers' timings, and validation through speculating servers.

The exactness test: a model-free speculating server's own ``draft_n`` and ``draft_n_accepted`` must equal
the replay of the output it served (plain greedy's, or its own where speculation changed it), for
ngram-simple at two sizes and for ngram-mod with its table carried across requests. Runs on the embedded
SmolLM2 GGUF's first layers (tests/small_gguf.py: its tokenizer, template and drafting, steps ~6x quicker); the
demo's test runs the embedded model itself. No timing is asserted."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from analyzer.analysis.server_analysis import MIN_SPEEDUP, ValidationAsk, analyze_in_llama_server
from analyzer.analysis.server_calibration import measured_noise
from analyzer.analysis.server_figures import ceilings, task_choices, validation_figures
from analyzer.analysis.server_generation import ServerSetup
from analyzer.analysis.server_outcomes import ServerPrompt
from analyzer.engine.llama_server_process import LlamaServerError, LlamaServerProcess
from analyzer.measuring.noise import sampled_half_width
from analyzer.measuring.server_drafting import parse_drafter
from tests.small_gguf import gguf_spec

pytestmark = pytest.mark.slow  # llama-server end to end: the quick tier leaves it out

SAMPLE = Path(__file__).resolve().parents[1] / "analyzer" / "sample_data" / "sample_prompts.jsonl"
# tasks whose answers copy their input draft often; a chat task drafts little
TASKS = ("extraction", "translation", "roleplay", "code", "general")


def _prompts(per_task: int) -> list[ServerPrompt]:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    chosen = [r for task in TASKS for r in [r for r in rows if r["task"] == task][:per_task]]
    return [ServerPrompt(r["id"], r["task"], [{"role": "user", "content": r["prompt"]}]) for r in chosen]


@pytest.fixture(scope="module")
def model_path(small_gguf) -> Path:
    return small_gguf


@pytest.fixture(scope="module")
def analysis(llama_server_binary, model_path):
    drafters = [parse_drafter(d) for d in ("ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod 16 2-16")]
    setup = ServerSetup(llama_server_binary, model_path, threads=2, n_ctx=4096)
    lines: list[str] = []
    # two validation passes whatever the machine's noise: ngram-mod's server then sees every prompt twice
    result = analyze_in_llama_server(
        setup, _prompts(2), drafters, n_predict=48, calibration_prompts=3, validate=True,
        validation=ValidationAsk(repeats=2, half_width=0.0, budget_share=None), say=lines.append,
    )  # fmt: skip
    return result, lines


def test_server_draft_counts_equal_the_replay_of_the_output_it_served(analysis):
    result, lines = analysis
    assert lines[0].startswith(f"generated 1/10 ({result.prompts[0].prompt.key})")
    assert lines[-1].startswith("validation: ") and not lines[-1].endswith(" left")  # step lines only
    assert lines[-2].startswith("validated 7/7") and ", pass 2/2" in lines[-2]
    assert re.search(r", about \d+ (s|min) left$", lines[-2])  # the time left, told from the passes so far
    assert lines[-1].startswith("validation: every held-out prompt (7) in 2 passes, as asked")
    compared = drafted = history = 0
    for outcome in result.prompts:
        for setting in outcome.settings:
            # calibration prompts ran once, the others twice
            assert len(setting.trials) == (1 if outcome.calibration else 2)
            for trial in setting.trials:
                assert setting.replayed_as_served(trial)  # model-free: every run is replayed as served
                left_plain = trial.measured.completion.tokens != trial.plain.completion.tokens
                stateful = setting.drafter.kind == "ngram-mod"  # its table: always the server's own history
                assert (trial.replay is not None) == (left_plain or stateful)
                replay = setting.trial_replay(trial)
                timings = trial.measured.completion.timings
                assert (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)) == (
                    replay.draft_n,
                    replay.draft_n_accepted,
                ), (outcome.prompt.key, setting.drafter.label)
                compared += 1
                drafted += replay.draft_n > 0
                history += trial.replay is not None and trial.replay != setting.replay
    # every run compared, and most of them drafted: the comparison is not vacuous
    assert compared == 3 * (3 + 7 * 2) and drafted >= 30
    # ngram-mod's server drafts from its history: a repeated prompt finds its own earlier output, which the
    # workload-order replay never sees; the exactness above holds only because each run is replayed on the
    # server's own history
    assert history >= 7


def test_costs_predictions_and_task_choices_come_from_the_servers(analysis):
    result, _ = analysis
    assert set(result.costs) == {"n-gram"}
    cost = result.costs["n-gram"]
    # physically possible: nothing negative, an accepted token at most a step, a round at least a step
    assert cost.plain_step_ms > 0 and cost.per_context_ms >= 0 and cost.step_extra_ms == 0
    assert (
        cost.round_ms >= 0 and cost.per_draft_ms >= 0
    )  # a rejected drafted token costs something or nothing
    assert -1e-9 <= cost.per_draft_ms + cost.per_accepted_ms <= cost.plain_step_ms + 1e-9  # an accepted one
    assert cost.round_cost_ms(4, 300) >= cost.round_cost_ms(1, 300) >= cost.plain_step_ms
    assert cost.samples >= 3 and 0 <= cost.fit_mare < 1  # the calibration runs that drafted
    assert cost.heldout_mare is not None and cost.plain_heldout_mare is not None  # 3 prompts left out in turn
    # the plain stage is fitted from the calibration passes' plain runs (the generation pass, warm on one
    # server, is left out), the undisturbed ones
    calibration_runs = [r for o in result.prompts if o.calibration for pair in o.plain_pairs for r in pair]
    assert cost.plain_samples == sum(not r.disturbed for r in calibration_runs) >= 2
    # every pass ran the plain server before and after the settings: one pair of identical runs each (the
    # disturbed ones left out of the noise floor)
    pairs = sum(len(o.plain_pairs) for o in result.prompts)
    assert pairs == 3 + 7 * 2
    assert result.noise is not None and 2 <= result.noise.pairs <= pairs and result.noise.floor is not None
    # the bound: 5 points beyond one run's noise as the calibration passes measured it, taken as many times as
    # the fits without each prompt reach to it (how large that noise is depends on the machine, so it is
    # checked against the measured noise, not against a range)
    calibration_noise = measured_noise([o for o in result.prompts if o.calibration])
    assert calibration_noise.run_error is not None and 1.0 <= cost.checked_reach <= 2.0
    assert result.fit_bound == pytest.approx(0.05 + calibration_noise.run_error * cost.checked_reach)
    fits_hold = all(c.checked_error <= result.fit_bound for c in result.costs.values())
    if result.noise.verdict == "noisy":  # a floor over 15% withholds the advice whatever the fit
        assert result.withheld is not None
    else:
        assert (result.withheld is None) == fits_hold
    for outcome in result.prompts:
        for setting in outcome.settings:
            replay = setting.replay
            assert replay.output_tokens == len(outcome.plain.completion.tokens)
            expected = cost.plain_ms(replay) / cost.speculative_ms(replay)
            assert setting.predicted_speedup == pytest.approx(expected)
            if not replay.rounds:  # nothing drafted: the prediction is plain decoding
                assert setting.predicted_speedup == pytest.approx(1.0)
    choices = task_choices(result)
    assert [c.task for c in choices] == sorted(TASKS)
    for choice in choices:
        # the one rule: the best setting where it clears 1 + margin and its interval's lower end clears 1.0
        # (a task of fewer than 3 prompts takes the workload's decision)
        best = max(choice.predicted.values())
        low = choice.curve.interval_of(choice.curve.best)[0]
        clears = best > MIN_SPEEDUP and low > 1.0
        if choice.curve.point.basis == "workload":
            assert choice.prompts < 3
        else:
            assert choice.prompts >= 3 and (choice.curve.chosen is not None) == clears
        assert (choice.best is None) == (choice.curve.chosen is None or result.withheld is not None)
        if choice.best is not None and choice.curve.point.basis == "task":
            assert choice.curve.speedup_of(choice.best.label) == max(choice.curve.speedups)
    figures = validation_figures(result)
    assert [f.setting for f in figures] == [d.label for d in result.drafters]
    assert all(f.runs == 7 and f.trials == 14 for f in figures)  # the 3 calibration prompts are not validated
    assert all(f.counts_equal == 1.0 for f in figures if f.counts_equal is not None)
    assert all(f.mare is not None and f.advice_mare is not None for f in figures)
    for outcome in result.prompts:
        for setting in outcome.settings:
            # the advice is compared where the server met the prompt as the advice assumes: ngram-mod's
            # first pass only (later ones find the prompt's own output in its table)
            first_only = setting.drafter.kind == "ngram-mod"
            expected = (
                [t for t in setting.trials[:1] if not t.disturbed] if first_only else setting.quiet_trials
            )
            assert setting.advice_trials == expected
    for index, f in enumerate(figures):
        assert f.aggregate_predicted is not None and f.aggregate_measured is not None
        assert f.aggregate_error == pytest.approx(abs(f.aggregate_predicted / f.aggregate_measured - 1))
        # the half-width run noise leaves on the aggregate: the analysis' own run error over the quiet validated
        # prompts' plain times and their passes (how large it is depends on the machine, so not a range)
        settings = [o.settings[index] for o in result.prompts]
        quiet = [s for s in settings if not s.calibration and s.quiet_trials]
        assert quiet and result.noise.run_error is not None
        weights = [result.cost_of(result.drafters[index]).plain_ms(s.replay) for s in quiet]
        passes = [len(s.quiet_trials) for s in quiet]
        assert f.aggregate_noise == pytest.approx(sampled_half_width(result.noise.run_error, weights, passes))
        assert f.within_noise is not None and 0 <= f.within_noise <= 1
    routing = ceilings(result)
    assert [c.group for c in routing] == [*sorted(TASKS), "all"]
    overall = routing[-1]
    # the oracle is the ceiling: no router that decides before generation does better, none worse than off
    assert overall.oracle >= overall.by_task - 1e-9 and overall.oracle >= overall.static - 1e-9
    assert (
        overall.oracle >= 1.0 and overall.oracle_interval[0] <= overall.oracle <= overall.oracle_interval[1]
    )


def test_calibration_prompts_that_draft_nothing_fail_with_advice_and_store_nothing(
    runner, llama_server_binary, model_path, monkeypatch
):
    from webui.cli import cli

    monkeypatch.setenv("SPECROUTE_LLAMA_SERVER", str(llama_server_binary))
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    # ngram-mod at its defaults needs 48 tokens found in a row: one short chat prompt never gets there
    args = [
        "--model",
        gguf_spec(model_path),
        "--drafter",
        "ngram-mod",
        "--per-task",
        "1",
        "--calibration",
        "1",
        "--n-predict",
        "8",
        "--no-validate",
    ]
    failed = runner.invoke(cli, ["llama-server", "analyze", *args])
    assert failed.exit_code == 1, failed.output
    assert failed.stderr.splitlines()[-1] == (
        "Error: none of the 1 calibration prompts drafted anything with ngram-mod 24 48-64, so no round could "
        "be timed: raise --calibration, or add prompts that repeat their input (extraction, code edits) "
        "(job #1 failed, server_analysis_failed)"  # nothing to resume: the analysis as asked cannot be made
    )
    assert runner.invoke(cli, ["llama-server", "show", "1"]).stderr == "Error: no llama-server analysis #1\n"


def test_a_server_that_cannot_start_says_why(llama_server_binary, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    with pytest.raises(LlamaServerError, match="exited with .* at start"):
        LlamaServerProcess(llama_server_binary, broken, threads=1, n_ctx=256).start(timeout_s=60)


def test_the_command_line_analyzes_stores_shows_and_plans_pools_and_the_page_shows_it(
    runner, llama_server_binary, model_path, monkeypatch, tmp_path
):
    from markupsafe import escape
    from sqlalchemy import func, select

    from analyzer.analysis.server_text import divergence_text
    from analyzer.db import make_engine
    from analyzer.names import DEFAULT_MARGIN
    from analyzer.orm import Prompt, ServerAnalysisRecord
    from analyzer.pricing.policy_curve import decision_rule
    from analyzer.pricing.speedup import MIN_TASK_PROMPTS
    from webui.app import create_app
    from webui.cli import cli
    from webui.cli.server_analysis import DEFAULT_DRAFTERS

    monkeypatch.setenv("SPECROUTE_LLAMA_SERVER", str(llama_server_binary))
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    bad = runner.invoke(cli, ["llama-server", "analyze", "--drafter", "ngram-cache"])
    assert (
        bad.exit_code == 2
        and "drafter 'ngram-cache': start with one of ngram-simple, ngram-mod" in bad.stderr
    )
    args = [
        "--model",
        gguf_spec(model_path),
        "--per-task",
        "1",
        "--drafter",
        "ngram-simple 3/8",
        "--drafter",
        "ngram-simple 2/4",
        "--n-predict",
        "24",
    ]
    done = runner.invoke(
        cli,
        ["llama-server", "analyze", *args, "--calibration", "3", "--validate-repeats", "1", "--validate-all"],
    )
    assert done.exit_code == 0, done.output
    assert "analyzing 13 prompts in llama-server" in done.stderr and "validated 10/10" in done.stderr
    shown = [
        line for line in done.stdout.splitlines() if line.startswith("validated every held-out prompt (10)")
    ]
    assert len(shown) == 1 and shown[0].endswith("(target ±5.0%), no budget")
    verdict, body = done.stdout.split("\n\n", 1)  # the verdict first, at most eight lines
    assert verdict.startswith("Verdict: speculate on ") and len(verdict.splitlines()) <= 8
    lines = body.splitlines()
    assert lines[0].startswith(
        "llama-server analysis #1 of prompt set #1: 13 prompts, 24 new tokens, 2 threads"
    )
    assert "ngram-simple 3/8 | 10 (" in done.stdout and "ngram-simple 2/4 | 10 (" in done.stdout
    routing_at = next(i for i, line in enumerate(lines) if line.startswith("routing from the replays"))
    task_rows = [
        line
        for line in lines[:routing_at]
        if line.split(" | ")[0] in {"code", "extraction", "rag", "translation"}
    ]
    assert len(task_rows) == 4
    # the routing numbers per task and overall: the oracle is never below routing by task or the static choice
    routing_rows = [line.split(" | ") for line in lines[routing_at + 1 :]]
    assert [row[0] for row in routing_rows][-1] == "all" and len(routing_rows) == 14
    for row in routing_rows:
        static, by_task, oracle = (float(cell.split()[0]) for cell in row[2:5])
        assert oracle >= by_task - 1e-3 and oracle >= static - 1e-3 and oracle >= 1.0
    shown = runner.invoke(cli, ["llama-server", "show", "1"])
    assert shown.exit_code == 0 and shown.stdout == done.stdout
    assert runner.invoke(cli, ["llama-server", "show", "2"]).stderr == "Error: no llama-server analysis #2\n"
    plan = runner.invoke(cli, ["llama-server", "pools", "1", "--port", "9000"])
    assert plan.exit_code == 0
    data_dir = tmp_path / "data"
    with make_engine(f"sqlite:///{data_dir / 'specroute.db'}").connect() as connection:
        record = connection.execute(select(ServerAnalysisRecord)).one()
        assert connection.scalar(select(func.count()).select_from(ServerAnalysisRecord)) == 1
    chosen = {t["task"]: t["chosen"] for t in record.tasks}
    assert len(chosen) == 13
    # what the validation guarantees, given how often speculation changed the output, under its table
    guarantee = divergence_text(record.validation)
    changed = [1 - f["output_equal"] for f in record.validation]
    assert guarantee in done.stdout.splitlines() and guarantee.startswith(
        "Every validated speculating server served plain greedy's output (20 prompt-settings)"
        if not any(changed)
        else f"Speculation changed the served output in {sum(changed) / 2:.0%} of 20 validated"
    )
    routes = dict(line.split(": ") for line in plan.stdout.split("# task -> pool\n")[1].splitlines())
    for task, label in chosen.items():  # every task goes to the pool running its chosen setting
        expected = (
            "llama-server-off"
            if label is None
            else "llama-server-" + label.replace(" ", "-").replace("/", "-")
        )
        assert routes[task] == expected
        assert f"# {expected}: {label or 'off'} for " in plan.stdout
    assert "--port 9000" in plan.stdout and "-np 1" in plan.stdout
    for label in {c for c in chosen.values() if c}:
        size_n, size_m = label.split()[1].split("/")
        assert (
            f"--spec-type ngram-simple --spec-ngram-simple-size-n {size_n} --spec-ngram-simple-size-m {size_m}"
            in plan.stdout
        )

    app = create_app(
        {"database_url": f"sqlite:///{data_dir / 'specroute.db'}", "ui_worker": False, "TESTING": True}
    )
    try:
        client = app.test_client()
        listing = client.get("/llama-server").get_data(as_text=True)
        assert 'href="/llama-server/1"' in listing
        page = client.get("/llama-server/1").get_data(as_text=True)
        assert page.count('<tr data-task="') == 13 and "Predicted vs measured speedup per prompt" in page
        for task, label in chosen.items():
            assert f'<tr data-task="{task}">' in page
        assert f'<p id="server-divergence">{escape(guarantee)}</p>' in page
        assert client.get("/llama-server/7").status_code == 404
    finally:
        app.extensions["specroute.close"]()
    # the same analysis through 'specroute analyze --engine llama-server': the run options that do not apply are
    # refused by name, and the JSON carries per prompt its id and per option its label and predicted speedup
    refused = runner.invoke(
        cli,
        [
            "analyze",
            "--engine",
            "llama-server",
            "--prompts",
            "sample",
            "--gamma-max",
            "4",
            "--dtype",
            "float32",
        ],
    )
    assert refused.exit_code == 2 and "do not apply to --engine llama-server" in refused.stderr
    assert "--gamma-max" in refused.stderr and "--dtype" in refused.stderr
    quick = [
        "--prompts",
        "sample",
        "--target",
        gguf_spec(model_path),
        "--limit",
        "8",
        "--max-new-tokens",
        "24",
    ]
    quick += ["--validate", "0", "--json"]
    as_json = runner.invoke(cli, ["analyze", "--engine", "llama-server", *quick])
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert (report["kind"], report["analysis_id"], report["n_predict"]) == ("llama-server", 2, 24)
    labels = [parse_drafter(d).label for d in DEFAULT_DRAFTERS]
    with make_engine(f"sqlite:///{data_dir / 'specroute.db'}").connect() as connection:
        first_ids = connection.scalars(
            select(Prompt.id).where(Prompt.prompt_set_id == 1).order_by(Prompt.position).limit(8)
        ).all()
    assert [row["prompt_id"] for row in report["prompts"]] == first_ids
    for row in report["prompts"]:
        assert [o["label"] for o in row["options"]] == labels
        assert all(o["predicted_speedup"] > 0 and 0 <= o["accepted"] <= o["drafted"] for o in row["options"])
    # the first 8 sample prompts: 5 code, 3 creative_writing, each task enough to decide on its own numbers by
    # the one rule: on where the best option's speedup clears 1 + margin and its interval's lower end clears 1
    per_task = Counter(row["task"] for row in report["prompts"])
    assert per_task == {"code": 5, "creative_writing": 3}
    assert sorted(t["task"] for t in report["tasks"]) == sorted(per_task)
    for task in report["tasks"]:
        assert [o["label"] for o in task["options"]] == labels
        assert all(o["low"] <= o["speedup"] <= o["high"] for o in task["options"])
        assert task["prompts"] == per_task[task["task"]] >= MIN_TASK_PROMPTS and task["basis"] == "task"
        best = max(task["options"], key=lambda o: o["speedup"])  # the first of equals, as best_gamma takes
        speculate, code = decision_rule(best["speedup"], best["low"], DEFAULT_MARGIN)
        assert task["code"] == code
        assert task["chosen"] == (best["label"] if speculate and not report["advice_withheld"] else None)


def test_draft_simple_counts_mostly_equal_the_replay_with_and_without_the_confidence_stop(
    llama_server_binary, model_path
):
    # the embedded model drafts for itself: cheap, and its p_min stops exercise the confidence stop. The
    # draft's logits come from llama-cpp-python, whose batches differ from the server's draft context, so a
    # near-tie can flip an argmax: the share of equal counts is reported, not guaranteed (docs/llamacpp.md)
    drafters = [parse_drafter(d) for d in ("draft-simple 0-3 p0", "draft-simple 0-5 p0.6")]
    setup = ServerSetup(llama_server_binary, model_path, threads=2, n_ctx=4096, draft_model=model_path)
    result = analyze_in_llama_server(
        setup,
        _prompts(1),
        drafters,
        n_predict=32,
        calibration_prompts=2,
        validate=True,
        validation=ValidationAsk(repeats=1),
    )
    equal = [
        s
        for o in result.prompts
        for s in o.settings
        if s.measured is not None
        and s.plain is not None
        and s.measured.completion.tokens == s.plain.completion.tokens
    ]
    assert len(equal) >= 8
    assert sum(bool(s.counts_equal) for s in equal) >= 0.6 * len(equal)
    p0 = [o.settings[0].replay for o in result.prompts]
    confident = [o.settings[1].replay for o in result.prompts]
    # without the stop every round but a request's last drafts 3; with it, some rounds stop early
    assert all(k == 3 for r in p0 for k, _ in r.rounds[:-1])
    assert any(k < 5 for r in confident for k, _ in r.rounds[:-1])
    figures = {f.setting: f for f in validation_figures(result)}
    assert set(figures) == {"draft-simple 0-3 p0", "draft-simple 0-5 p0.6"}
    # the draft decodes beside the target, so its servers' steps are fitted, not the plain server's; the fit
    # takes the calibration runs whose output equals plain greedy (their replay is what the server did)
    assert set(result.costs) == {"draft model"} and result.costs["draft model"].samples >= 1
    cost = result.costs["draft model"]
    assert (
        cost.step_extra_ms >= 0
        and cost.per_draft_decode_ms >= 0
        and cost.per_accepted_ms <= cost.plain_step_ms
    )


def test_an_analysis_through_servers_the_user_runs(
    runner, llama_server_binary, model_path, monkeypatch, tmp_path
):
    """--server: the analysis asks servers it did not start (the model and context from their /props), checks
    from their own draft counts that each runs its setting, and leaves them running."""
    from webui.cli import cli

    monkeypatch.delenv("SPECROUTE_LLAMA_SERVER", raising=False)
    monkeypatch.setenv(
        "SPECROUTE_LLAMA_SERVER", str(tmp_path / "no-such-binary")
    )  # never needed with --server
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    plain = LlamaServerProcess(llama_server_binary, model_path, threads=2, n_ctx=2048)
    spec = LlamaServerProcess(
        llama_server_binary,
        model_path,
        threads=2,
        n_ctx=2048,
        flags=parse_drafter("ngram-simple 2/4").server_flags(),
    )
    with plain, spec:
        plain_url, spec_url = plain.client.url, spec.client.url
        args = ["llama-server", "analyze", "--per-task", "1", "--n-predict", "24", "--calibration", "3"]
        args += ["--validate-repeats", "1"]
        both = runner.invoke(cli, [*args, "--server", plain_url, "--drafter", "ngram-mod"])
        assert both.exit_code == 2 and "leave out --drafter" in both.stderr
        alone = runner.invoke(cli, [*args, "--server", plain_url])
        assert alone.exit_code == 2 and "at least one setting's ('SETTING=URL')" in alone.stderr
        wrong = runner.invoke(
            cli, [*args, "--server", plain_url, "--server", f"ngram-simple 2/4={plain_url}"]
        )
        # the plain server named as the setting's drafts nothing: the setting is left out, and with no other
        # setting the analysis stops, saying what to check on the user's server
        assert wrong.exit_code == 1
        assert (
            "every setting's server disagreed with its replay, so nothing is left to analyze" in wrong.stderr
        )
        assert re.search(
            r"ngram-simple 2/4: its server drafted 0 tokens \(0 accepted\) on the 3 calibration", wrong.stderr
        )
        assert (
            f"check that the server at {plain_url} runs --spec-type ngram-simple --spec-ngram-simple-size-n 2 "
            "--spec-ngram-simple-size-m 4, one slot (-np 1)" in " ".join(wrong.stderr.split())
        )
        done = runner.invoke(cli, [*args, "--server", plain_url, "--server", f"ngram-simple 2/4={spec_url}"])
        assert done.exit_code == 0, done.output
        assert f"analyzing 13 prompts in llama-server (the servers at {plain_url}, {spec_url})" in done.stderr
        first = done.stdout.split("\n\n", 1)[1].splitlines()[0]  # after the verdict
        assert first.startswith("llama-server analysis #1 of prompt set #1: 13 prompts, 24 new tokens")
        assert "llama-server b1-" in first and first.endswith(model_path.name)
        sample = re.search(
            r"^validated (\d+) of 10 held-out prompts \(chosen across tasks", done.stdout, re.M
        )
        assert sample is not None and 4 <= int(sample.group(1)) < 10  # what the budget pays for, at least 4
        rows = [
            line
            for line in done.stdout.splitlines()
            if line.startswith(f"ngram-simple 2/4 | {sample.group(1)} (")
        ]
        assert len(rows) == 1  # validated through the user's servers
        assert plain.client.ready() and spec.client.ready()  # still running: not ours to stop
    gone = runner.invoke(cli, [*args, "--server", plain_url, "--server", f"ngram-simple 2/4={spec_url}"])
    assert gone.exit_code == 1 and f"no llama-server answers /health with ok at {plain_url}" in gone.stderr


def test_the_demo_analyzes_in_llama_server_by_default_publishes_pools_and_reuses_it(
    runner, llama_server_binary, monkeypatch, cold_start_classifier_trained
):
    """The main job under SPECROUTE_ENGINE's default (auto): the sample analyzed in llama-server (3 prompts
    per task, cut to 10 here: three tasks of 3 and one of 1, which takes the workload's decision; 24 new
    tokens), validated through speculating servers, its policy set published with a pool per chosen setting,
    the analysis printed; a rerun reuses both."""
    from sqlalchemy import select

    from analyzer.analysis.server_text import divergence_text
    from analyzer.db import make_engine
    from analyzer.orm import ServerAnalysisJob, ServerAnalysisRecord
    from analyzer.settings import load_settings
    from router.orm import PolicySet
    from webui.cli import cli

    monkeypatch.setenv("SPECROUTE_LLAMA_SERVER", str(llama_server_binary))
    quick = ("demo", "--no-serve", "--limit", "10", "--max-new-tokens", "24")
    first = runner.invoke(cli, list(quick))
    assert first.exit_code == 0, first.output
    assert "[3/6] analyzing 10 sample prompts (3 per task) in llama-server" in first.output
    assert "validated through speculating servers" in first.output
    assert (
        "[4/6] classifier v1 already trained (reused)" in first.output
    )  # trained by tests/test_cli.py's demo
    assert "llama-server analysis #1 of prompt set #1: 10 prompts, 24 new tokens, 2 threads" in first.output
    assert (
        "[6/6] not serving (--no-serve); 'specroute serve' shows the report at /llama-server/1"
        in first.output
    )
    engine = make_engine(load_settings().resolved_database_url())
    with engine.connect() as connection:
        record = connection.execute(select(ServerAnalysisRecord)).one()
        (policy_set,) = connection.execute(select(PolicySet)).all()
        (job,) = connection.execute(
            select(ServerAnalysisJob)
        ).all()  # the demo's analysis went through the queue
    engine.dispose()
    assert (job.status, job.analysis_id, job.attempts) == ("done", record.id, 1)
    assert len(record.prompts) == 10 and sum(p["calibration"] for p in record.prompts) == 3
    # validated: the sample its budget pays for, at least 4 of the 7 held out, chosen across tasks
    validated = record.validation_plan["validated"]
    assert record.validation_plan["held_out"] == 7 and 4 <= validated <= 7
    assert record.validation_repeats >= 1 and all(f["runs"] == validated for f in record.validation)
    assert [t["prompts"] for t in record.tasks] == [3, 3, 3, 1]
    assert divergence_text(record.validation) in first.output
    assert policy_set.server_analysis_id == record.id and policy_set.is_active == (not record.advice_withheld)
    # a pool per chosen setting, and the plain one (which serves the tasks left off)
    assert {"off", *(t["chosen"] for t in record.tasks if t["chosen"])} <= set(policy_set.pools)
    assert f"({'active' if policy_set.is_active else 'NOT activated: advice withheld'}; " in first.output
    assert f"{len(policy_set.pools)} pools)" in first.output
    again = runner.invoke(cli, list(quick))
    assert again.exit_code == 0, again.output
    assert "[3/6] llama-server analysis #1 already done (reused)" in again.output
    assert "[5/6] policy set v1 from llama-server analysis #1 already published" in again.output
