"""benchmarks/README.md is exactly what benchmarks/readme_tables.py renders from benchmarks/results/, so a hand
edit or a table left behind by a newer result fails; every claim has its section, and every table in it names the
result it reads, the machine and the command; a figure changed in a result changes its table; and every script
whose result the README reads rewrites the README after writing it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import readme_tables

ROOT = Path(__file__).resolve().parent.parent
PROVENANCE = re.compile(r"^- `results/([^`]+)`\. Machine: (.+?)\. Command: (`.+`)$", re.M)


def _sections(text: str) -> dict[str, str]:
    """The text under each ``## heading``, by heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _copied_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(readme_tables.RESULTS, results, ignore=shutil.ignore_patterns("*.pickle", "screenshots"))
    return results


def test_the_readme_on_disk_is_the_one_its_results_render():
    on_disk = readme_tables.README.read_text(encoding="utf-8")
    assert on_disk == readme_tables.render(), (
        "benchmarks/README.md is not what benchmarks/results/ renders: run `python -m benchmarks.readme_tables` "
        "(and change benchmarks/readme_tables.py, not the README, for its text)"
    )


def test_every_claim_has_a_section_whose_tables_name_their_machine_and_command():
    sections = _sections(readme_tables.render())
    assert list(sections) == [title for title, _ in readme_tables.SECTIONS]
    for title, body in sections.items():
        tables = len(re.findall(r"^\|---", body, flags=re.M))
        named = PROVENANCE.findall(body)
        assert tables and named, f"{title}: no table, or no result named with its machine and command"
        for name, machine, command in named:
            assert (readme_tables.RESULTS / name).is_file(), f"{title}: results/{name} does not exist"
            assert machine.strip() and command.strip("`").strip(), f"{title}: results/{name}"
        # every line after a table up to the next paragraph is a result's machine and command
        for table_end in re.finditer(r"^\|.*\|\n\n(?!\|)", body, flags=re.M):
            following = body[table_end.end() :].split("\n\n", 1)[0]
            assert PROVENANCE.match(following), f"{title}: a table without its result, machine and command"


def test_the_numbers_are_formatted_to_three_significant_digits():
    assert readme_tables.num(0.0923025) == "0.0923"
    assert readme_tables.num(19.435353) == "19.4"
    assert readme_tables.num(1645.8) == "1,646"
    assert readme_tables.num(44269) == "44,269"
    assert readme_tables.num(None) == "-"
    assert readme_tables.pct(0.010523) == "1.1%"
    assert readme_tables.duration(424) == "7 min 4 s"


def test_a_command_is_rebuilt_from_the_arguments_a_result_records():
    args = {
        "per_task": "2",
        "pair": "True",
        "before": "False",
        "tasks": "None",
        "cache_dir": "/tmp/c",
        "out": "x",
    }
    command = readme_tables.command_from_args("bench_routing.py", args, "routing_pair.json")
    assert (
        command
        == "python benchmarks/bench_routing.py --per-task 2 --pair --out benchmarks/results/routing_pair.json"
    )


@pytest.mark.parametrize(
    ("name", "change", "row_start", "cell"),
    [
        (
            "classifier.json",
            lambda d: d["latency"]["tfidf:1"].update(p99_ms=0.123456),
            "| tfidf C=1 |",
            "| 0.123 |",
        ),
        (
            "cost_transfer_unseen.json",
            lambda d: d["advice"]["settings"][0].update(aggregate_error=0.0777),
            "| unseen | ngram-simple 12/48 |",
            "| 7.8% |",
        ),
        (
            "router_http.json",
            lambda d: d["http"]["rows"]["sqlite | specroute, 2 processes | /v1/route"].update(
                requests_per_s=4321.0
            ),
            "| router_http | sqlite | specroute, 2 processes | /v1/route |",
            "| 4,321 |",
        ),
        (
            "suite.json",
            lambda d: d["tests"]["runs"][0].update(tests_s=400),
            "| the test command, run 1 of ",
            "| 6 min 40 s |",
        ),
    ],
)
def test_a_figure_changed_in_a_result_changes_its_table(tmp_path, name, change, row_start, cell):
    results = _copied_results(tmp_path)
    rendered = readme_tables.render(results)
    assert rendered == readme_tables.render()
    data = json.loads((results / name).read_text(encoding="utf-8"))
    change(data)
    (results / name).write_text(json.dumps(data), encoding="utf-8")
    changed = readme_tables.render(results)
    row = next(line for line in changed.splitlines() if line.startswith(row_start))
    assert cell in row and cell not in next(
        line for line in rendered.splitlines() if line.startswith(row_start)
    )
    assert [line for line in changed.splitlines() if line not in rendered.splitlines()] == [row]


def test_write_readme_writes_what_render_returns(tmp_path):
    results = _copied_results(tmp_path)
    written = readme_tables.write_readme(results, tmp_path / "README.md")
    assert written.read_text(encoding="utf-8") == readme_tables.render(results)


def test_every_script_whose_result_the_readme_reads_rewrites_the_readme():
    commands = " ".join(command for _, _, command in PROVENANCE.findall(readme_tables.render()))
    scripts = set(re.findall(r"python benchmarks/(\w+\.py)", commands)) - {"real_pair.py"}  # a setup step
    assert scripts
    for script in sorted(scripts):
        source = (ROOT / "benchmarks" / script).read_text(encoding="utf-8")
        assert "write_readme()" in source, (
            f"benchmarks/{script} writes a result but does not rewrite the README"
        )


def test_the_suite_s_times_are_read_from_a_ci_log_and_a_build_log():
    """The two pytest passes' closing lines (with or without other counts beside "passed") and the build's own
    closing line give the suite's figures."""
    from benchmarks.suite_times import build_seconds, pytest_passes

    log = (
        "........ [100%]\n1017 passed, 3 warnings in 262.25s (0:04:22)\n...\n"
        "====== 27 passed in 318.80s (0:05:18) ======\nCI_WALL 700.5\n"
    )
    assert pytest_passes(log) == [(1017, 262.25), (27, 318.8)]
    assert (
        build_seconds("step 212 of 212: Linking\nbuilt /x/llama-server and its libraries in 12 min 40 s\n")
        == 760
    )
    with pytest.raises(ValueError, match="no 'built"):
        build_seconds("llama-server 0.3.36 already built: /x (reused)")


def _demo_runs(decisions: list[dict[str, str]], withheld: list[str | None]) -> dict:
    """A demo_repeat result of one run per entry of ``decisions``."""
    from benchmarks.demo_repeat import agreement

    runs = [
        {
            "seconds": 300.0 + number,
            "printed": [],
            "advice_withheld": why,
            "calibration": "the fit held",
            "validation_plan": None,
            "noise": {"verdict": "quiet", "floor": 0.045},
            "decisions": chosen,
            "margins": {
                "code": {
                    "best": "ngram-mod 24/48",
                    "speedup": 1.4,
                    "low": 1.2 + number / 100,
                    "fit_error": 0.03,
                },
                "qa": {"best": "ngram-simple 2/4", "speedup": 1.07, "low": 0.98, "fit_error": 0.04},
            },
        }
        for number, (chosen, why) in enumerate(zip(decisions, withheld, strict=True))
    ]
    return {
        "machine": "AMD EPYC, 2 CPUs",
        "runs": runs,
        "agreement": agreement(runs),
        "command": "python benchmarks/demo_repeat.py --runs 3",
    }


def test_the_demo_runs_again_get_their_table_saying_whether_they_agree(tmp_path):
    results = _copied_results(tmp_path)
    (results / "demo_repeat.json").unlink(missing_ok=True)
    assert "`specroute demo --no-serve` in a fresh data folder" not in readme_tables.render(results)
    same = {"code": "ngram-mod 24/48", "qa": "off"}
    data = _demo_runs([same, same, same], [None, None, None])
    assert data["agreement"] == {"withheld": 0, "tasks": 2, "differing": {}, "agree": True}
    (results / "demo_repeat.json").write_text(json.dumps(data), encoding="utf-8")
    rendered = readme_tables.render(results)
    assert "Every run withheld nothing and gave every task the same decision" in rendered
    # the task nearest the rule is qa: its lower end (0.98) is nearer 1.0 than code's (1.21)
    assert (
        "| 2 | 301 | quiet (4.5%) | no | 2 of 2 | qa: ngram-simple 2/4 1.07x, low 0.98, fit ±0.040 |"
        in rendered
    )
    other = {"code": "ngram-mod 24/48", "qa": "ngram-simple 2/4"}
    data = _demo_runs([same, other, same], [None, None, "the fit missed"])
    assert data["agreement"]["differing"] == {"qa": ["off", "ngram-simple 2/4", "off"]}
    (results / "demo_repeat.json").write_text(json.dumps(data), encoding="utf-8")
    rendered = readme_tables.render(results)
    assert "1 of 3 runs withheld the advice and 1 of 2 tasks got different decisions" in rendered
    assert "Of the 3 runs the product judged quiet, 1 withheld the advice." in rendered
    assert "| 2 | 301 | quiet (4.5%) | no | 1 of 2 |" in rendered
    assert "| 3 | 302 | quiet (4.5%) | yes: the fit missed | 2 of 2 |" in rendered


def test_a_profile_sample_is_the_first_category_any_of_its_frames_names(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports its folder's bench_router
    from benchmarks.profile_router import category, shares

    request = ["Thread 1", "handle (waitress/channel.py:1)", "route_one (/r/router/serve/api.py:9)"]
    decided = [*request, "route (/r/router/decide/decision.py:3)", "score (/r/router/classify/scorer.py:7)"]
    logged = [
        "Thread 2",
        "run (/r/router/serve/batch_writer.py:1)",
        "as_dict (/r/router/decide/reasons.py:4)",
    ]
    checked = [
        *request,
        "read_route (/r/router/decide/contract.py:2)",
        "model_validate (/v/pydantic/main.py:5)",
    ]
    written = [*request, "to_json (/r/router/decide/contract.py:8)"]
    assert [category(s) for s in (request, decided, logged, checked, written)] == [
        "server and framework",
        "deciding",
        "decision log",
        "validating",
        "serializing",
    ]
    found = shares([(request, 1), (decided, 2), (logged, 1)])
    assert found["samples"] == 4
    assert (found["shares"]["deciding"], found["shares"]["decision log"]) == (0.5, 0.25)
    assert found["top_frames"][0] == ["score (/r/router/classify/scorer.py:7)", 0.5]


def test_the_router_profile_table_shows_each_checkout_profiled_beside_today(tmp_path):
    def profile(checkout: str, deciding: float, rps: float, gil_free: float) -> dict:
        return {
            "machine": "AMD EPYC, 2 CPUs", "threads": 8, "concurrency": 16, "seconds": 20, "samples": 100,
            "gil_free": gil_free,
            "load": {"requests_per_s": rps, "p99_ms": 30.0}, "checkout": checkout, "command": f"profile {checkout}",
            "shares": {"decision log": 0.1, "deciding": deciding, "server and framework": 0.9 - deciding},
        }  # fmt: skip

    assert readme_tables._router_profile(tmp_path) == ""  # nothing profiled: no section
    (tmp_path / "router_profile.json").write_text(json.dumps(profile("today", 0.3, 1500, 0.25)))
    (tmp_path / "router_profile_49cefe4.json").write_text(json.dumps(profile("49cefe4", 0.2, 800, 0.5)))
    table = readme_tables._router_profile(tmp_path)
    assert "| where | share of samples (today) | share of samples (49cefe4) |" in table
    assert "| deciding | 30.0% | 20.0% |" in table
    assert "| no thread held the GIL (share of instants) | 25.0% | 50.0% |" in table
    assert "| requests/s while sampled | 1,500 | 800 |" in table
    assert "`results/router_profile_49cefe4.json`" in table and "`profile 49cefe4`" in table


def test_the_first_command_is_the_readmes_timed_by_its_steps_and_the_demos_phases(tmp_path):
    from benchmarks.first_command import first_command, marked, phases, steps_of

    command = first_command((ROOT / "README.md").read_text(encoding="utf-8"))
    assert command.startswith("python3 -m venv .venv && ") and command.endswith(" && specroute demo")
    steps = steps_of(command)
    assert marked(command).count("echo '@@step ") == len(steps) and marked(command).endswith("specroute demo")
    lines = [
        (0.0, "@@step 0"),
        (4.0, "Collecting torch"),
        (10.0, "@@step 1"),
        (12.0, "[1/6] database sqlite:///x: empty -> 0037"),
        (30.0, "[3/6] analyzing 39 sample prompts"),
        (400.0, "[6/6] serving the report and the router"),
    ]
    step_rows, demo_rows = phases(lines, ["first", "second"])
    assert [(r["step"], r["seconds"]) for r in step_rows] == [("first", 10.0), ("second", 390.0)]
    assert [r["seconds"] for r in demo_rows] == [18.0, 370.0, 0.0]
    results = _copied_results(tmp_path)
    result = {
        "machine": "Intel Xeon, 2 CPUs",
        "commit": "abc1234",
        "seconds": 400.0,
        "steps": step_rows,
        "demo": demo_rows,
        "warm": "pip's download cache",
        "command": "python benchmarks/first_command.py",
    }
    (results / "first_command.json").write_text(json.dumps(result), encoding="utf-8")
    rendered = readme_tables.render(results)
    assert (
        "| `second` | 6 min 30 s |" in rendered
        and "| demo: [3/6] analyzing 39 sample prompts | 6 min 10 s |" in rendered
    )
    assert "| **until the demo serves its report** | **6 min 40 s** |" in rendered
    assert "fresh clone (of abc1234)" in rendered
