"""Devices and precision on the CPU (CI has no GPU): resolution of device and dtype names, every
refusal (absent GPU, a GPU index beyond the count, bf16 on a GPU without it, a dtype the device fails
to run, a model that does not fit), nothing stored when the CLI or the web form refuses, bfloat16
analyses of tiny real models end to end with their fidelity fields, profiles per batch size, and the
machinery overhead measured against a fake clock."""

from __future__ import annotations

import json

import pytest
import torch
from sqlalchemy import func, select

from analyzer.checks import DeviceError, check_dtype_name
from analyzer.db import make_engine, make_session_factory
from analyzer.engine import overhead as overhead_module
from analyzer.engine.engines import measuring_engine
from analyzer.engine.overhead import measure_machinery_overhead
from analyzer.measuring import interference
from analyzer.models import devices
from analyzer.models.devices import ModelTooLarge, Placement, parse_batch_sizes, resolve
from analyzer.models.loading import load_model
from analyzer.models.specs import parse_spec
from analyzer.orm import AnalysisRun, CostProfile, PromptResult, RunCostProfile
from analyzer.settings import SettingsError, load_settings
from tests.test_runs import PROMPTS, _analyze, cli_db, model_folders  # noqa: F401 (fixtures)
from tests.tiny_models import make_noisy_copy, make_tiny_model
from webui.cli import cli

CONTEXT = [33, 78, 72, 19, 50, 80, 63, 83, 77, 11, 80, 4, 45, 48, 17, 95, 19, 50]


# ------------------------------------------------------------------------------ resolution


def test_auto_on_a_machine_without_a_gpu_is_the_cpu_in_float32():
    placement = resolve("auto", "auto")
    assert (placement.device, placement.dtype) == ("cpu", "float32")
    assert placement.name == devices.cpu_model_name() and not placement.is_cuda
    assert resolve("CPU", "bf16") == Placement("cpu", "bfloat16", placement.name)
    assert resolve("cpu", "fp16").torch_dtype == torch.float16


@pytest.mark.parametrize(
    "device, dtype, fragment",
    [
        ("gpu", "auto", "unknown device 'gpu'; use one of: auto, cpu, cuda, cuda:N"),
        ("cuda:x", "auto", "unknown device"),
        ("cpu", "fp8", "unknown dtype 'fp8'; use one of: auto, float32, bfloat16, float16"),
        ("cpu", "int8", "unknown dtype"),
    ],
)
def test_unknown_names_are_refused_with_the_choices(device, dtype, fragment):
    with pytest.raises(DeviceError, match=fragment.replace("(", r"\(")):
        resolve(device, dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_a_gpu_that_is_absent_is_a_clear_error(device):
    with pytest.raises(
        DeviceError,
        match=rf"device '{device}' asked for, but torch .* sees no CUDA GPU on this "
        r"machine; use --device cpu",
    ):
        resolve(device, "auto")


def _fake_gpus(monkeypatch, count: int, bf16: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_a_gpu_index_beyond_the_count_names_the_gpus_there_are(monkeypatch):
    _fake_gpus(monkeypatch, count=2, bf16=True)
    with pytest.raises(
        DeviceError, match=r"device cuda:3 asked for, but this machine has 2 CUDA GPUs \(cuda:0..cuda:1\)"
    ):
        resolve("cuda:3", "auto")


def test_bfloat16_on_a_gpu_without_it_is_refused_and_auto_takes_float16(monkeypatch):
    _fake_gpus(monkeypatch, count=1, bf16=False)
    with pytest.raises(
        DeviceError, match=r"Tesla T4 \(compute capability 7.5\) cannot run bfloat16; use --dtype float16"
    ):
        resolve("cuda", "bfloat16")
    probed = []
    monkeypatch.setattr(devices, "_probe", lambda device, dtype: probed.append((device, dtype)))
    assert resolve("cuda", "auto") == Placement("cuda:0", "float16", "Tesla T4")
    assert probed == [("cuda:0", "float16")]


def test_a_dtype_the_device_fails_to_run_is_refused_with_torchs_reason(monkeypatch):
    def probe(device, dtype):
        raise RuntimeError(f"\"addmm_impl_cpu_\" not implemented for '{dtype}'")

    monkeypatch.setattr(devices, "_probe", probe)
    with pytest.raises(
        DeviceError, match=r"cpu \(.*\) cannot run float16: \"addmm_impl_cpu_\" not implemented"
    ):
        resolve("cpu", "float16")


def test_batch_sizes_parse_sorted_and_unique_and_bad_ones_are_refused():
    assert parse_batch_sizes("16, 1,4,4") == (1, 4, 16)
    assert parse_batch_sizes("") is None and parse_batch_sizes(None) is None
    for bad in ("0", "1,x", "1,,4", "-4", "1000"):
        with pytest.raises(DeviceError, match="batch sizes must be integers from 1 to 256"):
            parse_batch_sizes(bad)
    assert devices.default_batch_sizes(Placement("cuda:0", "bfloat16", "H100")) == (1, 4, 16)
    assert devices.default_batch_sizes(resolve("cpu", "auto")) == (1,)


def test_settings_refuse_unknown_devices_and_dtypes():
    assert load_settings({"device": "cuda:1", "dtype": "bf16"}).dtype == "bf16"
    assert check_dtype_name(load_settings({"dtype": "bf16"}).dtype) == "bfloat16"
    with pytest.raises(SettingsError, match="SPECROUTE_DTYPE: unknown dtype 'fp8'"):
        load_settings({"dtype": "fp8"})
    with pytest.raises(SettingsError, match="SPECROUTE_DEVICE: unknown device 'tpu'"):
        load_settings(environ={"SPECROUTE_DEVICE": "tpu"})


# ------------------------------------------------------------------------------ loading


def test_models_load_once_on_the_placement_in_its_dtype(model_folders, tmp_path):
    placement = resolve("cpu", "bfloat16")
    loaded = load_model(parse_spec(f"hf:{model_folders['target']}"), cache_dir=tmp_path, placement=placement)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.model.device.type == "cpu" and loaded.placement == placement
    parameters = sum(p.numel() for p in loaded.model.parameters())
    assert loaded.weight_bytes == 2 * parameters


def test_a_model_larger_than_the_free_gpu_memory_is_refused_before_moving(
    model_folders, tmp_path, monkeypatch
):
    import analyzer.models.loading as loading

    monkeypatch.setattr(loading, "available_memory_bytes", lambda device: 1000)
    moved = []
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: moved.append(k) or self)
    gpu = Placement("cuda:0", "bfloat16", "NVIDIA H100 80GB HBM3")
    spec = f"hf:{model_folders['target']}"
    with pytest.raises(ModelTooLarge) as error:
        load_model(parse_spec(spec), cache_dir=tmp_path, placement=gpu)
    message = str(error.value)
    assert (
        f"model {model_folders['target']}" in message
        and "does not fit on cuda:0 (NVIDIA H100 80GB HBM3) in bfloat16" in message
    )
    assert "the device had 0.00 GiB free" in message and "its weights need 0.00 GiB" in message
    assert not moved  # refused before any weight was moved


def test_out_of_memory_while_moving_names_the_model_and_the_memory(model_folders, tmp_path, monkeypatch):
    def out_of_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    import analyzer.models.loading as loading

    monkeypatch.setattr(loading, "available_memory_bytes", lambda device: 3 * 2**30)
    monkeypatch.setattr(torch.nn.Module, "to", out_of_memory)
    with pytest.raises(
        ModelTooLarge,
        match=r"does not fit on cpu .* in float32: its weights need .* GiB, the device "
        r"had 3.00 GiB free",
    ):
        load_model(
            parse_spec(f"hf:{model_folders['target']}"),
            cache_dir=tmp_path,
            placement=resolve("cpu", "float32"),
        )


# ------------------------------------------------------------------------------ runs


def _count(model) -> int:
    engine = make_engine(load_settings().resolved_database_url())
    try:
        with make_session_factory(engine)() as session:
            return session.scalar(select(func.count()).select_from(model))
    finally:
        engine.dispose()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "cuda"], "sees no CUDA GPU on this machine"),
        (["--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--batch-sizes", "1,0"], "batch sizes must be integers from 1 to 256"),
    ],
)
def test_the_cli_refuses_what_this_machine_cannot_run_and_stores_no_run(cli_db, model_folders, args, message):
    result = _analyze(cli_db, "--target", f"hf:{model_folders['target']}", *args)
    assert result.exit_code == 1 and message in result.stderr
    assert _count(AnalysisRun) == 0


def test_a_model_that_does_not_fit_fails_the_run_with_nothing_measured(cli_db, model_folders, monkeypatch):
    def out_of_memory(self, *args, **kwargs):
        raise RuntimeError(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes"
        )

    monkeypatch.setattr(torch.nn.Module, "to", out_of_memory)
    result = _analyze(cli_db, "--target", f"hf:{model_folders['target']}")
    assert result.exit_code == 1 and f"model {model_folders['target']}" in result.stderr
    assert "does not fit on cpu" in result.stderr
    engine = make_engine(load_settings().resolved_database_url())
    with make_session_factory(engine)() as session:
        run = session.scalar(select(AnalysisRun))
        assert run.status == "failed" and "ModelTooLarge" in run.error and "does not fit on cpu" in run.error
        assert session.scalar(select(func.count()).select_from(PromptResult)) == 0
        assert session.scalar(select(func.count()).select_from(CostProfile)) == 0
    engine.dispose()


def test_bfloat16_analysis_end_to_end_reports_fidelity_and_honest_guarantees(cli_db, model_folders):
    result = _analyze(
        cli_db,
        "--target",
        f"hf:{model_folders['target']}",
        "--draft",
        f"hf:{model_folders['draft']}",
        "--device",
        "cpu",
        "--dtype",
        "bfloat16",
        "--validate",
        "3",
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dtype"] == "bfloat16" and report["params"]["dtype"] == "bfloat16"
    assert report["device"].startswith("cpu: ")
    assert report["guarantee"].startswith("bfloat16: the replay is an estimate, not exact")
    assert report["mode"] == "greedy (replay estimate in bfloat16)"
    assert "validated outputs matched plain greedy" in report["guarantee"]
    profile = report["cost_profiles"]["1"]
    assert (
        set(report["cost_profiles"]) == {"1"}
        and profile["dtype"] == "bfloat16"
        and profile["batch_size"] == 1
    )
    # generate() spends time outside the forwards on every step (its Python loop, logits processing, stopping
    # criteria): the machinery overhead the profile keeps is that time, above 0 (one that lost it clamps at 0)
    assert profile["round_overhead_s"] > 0 and profile["decode_overhead_s"] > 0
    fidelity = report["workload"]["fidelity"]
    assert fidelity["prompts"] == 4 and fidelity["positions"] == sum(
        p["output_tokens"] for p in report["prompts"]
    )
    assert 0 <= fidelity["mismatches"] <= fidelity["positions"]
    assert 0.0 <= fidelity["mismatch_share"] <= fidelity["worst_prompt_share"] <= 1.0
    assert all(0.0 <= p["replay_mismatch_share"] <= 1.0 for p in report["prompts"])
    assert sum(t["fidelity"]["prompts"] for t in report["tasks"].values()) == 4
    rows = report["validation"]
    assert len(rows) == 3
    for row in rows:
        assert (
            row["replayed_rounds"]
            == report["prompts"][[p["prompt_id"] for p in report["prompts"]].index(row["prompt_id"])][
                "per_gamma"
            ][str(row["gamma"])]["rounds"]
        )
        assert row["passes_error_pct"] == pytest.approx(
            100 * (row["target_forward_passes"] - row["replayed_rounds"]) / row["replayed_rounds"]
        )
        assert isinstance(row["replay_identical"], bool) and row["task"] in report["tasks"]
    summary = report["validation_summary"]["run"]
    assert summary["validated"] == 3 and summary["identical"] == sum(r["outputs_identical"] for r in rows)
    assert summary["passes_error_pct"] == pytest.approx(sum(abs(r["passes_error_pct"]) for r in rows) / 3)
    assert sum(t["validated"] for t in report["validation_summary"]["tasks"].values()) == 3
    assert summary["speedup_error_pct"] == pytest.approx(
        100
        * sum(abs(r["predicted_speedup"] - r["measured_speedup"]) / r["measured_speedup"] for r in rows)
        / 3
    )


def test_float32_runs_claim_exactness_and_measure_no_fidelity(cli_db, model_folders):
    result = _analyze(
        cli_db,
        "--target",
        f"hf:{model_folders['target']}",
        "--draft",
        f"hf:{model_folders['draft']}",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--validate",
        "2",
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dtype"] == "float32" and report["guarantee"].startswith("float32: the replay is exact")
    assert report["mode"] == "greedy (exact replay)"
    assert report["workload"]["fidelity"] is None and all(
        p["replay_mismatch_share"] is None for p in report["prompts"]
    )
    for row in report["validation"]:  # exact: real assisted generation takes the replayed rounds, same output
        assert row["target_forward_passes"] == row["replayed_rounds"] and row["passes_error_pct"] == 0.0
        assert row["outputs_identical"] and row["replay_identical"]


@pytest.mark.slow
def test_profiles_per_batch_size_are_stored_reused_and_reported(cli_db, model_folders):
    args = ("--target", f"hf:{model_folders['target']}", "--draft", "ngram", "--batch-sizes", "2,1")
    first = json.loads(_analyze(cli_db, *args).stdout)
    assert set(first["cost_profiles"]) == {"1", "2"} and first["params"]["profile_batch_sizes"] == [1, 2]
    assert first["cost_profiles"]["2"]["batch_size"] == 2
    for summary in list(first["tasks"].values()) + [first["workload"]]:
        assert set(summary["by_batch"]) == {"1", "2"}
        assert summary["by_batch"]["1"]["speedup_curve"] == summary["speedup_curve"]
        assert len(summary["by_batch"]["2"]["speedup_curve"]) == 4
    assert _count(CostProfile) == 2 and _count(RunCostProfile) == 2
    second = json.loads(_analyze(cli_db, *args).stdout)  # same pair, device, dtype and sizes: reused
    assert second["cost_profiles"] == first["cost_profiles"] and _count(CostProfile) == 2
    third = json.loads(_analyze(cli_db, *args, "--reprofile").stdout)
    assert _count(CostProfile) == 4 and third["cost_profiles"]["2"] != first["cost_profiles"]["2"]
    json.loads(
        _analyze(
            cli_db, "--target", f"hf:{model_folders['target']}", "--draft", "ngram", "--dtype", "bfloat16"
        ).stdout
    )
    assert _count(CostProfile) == 5  # another dtype is another profile


def test_the_web_form_refuses_bad_devices_and_queues_good_ones(app, client):
    from analyzer.prompts.prompt_sets import import_prompt_file
    from webui.run_pages import model_choices

    with app.app_context():
        targets, drafts = model_choices()
    with app.extensions["specroute.sessions"]() as session, session.begin():
        import_prompt_file(
            session, "mix", "".join(json.dumps(p) + "\n" for p in PROMPTS).encode(), "mix.jsonl"
        )
    page = client.get("/runs/new")
    assert b'name="device" value="auto"' in page.data and b"<option selected>auto</option>" in page.data
    token = page.data.split(b'name="csrf_token" value="')[1].split(b'"')[0].decode()
    form = {
        "csrf_token": token,
        "prompt_set": "mix",
        "target": targets[0],
        "draft": drafts[-1],
        "max_new_tokens": "8",
        "gamma_max": "4",
        "temperature": "0",
        "validate": "0",
        "device": "tpu",
        "dtype": "bfloat16",
        "batch_sizes": "1,0",
    }
    refused = client.post("/runs", data=form)
    assert refused.status_code == 400
    assert b"unknown device &#39;tpu&#39;" in refused.data and b"batch sizes must be integers" in refused.data
    assert _count_runs(app) == 0
    assert targets[0] in drafts  # a model spec is offered as both; the pair of it with itself is refused
    itself = client.post(
        "/runs", data={**form, "device": "cuda:1", "batch_sizes": "16,1,4", "draft": targets[0]}
    )
    assert itself.status_code == 400 and b"choose a draft other than the target" in itself.data
    assert _count_runs(app) == 0
    accepted = client.post("/runs", data={**form, "device": "cuda:1", "batch_sizes": "16,1,4"})
    assert accepted.status_code == 302
    with app.extensions["specroute.sessions"]() as session:
        params = session.scalar(select(AnalysisRun)).params
    assert (params["device"], params["dtype"], params["profile_batch_sizes"]) == (
        "cuda:1",
        "bfloat16",
        [1, 4, 16],
    )


def _count_runs(app) -> int:
    with app.extensions["specroute.sessions"]() as session:
        return session.scalar(select(func.count()).select_from(AnalysisRun))


# ------------------------------------------------------------------------------ machinery overhead


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_machinery_overhead_is_the_time_outside_the_forwards_per_step(monkeypatch):
    from transformers.generation import candidate_generator, logits_process

    clock = FakeClock()
    monkeypatch.setattr(overhead_module, "perf_counter", clock)
    target = make_tiny_model(seed=0)
    draft = make_noisy_copy(target, noise_std=0.01, seed=1)
    target.register_forward_pre_hook(
        lambda module, args: setattr(clock, "now", clock.now + 1.0)
    )  # model time
    draft.register_forward_pre_hook(lambda module, args: setattr(clock, "now", clock.now + 0.125))
    calls = {"process": 0, "lookup": 0}
    process, lookup = (
        logits_process.LogitsProcessorList.__call__,
        candidate_generator.PromptLookupCandidateGenerator.get_candidates,
    )

    def slow_process(self, *args, **kwargs):  # machinery time: 0.25 s per logits processing
        calls["process"] += 1
        clock.now += 0.25
        return process(self, *args, **kwargs)

    def slow_lookup(self, *args, **kwargs):  # the draft step of prompt lookup: 0.5 s per lookup
        calls["lookup"] += 1
        clock.now += 0.5
        return lookup(self, *args, **kwargs)

    monkeypatch.setattr(logits_process.LogitsProcessorList, "__call__", slow_process)
    monkeypatch.setattr(candidate_generator.PromptLookupCandidateGenerator, "get_candidates", slow_lookup)
    from analyzer.measuring.validate import assisted_generate

    _, passes = assisted_generate(target, CONTEXT, 12, gamma=3, ngram_max=2, eos_token_id=[])
    per_round_calls = calls["process"] / passes
    lookups_per_round = calls["lookup"] / passes
    overhead = measure_machinery_overhead(
        target, CONTEXT, gamma=3, new_tokens=12, ngram_max=2, lookup_s=0.5, repeats=1
    )
    assert overhead.decode_s == pytest.approx(
        0.25
    )  # one logits processing per greedy step, forwards excluded
    assert overhead.round_s == pytest.approx(0.25 * per_round_calls + 0.5 * lookups_per_round - 0.5)
    # the target's own forwards in those generations, by tokens verified: every one took 1 s here; the
    # greedy call's 11 single-token steps are enough to keep k = 1 (the prompt's forward is left out)
    assert 1 in overhead.forward_s and set(overhead.forward_s) <= {1, 2, 3, 4}
    assert all(s == pytest.approx(1.0) for s in overhead.forward_s.values())
    calls["process"] = 0
    _, passes = assisted_generate(target, CONTEXT, 12, gamma=3, draft_model=draft, eos_token_id=[])
    expected = (
        0.25 * calls["process"] / passes
    )  # the draft's forwards (0.125 s each) are model time, not machinery
    with_draft = measure_machinery_overhead(
        target, CONTEXT, gamma=3, new_tokens=12, draft_model=draft, repeats=1
    )
    assert with_draft.decode_s == pytest.approx(0.25)
    assert with_draft.round_s == pytest.approx(expected)


def test_the_report_page_shows_device_dtype_guarantee_batches_fidelity_and_validation(cli_db, model_folders):
    from webui.app import create_app

    report = json.loads(
        _analyze(
            cli_db,
            "--target",
            f"hf:{model_folders['target']}",
            "--draft",
            "ngram",
            "--dtype",
            "bfloat16",
            "--batch-sizes",
            "1,2",
            "--validate",
            "2",
        ).stdout
    )
    app = create_app(
        {"database_url": load_settings().resolved_database_url(), "ui_worker": False, "TESTING": True}
    )
    try:
        page = app.test_client().get(f"/runs/{report['run_id']}").get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    assert "What this guarantees:</strong> bfloat16: the replay is an estimate, not exact" in page
    assert 'id="cost-table"' in page and page.count('<td class="num">2</td>') >= 1
    assert 'id="batch-table"' in page and "<th>batch 1</th><th>batch 2</th>" in page
    assert "Predicted speedup S(g) by task at batch size 2" in page and "S(g) by task at batch size 1" in page
    fidelity = report["workload"]["fidelity"]
    assert (
        f"disagreed with the generated token at\n    {fidelity['mismatches']} of {fidelity['positions']} positions"
        in page
    )
    assert (
        'id="validation-table"' in page
        and '<td>validated sample (2 tasks)</td><td class="num">2</td>' in page
    )


def test_the_guarantee_sentence_per_dtype_and_mode():
    from analyzer.models.devices import guarantee_sentence

    assert guarantee_sentence("float32").startswith("float32: the replay is exact")
    assert guarantee_sentence(None).startswith("float32: the replay is exact")  # runs from before dtypes
    assert guarantee_sentence("bfloat16", sampling=True).startswith(
        "Sampling mode: the speedups are expectations"
    )
    bare = guarantee_sentence("float16")
    assert (
        bare.startswith("float16: the replay is an estimate, not exact") and "run with --validate N" in bare
    )
    measured = guarantee_sentence(
        "bfloat16",
        fidelity={"mismatch_share": 0.0163, "validated": 8, "identical": 2, "passes_error_pct": 6.53},
    )
    assert "disagreed with the generated token at 1.63% of positions" in measured
    assert (
        "2 of 8 validated outputs matched plain greedy and target passes differed from the replayed rounds by 6.5%"
        in measured
    )
    no_rounds = guarantee_sentence(
        "bfloat16", fidelity={"validated": 1, "identical": 1, "passes_error_pct": None}
    )
    assert no_rounds.endswith("1 of 1 validated outputs matched plain greedy.")
    repriced = guarantee_sentence(
        "Q4_1",
        estimate_opening=measuring_engine("llama.cpp").estimate_opening("Q4_1"),
        fidelity={"mismatch_share": 0.01},
        repriced_from=2,
    )
    assert repriced.endswith(
        "; a re-priced run has no validations of its own: see run 2's, and validate the speedups in the "
        "engine that priced it."
    )
    assert "--validate" not in repriced


@pytest.mark.slow
def test_a_noisy_profile_is_flagged_in_the_report_and_never_reused_silently(
    cli_db, model_folders, monkeypatch
):
    import itertools

    from webui.app import create_app

    args = ("--target", f"hf:{model_folders['target']}", "--draft", "ngram")
    busy = itertools.count(0, 10**6)  # /proc/stat as on a machine whose other processes take every core
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))
    first = json.loads(_analyze(cli_db, *args).stdout)
    profile = first["cost_profiles"]["1"]
    assert profile["quality"] == "noisy"
    assert profile["quality_notes"][-1] == "other processes used 100% of the machine's CPU while profiling"
    assert profile["quality_notes"][0] == (  # a load that goes on: not measured again
        "machinery overhead: other processes used 100% of the machine's CPU in 1 attempt; still 100% right "
        "after, so not measured again"
    )
    assert first["advice_withheld"].startswith(
        "Advice withheld: measured on a busy machine (the cost profile at batch size 1 was judged noisy: "
        "machinery overhead: other processes used 100%"
    )
    text = cli_db.invoke(cli, ["report", str(first["run_id"])]).stdout
    verdict = text.split("\n\n")[0].splitlines()  # the verdict leads the report, and says it
    assert verdict[0].endswith("every task off: the advice is withheld") and len(verdict) <= 8
    assert any(line.startswith("Advice withheld: measured on a busy machine (") for line in verdict)
    assert "NOISY profile (" in text and "specroute analyze ... --reprofile" in text
    published = cli_db.invoke(cli, ["policies", "publish", "--run", str(first["run_id"])])
    assert published.exit_code == 0 and "policy set v1 NOT activated. Advice withheld" in published.stderr
    assert json.loads(cli_db.invoke(cli, ["policies", "list", "--json"]).stdout)[0]["active"] is False
    app = create_app(
        {"database_url": load_settings().resolved_database_url(), "ui_worker": False, "TESTING": True}
    )
    try:
        page = app.test_client().get(f"/runs/{first['run_id']}").get_data(as_text=True)
        policies_page = app.test_client().get("/policies").get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    assert 'id="noisy-profile-1"' in page and "<code>specroute analyze … --reprofile</code>" in page
    assert 'id="advice-withheld">Advice withheld: measured on a busy machine' in page  # the headline
    assert 'id="withheld-v1"><strong>Advice withheld: measured on a busy machine.</strong>' in policies_page
    assert "this set was not\n    activated when it was published" in policies_page
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: None)  # the machine is quiet again
    second = cli_db.invoke(
        cli, ["analyze", "--prompts", "mix", "--max-new-tokens", "12", "--gamma-max", "4", *args]
    )
    assert second.exit_code == 0, second.stderr
    assert (
        "stored cost profile 1 (batch 1) was judged noisy (" in second.stderr
        and "not reused" in second.stderr
    )
    assert (
        "profiling the cost of drafting and verifying at batch size 1" in second.stderr
    )  # so it measured anew
    assert _count(CostProfile) == 2  # measured anew rather than reusing the noisy one
    second_report = json.loads(
        cli_db.invoke(cli, ["report", str(first["run_id"] + 1), "--format", "json"]).stdout
    )
    quiet = second_report["cost_profiles"]["1"]
    # the new profile is not noisy (the run's validation may still judge this machine too noisy to time advice
    # on: a virtual machine's neighbours, which that check exists to catch, not the profile's quality)
    assert quiet["quality"] in ("clean", "remeasured") and "NOISY profile (" not in second.stdout
    third = json.loads(_analyze(cli_db, *args).stdout)
    assert (
        third["cost_profiles"]["1"] == quiet and _count(CostProfile) == 2
    )  # a judged-good profile is reused
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))  # busy again, and --reprofile
    assert (
        json.loads(_analyze(cli_db, *args, "--reprofile").stdout)["cost_profiles"]["1"]["quality"] == "noisy"
    )
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: None)
    fifth = cli_db.invoke(
        cli, ["analyze", "--prompts", "mix", "--max-new-tokens", "12", "--gamma-max", "4", *args]
    )
    assert (
        "stored cost profile 3 (batch 1) was judged noisy (" in fifth.stderr and "not reused" in fifth.stderr
    )
    assert (
        "profiling the cost" not in fifth.stderr and _count(CostProfile) == 3
    )  # the older clean one instead
    fifth_report = json.loads(
        cli_db.invoke(cli, ["report", str(first["run_id"] + 4), "--format", "json"]).stdout
    )
    assert fifth_report["cost_profiles"]["1"] == quiet


def test_the_worker_records_each_phase_on_the_run_and_profiling_reports_its_passes(
    cli_db, model_folders, monkeypatch
):
    from analyzer.analysis.run_records import RunParams, create_run
    from analyzer.analysis.runs import execute_run
    from analyzer.measuring import interference

    # the passes are counted here, not judged: a busy machine's jitter, or a repeat starved of CPU by the other
    # test worker or the hypervisor, would make profiling measure again
    monkeypatch.setattr(interference, "MIN_SPREAD_S", 10.0)
    monkeypatch.setattr(interference, "MIN_CPU_SHARE", 0.0)

    engine = make_engine(load_settings().resolved_database_url())
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run_id = create_run(
            session,
            "mix",
            f"hf:{model_folders['target']}",
            f"hf:{model_folders['draft']}",
            RunParams(max_new_tokens=8, gamma_max=3, device="cpu", dtype="float32"),
        ).id
    seen = []

    def progress(done, total, phase):
        with sessions() as session:
            stored = session.get(AnalysisRun, run_id).phase
        seen.append((done, total, phase, stored))

    execute_run(sessions, run_id, cache_dir=load_settings().resolved_data_dir() / "cache", progress=progress)
    phases = list(dict.fromkeys(phase for _, _, phase, _ in seen))
    assert phases[0].startswith(
        f"loading hf:{model_folders['target']} and hf:{model_folders['draft']} on cpu ("
    )
    assert phases[0].endswith(") in float32")
    assert phases[1] == "profiling the machinery overhead of generate() on cpu in float32"
    assert (
        phases[2] == "profiling the cost of drafting and verifying at batch size 1 (1 of 1) on cpu in float32"
    )
    assert phases[3] == "measuring"
    assert all(stored == phase[:300] for _, _, phase, stored in seen)  # the web UI sees what the CLI sees
    profiling = [(done, total) for done, total, phase, _ in seen if phase == phases[2]]
    assert profiling[0] == (0, 12) and profiling[-1] == (12, 12)  # 6 passes each for target and draft
    assert [done for done, _ in profiling] == list(range(13))
    with sessions() as session:
        assert (
            session.get(AnalysisRun, run_id).phase is None
            and session.get(AnalysisRun, run_id).status == "done"
        )
    engine.dispose()
