"""Does the advice hold in transformers on prompts the project does not ship? One
analysis of a workload from sources the bundled corpus does not contain (`specroute analyze`'s own pipeline:
the embedded SmolLM2-135M-Instruct with prompt lookup, in transformers, on this CPU), then every prompt
validated at several gammas with the product's own validation (plain greedy and assisted generation, two
runs each, alternated), priced twice from the same analysis:

- **before**: its cost profile at one context (the median prompt's), every prompt priced alike
  (:func:`analyzer.advice.summary.cost_from_profile` with ``with_context=False``), the baseline;
- **after**: the same profile with its context slopes (measured again over the longest request's context),
  each prompt priced at its own mean context, as runs are priced.

Printed per gamma, for each model: the time-weighted aggregate predicted and measured speedup and its error,
the per-prompt error, the share of prompts within the machine's noise floor + 3 points, the correlation among
prompts whose replay drafted; per task the aggregate error; and the noise floor (from each prompt's two greedy
runs) beside them. The figures are :func:`analyzer.advice.report.validation_summary`'s, what a run's report
gives. Writes JSON to benchmarks/results/.

    python benchmarks/transformers_transfer.py --workload unseen
    python benchmarks/transformers_transfer.py --workload long
    python benchmarks/transformers_transfer.py --workload mixed --per-task 2

The workloads are ``benchmarks/cost_transfer.py``'s. Run it with nothing else on the machine; every figure is
for the CPU model and thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sqlalchemy import select
from sqlalchemy.orm import selectinload

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_transfer import LONG_CONTEXT_TASKS, long_prompts, unseen_prompts  # noqa: E402

import migrations  # noqa: E402
from analyzer.advice.report import validation_summary  # noqa: E402
from analyzer.advice.summary import cost_for_run, cost_from_profile  # noqa: E402
from analyzer.analysis.run_records import RunParams, create_run  # noqa: E402
from analyzer.analysis.runs import execute_run  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.engine.engines import measuring_engine  # noqa: E402
from analyzer.models.devices import cpu_model_name  # noqa: E402
from analyzer.orm import AnalysisRun, PromptResult  # noqa: E402
from analyzer.pricing.speedup import predicted_speedup  # noqa: E402
from analyzer.prompts.prompt_sets import import_prompt_file  # noqa: E402

TARGET, DRAFT = "builtin:smollm2-135m-instruct", "ngram"
RESULTS = Path(__file__).resolve().parent / "results"


def workload_file(workload: str, per_task: int) -> bytes:
    """The workload as a JSONL prompt file (id, prompt, task); ``mixed``: the unseen prompts (``per_task``
    per task) and every other long one, short and long prompts in one workload, so that one context cannot
    price both."""
    if workload == "unseen":
        prompts = unseen_prompts(per_task)
    elif workload == "long":
        prompts = long_prompts()
    else:
        prompts = unseen_prompts(per_task) + long_prompts()[::2]
    rows = [{"id": p.key, "prompt": p.messages[-1]["content"], "task": p.task} for p in prompts]
    return "\n".join(json.dumps(row) for row in rows).encode() + b"\n"


def analyse(sessions, args, cache_dir: Path) -> int:
    params = RunParams(
        engine="transformers",
        max_new_tokens=args.max_new_tokens,
        gamma_max=max(args.gammas),
        validate=0,
        reprofile=True,
    )
    with sessions() as session, session.begin():
        run_id = create_run(session, "transfer", TARGET, DRAFT, params).id
    execute_run(
        sessions,
        run_id,
        cache_dir=cache_dir,
        progress=lambda d, t, phase: print(f"\r  {phase} {d}/{t}      ", end="", file=sys.stderr),
    )
    print(file=sys.stderr)
    return run_id


def judge(rows: list[dict], key: str) -> dict:
    """:func:`validation_summary` of the rows with ``predicted_speedup`` from the ``key`` model, per gamma
    and per task."""
    priced = [{**r, "predicted_speedup": r[key]} for r in rows]
    per_gamma = {}
    for gamma in sorted({r["gamma"] for r in rows}):
        group = [r for r in priced if r["gamma"] == gamma]
        summary = validation_summary(group)
        drafting = [r for r in group if r["drafted"]]
        summary["drafting"] = len(drafting)
        summary["correlation_drafting"] = (validation_summary(drafting) or {}).get("correlation")
        per_gamma[gamma] = summary
    tasks = {}
    for task in sorted({r["task"] for r in rows}):
        errors = [
            validation_summary([r for r in priced if r["task"] == task and r["gamma"] == g])[
                "aggregate_error_pct"
            ]
            for g in per_gamma
        ]
        tasks[task] = {"mean_error_pct": float(np.mean(errors)), "worst_pct": float(np.max(errors))}
    return {"gammas": per_gamma, "tasks": tasks, "all": validation_summary(priced)}


def _f(value, form: str = "{:.1f}%") -> str:
    return "-" if value is None else form.format(value)


def print_judgement(name: str, figures: dict) -> None:
    print(f"\n{name}")
    print(
        "| gamma | prompts | aggregate predicted / measured | aggregate error | error per prompt | "
        "within noise + 3 pts | correlation (drafting) |"
    )
    print("|---|---|---|---|---|---|---|")
    for gamma, s in figures["gammas"].items():
        within = None if s["within_noise"] is None else 100 * s["within_noise"]
        print(
            f"| {gamma} | {s['timed']} | {_f(s['aggregate_predicted'], '{:.3f}')} / "
            f"{_f(s['aggregate_measured'], '{:.3f}')} | {_f(s['aggregate_error_pct'])} | "
            f"{_f(s['speedup_error_pct'])} | {_f(within, '{:.0f}%')} | "
            f"{_f(s['correlation_drafting'], '{:.2f}')} ({s['drafting']}) |"
        )
    print(f"correlation over every gamma's runs: {_f(figures['all']['correlation'], '{:.2f}')}")
    print("| task | mean aggregate error over gammas | worst |")
    print("|---|---|---|")
    for task, row in figures["tasks"].items():
        print(f"| {task} | {row['mean_error_pct']:.1f}% | {row['worst_pct']:.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("unseen", "long", "mixed"), default="unseen")
    parser.add_argument(
        "--per-task", type=int, default=8, help="prompts per task of dev-extra.jsonl (unseen)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gammas", type=lambda text: [int(g) for g in text.split(",")], default=[1, 3, 6])
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/transfer.db")
        migrations.upgrade(engine)
        sessions = make_session_factory(engine)
        with sessions() as session, session.begin():
            import_prompt_file(
                session, "transfer", workload_file(args.workload, args.per_task), "transfer.jsonl"
            )
        run_id = analyse(sessions, args, Path(folder) / "cache")
        analysed = time.perf_counter() - started
        with sessions() as session:
            run = session.get(AnalysisRun, run_id)
            params, pair = run.run_params, run.pair
            profile = run.cost_profile
            cost = cost_from_profile(profile, run.pair.draft.kind, with_context=False)
            with_context = cost_for_run(run)
            query = select(PromptResult).where(PromptResult.run_id == run_id).order_by(PromptResult.id)
            results = list(session.scalars(query.options(selectinload(PromptResult.gamma_counts))))
            loaded = measuring_engine(run.measured_by).load(
                pair, Path(folder) / "cache", params, allow_network=False
            )
            profile_text = (
                f"profile: T_t(1) {1000 * profile.target_forward_s[0]:.2f} ms at {profile.context_tokens} tokens"
                + (
                    f", {1e6 * profile.context_slope_s[0]:.2f} us per token of context (measured again at "
                    f"{profile.long_context_tokens})"
                    if profile.context_slope_s
                    else ", one context"
                )
                + (
                    "; scaled to generate()'s forwards: "
                    + ", ".join(f"k={k} x{r:.3f}" for k, r in profile.generate_ratio.items())
                    if profile.generate_ratio
                    else "; timed alone"
                )
                + f"; quality {profile.quality}"
            )
            session.expunge_all()
        engine.dispose()
    assert cost is not None and with_context is not None
    rows = []
    for number, result in enumerate(results, 1):
        counts = {g.gamma: g for g in result.gamma_counts}
        for gamma in args.gammas:
            measured = loaded.validate(list(result.prompt_token_ids), params, gamma)
            hist = counts[gamma].drafted_hist
            greedy, speculative = list(measured.greedy_times_s), list(measured.speculative_times_s)
            rows.append(
                {
                    "prompt_id": result.prompt_id,
                    "task": result.task_type,
                    "gamma": gamma,
                    "prompt_tokens": result.prompt_tokens,
                    "output_tokens": result.output_tokens,
                    "drafted": int(counts[gamma].drafted),
                    "outputs_identical": measured.outputs_identical,
                    "replay_identical": measured.speculative_ids == list(result.output_token_ids or []),
                    "passes_error_pct": None,
                    "disturbed": False,
                    "greedy_times_s": greedy,
                    "speculative_times_s": speculative,
                    "greedy_time_s": measured.greedy_time_s,
                    "speculative_time_s": measured.speculative_time_s,
                    "measured_speedup": measured.measured_speedup,
                    "after": predicted_speedup(
                        result.output_tokens, hist, with_context, result.prompt_tokens
                    ),
                    "before": predicted_speedup(result.output_tokens, hist, cost, result.prompt_tokens),
                }
            )
        print(f"\r  validated {number}/{len(results)}      ", end="", file=sys.stderr)
    print(file=sys.stderr)
    wall = time.perf_counter() - started
    lengths = [r.prompt_tokens for r in results]
    print(
        f"\n{args.workload}: {len(results)} prompts ({min(lengths)}-{max(lengths)} tokens, median "
        f"{int(np.median(lengths))}), {args.max_new_tokens} new tokens, gammas {args.gammas}, transformers "
        f"{TARGET} + prompt lookup on {cpu_model_name()} ({os.cpu_count()} cores, torch {torch.get_num_threads()} "
        f"threads); analysis {analysed:.0f} s, all {wall:.0f} s"
    )
    print(profile_text)
    before, after = judge(rows, "before"), judge(rows, "after")
    noise = after["all"]
    print(
        f"machine noise: two greedy runs of the same prompt differ by {_f(noise['noise_floor_pct'])} on average "
        f"({noise['noise_pairs']} pairs)"
    )
    print_judgement("before (one context, every prompt priced alike)", before)
    print_judgement("after (each prompt at its own context)", after)
    long_tasks = [t for t in LONG_CONTEXT_TASKS if t in after["tasks"]]
    if long_tasks:
        print(
            f"\nlong-context tasks ({', '.join(long_tasks)}): mean aggregate error "
            f"{np.mean([before['tasks'][t]['mean_error_pct'] for t in long_tasks]):.1f}% before, "
            f"{np.mean([after['tasks'][t]['mean_error_pct'] for t in long_tasks]):.1f}% after"
        )
    out = RESULTS / f"transformers_transfer_{args.workload}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "workload": args.workload,
                "cpu": cpu_model_name(),
                "threads": torch.get_num_threads(),
                "profile": profile_text,
                "rows": rows,
                "before": before,
                "after": after,
                "seconds": wall,
            },
            indent=1,
            default=str,
        )
    )
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
