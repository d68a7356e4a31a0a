"""The specroute command line against a real SQLite file in a temporary data folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import migrations
from webui.cli import cli


def run(runner, *args, input=None):
    return runner.invoke(cli, list(args), input=input, catch_exceptions=False)


def test_commands_refuse_an_unmigrated_database_and_say_what_to_run(runner):
    for args in (["prompts", "list"], ["prompts", "show", "x"], ["prompts", "import", "--sample"]):
        result = run(runner, *args)
        assert result.exit_code == 1
        assert "has no specroute schema yet. Run: specroute db upgrade" in result.stderr


def test_db_upgrade_current_and_idempotent_rerun(runner):
    first = run(runner, "db", "upgrade")
    head = migrations.head_revision()
    assert first.exit_code == 0 and f"upgraded from empty to {head}" in first.output
    again = run(runner, "db", "upgrade")
    assert f"already at revision {head}" in again.output
    current = run(runner, "db", "current")
    assert f"revision: {head}" in current.output and f"head:     {head}" in current.output


def test_import_list_show_and_delete(runner, tmp_path):
    run(runner, "db", "upgrade")
    source = tmp_path / "mine.csv"
    source.write_text(
        'prompt,task,id\n"Translate: hallo",translation,t1\nWrite code,code,c1\nWrite code,code,c1\n'
    )
    imported = run(runner, "prompts", "import", str(source))
    assert imported.exit_code == 0
    assert "imported 2 prompts as 'mine' (code 1, translation 1)" in imported.output
    assert "line 4: same prompt as line 3, merged" in imported.output
    listed = json.loads(run(runner, "prompts", "list", "--json").stdout)
    assert [(s["name"], s["prompt_count"], s["task_counts"]) for s in listed] == [
        ("mine", 2, {"code": 1, "translation": 1})
    ]
    shown = json.loads(run(runner, "prompts", "show", "mine", "--json", "--search", "hallo").stdout)
    assert shown["matching"] == 1 and shown["prompts"][0]["id"] == "t1"
    assert "[translation] id=t1 Translate: hallo" in run(runner, "prompts", "show", "mine").output
    missing = run(runner, "prompts", "show", "nope")
    assert missing.exit_code == 1 and "no prompt set named 'nope' (known: mine)" in missing.stderr
    assert run(runner, "prompts", "delete", "mine", "--yes").exit_code == 0
    assert json.loads(run(runner, "prompts", "list", "--json").stdout) == []


def test_invalid_file_exits_1_with_every_error_on_stderr_and_stores_nothing(runner, tmp_path):
    run(runner, "db", "upgrade")
    bad = tmp_path / "broken.jsonl"
    bad.write_bytes(
        b'{"prompt": "fine"}\n{"prompt": ""}\nnot json\n{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'
    )
    result = run(runner, "prompts", "import", str(bad))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "broken.jsonl: 3 errors; nothing was imported",
        "  line 2, field 'prompt': empty prompt",
        "  line 3: bad JSON: Expecting value at column 1",
        "  line 5: invalid UTF-8 at column 16 (byte 0xe9)",
    ]
    as_json = json.loads(run(runner, "prompts", "import", str(bad), "--json").stdout)
    assert as_json["error"]["code"] == "invalid_prompt_file" and as_json["error"]["details"]["total"] == 3
    assert json.loads(run(runner, "prompts", "list", "--json").stdout) == []


def test_import_usage_errors(runner, tmp_path):
    run(runner, "db", "upgrade")
    assert run(runner, "prompts", "import").exit_code == 2
    assert run(runner, "prompts", "import", "--sample", str(tmp_path / "x.txt")).exit_code == 2
    unreadable = run(runner, "prompts", "import", str(tmp_path))
    assert unreadable.exit_code == 2  # a folder is not a file
    run(runner, "prompts", "import", "--sample")
    again = run(runner, "prompts", "import", "--sample")
    assert again.exit_code == 1 and "already exists" in again.stderr


@pytest.mark.slow
def test_demo_runs_the_main_job_and_reuses_it(
    runner, monkeypatch, steady_timings, cold_start_training_printed, cold_start_classifier_trained
):
    """The whole main job on the embedded model, cut short: 3 prompts, 8 new tokens, no serving (in
    transformers here; llama.cpp is tested in tests/test_llamacpp.py, the default, llama-server, in
    tests/test_llama_server_engine.py); then again with --reprofile on a busy machine. The demo's steps [1/6]
    (an empty database migrated) and [4/6] (the classifier cross-validated and trained) ran once for the
    session's demos (tests/conftest.py): what they printed is checked here, and the demo reuses the
    classifier. The model's timings keep their medians but read as steady (``steady_timings``), so a noisy
    VM cannot withhold the first run's advice; the busy machine is faked through /proc/stat."""
    import itertools

    from analyzer.measuring import interference

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
        "transformers",
    )
    steps = cold_start_training_printed
    assert (
        steps.startswith("[1/6] database sqlite:///")
        and f": empty -> {migrations.head_revision()}\n" in steps
    )
    assert "[4/6] training the task classifier on the bundled corpus" in steps
    assert "cross-validating (leave-one-source-out): fold 16/16" in steps and "keyword baseline" in steps
    first = run(runner, *quick)
    assert first.exit_code == 0, first.output
    head = migrations.head_revision()
    assert "[1/6] database sqlite:///" in first.output and f": {head} -> {head}\n" in first.output
    assert "imported the bundled sample prompts as 'sample'" in first.output
    assert "64 prompts over 13 task types" in first.output
    assert (
        "[3/6] analysis run 1 (new): builtin:smollm2-135m-instruct with ngram drafting in transformers"
        in first.output
    )
    assert "[4/6] classifier v1 already trained (reused)" in first.output
    assert "[5/6] published policy set v1 from run 1 (active)" in first.output
    assert "Advice withheld" not in first.output
    assert "run 1" in first.output and "[6/6] not serving" in first.output
    second = run(runner, *quick)
    assert "already imported as 'sample' (reused)" in second.output
    assert (
        "analysis run 1 already done (reused)" in second.output
        and "classifier v1 already trained (reused)" in second.output
    )
    assert "policy set v1 from run 1 already published (active; reused)" in second.output
    listed = json.loads(run(runner, "prompts", "list", "--json").stdout)
    assert [s["prompt_count"] for s in listed] == [64]
    runs = json.loads(run(runner, "runs", "list", "--json").stdout)
    assert [(r["status"], r["done"]) for r in runs] == [("done", 3)]
    # on a busy machine, --reprofile analyzes again (a new run, its cost profile measured anew): the
    # report leads with "Advice withheld", the validation is marked and left out of the error, and the
    # policies are published but not activated
    busy = itertools.count(0, 10**6)  # /proc/stat as on a machine whose other processes take every core
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))
    again = run(runner, *quick, "--reprofile")
    assert again.exit_code == 0, again.output
    assert "[3/6] analysis run 2 (new)" in again.output
    assert "[5/6] published policy set v2 from run 2 (NOT activated: advice withheld)" in again.output
    report = again.output.split("[5/6]")[1]
    verdict = report.split("\n\n")[1].splitlines()  # after the [5/6] line: the verdict leads the report
    assert verdict[0].startswith("Verdict: speculate on 0 of ") and len(verdict) <= 8
    assert any(
        line.startswith("Advice withheld: measured on a busy machine (the cost profile at")
        for line in verdict
    )
    assert "speedups not compared: every validation was measured on a busy machine" in report
    assert "The router does not follow this run's policies" in again.output
    active = [
        s["version"] for s in json.loads(run(runner, "policies", "list", "--json").stdout) if s["active"]
    ]
    assert active == [1]
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: None)
    third = run(runner, *quick)  # a rerun reuses the newest finished run with the demo's settings
    assert "analysis run 2 already done (reused)" in third.output
    assert "policy set v2 from run 2 already published (not active; reused)" in third.output


def test_settings_command_and_bad_setting(runner, monkeypatch):
    shown = json.loads(run(runner, "settings", "--json").stdout)
    assert {row["env"] for row in shown} >= {"SPECROUTE_DATA_DIR", "SPECROUTE_MAX_PROMPTS"}
    monkeypatch.setenv("SPECROUTE_MAX_PROMPTS", "lots")
    result = run(runner, "prompts", "list")
    assert result.exit_code == 1 and "SPECROUTE_MAX_PROMPTS: expected an integer" in result.stderr


def test_installed_console_script_runs(tmp_path):
    script = shutil.which("specroute") or str(
        (__import__("pathlib").Path(sys.executable).parent / "specroute")
    )
    result = subprocess.run([script, "--help"], capture_output=True, text=True, check=True)
    for group in ("db", "demo", "prompts", "settings"):
        assert group in result.stdout


def test_decisions_prune_deletes_only_old_decisions(runner, tmp_path):
    from datetime import timedelta

    from sqlalchemy import select

    from analyzer.db import make_engine, make_session_factory, utcnow
    from router.orm import RouteDecision

    assert run(runner, "db", "upgrade").exit_code == 0
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'specroute.db'}")
    with make_session_factory(engine)() as session, session.begin():
        for i, age_days in enumerate([0, 0.5, 2, 3, 10]):
            session.add(
                RouteDecision(
                    route_id=f"r-{i}",
                    task_type="qa",
                    confidence=0.9,
                    speculate=False,
                    gamma=0,
                    expected_speedup=1.0,
                    reasons=[],
                    created_at=utcnow() - timedelta(days=age_days),
                )
            )
    result = run(runner, "decisions", "prune", "--older-than-days", "1", "--yes")
    assert result.exit_code == 0 and "deleted 3 routing decisions" in result.output
    with make_session_factory(engine)() as session:
        assert sorted(session.scalars(select(RouteDecision.route_id))) == ["r-0", "r-1"]
    assert "deleted 0" in run(runner, "decisions", "prune", "--older-than-days", "1", "--yes").output
    engine.dispose()


def test_a_context_size_is_refused_where_the_engine_has_none_and_a_bad_rule_names_the_choices(runner):
    """``--ctx`` sizes the context of the engines that have one (llama.cpp, llama-server); the transformers
    engine, which holds each model's own, refuses it naming those engines, before a run is stored; a bad
    ``--long-prompts`` rule is refused naming the choices."""
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    refused = runner.invoke(
        cli, ["analyze", "--prompts", "sample", "--engine", "transformers", "--ctx", "2048"]
    )
    assert refused.exit_code == 1
    assert "a context size (--ctx) applies to the llama.cpp and llama-server engines" in refused.stderr
    assert json.loads(runner.invoke(cli, ["runs", "list", "--json"]).stdout) == []
    bad = runner.invoke(
        cli, ["analyze", "--prompts", "sample", "--engine", "llama-server", "--long-prompts", "cut"]
    )
    assert bad.exit_code == 2 and "'leave-out', 'refuse'" in bad.stderr
    small = runner.invoke(cli, ["analyze", "--prompts", "sample", "--engine", "llama-server", "--ctx", "100"])
    assert small.exit_code == 2 and "100 is not in the range 256<=x<=131072" in small.stderr


def test_analyze_takes_every_option_of_an_analysis_in_llama_server_and_refuses_them_elsewhere(
    runner, monkeypatch
):
    """``specroute analyze --engine llama-server`` takes the options ``specroute llama-server analyze`` has (the
    settings, threads, calibration, prompts per task, servers the user runs, validation passes, refit) and hands
    them to the same analysis; another engine refuses them by name."""
    from webui.cli import server_analysis

    asked: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(
        server_analysis, "run_server_analysis", lambda *a, **k: asked.append((a, k))
    )  # queued
    common = ["analyze", "--engine", "llama-server", "--prompts", "sample", "--queue"]
    given = run(runner, *common, "--drafter", "ngram-mod 16 8-32", "--drafter", "ngram-simple 3/8",
                "--threads", "4", "--calibration", "5", "--per-task", "2", "--validate-repeats", "3", "--refit",
                "--ctx", "2048")  # fmt: skip
    assert given.exit_code == 0, given.output
    ((args, options),) = asked
    assert [d.label for d in args[3]] == ["ngram-mod 16 8-32", "ngram-simple 3/8"] and args[4] is None
    assert {
        k: options[k] for k in ("threads", "calibration", "per_task", "validate_repeats", "refit", "n_ctx")
    } == {"threads": 4, "calibration": 5, "per_task": 2, "validate_repeats": 3, "refit": True, "n_ctx": 2048}
    assert options["urls"] is None and options["queue_only"] is True
    served = run(
        runner,
        *common,
        "--server",
        "http://10.0.0.5:8081",
        "--server",
        "ngram-mod 16 8-32=http://10.0.0.5:8082",
    )
    assert served.exit_code == 0, served.output
    assert asked[1][1]["urls"] == {"off": "http://10.0.0.5:8081", "ngram-mod 16 8-32": "http://10.0.0.5:8082"}
    assert "threads" not in asked[1][1]  # left out: the analysis' own default
    both = run(runner, *common, "--server", "http://10.0.0.5:8081", "--drafter", "ngram-simple")
    assert both.exit_code == 2 and "leave out --drafter" in both.stderr
    elsewhere = run(
        runner, "analyze", "--engine", "transformers", "--prompts", "sample", "--threads", "4", "--refit"
    )
    assert (
        elsewhere.exit_code == 2
        and "--threads, --refit apply to --engine llama-server only" in elsewhere.stderr
    )
    assert len(asked) == 2
