"""``specroute export``: a run's or a policy set's decisions written in each engine's own terms.
Each export parses, names only the fields its engine documents (tests/data/engine_docs/: fields and
examples copied from the engines' documentation, with their sources), and round-trips the decisions it
was made from: the per-batch tables give, at every batch size, the gamma the router decides there and
the report's decision at every profiled size; every task's pool runs the gamma the router sends it
with. The runs are simulated (analyzer/analysis/simulated_run.py: real walks, real pricing and summary)."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from analyzer.advice.summary_store import run_summary
from analyzer.measuring.assistant_defaults import assistant_rounds
from analyzer.orm import AnalysisRun, PromptResult
from analyzer.prompts.prompt_sets import import_sample
from router.decide.contract import RouteRequest
from router.decide.decision import Router, RouterConfig, router_from_database
from router.export.export_plan import ExportError, plan_for_policy_set, plan_for_run
from router.export.serving import EXPORTERS, render_export
from router.orm import PolicySet, TaskPolicy
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot, publish_policies
from router.policies.server_policy import publish_server_policies
from tests.factories import make_done_run, make_server_analysis
from webui.cli import cli

DOCS = Path(__file__).parent / "data" / "engine_docs"
FLAT = [0.100 * (1 + 0.03 * (k - 1)) for k in range(1, 10)]  # T(k) at a GPU-like batch: verifying is cheap
MID = [0.100 * (1 + 0.5 * (k - 1)) for k in range(1, 10)]
STEEP = [0.100 * (1 + 1.2 * (k - 1)) for k in range(1, 10)]  # every verified token costs more than a step
BATCH_CURVES = {4: FLAT, 16: MID, 64: STEEP}
# the launch arguments the exports use besides the engines' speculative ones (ports, the model)
LAUNCH = {
    "vllm": {"--port"},
    "sglang": {"--model-path", "--port"},
    "llama-server": {"-m", "--port", "-t", "-c"},
}


def documented(engine: str) -> dict:
    return json.loads((DOCS / f"{engine.replace('-', '_')}.json").read_text("utf-8"))


def fields(engine: str) -> set[str]:
    return set(documented(engine)["fields"])


@pytest.fixture
def run(session):
    with session.begin():
        made = make_done_run(
            session, {"code": 0.95, "qa": 0.85, "chat": 0.5}, per_task=5, batch_curves=BATCH_CURVES
        )
    return made


# ---------------------------------------------------------------- parsing each engine's export


def commands(text: str) -> list[list[str]]:
    """The command lines of a shell export (comments and the SPECROUTE_ROUTER_POOLS line aside)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [shlex.split(line) for line in lines if not line.startswith("SPECROUTE_ROUTER_POOLS=")]


def options(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line ("" for a flag without a value)."""
    found = {}
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            value = args[i + 1] if i + 1 < len(args) else ""
            found[arg] = "" if value.startswith("-") else value
    return found


def parse_export(engine: str, fmt: str, text: str) -> list[dict]:
    """Every server config of an export as a dict of the engine's own fields, checked against what the
    engine documents (the single server first, then the pools)."""
    names = fields(engine)
    if fmt == "json":
        data = json.loads(text)
        per_task = data["per_task"]
        servers = [data["single_server"], *per_task.get("pools", [])]
        configs = [s["config"] for s in servers] + [e["settings"] for e in per_task.get("per_call") or []]
        if engine == "trtllm":
            configs = [c.get("speculative_config", {}) for c in configs]
    elif fmt == "yaml":
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
        assert all(set(d) <= {"speculative_config"} for d in documents)
        configs = [d.get("speculative_config", {}) for d in documents]
    elif fmt == "python":
        tree = ast.parse(text)
        settings = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and node.targets[0].id == "SETTINGS"
        )
        configs = [v or {} for v in ast.literal_eval(settings).values()]
    else:
        configs = []
        for args in commands(text):
            found = options(args)
            if engine == "vllm":
                assert args[:2] == ["vllm", "serve"]
                assert set(found) <= {"--port", "--speculative-config"}
                configs.append(json.loads(found.get("--speculative-config", "{}")))
            else:
                if engine == "sglang":
                    assert args[:3] == ["python3", "-m", "sglang.launch_server"]
                    found = options(args[3:])
                assert set(found) - LAUNCH[engine] <= names, set(found) - LAUNCH[engine] - names
                configs.append({k: v for k, v in found.items() if k not in LAUNCH[engine]})
    for config in configs:
        assert set(config) <= names, f"{engine}: {set(config) - names} not documented"
        in_documented_ranges(engine, config)
    return configs


def in_documented_ranges(engine: str, config: dict) -> None:
    """The value ranges the engines' documentation gives (tests/data/engine_docs/)."""
    if engine == "vllm" and config:
        top = config["num_speculative_tokens"]
        assert top > 0
        if "prompt_lookup_max" in config:
            assert 1 <= config["prompt_lookup_min"] <= config["prompt_lookup_max"]
        table = config.get("num_speculative_tokens_per_batch_size")
        if table:  # inclusive ranges from 1, contiguous, each K within num_speculative_tokens
            assert table[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(table, table[1:]))
            assert all(low <= high and 0 <= k <= top for low, high, k in table)
    if engine == "trtllm" and config:
        assert config["max_draft_len"] > 0
        schedule = {int(b): k for b, k in (config.get("draft_len_schedule") or {}).items()}
        assert not (schedule and "max_concurrency" in config)  # mutually exclusive
        if schedule:
            assert min(schedule) >= 1 and schedule[min(schedule)] == config["max_draft_len"]
            assert all(0 <= k <= config["max_draft_len"] for k in schedule.values())
        assert config.get("max_concurrency", 1) > 0
    if engine == "llama-server":
        for flag, value in config.items():
            if flag.startswith(("--spec-ngram", "--spec-draft-n-max")):
                assert 0 <= int(value) <= 1024, (flag, value)
    if engine == "sglang" and config:
        assert int(config["--speculative-num-draft-tokens"]) >= 2


@pytest.mark.parametrize("name,fmt", [(e.name, f) for e in EXPORTERS.values() for f in e.formats])
def test_every_export_parses_and_names_only_fields_its_engine_documents(session, run, name, fmt):
    text = render_export(plan_for_run(session, run.id), name, fmt)
    configs = parse_export(name, fmt, text)
    assert any(configs), f"{name} {fmt}: nothing speculates"  # the code task pays, so some server speculates
    for config in configs:
        if name == "trtllm" and config:
            assert config["decoding_type"] == "DraftTarget"  # the YAML value the docs give for a draft model
            assert config["max_draft_len"] >= 1
        if name == "llama-server" and config:
            spec_types = documented("llama-server")["fields"]["--spec-type"]["values"]
            assert config["--spec-type"] in spec_types
        if name == "sglang" and config:
            assert int(config["--speculative-num-draft-tokens"]) == int(config["--speculative-num-steps"]) + 1


def test_the_doc_fixtures_examples_parse_as_the_exports_do():
    # the documented examples go through the same parsers: the fixtures and the parsers agree on the format
    for example in documented("vllm")["examples"]:
        if example["text"].lstrip().startswith("vllm serve") or example["text"].startswith(
            "--speculative-config"
        ):
            line = example["text"].replace("\\\n", " ")
            args = shlex.split(line.split("VLLM_USE_V2_MODEL_RUNNER=0 ")[-1])
            config = json.loads(options(args)["--speculative-config"])
            assert set(config) <= fields("vllm"), config
            for low, high, k in config.get("num_speculative_tokens_per_batch_size", []):
                assert 1 <= low <= high and 0 <= k <= config["num_speculative_tokens"]
    yaml_examples = [
        e["text"]
        for e in documented("trtllm")["examples"]
        if e["text"].lstrip().startswith(("speculative_config", "#"))
    ]
    assert yaml_examples
    for text in yaml_examples:
        config = yaml.safe_load(text)["speculative_config"]
        assert set(config) <= fields("trtllm") and config["max_draft_len"] >= 1
    for example in documented("sglang")["examples"]:
        if "sglang.launch_server" in example["text"]:
            args = shlex.split(example["text"].replace("\\\n", " ").split("SGLANG_ENABLE_SPEC_V2=True ")[-1])
            speculative = {flag for flag in options(args) if flag.startswith("--speculative")}
            assert speculative <= fields("sglang"), speculative - fields("sglang")


# ---------------------------------------------------------------- round trips


def vllm_k(table: list[list[int]], batch: int) -> int:
    """K at ``batch`` under vLLM's documented rule: inclusive [start, end, K] ranges."""
    return next(k for low, high, k in table if low <= batch <= high)


def trtllm_k(config: dict, batch: int) -> int:
    """K at ``batch`` under TensorRT-LLM's documented rules: draft_len_schedule keys are inclusive upper
    bounds (0 above the largest; JSON writes them as strings, which its dict[int, int] takes), and
    max_concurrency turns speculation off above it."""
    if "max_concurrency" in config:
        return config["max_draft_len"] if batch <= config["max_concurrency"] else 0
    schedule = {int(b): k for b, k in config["draft_len_schedule"].items()}
    return next((schedule[b] for b in sorted(schedule) if batch <= b), 0)


def test_the_per_batch_tables_are_the_routers_and_the_reports_decisions(session, run):
    with session.begin():
        publish_policies(session, run.id)
        router = router_from_database(session, RouterConfig(max_batch_size=8))  # no classifier: the fallback
        summary = run_summary(session, session.get(AnalysisRun, run.id))
    plan = plan_for_run(session, run.id)
    vllm = json.loads(render_export(plan, "vllm", "json"))
    table = vllm["single_server"]["config"]["num_speculative_tokens_per_batch_size"]
    routed = {}
    for batch in range(1, 100):
        decision = router.route("some text", batch_size=batch)
        routed[batch] = decision.gamma if decision.speculate else 0
        assert vllm_k(table, batch) == routed[batch], batch
    assert len(set(routed.values())) >= 3  # the curves make the decision move with the batch size
    assert max(routed.values()) == vllm["single_server"]["config"]["num_speculative_tokens"]
    for batch, entry in summary.workload.by_batch.items():  # the report's decision at each profiled size
        assert vllm_k(table, batch) == (entry.best_gamma if entry.speculate else 0)
    trtllm = json.loads(render_export(plan, "trtllm", "json"))["single_server"]["config"][
        "speculative_config"
    ]
    assert routed[1] > 0 and "draft_len_schedule" in trtllm  # on at batch 1, off further up: a schedule
    for batch in range(1, 100):
        assert trtllm_k(trtllm, batch) == min(routed[batch], trtllm["max_draft_len"]), batch
    clamped = {b for b in routed if routed[b] > trtllm["max_draft_len"]}
    value = next(
        v
        for v in json.loads(render_export(plan, "trtllm", "json"))["single_server"]["values"]
        if v["field"] == "draft_len_schedule"
    )
    assert ("clamped" in value["from"]) == bool(clamped)


def test_every_tasks_pool_runs_the_gamma_the_router_sends_it_with(session, run):
    with session.begin():
        router = _router(session, run.id)
    plan = plan_for_run(session, run.id)
    exported = json.loads(render_export(plan, "vllm", "json", first_port=9100))
    pools = {p["key"]: p for p in exported["per_task"]["pools"]}
    assert exported["per_task"]["router_pools"] == {k: p["url"] for k, p in pools.items()}
    assert [p["url"] for p in pools.values()] == [f"http://127.0.0.1:{9100 + i}" for i in range(len(pools))]
    assert exported["provenance"]["analysis"] == str(run.id)  # a run's reference is its number
    assert exported["per_task"]["publish"].endswith(f"specroute policies publish --analysis {run.id}")
    for group in plan.groups:
        for batch in range(1, 40):
            decision = router.decide_task(group.task, RouteRequest.of(batch_size=batch))
            key = f"k{decision.gamma}" if decision.speculate else "off"
            config = pools[key]["config"]
            assert config.get("num_speculative_tokens", 0) == (decision.gamma if decision.speculate else 0)
            assert group.task in pools[key]["tasks"]


def _router(session, run_id: int) -> Router:
    from router.policies.policy import run_policy_set

    built = run_policy_set(session, session.get(AnalysisRun, run_id))
    contract = PolicyContract.of(built)
    return Router(
        None,
        {p.task_type: PolicySnapshot.of(p) for p in built.policies},
        policy_version=None,
        config=RouterConfig(max_batch_size=8),
        cost=contract.cost,
        contract=contract,
    )


def test_transformers_exports_per_task_kwargs_and_says_they_are_not_its_defaults(session, run):
    text = render_export(plan_for_run(session, run.id), "transformers", "python")
    assert not text.startswith("# WARNING")  # transformers priced this run
    settings = parse_export("transformers", "python", text)
    tree = ast.parse(text)
    table = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)))
    plan = plan_for_run(session, run.id)
    for group in plan.groups:
        expected = (
            None
            if not group.gamma
            else {
                "num_assistant_tokens": group.gamma,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            }
        )
        assert table[group.task] == expected
    assert settings and "were not replayed for this run" in text  # a simulated run has no replayed defaults


def test_transformers_exports_its_defaults_where_they_beat_the_fixed_gamma(session, client):
    with session.begin():
        run = make_done_run(session, {"code": 0.95, "qa": 0.7, "chat": 0.2}, per_task=5, gamma_max=8)
        run.cost_profile.target_forward_s = [0.040 + 0.004 * k for k in range(21)]  # verifying 21 is priced
        for result in session.scalars(select(PromptResult).where(PromptResult.run_id == run.id)):
            matches = result.draft_matches
            confident = [0.9 if m else 0.3 for m in matches]  # the confidence stop ends a round at a miss
            result.assistant_rounds = [
                list(r) for r in assistant_rounds(matches, confident, 64, lambda *_: 0)
            ]
        run.summary = None
    plan = plan_for_run(session, run.id)
    exported = json.loads(render_export(plan, "transformers", "json"))
    uses = {}
    for entry, group in zip(exported["per_task"]["per_call"], plan.groups):
        assert entry["task"] == group.task and entry["transformers_defaults"] == group.defaults
        defaults = group.defaults
        clears = defaults["speedup"] > 1 + plan.margin and defaults["speedup_interval"][0] > 1.0
        beats = not group.gamma or defaults["speedup"] > group.speedup
        expected = "defaults" if clears and beats else "gamma" if group.gamma else "off"
        assert entry["uses"] == expected, (group.task, defaults, group.speedup)
        fixed = {
            "num_assistant_tokens": group.gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }
        assert entry["settings"] == (fixed if expected == "gamma" else {})
        uses[group.task] = expected
    assert uses["code"] == "defaults" and uses["chat"] == "off"
    text = render_export(plan, "transformers", "python")
    table = ast.literal_eval(next(n.value for n in ast.parse(text).body if isinstance(n, ast.Assign)))
    assert (
        table["code"] == {}
        and table["chat"] is None
        and "transformers' defaults (num_assistant_tokens 20" in text
    )
    session.commit()
    page = client.get(f"/runs/{run.id}").get_data(as_text=True)  # the report shows the defaults beside g*
    code = next(g for g in plan.tasks if g.task == "code")
    assert (
        'id="defaults-table"' in page
        and f'<td>code</td><td class="num">{code.defaults["speedup"]:.2f}x' in page
    )


# ---------------------------------------------------------------- where values come from, and --strict


def test_every_value_says_where_it_came_from_and_another_engines_prices_are_flagged_first(
    session, run, runner, monkeypatch, db_url
):
    plan = plan_for_run(session, run.id)
    code = next(g for g in plan.tasks if g.task == "code")
    text = render_export(plan, "vllm", "flags")
    first = text.splitlines()[0]
    assert first.startswith("# WARNING: run") and "priced by transformers, not vLLM" in first
    data = json.loads(render_export(plan, "vllm", "json"))
    assert json.loads(render_export(plan, "vllm", "json").splitlines()[0].rstrip(",") + "}")[
        "warning"
    ].startswith("WARNING")
    for server in [data["single_server"], *data["per_task"]["pools"]]:
        assert [v["field"] for v in server["values"]] == list(server["config"])
        assert all(v["from"] for v in server["values"])
    assert (
        data["provenance"]["measured_by"] == "transformers"
        and data["provenance"]["priced_by"] == "transformers"
    )
    code_row = next(t for t in data["tasks"] if t["task"] == "code")
    assert (code_row["gamma"], code_row["predicted_speedup"], code_row["speedup_interval"]) == (
        code.gamma,
        code.speedup,
        list(code.interval),
    )
    assert "code at batch" in next(
        v["from"] for v in data["per_task"]["pools"][-1]["values"] if v["field"] == "num_speculative_tokens"
    )
    session.commit()  # the CLI's own connection writes
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", db_url)
    strict = runner.invoke(cli, ["export", "--run", str(run.id), "--for", "vllm", "--strict"])
    assert (
        strict.exit_code == 1
        and "--strict: run" in strict.stderr
        and "priced by transformers, not vLLM" in strict.stderr
    )
    ok = runner.invoke(cli, ["export", "--run", str(run.id), "--for", "transformers", "--strict"])
    assert ok.exit_code == 0 and "SETTINGS = {" in ok.stdout


def test_a_run_priced_on_an_imported_vllm_profile_exports_for_vllm_without_a_warning(session, run):
    with session.begin():
        stored = session.get(AnalysisRun, run.id)
        for link in stored.batch_profiles:
            link.cost_profile.priced_by, link.cost_profile.source, link.cost_profile.engine_version = (
                "vllm",
                "imported",
                "0.11.0",
            )
        stored.priced_by = "vllm"
    plan = plan_for_run(session, run.id)
    assert "vllm 0.11.0" in plan.priced_on and "imported" in plan.priced_on
    assert not render_export(plan, "vllm", "flags").startswith("# WARNING")
    assert render_export(plan, "sglang", "flags").startswith("# WARNING: run")
    assert render_export(plan, "vllm", "flags", strict=True)
    with pytest.raises(ExportError, match="priced by vllm, not SGLang"):
        render_export(plan, "sglang", "flags", strict=True)


# ---------------------------------------------------------------- cliffs


def _set_with(session, at_8: list[float], low_8: float) -> int:
    """A stored policy set (no run) whose workload speculates at batch 1 and has ``at_8`` at batch 8."""
    base = [1.30, 1.40, 1.35]
    policy = TaskPolicy(
        task_type=FALLBACK_TASK, is_fallback=True, speculate=True, gamma=2, alpha_mean=0.8, alpha_var=0.01,
        n_prompts=12, expected_speedup=1.40, tier="RECOMMENDED", speedup_curve=base,
        speedup_curves_by_batch={"1": base, "8": at_8}, speedup_low=1.2, speedup_high=1.6,
        speedup_lows_by_batch={"1": 1.2, "8": low_8}, decision_basis="task",
    )  # fmt: skip
    with session.begin():
        policy_set = PolicySet(
            version=1,
            draft_kind="ngram",
            draft_options={"max_ngram": 2},
            gamma_max=3,
            margin=0.05,
            is_active=True,
        )
        policy_set.policies = [policy]
        session.add(policy_set)
    return 1


@pytest.mark.parametrize("at_8,low_8,cliff", [([1.03, 1.02, 1.0], 0.97, True), ([0.8, 0.7, 0.6], 0.7, False)])
def test_a_flip_the_intervals_do_not_settle_is_marked_as_a_cliff(session, at_8, low_8, cliff):
    plan = plan_for_policy_set(session, _set_with(session, at_8, low_8))
    spans = [(s.low, s.high, s.gamma) for s in plan.workload.spans]
    assert spans[0][2] == 2 and spans[-1][2] == 0  # on at batch 1, off at 8 and beyond
    assert bool(plan.workload.cliffs) == cliff
    text = render_export(plan, "vllm", "flags")
    assert ("cliff between batch" in text) == cliff
    if cliff:
        assert (
            "1.03x" in plan.workload.cliffs[0].text
            and "profile batch sizes between 1 and 8" in plan.workload.cliffs[0].text
        )
        assert json.loads(render_export(plan, "vllm", "json"))["cliffs"] == [plan.workload.cliffs[0].text]


def test_cliffs_follow_the_reports_intervals(session, run):
    plan = plan_for_run(session, run.id)
    summary = run_summary(session, session.get(AnalysisRun, run.id))
    flips = 0
    for group in plan.groups:
        found = summary.workload if group.task == "*" else summary.tasks[group.task]
        marked = {c.last for c in group.cliffs}
        for left, right in zip(group.spans, group.spans[1:]):
            if bool(left.gamma) == bool(right.gamma) or right.low > max(plan.profiled):
                continue
            flips += 1
            below = max(b for b in plan.profiled if b <= left.high)
            above = min(b for b in plan.profiled if b > left.high)
            off = found.by_batch[above] if left.gamma else found.by_batch[below]
            on = found.by_batch[below] if left.gamma else found.by_batch[above]
            overlap = (
                on.speedup_interval[0] <= off.speedup_interval[1]
                and off.speedup_interval[0] <= on.speedup_interval[1]
            )
            assert (left.high in marked) == (off.speedup_interval[1] > 1.0 or overlap)
    assert flips >= 2


# ---------------------------------------------------------------- llama-server sets, refusals, the CLI


def test_a_set_from_a_llama_server_analysis_exports_its_pools_for_llama_server_only(session):
    with session.begin():
        prompt_set, _ = import_sample(session)
        record = make_server_analysis(session, prompt_set, {"extraction": "copy", "code": "chunks"})
        policy_set = publish_server_policies(session, record.id)
    plan = plan_for_policy_set(session, policy_set.version)
    text = render_export(plan, "llama-server", "flags")
    assert not text.startswith("# WARNING")
    parse_export("llama-server", "flags", text)
    exported = json.loads(render_export(plan, "llama-server", "json"))
    pools = {p["key"]: p for p in exported["per_task"]["pools"]}
    chosen = {p.setting for p in policy_set.policies if p.speculate}
    assert set(pools) == {"off"} | chosen and chosen
    for key in chosen:
        from analyzer.measuring.server_drafting import parse_drafter

        assert (
            pools[key]["command"][-len(parse_drafter(key).server_flags()) :]
            == parse_drafter(key).server_flags()
        )
        assert set(pools[key]["tasks"]) == {
            p.task_type for p in policy_set.policies if p.setting == key and p.speculate
        }
    analysis = f"llama-server:{record.id}"
    assert exported["provenance"]["analysis"] == analysis
    assert exported["per_task"]["publish"].endswith(f"specroute policies publish --analysis {analysis}")
    for engine in ("vllm", "sglang", "trtllm", "transformers"):
        with pytest.raises(ExportError, match=f"analysis {analysis}: .* export it --for llama-server"):
            render_export(plan, engine)


def test_the_command_line_checks_what_it_is_asked(session, run, runner, monkeypatch, db_url, tmp_path):
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", db_url)
    both = runner.invoke(cli, ["export", "--run", str(run.id), "--policies", "1", "--for", "vllm"])
    assert both.exit_code == 2 and "give one of --analysis, --run or --policies" in both.stderr
    wrong = runner.invoke(cli, ["export", "--run", str(run.id), "--for", "vllm", "--format", "yaml"])
    assert wrong.exit_code == 1 and "vLLM exports as flags, json, not 'yaml'" in wrong.stderr
    none = runner.invoke(cli, ["export", "--for", "vllm"])
    assert none.exit_code == 1 and "no active policy set" in none.stderr
    missing = runner.invoke(cli, ["export", "--run", "999", "--for", "vllm"])
    assert missing.exit_code == 1 and "no analysis run 999" in missing.stderr
    target = tmp_path / "spec.yaml"
    written = runner.invoke(cli, ["export", "--run", str(run.id), "--for", "trtllm", "-o", str(target)])
    assert written.exit_code == 0 and parse_export("trtllm", "yaml", target.read_text())
    with session.begin():
        publish_policies(session, run.id)
    active = runner.invoke(cli, ["export", "--for", "vllm", "--format", "json"])
    assert active.exit_code == 0 and json.loads(active.stdout)["provenance"]["source"] == "policy set v1"
    assert (
        json.loads(active.stdout)["single_server"]
        == json.loads(render_export(plan_for_run(session, run.id), "vllm", "json"))["single_server"]
    )


def test_the_pages_show_the_export_with_a_copy_button(client, session, run):
    with session.begin():
        publish_policies(session, run.id)
    page = client.get(f"/runs/{run.id}?export=trtllm").get_data(as_text=True)
    assert 'id="export-text"' in page and "speculative_config:" in page and 'data-copy="export-text"' in page
    policies = client.get("/policies?export=sglang").get_data(as_text=True)
    assert "--speculative-algorithm STANDALONE" in policies and "policy set v1" in policies
    bad = client.get(f"/runs/{run.id}?export=nope").get_data(as_text=True)
    assert (
        "unknown engine &#39;nope&#39;" in bad and 'id="export-text"' in bad
    )  # named, and the default shown
    text = client.get(f"/runs/{run.id}/export.txt?for=vllm&format=json")
    assert (
        text.status_code == 200
        and text.mimetype == "text/plain"
        and json.loads(text.get_data(as_text=True))["engine"] == "vllm"
    )
    refused = client.get(f"/runs/{run.id}/export.txt?for=vllm&strict=1")
    assert refused.status_code == 400 and refused.get_data(as_text=True).startswith(
        "invalid_export: --strict: run"
    )
    unknown = client.get("/policies/7/export.txt?for=vllm")
    assert unknown.status_code == 400 and "no policy set version 7" in unknown.get_data(as_text=True)
    nope = client.get(f"/runs/{run.id}/export.txt?for=nope")
    assert nope.status_code == 400 and "unknown engine 'nope' for export" in nope.get_data(as_text=True)


def test_the_policies_page_takes_any_version_argument(client, session, run):
    with session.begin():
        publish_policies(session, run.id)
    for asked in ("1", "0", "-3", "99999999999999999999999", "x", "2"):
        page = client.get(f"/policies?version={asked}&export=vllm")
        assert page.status_code == 200, asked
        text = page.get_data(as_text=True)
        assert ("no policy set version 2" in text) == (asked == "2")
        assert ('id="export-text"' in text) == (asked != "2")  # out of range or not a number: the active set


def test_an_analysis_exports_by_its_reference_as_publishing_it_would_route_it(
    session, runner, monkeypatch, db_url
):
    """``specroute export --analysis llama-server:ID`` writes what the set published from that analysis
    exports (the same pools, flags and tasks), and ``--analysis RUN`` what ``--run RUN`` does."""
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", db_url)
    with session.begin():
        prompt_set, _ = import_sample(session)
        record = make_server_analysis(session, prompt_set, {"extraction": "copy", "code": "chunks"})
        run = make_done_run(session, {"code": 0.8, "qa": 0.3}, per_task=3)
    args = ["--for", "llama-server", "--format", "json"]

    def exported(*given: str) -> dict:
        result = runner.invoke(cli, ["export", *given, *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    before = exported("--analysis", f"llama-server:{record.id}")
    with session.begin():
        version = publish_server_policies(session, record.id).version
    published = exported("--policies", str(version))
    assert before["per_task"] == published["per_task"] and before["per_task"]["pools"]
    assert before["single_server"] == published["single_server"]
    assert exported("--analysis", str(run.id)) == exported("--run", str(run.id))
    both = runner.invoke(cli, ["export", "--analysis", str(run.id), "--run", str(run.id), *args])
    assert both.exit_code == 2 and "give one of --analysis, --run or --policies" in both.stderr
    missing = runner.invoke(cli, ["export", "--analysis", "llama-server:99", *args])
    assert missing.exit_code == 1 and "no llama-server analysis #99" in missing.stderr
