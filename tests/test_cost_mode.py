"""The cost mode: ``--cost-mode eager|cuda-graphs``, the SPECROUTE_COST_MODE setting
and the web form's select; cuda-graphs refused on a CPU with a clear error, before anything is stored;
the plumbing end to end on a CPU stand-in with the graph harness's steps run uncaptured: the profile stored and
reused in its own mode only, validation over the harness's loops, the mode shown in the report, its text and the
price comparison; and, on a CUDA GPU, the steps captured as CUDA graphs and replayed."""

from __future__ import annotations

import json
import re

import pytest
import torch
from sqlalchemy import select

from analyzer import run_params
from analyzer.analysis.run_records import RunParams
from analyzer.checks import CostModeError, check_cost_mode_device, check_cost_mode_name
from analyzer.engine import run_models
from analyzer.engine.engines import check_run
from analyzer.models import devices
from analyzer.orm import AnalysisRun
from analyzer.settings import SettingsError, load_settings
from tests.test_engines import _form, web_app  # noqa: F401 (fixtures)
from tests.test_runs import PROMPTS, _analyze, cli_db, model_folders  # noqa: F401 (fixtures)
from webui.cli import cli

GPU_ONLY = "cost mode cuda-graphs times CUDA graphs, which need a CUDA GPU; this run's device is cpu"


def test_cost_mode_names_and_devices_are_checked_with_the_choices_named():
    assert check_cost_mode_name("cuda-graphs") == "cuda-graphs"
    with pytest.raises(CostModeError, match=r"unknown cost mode 'graphs'; use one of: eager, cuda-graphs"):
        check_cost_mode_name("graphs")
    check_cost_mode_device("eager", "cpu")
    check_cost_mode_device("cuda-graphs", "cuda")
    with pytest.raises(CostModeError, match=GPU_ONLY):
        check_cost_mode_device("cuda-graphs", "cpu")
    with pytest.raises(run_params.RunError, match="is the transformers engine's; llama.cpp times its own"):
        check_run(RunParams(engine="llama.cpp", cost_mode="cuda-graphs"))
    with pytest.raises(run_params.RunError, match=GPU_ONLY):
        check_run(RunParams(device="cpu", cost_mode="cuda-graphs"))
    assert check_run(RunParams(device="auto", cost_mode="cuda-graphs")).cost_mode == "cuda-graphs"
    assert RunParams.from_json({"max_new_tokens": 8}).cost_mode == "eager"  # runs stored before the mode


def test_the_cost_mode_setting_is_checked_and_read_from_the_environment():
    assert load_settings(environ={}).cost_mode == "eager"
    assert load_settings(environ={"SPECROUTE_COST_MODE": "cuda-graphs"}).cost_mode == "cuda-graphs"
    with pytest.raises(SettingsError, match=r"SPECROUTE_COST_MODE: unknown cost mode 'fast'; use one of"):
        load_settings(environ={"SPECROUTE_COST_MODE": "fast"})


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_analyze_refuses_cuda_graphs_on_a_cpu_before_storing_anything(cli_db, model_folders, device):
    target = f"hf:{model_folders['target']}"
    result = _analyze(
        cli_db, "--target", target, "--draft", "ngram", "--cost-mode", "cuda-graphs", "--device", device
    )
    assert result.exit_code != 0
    assert GPU_ONLY in result.stderr and "Use --cost-mode eager here" in result.stderr
    assert json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout) == []


def test_a_worker_on_a_cpu_fails_a_queued_cuda_graphs_run_with_the_reason(cli_db, model_folders, monkeypatch):
    monkeypatch.setenv("SPECROUTE_COST_MODE", "cuda-graphs")  # the setting is the default
    target = f"hf:{model_folders['target']}"
    queued = _analyze(cli_db, "--target", target, "--draft", "ngram", "--queue")
    assert queued.exit_code == 0, queued.stderr
    run_id = json.loads(queued.stdout)["run_id"]
    resumed = _analyze(cli_db, "--resume", str(run_id))
    assert resumed.exit_code != 0 and GPU_ONLY in resumed.stderr
    [run] = json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert run["status"] == "failed"


def test_the_cost_mode_setting_does_not_stop_a_llama_cpp_run_but_the_option_does(cli_db, monkeypatch):
    monkeypatch.setenv("SPECROUTE_COST_MODE", "cuda-graphs")
    args = [
        "--target",
        "builtin:smollm2-135m-instruct",
        "--draft",
        "ngram",
        "--engine",
        "llama.cpp",
        "--queue",
    ]
    queued = _analyze(cli_db, *args)
    assert queued.exit_code == 0, queued.stderr
    [run] = json.loads(cli_db.invoke(cli, ["runs", "list", "--json"]).stdout)
    assert run["engine"] == "llama.cpp" and run["status"] == "queued"
    refused = _analyze(cli_db, *args, "--cost-mode", "cuda-graphs")
    assert (
        refused.exit_code != 0
        and "is the transformers engine's; llama.cpp times its own steps" in refused.stderr
    )


@pytest.fixture
def uncaptured_graphs(monkeypatch):
    """The cuda-graphs mode on the CPU: the device check let through, the steps run uncaptured."""
    monkeypatch.setattr(devices, "check_cost_mode_device", lambda mode, device: None)
    monkeypatch.setattr(run_models, "CAPTURE_GRAPHS", False)


@pytest.mark.slow
def test_the_cuda_graphs_mode_on_a_cpu_stand_in_prices_validates_words_the_mode_and_reuses_only_its_own(
    cli_db, model_folders, uncaptured_graphs
):
    """The cuda-graphs mode's plumbing on a CPU stand-in, its graph harness's static-cache steps run uncaptured:
    the run prices and validates over the harness's loops, the progress line, report, page and policy set use
    the mode's wording (what a GPU makes true: the GPU test below captures for real), and its profile prices
    only runs of its own mode."""
    pair = ["--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"]
    graphs = _analyze(cli_db, *pair, "--cost-mode", "cuda-graphs", "--validate", "2")
    assert graphs.exit_code == 0, graphs.stderr
    assert "(steps timed as replayed CUDA graphs)" in graphs.stderr  # the mode's wording, uncaptured here
    report = json.loads(graphs.stdout)
    assert report["cost_mode"] == "cuda-graphs" and report["params"]["cost_mode"] == "cuda-graphs"
    profile = report["cost_profile"]
    # k <= 21: a draft-model run in transformers also prices its assisted generation's defaults (20 drafts)
    assert (
        profile["cost_mode"] == "cuda-graphs" and len(profile["target_k_s"]) == 21 and profile["draft_s"] > 0
    )
    assert profile["round_overhead_s"] is not None and profile["decode_overhead_s"] is not None
    assert len(report["validation"]) == 2
    for validation in report["validation"]:  # the harness's own loops: exact, in the walked rounds
        assert validation["outputs_identical"] is True
        prompt = next(p for p in report["prompts"] if p["prompt_id"] == validation["prompt_id"])
        assert validation["target_forward_passes"] == prompt["per_gamma"][str(validation["gamma"])]["rounds"]

    eager = json.loads(_analyze(cli_db, *pair, "--limit", "2").stdout)
    assert eager["cost_mode"] == "eager" and eager["cost_profile"]["cost_mode"] == "eager"
    assert eager["cost_profile"]["id"] != profile["id"]  # a cuda-graphs profile never prices an eager run
    again = json.loads(_analyze(cli_db, *pair, "--limit", "2", "--cost-mode", "cuda-graphs").stdout)
    assert again["cost_profile"]["id"] == profile["id"]  # ... and is reused by its own mode

    text = cli_db.invoke(cli, ["report", str(report["run_id"])]).stdout
    assert "transformers engine (cuda-graphs cost mode)" in text
    listed = cli_db.invoke(cli, ["costs", "list"]).stdout
    assert f"profile {profile['id']} (measured): transformers (cuda-graphs) on cpu" in listed

    from webui.app import create_app

    app = create_app(
        {"database_url": load_settings().resolved_database_url(), "ui_worker": False, "TESTING": True}
    )
    try:
        page = app.test_client().get(f"/runs/{report['run_id']}").get_data(as_text=True)
        assert re.search(
            r'cost mode <code id="cost-mode">cuda-graphs</code>\s*\(steps replayed from captured CUDA', page
        )
        table = page.split('id="comparison-table"')[1].split("</table>")[0]
        assert "measured, cuda-graphs" in table and "measured, eager" in table  # both modes, side by side
        published = cli_db.invoke(cli, ["policies", "publish", "--run", str(report["run_id"])])
        assert published.exit_code == 0, published.stderr
        policies = app.test_client().get("/policies").get_data(as_text=True)
        assert "engine, <code>cuda-graphs</code> cost mode)" in policies
    finally:
        app.extensions["specroute.close"]()


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs: needs a CUDA GPU")
def test_a_cuda_graphs_run_on_a_gpu_captures_its_steps_and_replays_them(cli_db, model_folders, monkeypatch):
    """On a CUDA GPU the cuda-graphs mode captures a graph per verify step and replays it: the profile is timed
    from replayed graphs (captures and replays counted), stored in its mode, and validation over the
    harness's loops reproduces the walked rounds exactly (float32)."""
    from analyzer.engine import graph_cost

    captured, replayed = [], []
    capture = graph_cost.StaticModel._captured

    def counted_capture(self, input_ids):
        graph, logits = capture(self, input_ids)
        captured.append(int(input_ids.shape[-1]))
        replay = graph.replay

        def counted_replay():
            replayed.append(1)
            return replay()

        graph.replay = counted_replay
        return graph, logits

    monkeypatch.setattr(graph_cost.StaticModel, "_captured", counted_capture)
    pair = ["--target", f"hf:{model_folders['target']}", "--draft", f"hf:{model_folders['draft']}"]
    args = ["--cost-mode", "cuda-graphs", "--device", "cuda", "--dtype", "float32", "--validate", "2"]
    graphs = _analyze(cli_db, *pair, *args)
    assert graphs.exit_code == 0, graphs.stderr
    assert "(steps timed as replayed CUDA graphs)" in graphs.stderr
    assert captured and len(replayed) > len(captured)  # graphs captured once per shape, then replayed
    report = json.loads(graphs.stdout)
    assert report["cost_mode"] == "cuda-graphs" and report["device"].startswith("cuda")
    profile = report["cost_profile"]
    assert profile["cost_mode"] == "cuda-graphs" and len(profile["target_k_s"]) == 21
    assert all(t > 0 for t in profile["target_k_s"]) and profile["draft_s"] > 0
    assert len(report["validation"]) == 2
    for validation in report["validation"]:
        assert validation["outputs_identical"] is True
        prompt = next(p for p in report["prompts"] if p["prompt_id"] == validation["prompt_id"])
        assert validation["target_forward_passes"] == prompt["per_gamma"][str(validation["gamma"])]["rounds"]


def test_the_web_form_offers_the_cost_modes_and_refuses_cuda_graphs_on_a_cpu(web_app):
    client = web_app.test_client()
    page = client.get("/runs/new").get_data(as_text=True)
    select_html = re.search(r'<select name="cost_mode">(.*?)</select>', page).group(1)
    assert select_html == (  # blank: the engine's own default (SPECROUTE_COST_MODE in transformers)
        '<option value="" selected>default (eager in transformers)</option>'
        "<option >eager</option><option >cuda-graphs</option>"
    )
    form = {**_form(client), "target": "hf:/models/target"}
    refused = client.post("/runs", data={**form, "cost_mode": "cuda-graphs", "device": "cpu"})
    assert refused.status_code == 400 and "which need a CUDA GPU" in refused.get_data(as_text=True)
    unknown = client.post("/runs", data={**form, "cost_mode": "graphs"})
    assert unknown.status_code == 400 and "unknown cost mode &#39;graphs&#39;" in unknown.get_data(
        as_text=True
    )
    queued = client.post("/runs", data={**form, "cost_mode": "cuda-graphs"})  # device auto: a GPU worker's
    assert queued.status_code == 302
    with web_app.extensions["specroute.sessions"]() as session:
        [run] = session.scalars(select(AnalysisRun)).all()
        assert run.run_params.cost_mode == "cuda-graphs"
