"""transformers' assisted generation as people run it, on a finished transformers run with a draft model
: for each of the run's prompts, real greedy decoding, real assisted generation under
transformers' defaults (20 assistant tokens, "constant", confidence threshold 0.4 moved by its ROC rule)
and under the fixed gamma the report chose for the prompt's task, interleaved, median of --repeats. It
compares

- the defaults' replayed rounds and drafted tokens (stored per prompt result by the run) with the real
  run's target and draft forward passes (equal when the replay is exact),
- the predicted speedup of the defaults and of the fixed gamma (the run's summary) with the measured one,
  per task and pooled,

and prints a table (writes it as JSON with --out). Time it on a quiet machine; the thread count is printed.

    python benchmarks/transformers_defaults.py --database sqlite:////tmp/x/specroute.db --run 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from analyzer.advice.summary import cost_for_run
from analyzer.advice.summary_store import run_summary
from analyzer.db import make_engine, make_session_factory
from analyzer.engine.engines import measuring_engine
from analyzer.measuring.validate import assisted_generate, assisted_generate_as_set, greedy_generate
from analyzer.orm import AnalysisRun, PromptResult
from analyzer.pricing.assistant_price import assistant_defaults_price
from analyzer.pricing.speedup import pooled_speedup
from analyzer.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-task", type=int, default=None, help="the first N prompts of each task only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="print the table from this --out file's measurements again",
    )
    args = parser.parse_args()
    sessions = make_session_factory(make_engine(args.database))
    with sessions() as session:
        run = session.get(AnalysisRun, args.run)
        assert run is not None and run.status == "done", f"run {args.run} is not a finished run"
        params, pair, cost = run.run_params, run.pair, cost_for_run(run)
        summary = run_summary(session, run)
        results, taken = [], defaultdict(int)
        query = select(PromptResult).where(PromptResult.run_id == run.id).order_by(PromptResult.id)
        for result in session.scalars(query.options(selectinload(PromptResult.gamma_counts))):
            taken[result.task_type] += 1
            if args.per_task is None or taken[result.task_type] <= args.per_task:
                results.append(result)
        assert cost is not None and all(r.assistant_rounds is not None for r in results), "nothing replayed"
        if args.measured:  # the measurements of an earlier run of this script, the predictions again
            saved = json.loads(args.measured.read_text())
            report(saved["prompts"], results, cost, summary, saved["threads"], saved["repeats"], args.out)
            return
        loaded = measuring_engine(run.measured_by).load(
            pair, load_settings().resolved_data_dir() / "cache", params, allow_network=False
        )
        session.expunge_all()
    target, draft = loaded.target.model, loaded.draft.model
    eos = list(loaded.eos_ids)
    rows = []
    for result in results:
        task = result.task_type or "unlabelled"
        group = summary.tasks[task]
        gamma = (group.best_gamma if group.decision_basis != "workload" else summary.workload.best_gamma) or 1
        ids = list(result.prompt_token_ids)
        n = params.max_new_tokens
        times = defaultdict(list)
        real = {}
        for _ in range(args.repeats):  # interleaved: a slow spell hits all three alike
            started = time.perf_counter()
            plain, _ = greedy_generate(target, ids, n, eos_token_id=eos)
            times["plain"].append(time.perf_counter() - started)
            started = time.perf_counter()
            out_defaults, passes, drafts = assisted_generate_as_set(target, draft, ids, n, eos_token_id=eos)
            times["defaults"].append(time.perf_counter() - started)
            started = time.perf_counter()
            out_fixed, fixed_passes = assisted_generate(
                target, ids, n, gamma=gamma, draft_model=draft, eos_token_id=eos
            )
            times["fixed"].append(time.perf_counter() - started)
            real = {"passes": passes, "drafts": drafts, "fixed_passes": fixed_passes}
            real["identical"] = out_defaults == plain == out_fixed == list(result.output_token_ids)
        replayed = result.assistant_rounds or []
        predicted_defaults = assistant_defaults_price([result], cost)
        prompt = next(p for p in summary.prompts if p.prompt_id == result.prompt_id)
        rows.append(
            {
                "prompt_id": result.prompt_id,
                "task": task,
                "gamma": gamma,
                "output_tokens": result.output_tokens,
                "replayed_rounds": len(replayed),
                "replayed_drafted": int(sum(d for d, _ in replayed)),
                "real_rounds": real["passes"],
                "real_drafted": real["drafts"],
                "fixed_rounds_replayed": prompt.rounds.get(gamma),
                "fixed_rounds_real": real["fixed_passes"],
                "outputs_identical": real["identical"],
                "plain_s": float(np.median(times["plain"])),
                "defaults_s": float(np.median(times["defaults"])),
                "fixed_s": float(np.median(times["fixed"])),
                "predicted_defaults": predicted_defaults["speedup"] if predicted_defaults else None,
                "predicted_fixed": prompt.speedup_curve[gamma - 1],
            }
        )
        last = rows[-1]
        print(
            f"prompt {result.prompt_id} {task}: rounds {last['replayed_rounds']} replayed / {last['real_rounds']} "
            f"real, drafted {last['replayed_drafted']} / {last['real_drafted']}; defaults predicted "
            f"{last['predicted_defaults']:.2f}x measured {last['plain_s'] / last['defaults_s']:.2f}x; gamma {gamma} "
            f"predicted {last['predicted_fixed']:.2f}x measured {last['plain_s'] / last['fixed_s']:.2f}x",
            flush=True,
        )
    report(rows, results, cost, summary, torch.get_num_threads(), args.repeats, args.out)


def predicted(results: list[PromptResult], cost, gammas: dict[int, int]) -> tuple[float, float]:
    """The pooled predicted speedup of these prompts under transformers' defaults and at each prompt's
    fixed gamma (``gammas``: prompt id -> gamma), priced as the summary prices a group."""
    defaults = assistant_defaults_price(results, cost)
    fixed = pooled_speedup(
        [r.output_tokens for r in results],
        [np.asarray(r.gamma_counts[gammas[r.prompt_id] - 1].drafted_hist) for r in results],
        cost,
        [r.prompt_tokens for r in results],
    )
    return (defaults["speedup"] if defaults else float("nan")), fixed


def report(
    rows: list[dict], results: list[PromptResult], cost, summary, threads: int, repeats: int, out
) -> None:
    """The table per task and pooled over the measured prompts (predicted over the same prompts); JSON
    with ``out``."""
    del summary  # the predictions are over the measured prompts, not the summary's groups
    print(
        f"\n{len(rows)} prompts, median of {repeats} interleaved runs, torch threads {threads}, {os.cpu_count()} cores"
    )
    header = (
        "task | prompts | rounds replayed = real | drafted replayed = real | defaults predicted / measured | "
        "fixed gamma | fixed predicted / measured"
    )
    print(header)
    by_task = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row)
    lines = {}
    for task, group in [*sorted(by_task.items()), ("(all)", rows)]:
        plain = sum(r["plain_s"] for r in group)
        defaults = plain / sum(r["defaults_s"] for r in group)
        fixed = plain / sum(r["fixed_s"] for r in group)
        ids = {r["prompt_id"] for r in group}
        predicted_defaults, predicted_fixed = predicted(
            [r for r in results if r.prompt_id in ids], cost, {r["prompt_id"]: r["gamma"] for r in group}
        )
        fixed_gamma = sorted({r["gamma"] for r in group})
        same_rounds = sum(r["replayed_rounds"] == r["real_rounds"] for r in group)
        same_drafted = sum(r["replayed_drafted"] == r["real_drafted"] for r in group)
        lines[task] = {
            "prompts": len(group),
            "rounds_equal": same_rounds,
            "drafted_equal": same_drafted,
            "defaults_predicted": predicted_defaults,
            "defaults_measured": defaults,
            "fixed_gamma": fixed_gamma,
            "fixed_predicted": predicted_fixed,
            "fixed_measured": fixed,
        }
        print(
            f"{task} | {len(group)} | {same_rounds}/{len(group)} | {same_drafted}/{len(group)} | "
            f"{predicted_defaults:.2f}x / {defaults:.2f}x | {','.join(map(str, fixed_gamma))} | "
            f"{(predicted_fixed or float('nan')):.2f}x / {fixed:.2f}x"
        )
    if out:
        out.write_text(
            json.dumps({"threads": threads, "repeats": repeats, "tasks": lines, "prompts": rows}, indent=1)
        )
        print(f"wrote {out}")
        from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

        write_readme()


if __name__ == "__main__":
    main()
