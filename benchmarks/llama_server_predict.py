"""Predicted against measured through llama-server: an analysis in llama-server of the
bundled sample prompts with the embedded SmolLM2-135M-Instruct Q4_1, for several n-gram drafter settings,
validated through the servers themselves.

Prints: the fitted step costs; per setting the share of runs whose output equals plain greedy, the share of
those whose draft counts equal the replay's, and the MARE of the per-prompt speedup; per task the
predicted and measured speedup of every setting and the chosen one; routed (each task on its chosen
setting, off where none pays) against every static choice, measured on the validated prompts; and the
analysis' wall time against plain generation of the same prompts. Writes the table as JSON beside.

    python benchmarks/llama_server_predict.py [--workload sample|mixed] [--per-task 3] [--n-predict 64] [--threads 2]
    python benchmarks/real_pair.py && python benchmarks/llama_server_predict.py --pair --per-task 2 --max-chars 1200

Run it with nothing else on the machine; every figure is for the thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from analyzer.analysis.server_analysis import analyze_in_llama_server
from analyzer.analysis.server_figures import task_choices, validation_figures
from analyzer.analysis.server_generation import ServerSetup
from analyzer.analysis.server_outcomes import ServerAnalysis, ServerPrompt
from analyzer.analysis.server_text import cost_text
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings

SAMPLE = Path(__file__).resolve().parents[1] / "analyzer" / "sample_data" / "sample_prompts.jsonl"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts" / "dev.jsonl"
# prompts that hand over code to change: their answers copy much of their input
CODE_EDIT = re.compile(r"\b(fix|refactor|modify|rewrite|improve|optimi[sz]e|change)\b", re.I)
DRAFTERS = ("ngram-simple", "ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod", "ngram-mod 16 8-32")
# the real pair (benchmarks/real_pair.py): draft-simple at the server's defaults (n_max 3), with and without
# the confidence stop, and the best n-gram setting of the embedded model's runs beside them
PAIR_DRAFTERS = ("draft-simple 0-3 p0", "draft-simple 0-3 p0.75", "ngram-simple 2/4")
RESULTS = Path(__file__).resolve().parent / "results"


def _mixed_rows(per_task: int) -> list[dict]:
    """From the shared corpus: ``per_task`` prompts of every task under 3,000 characters, and a
    "code_edit" group of as many arena-hard prompts that hand over code to fix, modify or refactor."""
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    short = [r for r in rows if len(r["prompt"]) <= 3000]
    edits = [
        {**r, "task": "code_edit"}
        for r in short
        if r["task"] == "code"
        and r["id"].startswith("arena-hard")
        and CODE_EDIT.search(r["prompt"])
        and len(r["prompt"]) > 300
    ]
    return short + edits[:per_task]


def _prompts(per_task: int, workload: str, max_chars: int = 0) -> list[ServerPrompt]:
    rows = (
        [json.loads(line) for line in SAMPLE.read_text().splitlines()]
        if workload == "sample"
        else _mixed_rows(per_task)
    )
    rows = [r for r in rows if not max_chars or len(r["prompt"]) <= max_chars]
    counts: dict[str, int] = {}
    chosen = []
    for row in rows:
        if counts.get(row["task"], 0) < per_task:
            counts[row["task"]] = counts.get(row["task"], 0) + 1
            chosen.append(ServerPrompt(row["id"], row["task"], [{"role": "user", "content": row["prompt"]}]))
    # interleave the tasks, so the calibration prompts (the first ones) cover several
    return sorted(chosen, key=lambda p: [q.key for q in chosen if q.task == p.task].index(p.key))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def routed_vs_static(analysis: ServerAnalysis) -> dict[str, float]:
    """Measured time (ms) over the validated prompts for "off", every static setting and "routed"; a run
    whose output's length differs from plain's counts at its time per step times plain's steps."""
    best = {c.task: c.best for c in task_choices(analysis)}
    totals: dict[str, float] = {"off": 0.0, "routed": 0.0} | {d.label: 0.0 for d in analysis.drafters}
    for outcome in analysis.prompts:
        settings = outcome.settings
        if settings[0].calibration or settings[0].plain is None:
            continue
        plain = settings[0].plain
        totals["off"] += plain.completion.predicted_ms
        chosen = best[outcome.prompt.task]
        routed_ms = plain.completion.predicted_ms
        for setting in settings:
            assert setting.measured is not None
            ms = setting.measured.completion.predicted_ms / setting.measured.steps * plain.steps
            totals[setting.drafter.label] += ms
            if setting.drafter == chosen:
                routed_ms = ms
        totals["routed"] += routed_ms
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--per-task", type=int, default=3, help="prompts per task from the sample (default 3)"
    )
    parser.add_argument("--n-predict", type=int, default=64, help="new tokens per prompt (default 64)")
    parser.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    parser.add_argument("--calibration", type=int, default=8, help="prompts that fit the cost (default 8)")
    parser.add_argument(
        "--pair",
        action="store_true",
        help="the Qwen2.5-Coder 0.5B -> 1.5B pair of benchmarks/real_pair.py (run it first) with draft-simple",
    )
    parser.add_argument(
        "--max-chars", type=int, default=0, help="leave out prompts longer than this (0: none)"
    )
    parser.add_argument(
        "--workload",
        choices=("sample", "mixed"),
        default="sample",
        help="the bundled sample, or a mix from ../shared/data/prompts/dev.jsonl with a code_edit group",
    )
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(settings.llama_server, settings.resolved_data_dir() / "cache").path
    if args.pair:
        from real_pair import pair_specs  # this folder's own setup step (on sys.path as the script's folder)

        target_spec, draft_spec = pair_specs()
        setup = ServerSetup(
            binary, gguf_file(parse_spec(target_spec)), args.threads, 4096, gguf_file(parse_spec(draft_spec))
        )
    else:
        setup = ServerSetup(
            binary, gguf_file(parse_spec("builtin:smollm2-135m-instruct")), args.threads, 4096
        )
    prompts = _prompts(args.per_task, args.workload, args.max_chars)
    started = time.perf_counter()
    analysis = analyze_in_llama_server(
        setup,
        prompts,
        [parse_drafter(d) for d in (PAIR_DRAFTERS if args.pair else DRAFTERS)],
        n_predict=args.n_predict,
        calibration_prompts=args.calibration,
        validate=True,
        say=lambda line: print(f"  {line}", flush=True),
    )
    wall = time.perf_counter() - started
    print(
        f"\n{len(prompts)} prompts, {args.n_predict} new tokens, {args.threads} threads, llama-server {binary}"
    )
    print(f"target {setup.model}" + (f", draft {setup.draft_model}" if setup.draft_model else ""))
    for family, cost in analysis.costs.items():
        print(f"cost, {family}: {cost_text(cost.as_dict())}")
    print(
        "\n| setting | runs | disturbed | output = plain | counts = replay | MARE (the work served) | "
        "MARE (the advice) |"
    )
    print("|---|---|---|---|---|---|---|")
    figures = validation_figures(analysis)
    for f in figures:
        print(
            f"| {f.setting} | {f.runs} | {f.disturbed} | {_fmt(f.output_equal, 2)} | {_fmt(f.counts_equal, 2)} | "
            f"{_fmt(f.mare)} | {_fmt(f.advice_mare)} |"
        )
    labels = [d.label for d in analysis.drafters]
    print("\n| task | prompts | " + " | ".join(f"{label} pred / meas" for label in labels) + " | chosen |")
    print("|---|---|" + "---|" * len(labels) + "---|")
    choices = task_choices(analysis)
    for c in choices:
        cells = [f"{c.predicted[label]:.2f} / {_fmt(c.measured[label], 2)}" for label in labels]
        print(
            f"| {c.task} | {c.prompts} | " + " | ".join(cells) + f" | {c.best.label if c.best else 'off'} |"
        )
    totals = routed_vs_static(analysis)
    print("\n| choice | measured ms | speedup vs off |")
    print("|---|---|---|")
    for name, ms in sorted(totals.items(), key=lambda item: item[1]):
        print(f"| {name} | {ms:.0f} | {totals['off'] / ms:.3f} |")
    print(
        f"\nanalysis {analysis.seconds:.0f} s (servers started, generation, calibration, replays), plain "
        f"generation of the same prompts {analysis.plain_generation_seconds:.0f} s: "
        f"{analysis.seconds / analysis.plain_generation_seconds:.1f}x; validation {analysis.validation_seconds:.0f} s "
        f"more ({wall:.0f} s in all)"
    )
    out = RESULTS / f"llama_server_predict_{args.workload}{'_pair' if args.pair else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "prompts": len(prompts),
                "n_predict": args.n_predict,
                "threads": args.threads,
                "costs": {family: cost.as_dict() for family, cost in analysis.costs.items()},
                "validation": [f.as_dict() for f in figures],
                "tasks": [
                    {
                        "task": c.task,
                        "predicted": c.predicted,
                        "measured": c.measured,
                        "chosen": c.best.label if c.best else "off",
                    }
                    for c in choices
                ],
                "routed_vs_static_ms": totals,
                "analysis_s": analysis.seconds,
                "validation_s": analysis.validation_seconds,
                "plain_generation_s": analysis.plain_generation_seconds,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
