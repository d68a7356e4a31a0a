"""benchmarks/README.md, written whole from benchmarks/results/: one section per claim the product makes, each
table followed by the machine its run was measured on and the command that reproduces it, so that a figure in
the README is always the figure its run recorded.

    python -m benchmarks.readme_tables

Every benchmark script that writes one of these results calls :func:`write_readme` after writing it. The machine
and the command are read from the result where it records them (``machine``, ``cpu``, ``device``, ``threads``;
``command``, or the script's ``args``); where it does not, the machine is "not recorded in the result" and the
command is the script's own documented invocation for that file."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from analyzer.run_params import clipped

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
NOT_RECORDED = "not recorded in the result"

# argparse options that locate a run's files rather than shape its figures (--out is always the result's own path)
LOCATION_ARGS = {"out", "from_json", "cache_dir", "database", "run", "checkout"}

# the scripts' documented commands for results that record neither a command nor their arguments
DOCUMENTED = {
    "router.json": "python benchmarks/bench_router.py --out benchmarks/results/router.json",
    "router_http.json": "python benchmarks/bench_router.py --skip-in-process --database both "
    "--endpoints route,feedback --out benchmarks/results/router_http.json",
    "router_tfidf.json": "OMP_NUM_THREADS=1 python benchmarks/bench_router.py --features tfidf --workers 1 "
    "--runs 3 --out benchmarks/results/router_tfidf.json",
    "router_minilm.json": "OMP_NUM_THREADS=1 python benchmarks/bench_router.py --features tfidf+minilm "
    "--workers 1 --runs 3 --out benchmarks/results/router_minilm.json",
    "transformers_transfer_mixed.json": "python benchmarks/transformers_transfer.py --workload mixed --per-task 2",
    "llama_server_predict_sample_pair.json": "python benchmarks/real_pair.py && "
    "python benchmarks/llama_server_predict.py --pair --per-task 2 --max-chars 1200",
    "transformers_defaults.json": "python benchmarks/transformers_defaults.py --database URL --run N "
    "--per-task 2 --repeats 3 --out benchmarks/results/transformers_defaults.json "
    "(N: a finished transformers run with a draft model)",
    "llama_server_analyze_sample.txt": "specroute llama-server analyze --per-task 3 "
    "> benchmarks/results/llama_server_analyze_sample.txt",
}


# --- numbers ------------------------------------------------------------------------------------------------


def num(value: float | int | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits with thousands separators (integers whole), "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    return f"{value:,.{decimals}f}"


def ratio(value: float | None) -> str:
    """A speedup or a ratio of times, to three decimals."""
    return "-" if value is None else f"{value:.3f}"


def pct(fraction: float | None) -> str:
    """A fraction (0.012) as a percentage to one decimal (1.2%)."""
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def share(fraction: float | None) -> str:
    """A share (0.97) as a whole percentage (97%)."""
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def duration(seconds: float) -> str:
    """Seconds as minutes and seconds: 424 -> "7 min 4 s"."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


# --- Markdown and provenance --------------------------------------------------------------------------------


def table(header: str | Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; ``header`` is its column names, or one string of them separated by " | "."""
    header = header.split(" | ") if isinstance(header, str) else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def load(results: Path, name: str) -> dict:
    """The result ``name`` in the folder ``results``."""
    return json.loads((results / name).read_text(encoding="utf-8"))


def recorded_machine(data: dict, device: str | None = None) -> str:
    """The machine a result records: its ``machine``, ``cpu`` or the ``device`` given, with its ``threads``;
    else "not recorded in the result" (with the threads, where those are recorded)."""
    machine = data.get("machine") or data.get("cpu") or device
    threads = data.get("threads")
    if machine:
        return f"{machine}, {threads} threads" if threads and "thread" not in machine else machine
    return NOT_RECORDED + (f" ({threads} threads)" if threads else "")


def command_from_args(script: str, args: dict, name: str) -> str:
    """The command line a script's recorded ``args`` (argparse's, as strings or values) give, writing ``name``
    in benchmarks/results/; options that only locate files are left out."""
    parts = ["python", f"benchmarks/{script}"]
    for key, value in args.items():
        if key in LOCATION_ARGS or value in (None, "None", False, "False"):
            continue
        flag = "--" + key.replace("_", "-")
        parts.append(flag if value in (True, "True") else f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts + [f"--out benchmarks/results/{name}"])


def recorded_command(data: dict, script: str, name: str, documented: str | None = None) -> str:
    """The command a result records (``command``, or its script's ``args``), else the documented one."""
    if data.get("command"):
        return data["command"]
    if isinstance(data.get("args"), dict):
        return command_from_args(script, data["args"], name)
    return documented or DOCUMENTED.get(name) or f"python benchmarks/{script}"


def provenance(entries: Sequence[tuple[str, str, str | Sequence[str]]]) -> str:
    """One line per result file: ``(file name, machine, command or commands)``."""
    lines = []
    for name, machine, command in entries:
        commands = [command] if isinstance(command, str) else command
        lines.append(
            f"- `results/{name}`. Machine: {machine}. Command: " + "; ".join(f"`{c}`" for c in commands)
        )
    return "\n".join(lines)


def block(text: str, header: str | Sequence[str], rows: Sequence[Sequence[str]], entries) -> str:
    """A paragraph, its table and the provenance of every result the table reads."""
    return f"{text}\n\n{table(header, rows)}\n\n{provenance(entries)}"


# --- 1. advice accuracy -------------------------------------------------------------------------------------


def _llama_server_transfer(results: Path) -> str:
    rows, notes, entries = [], [], []
    for workload in ("unseen", "long"):
        name = f"cost_transfer_{workload}.json"
        data = load(results, name)
        cost_model = {s["setting"]: s for s in data["after"]["settings"]}
        for s in data["advice"]["settings"]:
            served = cost_model.get(s["setting"], {})
            rows.append(
                [
                    workload,
                    s["setting"],
                    num(s["prompts"]),
                    f"{ratio(s['aggregate_predicted'])} / {ratio(s['aggregate_measured'])}",
                    pct(s["aggregate_error"]),
                    pct(s["mare"]),
                    share(s["within_noise"]),
                    pct(served.get("aggregate_error")),
                    pct(served.get("mare")),
                ]
            )
        tokens, noise = data["prompt_tokens"], data["noise"] or {}
        whole = next((r for r in data["routing"] if r["group"] == "all"), None)
        priced = (
            f"; priced over every prompt, the best static setting {ratio(whole['static'])} "
            f"({whole['static_option'] or 'off'}), routing by task {ratio(whole['by_task'])}, the per-prompt "
            f"oracle {ratio(whole['oracle'])}"
            if whole
            else ""
        )
        notes.append(
            f"{workload}: {data['prompts']} prompts of {num(min(tokens))}-{num(max(tokens))} tokens, the machine's "
            f"noise floor {pct(noise.get('floor'))} ({noise.get('verdict', 'not measured')}){priced}"
        )
        command = recorded_command(
            data, "cost_transfer.py", name, f"python benchmarks/cost_transfer.py --workload {workload}"
        )
        entries.append((name, recorded_machine(data), command))
    text = (
        "### llama-server\n\nAn analysis in llama-server of the embedded SmolLM2-135M-Instruct Q4_1 with five n-gram "
        "settings, validated through the servers. Workloads: `unseen`, prompts of `../shared/data/prompts/"
        "dev-extra.jsonl` and prompts written for the benchmark (`benchmarks/data/written_prompts.jsonl`); `long`, "
        "long documents with a question. Judged on the validated prompts no cost fit calibrated "
        "on: the advice (predicted from plain greedy output before any server ran) against the measured speedup, "
        "time-weighted (aggregate) and per prompt; within noise is the share of prompts whose error is under the "
        "machine's noise floor plus 3 points; the cost model's errors price the work each server did.\n\n"
        + "\n".join(f"- {note}" for note in notes)
    )
    header = (
        "workload | setting | prompts | advice: predicted / measured | aggregate error | "
        "per-prompt error | within noise | cost model: aggregate error | per-prompt error"
    )
    return block(text, header, rows, entries)


def _transformers_transfer(results: Path) -> str:
    rows, entries, validated = [], [], {}
    for workload in ("unseen", "long", "mixed"):
        name = f"transformers_transfer_{workload}.json"
        data = load(results, name)
        figures = data["after"]
        groups = [(str(gamma), s) for gamma, s in figures["gammas"].items()] + [("all", figures["all"])]
        validated.update(dict.fromkeys(figures["gammas"]))
        for gamma, s in groups:
            rows.append(
                [
                    workload,
                    gamma,
                    num(s["timed"]),
                    f"{ratio(s['aggregate_predicted'])} / {ratio(s['aggregate_measured'])}",
                    pct(s["aggregate_error_pct"] / 100),
                    pct(s["speedup_error_pct"] / 100),
                    share(s["within_noise"]),
                    num(s.get("correlation_drafting", s.get("correlation"))),
                    pct(s["noise_floor_pct"] / 100),
                ]
            )
        command = recorded_command(
            data,
            "transformers_transfer.py",
            name,
            DOCUMENTED.get(name) or f"python benchmarks/transformers_transfer.py --workload {workload}",
        )
        entries.append((name, recorded_machine(data), command))
    gammas = ", ".join(validated)
    text = (
        "### transformers\n\n`specroute analyze`'s own pipeline (the embedded SmolLM2-135M-Instruct with prompt "
        "lookup, float32) on the same workloads (`mixed`: the unseen prompts and every other long one in one "
        f"workload), every prompt then validated at gamma {gammas} by plain greedy against assisted generation, "
        "two runs each; each prompt priced at its own context."
    )
    header = (
        "workload | gamma | prompts | predicted / measured | aggregate error | "
        "per-prompt error | within noise | correlation | noise floor"
    )
    return block(text, header, rows, entries)


def _server_validation(results: Path) -> str:
    predicted = {p.name: load(results, p.name) for p in sorted(results.glob("llama_server_predict_*.json"))}
    # a result has either "mare_all" (the error over every run beside "mare", over the runs whose output equals
    # plain greedy) or "advice_mare" (the advice's error beside "mare", the error of the work each server served)
    over_all = all("mare_all" in f for data in predicted.values() for f in data["validation"])
    second = "mare_all" if over_all else "advice_mare"
    rows, routed, entries = [], [], []
    for name, data in predicted.items():
        workload = _predict_workload(name)
        for f in data["validation"]:
            rows.append(
                [
                    workload,
                    f["setting"],
                    num(f["runs"]),
                    share(f["output_equal"]),
                    share(f["counts_equal"]),
                    pct(f["mare"]),
                    pct(f.get(second)),
                ]
            )
        routed.append((workload, data["routed_vs_static_ms"]))
        entries.append((name, recorded_machine(data), _predict_command(data, name)))
    name = "llama_server_routed.json"
    data = load(results, name)
    routed.append((f"{data['held_out']} held-out prompts, routed through specroute", data["totals_s"]))
    command = recorded_command(
        data,
        "llama_server_routed.py",
        name,
        f"python benchmarks/llama_server_routed.py --n-predict {data['n_predict']} --threads {data['threads']}",
    )
    routing_rows = []
    for workload, totals in routed:
        static = {k: v for k, v in totals.items() if k not in ("off", "routed")}
        best = min(static, key=static.__getitem__)
        routing_rows.append(
            [
                workload,
                ratio(totals["off"] / totals["routed"]),
                f"{best}: {ratio(totals['off'] / static[best])}",
            ]
        )
    errors = (
        (
            "error (output = plain)",
            "error (all runs)",
            "over the runs whose output equals plain greedy, and over all",
        )
        if over_all
        else (
            "error (work served)",
            "error (the advice)",
            "priced from the work each server served, and the advice's",
        )
    )
    text = (
        "#### llama-server, validated through its servers\n\nWorkloads: `mixed`, prompts of each task of "
        "`../shared/data/prompts/dev.jsonl` and a code_edit group; `sample, Qwen pair`, the bundled sample with "
        "Qwen2.5-Coder 0.5B drafting for 1.5B. Per setting: the validated runs, the share whose output equals "
        "plain greedy, the share whose draft counts equal the replay's, and the per-prompt error of the predicted "
        f"speedup ({errors[2]})."
    )
    header = ["workload", "setting", "runs", "output = plain", "counts = replay", errors[0], errors[1]]
    routing = (
        "Routed (each task on its chosen setting, off where none pays) and the best static setting: measured "
        "speedup over off on the same prompts (`llama_server_routed`: held-out prompts of `../shared/data/prompts/` "
        f"sent to specroute's own front door, which classified {data['classified_right']} of {data['held_out']} in "
        "their labelled task and forwarded each to its pool):\n\n"
        + table(["workload", "routed", "best static setting"], routing_rows)
    )
    routed_from = provenance([(name, recorded_machine(data), command)])
    return f"{block(text, header, rows, entries)}\n\n{routing}\n\n{routed_from}"


def _routing(results: Path) -> str:
    rows, entries = [], []
    for name in ("routing.json", "routing_pair.json", "routing_llamacpp.json"):
        data = load(results, name)
        overall = data["table"]["overall"]
        gamma = data.get("always_gamma", data.get("workload_gamma"))
        for mode, speed in overall["tokens_per_s"].items():
            label = re.sub(r"^[a-d]: ", "", mode).replace("workload gamma", f"workload gamma {gamma}")
            label = f"{label} (gamma {gamma})" if label == "always-on" else label
            rows.append(
                [
                    name.removesuffix(".json"),
                    data.get("engine", "transformers"),
                    num(overall["n"]),
                    label,
                    num(speed),
                    pct(overall["regret"][mode]),
                ]
            )
        entries.append((name, recorded_machine(data), recorded_command(data, "bench_routing.py", name)))
    text = (
        "#### Routed against always-on and off, end to end\n\nHeld-out prompts of the bundled corpus (neither in "
        "the analysed sample nor in the classifier's training data), each generated greedily in every mode in a "
        "rotating order; `routing_pair` drafts with Qwen2.5-Coder 0.5B for 1.5B, `routing_llamacpp` serves "
        "llama.cpp pools. Tokens per second over the workload, and the regret against the per-prompt oracle."
    )
    header = ["result", "engine", "prompts", "mode", "tokens/s", "regret"]
    return block(text, header, rows, entries)


def _engines(results: Path) -> str:
    rows, entries = [], []
    for name in ("engines_smollm2.json", "engines_pair.json"):
        data = load(results, name)
        for r in data["rows"]:
            rows.append(
                [
                    name.removesuffix(".json"),
                    r["engine"],
                    r["dtype"],
                    f"{r['identical']}/{r['validated']}",
                    f"{ratio(r['predicted'])} / {ratio(r['measured'])}",
                    pct(r["mare_pct"] / 100),
                    f"{r['workload']['best_gamma']}, {'speculate' if r['workload']['speculate'] else 'off'}",
                ]
            )
        devices = "; ".join(dict.fromkeys(r["device"] for r in data["rows"]))
        entries.append(
            (name, recorded_machine(data, devices), recorded_command(data, "bench_engines.py", name))
        )
    text = (
        "#### Both engines on the bundled sample prompts\n\nThe same prompts analysed by each engine and validated "
        "with its own speculative decoding (`engines_smollm2`: SmolLM2-135M-Instruct with n-gram drafting; "
        "`engines_pair`: the Qwen2.5-Coder pair; llama.cpp runs the GGUF quantized, transformers dequantized)."
    )
    header = (
        "result | engine | weights | identical / validated | predicted / measured | "
        "per-prompt error | best gamma, advice"
    )
    return block(text, header, rows, entries)


def _transformers_defaults(results: Path) -> str:
    name = "transformers_defaults.json"
    data = load(results, name)
    rows = [
        [
            task,
            num(t["prompts"]),
            f"{t['rounds_equal']}/{t['prompts']}",
            f"{ratio(t['defaults_predicted'])} / {ratio(t['defaults_measured'])}",
            ", ".join(map(str, t["fixed_gamma"])),
            f"{ratio(t['fixed_predicted'])} / {ratio(t['fixed_measured'])}",
        ]
        for task, t in data["tasks"].items()
    ]
    text = (
        "#### transformers' own assisted-generation defaults, replayed and priced\n\nOn a finished transformers "
        "run with the Qwen2.5-Coder pair (bundled sample prompts): the defaults' replayed rounds against real "
        f"assisted generation, and the predicted against the measured speedup (median of {data['repeats']}) of the "
        "defaults and of the fixed gamma the report chose."
    )
    header = (
        "task | prompts | rounds replayed = real | defaults: predicted / measured | "
        "fixed gamma | fixed gamma: predicted / measured"
    )
    return block(
        text,
        header,
        rows,
        [(name, recorded_machine(data), recorded_command(data, "transformers_defaults.py", name))],
    )


def advice_section(results: Path = RESULTS) -> str:
    """Predicted against measured speedup per engine, on workloads outside the analysis' bundled sample, then
    on the project's own prompts."""
    return "\n\n".join(
        [
            "The speedup the analysis predicts against the one measured by running the same prompts plainly and "
            "speculatively. None of the `unseen` and `long` prompts is in the bundled sample the analysis ships.",
            _llama_server_transfer(results),
            _transformers_transfer(results),
            "### llama.cpp\n\nNo llama.cpp result on these workloads; its figures on the project's own prompts are "
            "below.\n\n### On the project's own prompts",
            _server_validation(results),
            _routing(results),
            _engines(results),
            _transformers_defaults(results),
        ]
    )


# --- 2. the analysis' cost ----------------------------------------------------------------------------------


def analysis_cost_section(results: Path = RESULTS) -> str:
    """The analysis' wall time against one plain generation of the same prompts, per engine."""
    rows, entries = [], []
    for name in sorted(p.name for p in results.glob("analyzer_*.json")):
        data = load(results, name)
        for result in data["results"]:
            r = result["rows"]
            ours, plain, naive = (sum(row[k] for row in r) for k in ("ours_s", "plain_s", "naive_s"))
            per_prompt = sorted(row["ours_s"] / row["plain_s"] for row in r)
            median = (per_prompt[(len(r) - 1) // 2] + per_prompt[len(r) // 2]) / 2
            rows.append(
                [
                    "transformers",
                    result["drafter"],
                    num(len(r)),
                    num(ours),
                    num(plain),
                    ratio(ours / plain),
                    ratio(median),
                    f"{naive / ours:.1f}x",
                ]
            )
        devices = "; ".join(dict.fromkeys(res["cost_profile"]["device"] for res in data["results"]))
        entries.append(
            (name, recorded_machine(data, devices), recorded_command(data, "bench_analyzer.py", name))
        )
    for name in sorted(p.name for p in results.glob("llama_server_predict_*.json")):
        data = load(results, name)
        workload = _predict_workload(name)
        analysis, plain = data["analysis_s"], data["plain_generation_s"]
        rows.append(
            [
                "llama-server",
                workload,
                num(data["prompts"]),
                num(analysis),
                num(plain),
                ratio(analysis / plain),
                "-",
                "-",
            ]
        )
        entries.append((name, recorded_machine(data), _predict_command(data, name)))
    name = "llama_server_analyze_sample.txt"
    printed = (results / name).read_text(encoding="utf-8")
    took = re.search(r"took (\d+) s \(([\d.]+)x plain generation", printed)
    head = re.search(
        r": (\d+) prompts, \d+ new tokens, (\d+ threads, llama-server [^,]+(?:, [^,/]+\))?)", printed
    )
    if not took or not head:
        raise ValueError(f"{name}: no 'N prompts ... threads, llama-server ...' or 'took N s (Rx plain' line")
    rows.append(
        [
            "llama-server",
            "sample (`specroute llama-server analyze`)",
            head.group(1),
            took.group(1),
            "-",
            took.group(2),
            "-",
            "-",
        ]
    )
    entries.append((name, f"{NOT_RECORDED} ({head.group(2)})", DOCUMENTED[name]))
    text = (
        "The analysis measures every gamma from one plain generation per prompt: its wall time (generation, "
        "replay or teacher-forced draft pass, profiling of the step costs) against plain generation of the same "
        "prompts, in all and as the median per prompt, and for transformers the naive sweep (one real assisted "
        "generation per gamma) against the analysis."
    )
    header = (
        "engine | drafter / workload | prompts | analysis s | plain s | analysis / plain | "
        "median per prompt | naive sweep / analysis"
    )
    extra = [
        part
        for part in (_analysis_vs_sweep(results), _parallel_slots(results), _demo_repeat(results))
        if part
    ]
    return "\n\n".join([block(text, header, rows, entries), *extra])


def _demo_repeat(results: Path) -> str:
    """The demo run again and again in fresh data folders (benchmarks/demo_repeat.py): per run its time, the
    machine's noise by its own verdict, whether the advice was withheld, and whether every task's decision
    agrees with the first run's."""
    name = "demo_repeat.json"
    if not (results / name).exists():
        return ""
    data = load(results, name)
    first = data["runs"][0]["decisions"]
    rows = []
    for number, run in enumerate(data["runs"], 1):
        noise = run["noise"] or {}
        floor = noise.get("floor")
        same = sum(run["decisions"].get(task) == decision for task, decision in first.items())
        rows.append(
            [
                num(number),
                num(run["seconds"]),
                f"{noise.get('verdict', '-')} ({pct(floor)})"
                if floor is not None
                else noise.get("verdict", "-"),
                "no" if run["advice_withheld"] is None else f"yes: {clipped(run['advice_withheld'], 90)}",
                f"{same} of {len(first)}",
                _nearest_the_rule(run["margins"]),
            ]
        )
    agreed = data["agreement"]
    decided = ", ".join(f"{task} {decision}" for task, decision in sorted(first.items()))
    text = (
        "The first README command's analysis, said again: `specroute demo --no-serve` in a fresh data folder, run "
        "after run, each with its own calibration and validation. "
        + (
            "Every run withheld nothing and gave every task the same decision"
            if agreed["agree"]
            else f"{agreed['withheld']} of {len(data['runs'])} runs withheld the advice and "
            f"{len(agreed['differing'])} of {agreed['tasks']} tasks got different decisions"
        )
        + f"; the first run's: {decided}."
    )
    quiet = [run for run in data["runs"] if (run["noise"] or {}).get("verdict") == "quiet"]
    text += (
        f" Of the {len(quiet)} runs the product judged quiet, "
        f"{sum(run['advice_withheld'] is not None for run in quiet)} withheld the advice."
    )
    header = (
        "run | seconds | noise (its own verdict, floor) | advice withheld | decisions as the first run's "
        "| nearest the rule (task: best setting's speedup, interval's lower end, the fit's standard error)"
    )
    return block(text, header, rows, [(name, recorded_machine(data), data["command"])])


def _nearest_the_rule(margins: dict) -> str:
    """The task whose best setting clears 1 + margin with the interval's lower end nearest 1.0: the decision
    another calibration could most easily move."""
    near = [(task, m) for task, m in margins.items() if m.get("low") is not None and m["speedup"] > 1.05]
    if not near:
        return "no task clears 1.05x"
    task, m = min(near, key=lambda item: abs(item[1]["low"] - 1.0))
    error = f", fit ±{m['fit_error']:.3f}" if m.get("fit_error") is not None else ""
    return f"{task}: {m['best']} {m['speedup']:.2f}x, low {m['low']:.2f}{error}"


def _parallel_slots(results: Path) -> str:
    """The plain generation in one llama-server slot against several given as many requests at once
    (benchmarks/parallel_slots.py): its wall time and the outputs that differ."""
    name = "parallel_slots.json"
    if not (results / name).exists():
        return ""
    data = load(results, name)
    one, many = data["medians"]["1 slot"], data["medians"][f"{data['slots']} slots"]
    rows = [
        [
            num(data["prompts"]),
            num(data["slots"]),
            num(one),
            num(many),
            ratio(one / many),
            ", ".join(f"{d} of {data['prompts']}" for d in data["differing_outputs"]),
        ]
    ]
    text = (
        "Parallel slots for the generation the analysis replays: one plain llama-server with one slot against one "
        "with several slots given as many requests at once, medians of interleaved repetitions, and per repetition "
        "the prompts whose greedy output differs from the one-slot server's. The analysis generates with one slot: "
        "a differing output would be replayed and priced as if one slot had served it."
    )
    header = "prompts | slots | 1 slot s | slots s | speedup | outputs that differ"
    return block(text, header, rows, [(name, recorded_machine(data), data["command"])])


def _analysis_vs_sweep(results: Path) -> str:
    """The analysis in llama-server with its defaults beside a sweep of its settings and one plain generation,
    side by side in one run (benchmarks/analysis_vs_sweep.py); with each analysis' advice accuracy."""
    rows, entries = [], []
    names = [p.name for p in results.glob("analysis_vs_sweep_*.json")]
    for name in sorted(names, key=lambda n: int(n.removeprefix("analysis_vs_sweep_").removesuffix(".json"))):
        data = load(results, name)
        medians = data["medians"]
        for arm in [a for a in ("analysis", "reused") if a in medians]:
            rows.append(_analysis_row(data, arm))
        entries.append((name, recorded_machine(data), data["command"]))
    if not rows:
        return ""
    text = (
        "The analysis in llama-server with its defaults (the five n-gram settings, calibration until its fit holds, "
        "at most 8 prompts, validation until every setting's interval reaches ±5% or its budget is spent, one "
        "pass), fitting its own costs or reusing the fit of the analysis before it, against a sweep of the same "
        "settings (a plain server and each setting's server over every prompt) and one plain generation, each from "
        "starting its servers to stopping them, interleaved in one run, medians of the repetitions; the prompts "
        "each calibrated and validated, the advice's largest aggregate error per setting on the prompts each "
        "analysis validated, and the median noise half-width beside it; the sweep's runs where fewer than the "
        "others'. The last column is what the generation pass's plain runs would give calibration: their plain "
        "step time over the same prompts' interleaved plain runs (median over the calibration prompts)."
    )
    header = (
        "prompts | fit | plain s | sweep s | analysis s | analysis / plain | analysis / sweep | calibrated | "
        "validated | advice error, largest | noise half-width | advice withheld | generation / interleaved plain"
    )
    return block(text, header, rows, entries)


def _analysis_row(data: dict, arm: str) -> list[str]:
    """One arm's row of :func:`_analysis_vs_sweep`: "analysis" fits its own costs, "reused" an earlier fit."""
    medians = data["medians"]
    analyses = [a for a in data["analyses"] if a.get("arm", "analysis") == arm]
    settings = [s for a in analyses for s in a["settings"].values()]
    errors = [abs(s["advice_error"]) for s in settings if s["advice_error"] is not None]
    halves = [s["noise_half_width"] for s in settings if s["noise_half_width"] is not None]
    validated = [a["validation_plan"]["validated"] for a in analyses if a["validation_plan"]]
    held_out = [a["validation_plan"]["held_out"] for a in analyses if a["validation_plan"]]
    calibrated = [a["calibration_prompts"] for a in analyses if "calibration_prompts" in a]
    return [
        num(data["prompts"]),
        "its own"
        if arm == "analysis"
        else f"reused ({sum(a['reused_fit'] for a in analyses)} of {len(analyses)})",
        num(medians["plain"]),
        num(medians["sweep"]) + _fewer_runs(data, "sweep"),
        num(medians[arm]),
        ratio(medians[arm] / medians["plain"]),
        ratio(medians[arm] / medians["sweep"]),
        f"{min(calibrated)}-{max(calibrated)}" if calibrated else "8",
        f"{min(validated)}-{max(validated)} of {max(held_out)}" if validated else "-",
        pct(max(errors)) if errors else "-",
        pct(float(np.median(halves))) if halves else "-",
        num(sum(1 for a in analyses if a["withheld"])) + f" of {len(analyses)}",
        _generation_ratio(analyses),
    ]


def _fewer_runs(data: dict, arm: str) -> str:
    """ " (1 run)" where ``arm`` ran fewer times than the repetitions, else nothing."""
    runs = data.get("runs", {}).get(arm, data["repeats"])
    return f" ({runs} run{'s' if runs != 1 else ''})" if runs < data["repeats"] else ""


def _generation_ratio(analyses: list[dict]) -> str:
    """The median over ``analyses`` of the generation runs' plain step time over the interleaved plain runs',
    with its range; "-" where no analysis recorded it."""
    found = [a["generation_vs_interleaved"] for a in analyses if a.get("generation_vs_interleaved")]
    if not found:
        return "-"
    medians = [f["median_ratio"] for f in found]
    low, high = min(f["p10"] for f in found), max(f["p90"] for f in found)
    return f"{ratio(float(np.median(medians)))} ({ratio(low)}-{ratio(high)})"


def _predict_workload(name: str) -> str:
    """The workload a llama_server_predict result is named after: "mixed", "sample, Qwen pair"."""
    return name.removeprefix("llama_server_predict_").removesuffix(".json").replace("_pair", ", Qwen pair")


def _predict_command(data: dict, name: str) -> str:
    stem = name.removeprefix("llama_server_predict_").removesuffix(".json")
    documented = DOCUMENTED.get(name) or (
        f"python benchmarks/llama_server_predict.py --workload {stem} --n-predict {data['n_predict']} "
        f"--threads {data['threads']}"
    )
    return recorded_command(data, "llama_server_predict.py", name, documented)


# --- 3. the router ------------------------------------------------------------------------------------------

PATHS = {
    "fast alone": "as served",
    "first sight": "first pass of a fresh router",
    "fast": "as served, interleaved with the baseline",
    "pipeline": "baseline: scikit-learn's predict_proba, interleaved",
}


def _http_rows(http: dict) -> list[dict]:
    """The HTTP rows of a bench_router result, with database, server and endpoint (named in the server's
    label where the result has no columns for them)."""
    if "rows" in http:
        return list(http["rows"].values())
    rows = []
    for label, row in http.items():
        if not isinstance(row, dict):
            continue
        server, _, rest = label.partition(" /v1/")
        endpoint, _, processes = rest.partition(", ")
        rows.append(
            row
            | {
                "database": "-",
                "server": f"{server}, {processes}" if rest else label,
                "endpoint": f"/v1/{endpoint}" if rest else "-",
            }
        )
    return rows


def router_section(results: Path = RESULTS) -> str:
    """Decision latency in process, throughput over HTTP, and mixed load for a minute."""
    names = ("router_tfidf.json", "router_minilm.json", "router.json", "router_http.json")
    local, http, local_entries, http_entries = [], [], [], []
    for name in names:
        data = load(results, name)
        for path, label in PATHS.items():
            if "in_process" not in data:
                break
            r = data["in_process"][path]
            local.append(
                [
                    name.removesuffix(".json"),
                    label,
                    num(r["p50_ms"]),
                    num(r["p99_ms"]),
                    num(r["p99_ms_1500_2000_chars"]),
                    num(r["calls"]),
                ]
            )
        for r in _http_rows(data.get("http", {})):
            http.append(
                [
                    name.removesuffix(".json"),
                    r["database"],
                    r["server"],
                    r["endpoint"],
                    num(round(r["requests_per_s"])),
                    num(r["p50_ms"]),
                    num(r["p99_ms"]),
                    num(r["errors"]),
                ]
            )
        entry = (name, recorded_machine(data), recorded_command(data, "bench_router.py", name))
        local_entries += [entry] if "in_process" in data else []
        http_entries += [entry] if "http" in data else []
    load_rows, growth, load_entries = [], [], []
    for name in ("load.json", "load_workers2.json"):
        data = load(results, name)
        databases = data.get("databases") or {"-": data}
        for database, measured in databases.items():
            for kind, r in measured["rows"].items():
                load_rows.append(
                    [
                        name.removesuffix(".json"),
                        database,
                        num(data["workers"]),
                        kind,
                        num(r["requests"]),
                        num(r["per_s"]),
                        num(r["p50_ms"]),
                        num(r["p99_ms"]),
                        num(r["errors"]),
                    ]
                )
            where = name.removesuffix(".json") + ("" if database == "-" else f" {database}")
            growth.append(f"{where} {measured['rss_growth']:+.2%}")
        command = (
            f"python benchmarks/bench_load.py --workers {data['workers']} --threads {data['threads']} "
            f"--concurrency {data['concurrency']} --seconds {data['seconds']:g}"
            + (" --database both" if len(databases) > 1 else "")
            + f" --out benchmarks/results/{name}"
        )
        machine = recorded_machine({k: v for k, v in data.items() if k != "threads"})  # threads: the server's
        load_entries.append((name, machine, recorded_command(data, "bench_load.py", name, command)))
    classifier_note = (
        "In process: `Router.route` on one thread, the classifier (`router_tfidf`: TF-IDF; `router_minilm`: "
        "TF-IDF and the MiniLM sentence encoder) trained on two thirds of the bundled corpus and timed on the "
        "other third, cut to 2,000 characters; p50 and p99 of a decision, and p99 for prompts of 1,500-2,000 "
        "characters."
    )
    http_note = (
        "Over HTTP: `specroute serve` (waitress for one process, gunicorn above) under an asyncio load generator "
        "in another process, keep-alive connections, the median of its runs; the bare WSGI app on the same server "
        "settings is the server's own ceiling."
    )
    load_note = (
        "Mixed load: `POST /v1/route`, `POST /v1/route/batch` and `POST /v1/feedback` from keep-alive connections "
        "(their number and the seconds in each command). Server memory growth between the first and the last 10 s: "
        + "; ".join(growth)
        + "."
    )
    header_local = ["result", "decision path", "p50 ms", "p99 ms", "p99 ms, 1,500-2,000 chars", "calls"]
    header_http = ["result", "database", "server", "endpoint", "req/s", "p50 ms", "p99 ms", "errors"]
    header_load = "result | database | processes | kind | requests | per s | p50 ms | p99 ms | errors"
    profile = _router_profile(results)
    side_by_side = _router_side_by_side(results)
    return "\n\n".join(
        [
            block(classifier_note, header_local, local, local_entries),
            block(http_note, header_http, http, http_entries),
            *([side_by_side] if side_by_side else []),
            block(load_note, header_load, load_rows, load_entries),
            *([profile] if profile else []),
        ]
    )


def _router_side_by_side(results: Path) -> str:
    """Today's router beside an older tree's under the same load generator, every server up at once and the
    runs interleaved (bench_router.py ``--against``): per database, processes and endpoint each tree's
    requests per second, p50 and p99, its share of the bare app's requests per second in the same run, and
    today's over the other's."""
    rows, entries = [], []
    for name in sorted(p.name for p in results.glob("router_vs_*.json")):
        data = load(results, name)["http"]
        (today, _), (before, _) = list(data["trees"].items())
        bare = data["rows"]["- | - | bare WSGI app | -"]["requests_per_s"]
        for key, now in data["rows"].items():
            if not key.startswith(f"{today} | ") or now["database"] == "-":
                continue
            then = data["rows"][key.replace(f"{today} | ", f"{before} | ", 1)]
            rows.append(
                [
                    f"{today} / {before}",
                    now["database"],
                    now["server"],
                    now["endpoint"],
                    f"{num(round(now['requests_per_s']))} / {num(round(then['requests_per_s']))}",
                    f"{num(now['p50_ms'])} / {num(then['p50_ms'])}",
                    f"{num(now['p99_ms'])} / {num(then['p99_ms'])}",
                    f"{pct(now['requests_per_s'] / bare)} / {pct(then['requests_per_s'] / bare)}",
                    ratio(now["requests_per_s"] / then["requests_per_s"]),
                    ratio(now["p99_ms"] / then["p99_ms"]),
                    f"{num(now['errors'])} / {num(then['errors'])}",
                ]
            )
        kinds = sorted({r["database"] for r in data["rows"].values() if r["database"] != "-"})
        command = (
            f"python benchmarks/bench_router.py --skip-in-process --database {kinds[0] if len(kinds) == 1 else 'both'} "
            f"--endpoints {','.join(data['endpoints'])} --workers {','.join(map(str, data['workers']))} "
            f"--threads {data['threads']} --concurrency {data['concurrency']} --runs {data['runs']} "
            f"--against <worktree of {before}> "
            f"--against-label {before} --out benchmarks/results/{name}"
        )
        entries.append((name, data["machine"], command))
    if not rows:
        return ""
    text = (
        "The router today beside an older tree under the same load generator: `specroute serve` of each tree (its "
        "database prepared by its own command line), the bare WSGI app, every server up at once and their runs "
        "interleaved, medians of the runs; share of the bare app's requests per second in the same run."
    )
    header = (
        "trees | database | server | endpoint | req/s | p50 ms | p99 ms | share of the bare app | req/s ratio | "
        "p99 ratio | errors"
    )
    return block(text, header, rows, entries)


def _router_profile(results: Path) -> str:
    """Where a routed request's time goes under load (benchmarks/profile_router.py): each category's share of
    the sampling profiler's samples, today's and, beside it, each other checkout's profiled (``--label``)."""
    name = "router_profile.json"
    if not (results / name).exists():
        return ""
    names = [name] + sorted(p.name for p in results.glob("router_profile_*.json"))
    profiles = [load(results, n) for n in names]
    data = profiles[0]
    rows = [
        [category] + [pct(p["shares"].get(category, 0.0)) for p in profiles] for category in data["shares"]
    ]
    rows.append(["no thread held the GIL (share of instants)"] + [pct(p["gil_free"]) for p in profiles])
    rows.append(["requests/s while sampled"] + [num(p["load"]["requests_per_s"]) for p in profiles])
    rows.append(["p99 ms while sampled"] + [num(p["load"]["p99_ms"]) for p in profiles])
    text = (
        f"Where a routed request's time goes: one `specroute serve` process ({data['threads']} threads, SQLite) "
        f"under {data['concurrency']} connections posting corpus prompts to `/v1/route`, sampled by py-spy for "
        f"{num(data['seconds'])} s ({num(data['samples'])} samples today), each taken of the thread then holding "
        "the GIL: where the server's CPU time goes (its Python runs one thread at a time). Each sample is the first "
        "category any frame of its stack names, in the table's order; the instants at which no thread held the GIL "
        "are the server waiting on its sockets, its database or a CPU. The collapsed stacks are beside each result "
        "(`results/router_profile*.stacks.txt`, for a flame graph)."
    )
    header = "where | " + " | ".join(f"share of samples ({p.get('checkout', 'today')})" for p in profiles)
    entries = [(n, recorded_machine(p), p["command"]) for n, p in zip(names, profiles)]
    return block(text, header, rows, entries)


# --- 4. the task classifier ---------------------------------------------------------------------------------


def _option_label(option: str) -> str:
    """ "tfidf:1" -> "tfidf C=1"; the benchmark's "before: ..." option is the baseline it compares with."""
    label = re.sub(r"(\S+):(\d+(?:\.\d+)?)", r"\1 C=\2", option)
    return re.sub(r"^before: ", "baseline: ", label)


def classifier_section(results: Path = RESULTS) -> str:
    """Generalisation to unseen sources, calibration and the cost of a decision per option; adapting to
    unlabelled uploads; online gamma adaptation replayed."""
    name = "classifier.json"
    data = load(results, name)
    latency = data.get("latency", {})
    rows = []
    for option, r in data["results"].items():
        grouped, calibration, timed = r["grouped"], r["calibration"], latency.get(option, {})
        rows.append(
            [
                _option_label(option),
                num(r.get("folds")),
                num(r["macro_f1"]),
                num(r["accuracy"]),
                num(grouped["macro_f1"]),
                num(grouped["accuracy"]),
                num(calibration["ece_after"]),
                num(calibration["threshold"]),
                share(calibration["coverage"]),
                share(calibration["precision"]),
                num(timed.get("p50_ms")),
                num(timed.get("p99_ms")),
            ]
        )
    corpus = data["corpus"]
    text = (
        f"The bundled corpus: {num(corpus['prompts'])} prompts, {len(corpus['labels'])} task types, "
        f"{corpus['sources']} sources. Stratified k-fold CV (k in the table), and leave-one-source-out CV "
        "(unseen sources: each source predicted by a model trained on the others, scored on the tasks with more "
        "than one source); the "
        "calibrated expected calibration error, the routing threshold, the share of unseen-source prompts at or "
        "above it and the share of those right; one decision's latency in process."
    )
    header = (
        "option | k | stratified macro-F1 | accuracy | unseen sources macro-F1 | accuracy | ECE | "
        "threshold | above it | right above it | p50 ms | p99 ms"
    )
    entries = [(name, recorded_machine(corpus), recorded_command(data, "bench_classifier.py", name))]
    parts = [block(text, header, rows, entries)]

    name = "adapt.json"
    data = load(results, name)
    rows = []
    for protocol, p in data["protocols"].items():
        teacher = (
            "-" if protocol == "split" else num(p["teacher"]["macro_f1"])
        )  # split: the teacher saw the other half
        rows.append(
            [
                protocol,
                num(data["prompts"]),
                num(p["before"]["macro_f1"]),
                teacher,
                num(p["after"]["macro_f1"]),
            ]
        )
    for draw in data["mixed"]:
        sources = ", ".join(s.split("/")[-1] for s in draw["sources"])
        rows.append(
            [
                f"mixed: {sources}",
                num(draw["prompts"]),
                num(draw["before"]),
                num(draw["teacher"]),
                num(draw["after"]),
            ]
        )
    timed = data["latency"]
    text = (
        "Adapting to a user's unlabelled upload (`specroute train --adapt`): leave-one-source-out, each held-out "
        "source labelled by the teacher and learnt from its confident pseudo-labels; macro-F1 on its labels "
        "(transductive: adapted to and scored on the upload; split: adapted to one half, scored on the other; "
        "mixed: three sources pooled). One decision in process: p50 / p99 "
        f"{num(timed['before']['p50_ms'])} / {num(timed['before']['p99_ms'])} ms not adapted, "
        f"{num(timed['after']['p50_ms'])} / {num(timed['after']['p99_ms'])} ms adapted."
    )
    command = recorded_command(
        data,
        "bench_adapt.py",
        name,
        f"python benchmarks/bench_adapt.py --min-confidence {data['min_confidence']} --out benchmarks/results/{name}",
    )
    header = ["upload", "prompts", "not adapted", "teacher", "adapted"]
    parts.append(block(text, header, rows, [(name, recorded_machine(data), command)]))

    name = "adaptation.json"
    data = load(results, name)
    rows = [
        [
            policy,
            num(r["tokens_per_pass"]),
            ratio(r["speedup"]),
            f"{ratio(r['speedup_min'])}..{ratio(r['speedup_max'])}",
            num(r["acceptance"]),
        ]
        for policy, r in data["table"].items()
    ]
    text = (
        "Online gamma adaptation, replayed on the real match sequences of an analysis of the bundled sample (n-gram "
        "drafting): each policy's tokens per target pass, predicted speedup (median over seeds, with the range) and "
        "draft acceptance; `ours` routes through the product's Router and moves its estimate with each request's "
        "counts, as `/v1/feedback` does."
    )
    header = ["policy", "tokens per target pass", "predicted speedup", "over seeds", "acceptance"]
    parts.append(
        block(
            text,
            header,
            rows,
            [(name, recorded_machine(data), recorded_command(data, "bench_adaptation.py", name))],
        )
    )
    return "\n\n".join(parts)


# --- 5. the build and the tests -----------------------------------------------------------------------------


def suite_section(results: Path = RESULTS) -> str:
    """The llama.cpp build and the test command's times, as benchmarks/suite_times.py records them."""
    name = "suite.json"
    data = load(results, name)
    build, tests, quick = data["build"], data["tests"], data.get("quick_tier")
    rows = [
        [
            f"`{build['command']}`",
            "-",
            duration(build["seconds_min"])
            if build["seconds_min"] == build["seconds_max"]
            else f"{duration(build['seconds_min'])} to {duration(build['seconds_max'])}",
            "-",
        ]
    ]
    runs = tests["runs"]
    for number, run in enumerate(runs, 1):
        rows.append(
            [
                f"the test command, run {number} of {len(runs)}"
                + (" (the latest)" if number == len(runs) else ""),
                num(run["tests"]),
                duration(run["tests_s"]),
                duration(run["ci_s"]) if run.get("ci_s") is not None else "-",
            ]
        )
    if quick:
        rows.append(
            [
                f"quick tier, `{quick['command']}`",
                num(quick["tests"]),
                f"{duration(quick['seconds_min'])} to {duration(quick['seconds_max'])}",
                "-",
            ]
        )
    text = (
        f"Taken from {data['recorded']}. The build is {build['what']}; the tests are {tests['what']}, timed by "
        f"`{tests['ci_command']}` on a clean clone with the build cached (it runs the install, the test command, "
        "the docs build and the linters)"
        + ("; the quick tier is every test not marked slow." if quick else ".")
    )
    entries = [(name, recorded_machine(data), [build["command"], tests["command"], tests["ci_command"]])]
    suite = block(text, ["what", "tests", "time", "`.ci/run` in all"], rows, entries)
    first = _first_command(results)
    return "\n\n".join([suite, first]) if first else suite


def _first_command(results: Path) -> str:
    """The README's first command on a fresh clone and data folder (benchmarks/first_command.py): each step's
    time, the demo's phases, and the whole until the report is served."""
    name = "first_command.json"
    if not (results / name).exists():
        return ""
    data = load(results, name)
    rows = [[f"`{clipped(step['step'], 80)}`", duration(step["seconds"])] for step in data["steps"]]
    rows += [[f"demo: {clipped(phase['phase'], 80)}", duration(phase["seconds"])] for phase in data["demo"]]
    rows.append(["**until the demo serves its report**", f"**{duration(data['seconds'])}**"])
    text = (
        f"The README's first command as a new user runs it, on a fresh clone (of {data['commit']}) with a fresh data "
        f"folder, until the demo serves its report: {duration(data['seconds'])}. Warm, as on any machine that ran "
        f"it once: {data['warm']}. Each step of the command, then the demo's own phases (inside its step)."
    )
    return block(text, ["step", "time"], rows, [(name, recorded_machine(data), data["command"])])


# --- the README ---------------------------------------------------------------------------------------------

SECTIONS: tuple[tuple[str, Callable[[Path], str]], ...] = (
    ("Advice accuracy on prompts the project does not ship, per engine", advice_section),
    ("The analysis' cost against one plain generation", analysis_cost_section),
    ("Router latency and throughput", router_section),
    ("The task classifier", classifier_section),
    ("The build and the test suite", suite_section),
)

INTRO = (
    "# Benchmarks\n\nThis folder holds the benchmark scripts and the last result of each (`results/`). Every table "
    "below is written by `python -m benchmarks.readme_tables` from `results/*.json` (and one printed analysis, "
    "`results/llama_server_analyze_sample.txt`), and each script that writes "
    "a result rewrites this file after it, so a figure here is the one its run recorded. Each table names the "
    "result it reads, the machine it was measured on (as far as the result records it) and the command that "
    "reproduces it."
)


def render(results: Path = RESULTS) -> str:
    """The whole README from the results in ``results``."""
    sections = [f"## {title}\n\n{section(results)}" for title, section in SECTIONS]
    return "\n\n".join([INTRO, *sections]) + "\n"


def write_readme(results: Path = RESULTS, readme: Path = README) -> Path:
    """Write the README rendered from ``results`` to ``readme`` and return its path."""
    readme.write_text(render(results), encoding="utf-8")
    return readme


def main() -> None:
    print(f"wrote {write_readme()}")


if __name__ == "__main__":
    main()
