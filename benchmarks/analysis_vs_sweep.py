"""What an analysis in llama-server costs against what it replaces: a sweep of the same settings (each
setting's server over every prompt, and a plain one), and one plain generation of the same prompts, side by
side in one run, interleaved (the arms' order rotates each repetition), medians of ``--repeats``.

Arms, each from stopped servers to stopped servers (a server's start is part of what a user pays):

- ``plain``: one plain llama-server generating every prompt once (the generation the analysis cannot avoid);
- ``sweep``: the plain server and each setting's server in turn, each generating every prompt once (what
  llama.cpp's speed-bench client or a sweep over settings costs: one pass of the workload per setting);
- ``analysis``: ``analyze_in_llama_server`` with its defaults (generation, replay, calibration until its fit
  holds, validation until its target or budget, one pass as the demo makes);
- ``reused``: the same, given the fit the latest ``analysis`` arm made, as a second analysis on this machine,
  model, threads and build finds it (checked on two prompts, reused where it holds).

Beside the times, each analysis' advice accuracy on the prompts it validated: per setting the advice's
aggregate error (predicted from plain greedy output against the measured time-weighted speedup) and the noise
half-width, and the correlation of predicted and measured among prompts that draft; and what the generation
pass's plain runs would give calibration (``generation_vs_interleaved``): per calibration prompt the plain
step time its generation run took against its interleaved plain runs (median ratio and spread), and the noise
the generation runs would measure paired with the interleaved ones once that ratio is taken out. Writes
benchmarks/results/analysis_vs_sweep_<prompts>.json and rewrites benchmarks/README.md.

    python benchmarks/analysis_vs_sweep.py [--per-task 3] [--n-predict 64] [--repeats 3] [--sweep-repeats N]

``--sweep-repeats N`` runs the sweep arm in the first N repetitions only (at 300 prompts one sweep takes
about six plain generations); the medians say how many runs each arm had.

Run it with nothing else on the machine; every figure is for the CPU model and thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from analyzer.analysis.server_analysis import ValidationAsk, analyze_in_llama_server
from analyzer.analysis.server_calibration import PriorFit
from analyzer.analysis.server_figures import validation_figures
from analyzer.analysis.server_generation import ServerSetup, timed_complete
from analyzer.analysis.server_outcomes import ServerPrompt
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import ServerDrafter, parse_drafter
from analyzer.models.devices import cpu_model_name
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "analyzer" / "sample_data" / "sample_prompts.jsonl"
DRAFTERS = ("ngram-simple", "ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod", "ngram-mod 16 8-32")
ARMS = ("plain", "sweep", "analysis", "reused")


def sample_prompts(per_task: int) -> list[ServerPrompt]:
    """The bundled sample's first ``per_task`` prompts of each task, in file order (the demo's choice)."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    counts: dict[str, int] = {}
    chosen = []
    for row in rows:
        if counts.get(row["task"], 0) < per_task:
            counts[row["task"]] = counts.get(row["task"], 0) + 1
            chosen.append(ServerPrompt(row["id"], row["task"], [{"role": "user", "content": row["prompt"]}]))
    return chosen


def one_pass(
    setup: ServerSetup, drafter: ServerDrafter | None, prompts: list[ServerPrompt], n_predict: int
) -> float:
    """Seconds for a server of ``drafter`` (None: plain) to start, generate every prompt once and stop."""
    started = time.perf_counter()
    server = setup.server(drafter)
    server.start()
    try:
        for prompt in prompts:
            ids = server.client.tokenize(server.client.chat_prompt(prompt.messages))
            timed_complete(server, ids, n_predict)
    finally:
        server.stop()
    return time.perf_counter() - started


def analysis_arm(
    setup: ServerSetup,
    prompts: list[ServerPrompt],
    n_predict: int,
    calibration: int,
    prior: PriorFit | None,
    number: int,
) -> tuple[dict, PriorFit]:
    """One analysis with its defaults (one validation pass, as the demo), given ``prior`` (None: it fits its
    own): its seconds and advice accuracy, and its fit as the next analysis would find it, named by ``number``
    (this run's analyses counted from 1)."""
    started = time.perf_counter()
    analysis = analyze_in_llama_server(
        setup, prompts, [parse_drafter(d) for d in DRAFTERS], n_predict=n_predict,
        calibration_prompts=calibration, validate=True, validation=ValidationAsk(repeats=1), prior=prior,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    figures = validation_figures(analysis)
    return {
        "generation_vs_interleaved": generation_vs_interleaved(analysis.prompts),
        "seconds": seconds,
        "reused_fit": analysis.fit_from is not None,
        "calibration_prompts": analysis.calibration_prompts,
        "calibration": analysis.calibration_why,
        "phases": {
            "up to the predictions": analysis.seconds,
            "validation": analysis.validation_seconds,
            "plain generation inside": analysis.plain_generation_seconds,
        },
        "validation_plan": analysis.validation_plan,
        "withheld": analysis.withheld,
        "noise": analysis.noise.as_dict() if analysis.noise else None,
        "settings": {
            f.setting: {
                "validated": f.runs,
                "advice_error": f.advice_error,
                "noise_half_width": f.aggregate_noise,
                "correlation": f.correlation,
                "drafting": f.drafting,
            }
            for f in figures
        },
    }, PriorFit(analysis.costs, number)


def generation_vs_interleaved(outcomes: list) -> dict | None:
    """Per calibration prompt, the plain step time of its generation run (the plain server's prompts one after
    another) over the mean of its interleaved plain runs (each pass's plain runs around the settings' servers),
    undisturbed ones: the median ratio, its 10th and 90th percentiles, and the mean absolute log ratio around
    the median (the noise such pairs would measure once the bias is taken out). None: too few prompts."""
    ratios = []
    for outcome in outcomes:
        runs = [run for pair in outcome.plain_pairs for run in pair if not run.disturbed]
        if outcome.calibration and runs and not outcome.plain.disturbed and outcome.plain.step_ms > 0:
            ratios.append(outcome.plain.step_ms / float(np.mean([run.step_ms for run in runs])))
    if len(ratios) < 2:
        return None
    logs = np.log(np.asarray(ratios))
    return {
        "prompts": len(ratios),
        "median_ratio": float(np.exp(np.median(logs))),
        "p10": float(np.exp(np.percentile(logs, 10))),
        "p90": float(np.exp(np.percentile(logs, 90))),
        "noise_without_bias": float(np.mean(np.abs(logs - np.median(logs)))),
    }


def machine() -> str:
    return f"{cpu_model_name()}, {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--per-task", type=int, default=3, help="sample prompts per task (default 3: 39 prompts)"
    )
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of the arms (medians)")
    parser.add_argument(
        "--sweep-repeats", type=int, default=None, help="run the sweep in the first N repetitions only"
    )
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(
        settings.llama_server,
        settings.resolved_data_dir() / "cache",
        build_cache=settings.resolved_build_cache(),
    ).path
    setup = ServerSetup(binary, gguf_file(parse_spec("builtin:smollm2-135m-instruct")), args.threads, 4096)
    prompts = sample_prompts(args.per_task)
    print(
        f"{len(prompts)} prompts, {args.n_predict} new tokens, {args.threads} threads, {machine()}",
        flush=True,
    )
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    analyses, fit = [], None
    for repeat in range(args.repeats):
        order = ARMS[repeat % len(ARMS) :] + ARMS[: repeat % len(ARMS)]
        for arm in order:
            if arm == "sweep" and args.sweep_repeats is not None and repeat >= args.sweep_repeats:
                continue
            if arm == "plain":
                seconds[arm].append(one_pass(setup, None, prompts, args.n_predict))
            elif arm == "sweep":
                runs = [one_pass(setup, None, prompts, args.n_predict)]
                runs += [one_pass(setup, parse_drafter(d), prompts, args.n_predict) for d in DRAFTERS]
                seconds[arm].append(sum(runs))
            else:  # the reused arm takes the latest fit the analysis arm made (the first repeat makes it first)
                found, made = analysis_arm(
                    setup,
                    prompts,
                    args.n_predict,
                    args.calibration,
                    fit if arm == "reused" else None,
                    len(analyses) + 1,
                )
                if arm == "analysis":
                    fit = made
                analyses.append({"arm": arm, **found})
                seconds[arm].append(found["seconds"])
            print(f"repeat {repeat + 1}/{args.repeats}: {arm} {seconds[arm][-1]:.1f} s", flush=True)
    medians = {arm: float(np.median(values)) for arm, values in seconds.items()}
    for arm in ARMS:
        print(
            f"{arm}: median {medians[arm]:.1f} s, {medians[arm] / medians['plain']:.2f}x plain, "
            f"{medians[arm] / medians['sweep']:.2f}x the sweep"
        )
    result = {
        "machine": machine(),
        "threads": args.threads,
        "prompts": len(prompts),
        "n_predict": args.n_predict,
        "settings": list(DRAFTERS),
        "repeats": args.repeats,
        "runs": {arm: len(values) for arm, values in seconds.items()},
        "seconds": seconds,
        "medians": medians,
        "analyses": analyses,
        "command": f"python benchmarks/analysis_vs_sweep.py --per-task {args.per_task} --n-predict "
        f"{args.n_predict} --repeats {args.repeats}"
        + (f" --sweep-repeats {args.sweep_repeats}" if args.sweep_repeats is not None else ""),
    }
    out = HERE / "results" / f"analysis_vs_sweep_{len(prompts)}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    print(f"rewrote {write_readme()}")


if __name__ == "__main__":
    main()
