"""The engine as a dimension of every analysis: named once (analyzer/engine/engines.py), checked with what the
llama.cpp engine cannot measure refused before a run is stored, chosen on the command line, in the
setting and in the web form, recorded on the run, its profiles, its report and the policy sets
published from it, and named in every routing decision (the llama.cpp pool and who priced it). No
model is loaded here: runs are queued or simulated (analyzer/analysis/simulated_run.py)."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select

from analyzer.advice.report import build_report
from analyzer.advice.report_text import report_text
from analyzer.analysis.run_records import RunError, RunParams, create_run
from analyzer.checks import EngineError, check_engine_name
from analyzer.db import make_engine, make_session_factory
from analyzer.engine.engines import check_run
from analyzer.names import ENGINES
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.settings import SettingsError, load_settings
from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.decide.decision import Router
from router.policies.policy import PolicyContract, PolicySnapshot, publish_policies
from tests.factories import make_done_run
from tests.test_api import _validator
from webui.app import create_app
from webui.cli import cli

BUILTIN = "builtin:smollm2-135m-instruct"
PROMPTS = b'{"prompt": "def f(x): return x", "task": "code"}\n{"prompt": "What is 2 + 2?", "task": "qa"}\n'
CODE = "def f9(x): return x + 9  # fix this python function"


def test_engine_names_are_checked_exactly_and_the_error_names_the_choices():
    assert ENGINES == ("transformers", "llama.cpp")
    assert [check_engine_name(name) for name in ENGINES] == list(ENGINES)
    for bad in ("vllm", "Llama.cpp", "", None):
        with pytest.raises(EngineError, match=r"unknown engine .*; use one of: transformers, llama\.cpp"):
            check_engine_name(bad)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"temperature": 0.7}, "the llama.cpp engine measures greedy decoding only; use temperature 0"),
        ({"device": "cuda"}, "the llama.cpp engine runs on the CPU here; use device auto or cpu, not 'cuda'"),
        (
            {"device": "cuda:1"},
            "the llama.cpp engine runs on the CPU here; use device auto or cpu, not 'cuda:1'",
        ),
        (
            {"dtype": "float32"},
            "the llama.cpp engine measures the GGUF file's own quantization (Q4_1, Q8_0, ...) as "
            "shipped; leave dtype auto, not 'float32'",
        ),
        ({"dtype": "bf16"}, "leave dtype auto, not 'bf16'"),
        (
            {"batch_size": 4},
            "the llama.cpp engine runs one sequence per context (llama-cpp-python): use batch size 1",
        ),
        ({"profile_batch_sizes": (1, 4)}, "use batch size 1 and profile batch size 1 only"),
    ],
)
def test_run_params_refuse_what_the_llama_cpp_engine_cannot_measure(changes, message):
    with pytest.raises(RunError) as refused:
        check_run(RunParams(engine="llama.cpp", **changes))
    assert message in str(refused.value)
    assert check_run(
        RunParams(engine="transformers", **changes)
    )  # the same settings are fine in transformers


def test_run_params_accept_a_llama_cpp_run_and_refuse_an_unknown_engine():
    for ok in (
        RunParams(engine="llama.cpp"),
        RunParams(engine="llama.cpp", device="cpu", profile_batch_sizes=(1,)),
    ):
        assert check_run(ok).engine == "llama.cpp"
    assert RunParams().engine == "transformers"
    assert RunParams.from_json({"max_new_tokens": 8}).engine == "transformers"  # params stored before engines
    with pytest.raises(RunError, match=r"unknown engine 'vllm'; use one of: transformers, llama\.cpp"):
        RunParams(engine="vllm").check()


@pytest.mark.parametrize(
    "target, draft, message",
    [
        (
            "hf:/models/target",
            "ngram",
            "the target must be gguf:<folder>#<file.gguf> or builtin:<name>, not 'hf:/models/target'",
        ),
        (
            BUILTIN,
            "hf:/models/draft",
            "the draft must be ngram, gguf:<folder>#<file.gguf> or builtin:<name>, not 'hf:/models/draft'",
        ),
    ],
)
def test_create_run_refuses_a_pair_llama_cpp_cannot_load_and_stores_nothing(session, target, draft, message):
    with session.begin():
        import_prompt_file(session, "mix", PROMPTS, "mix.jsonl")
    with pytest.raises(RunError) as refused:
        create_run(session, "mix", target, draft, RunParams(engine="llama.cpp"))
    assert "the llama.cpp engine loads GGUF files only" in str(refused.value) and message in str(
        refused.value
    )
    session.rollback()
    assert session.scalar(select(AnalysisRun)) is None


def test_create_run_records_the_engine_on_the_run_and_in_its_params(session):
    with session.begin():
        import_prompt_file(session, "mix", PROMPTS, "mix.jsonl")
        llama = create_run(session, "mix", BUILTIN, "ngram:max_ngram=3", RunParams(engine="llama.cpp"))
        plain = create_run(session, "mix", "hf:/models/target", "ngram", RunParams())
    assert (llama.measured_by, llama.priced_by, llama.params["engine"]) == ("llama.cpp",) * 3
    assert (plain.measured_by, plain.priced_by, plain.params["engine"]) == ("transformers",) * 3


def test_the_engine_setting_is_checked_and_read_from_the_environment():
    assert (
        load_settings(environ={}).engine == "auto"
    )  # llama.cpp where it can measure the run, else transformers
    assert load_settings(environ={"SPECROUTE_ENGINE": "llama.cpp"}).engine == "llama.cpp"
    with pytest.raises(
        SettingsError,
        match=r"SPECROUTE_ENGINE: unknown engine 'vllm'; use one of: auto, transformers, llama\.cpp",
    ):
        load_settings({"engine": "vllm"}, environ={})


# ------------------------------------------------------------------------------ the command line


def _cli(runner, *args):
    return runner.invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def cli_mix(runner, tmp_path):
    """A migrated database in the runner's data folder holding the prompt set 'mix'."""
    (tmp_path / "mix.jsonl").write_bytes(PROMPTS)
    assert _cli(runner, "db", "upgrade").exit_code == 0
    assert _cli(runner, "prompts", "import", str(tmp_path / "mix.jsonl"), "--name", "mix").exit_code == 0
    return runner


def _queue(runner, *args):
    return _cli(runner, "analyze", "--prompts", "mix", "--queue", "--json", *args)


def test_analyze_queues_in_the_engine_asked_for_and_runs_list_shows_it(cli_mix, monkeypatch):
    llama = _queue(cli_mix, "--engine", "llama.cpp", "--target", BUILTIN)
    assert llama.exit_code == 0, llama.stderr
    assert "engine llama.cpp on the CPU" in llama.stderr
    plain = _queue(cli_mix, "--target", "hf:/models/target", "--device", "cpu")
    assert plain.exit_code == 0 and "engine transformers, device cpu" in plain.stderr
    monkeypatch.setenv("SPECROUTE_ENGINE", "llama.cpp")  # the setting is the default
    assert _queue(cli_mix, "--target", BUILTIN).exit_code == 0
    rows = json.loads(_cli(cli_mix, "runs", "list", "--json").stdout)
    assert [(r["id"], r["engine"]) for r in rows] == [(3, "llama.cpp"), (2, "transformers"), (1, "llama.cpp")]
    text = _cli(cli_mix, "runs", "list").stdout.splitlines()
    assert re.match(r"\s*3\s+queued\s+llama\.cpp\s+0/2", text[0])
    assert re.match(r"\s*2\s+queued\s+transformers\s", text[1])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "0.5"], "measures greedy decoding only"),
        (["--dtype", "float32"], "leave dtype auto, not 'float32'"),
        (["--batch-sizes", "1,4"], "profile batch size 1 only"),
        (["--target", "hf:/models/target"], "the target must be gguf:<folder>#<file.gguf> or builtin:<name>"),
    ],
)
def test_analyze_refuses_what_llama_cpp_cannot_measure_and_stores_no_run(cli_mix, args, message):
    result = _queue(cli_mix, "--engine", "llama.cpp", "--target", BUILTIN, *args)
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert json.loads(_cli(cli_mix, "runs", "list", "--json").stdout) == []


def test_analyze_refuses_an_unknown_engine_with_the_choices(cli_mix):
    result = _queue(cli_mix, "--engine", "vllm")
    assert result.exit_code == 1
    assert "unknown engine 'vllm'; use one of: auto, transformers, llama.cpp" in result.stderr


# ------------------------------------------------------------------------------ report and policies


def test_the_report_names_the_engine_in_json_text_and_html(session, engine, db_url):
    with session.begin():
        run_id = make_done_run(session, {"code": 0.9, "qa": 0.1}, draft_spec="ngram", engine="llama.cpp").id
        report = build_report(session, run_id)
    assert report["engine"] == "llama.cpp" and report["params"]["engine"] == "llama.cpp"
    assert {b: p["engine"] for b, p in report["cost_profiles"].items()} == {"1": "llama.cpp"}
    assert "llama.cpp engine" in report_text(report).split("\n\n")[1].splitlines()[0]  # after the verdict
    app = create_app({"database_url": db_url, "ui_worker": False, "TESTING": True})
    try:
        page = app.test_client().get(f"/runs/{run_id}").get_data(as_text=True)
        export = app.test_client().get(f"/runs/{run_id}/report.html").get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    assert re.search(r'<h1>Analysis run #\d+ <span class="pill" id="run-engine"[^>]*>llama\.cpp</span>', page)
    assert (
        '<code id="engine">llama.cpp</code>' in page and 'id="run-engine" title="engine">llama.cpp<' in export
    )


@pytest.fixture
def llama_published(session):
    """An active policy set published from a llama.cpp run with prompt lookup (code speculates, qa
    does not) and a classifier telling the two apart."""
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1}, draft_spec="ngram", engine="llama.cpp")
        publish_policies(session, run.id, pools={"off": "llama-plain"})  # the publisher's pools
        texts = [f"def f{i}(x): return x + {i}  # fix this python function" for i in range(6)] + [
            f"What is the capital of country number {i}? Answer briefly." for i in range(6)
        ]
        train_classifier(
            session, make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"), cross_validate=False
        )
    return run


def test_a_llama_cpp_policy_set_is_served_with_its_engine_and_the_llama_cpp_pool(
    engine, db_url, llama_published
):
    app = create_app(
        {
            "database_url": db_url,
            "router_refresh_s": 0,
            "ui_worker": False,
            "TESTING": True,
            # this server's own naming: the active set published its pools, and those win (every replica
            # routes alike whatever its environment says)
            "router_pools": json.dumps({"off": "other-plain"}),
        }
    )
    client = app.test_client()
    try:
        _, validate = _validator(client)
        policies = client.get("/v1/policies").get_json()
        assert policies["active"]["pools"] == {"off": "llama-plain"} | {
            f"k{g}": f"spec-k{g}" for g in range(1, 9)
        }
        validate("Policies", policies)
        assert policies["active"]["engine"] == "llama.cpp"
        assert [v["engine"] for v in policies["versions"]] == ["llama.cpp"]
        code = client.post("/v1/route", json={"prompt": CODE, "max_new_tokens": 100}).get_json()
        qa = client.post(
            "/v1/route",
            json={
                "prompt": "What is the capital of country number 9? Answer briefly.",
                "max_new_tokens": 100,
            },
        ).get_json()
        validate("Decision", code), validate("Decision", qa)
    finally:
        app.extensions["specroute.close"]()
    assert code["task_type"] == "code" and code["speculate"] and code["gamma"] >= 1
    assert code["engine"]["llama.cpp"] == {
        "pool": f"spec-k{code['gamma']}",
        "speculative": {"draft": "prompt-lookup", "n_max": code["gamma"]},
    }
    assert code["engine"]["pool"] == f"spec-k{code['gamma']}" and code["engine"]["priced_by"] == "llama.cpp"
    assert qa["task_type"] == "qa" and not qa["speculate"]
    assert qa["engine"]["llama.cpp"] == {"pool": "llama-plain", "speculative": None}
    assert (
        qa["engine"]["transformers"] == {"assistant_model": False}
        and qa["engine"]["priced_by"] == "llama.cpp"
    )


def test_policies_list_names_the_engine(runner):
    assert _cli(runner, "db", "upgrade").exit_code == 0
    database = make_engine(load_settings().resolved_database_url())
    with make_session_factory(database)() as session, session.begin():
        run = make_done_run(session, {"code": 0.9}, engine="llama.cpp")
        publish_policies(session, run.id)
        run.priced_by = "transformers"  # the set copies the run's engines as they are when published
        publish_policies(session, run.id)
    database.dispose()
    listed = json.loads(_cli(runner, "policies", "list", "--json").stdout)
    assert [(s["version"], s["engine"]) for s in listed] == [(2, "transformers"), (1, "llama.cpp")]
    assert [(s["priced_by"], s["measured_by"]) for s in listed] == [
        ("transformers", "llama.cpp"),
        ("llama.cpp", "llama.cpp"),
    ]
    assert (
        "policy set v1 (inactive) from analysis 1, priced in llama.cpp"
        in _cli(runner, "policies", "list").stdout
    )


def test_a_model_draft_speculates_in_llama_cpp_with_a_model_and_without_a_policy_set_nothing_priced():
    policy = PolicySnapshot("*", True, 3, 0.8, 0.01, 10, 1.35, "RECOMMENDED", (1.1, 1.2, 1.35, 1.3))
    decision = Router(
        None,
        {"*": policy},
        policy_version=1,
        draft_kind="hf",
        contract=PolicyContract(priced_by="transformers"),
    ).route("x")
    assert decision.to_data()["engine"]["llama.cpp"] == {
        "pool": "spec-k3",
        "speculative": {"draft": "model", "n_max": 3},
    }
    assert decision.to_data()["engine"]["priced_by"] == "transformers"
    copied = decision.to_data()["engine"]
    copied["llama.cpp"]["speculative"]["n_max"] = 99  # the decision keeps its own settings
    assert decision.to_data()["engine"]["llama.cpp"]["speculative"]["n_max"] == 3
    nothing = Router(None, {}, policy_version=None).route("x").to_data()["engine"]
    assert nothing["llama.cpp"] == {"pool": "spec-off", "speculative": None} and nothing["priced_by"] is None


# ------------------------------------------------------------------------------ the web form


@pytest.fixture
def web_app(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": f"{BUILTIN},hf:/models/target,ngram",
            "TESTING": True,
        }
    )
    with app.extensions["specroute.sessions"]() as session, session.begin():
        import_prompt_file(session, "mix", PROMPTS, "mix.jsonl")
    yield app
    app.extensions["specroute.close"]()


def _form(client) -> dict:
    page = client.get("/runs/new").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    return {
        "csrf_token": token,
        "prompt_set": "mix",
        "target": BUILTIN,
        "draft": "ngram",
        "max_new_tokens": "8",
        "gamma_max": "4",
        "temperature": "0",
        "validate": "0",
        "device": "auto",
        "dtype": "auto",
    }


def test_the_web_form_offers_the_engines_and_queues_a_llama_cpp_run(web_app):
    client = web_app.test_client()
    page = client.get("/runs/new").get_data(as_text=True)
    select_html = re.search(r'<select name="engine">(.*?)</select>', page).group(1)
    assert select_html == (
        "<option selected>auto</option><option >transformers</option><option >llama.cpp</option>"
    )
    # the form says which engine the preselected run measures in, and why
    assert (
        '<strong id="engine-choice">llama.cpp: SPECROUTE_ENGINE is auto and llama.cpp can measure this run '
        "as asked</strong>" in page
    )
    form = _form(client)
    refused = client.post("/runs", data={**form, "engine": "llama.cpp", "target": "hf:/models/target"})
    assert refused.status_code == 400
    assert "the llama.cpp engine loads GGUF files only" in refused.get_data(as_text=True)
    unknown = client.post("/runs", data={**form, "engine": "vllm"})
    assert unknown.status_code == 400 and "unknown engine &#39;vllm&#39;" in unknown.get_data(as_text=True)
    started = client.post("/runs", data={**form, "engine": "llama.cpp"})
    assert started.status_code == 302
    # no engine field: the setting's, auto, which measures the builtin (GGUF) target in llama.cpp and
    # a Hugging Face model in transformers
    default = client.post("/runs", data=form)
    assert default.status_code == 302
    plain = client.post("/runs", data={**form, "target": "hf:/models/target"})
    assert plain.status_code == 302
    with web_app.extensions["specroute.sessions"]() as session:
        runs = session.scalars(select(AnalysisRun).order_by(AnalysisRun.id)).all()
        assert [(r.priced_by, r.params["engine"]) for r in runs] == [
            ("llama.cpp", "llama.cpp"),
            ("llama.cpp", "llama.cpp"),
            ("transformers", "transformers"),
        ]
    listing = client.get("/runs").get_data(as_text=True)
    assert re.search(r">1</a></td>\s*<td>llama\.cpp</td>", listing)
    assert client.get(f"/runs/{runs[0].id}/status.json").get_json()["engine"] == "llama.cpp"
    assert 'id="run-engine" title="engine">llama.cpp<' in client.get(f"/runs/{runs[0].id}").get_data(
        as_text=True
    )


def test_the_web_form_defaults_to_the_engine_setting(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": f"{BUILTIN},ngram",
            "engine": "llama.cpp",
            "TESTING": True,
        }
    )
    try:
        with app.extensions["specroute.sessions"]() as session, session.begin():
            import_prompt_file(session, "mix", PROMPTS, "mix.jsonl")
        page = app.test_client().get("/runs/new").get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    assert "<option >transformers</option><option selected>llama.cpp</option>" in page
    assert '<strong id="engine-choice">llama.cpp: SPECROUTE_ENGINE is llama.cpp</strong>' in page
