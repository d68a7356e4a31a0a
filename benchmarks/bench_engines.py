"""transformers against llama.cpp on the same prompts: what each engine's analysis measures and advises.

The same prompt set is analysed once per engine, in one database, by the product's own runs
(``RunParams(engine=...)``, validated with each engine's real speculative decoding), in the order
given by ``--order`` (default: transformers, llama.cpp, llama.cpp, transformers when ``--repeat 2``,
so that drift of the machine affects both alike). Printed per engine: plain ms per token (T_t(1) plus
the machinery's per-step time), T_t(k)/T_t(1) for k = 2..gamma_max+1, the draft step, the per-round
machinery time, the acceptance (alpha) of the workload, the best gamma, S(g*) and the decision per
task, and predicted against measured speedup of the validated prompts (mean absolute relative error).

    python benchmarks/bench_engines.py --limit 16 --max-new-tokens 64 --validate 8 \\
        --out benchmarks/results/engines_smollm2.json
    python benchmarks/bench_engines.py --pair --per-task 1 --max-new-tokens 48 --gamma-max 8 --validate 4 \\
        --out benchmarks/results/engines_pair.json        # the Qwen2.5-Coder 0.5B -> 1.5B GGUF pair

Both engines load the same GGUF files: transformers dequantizes them to float32 (its CPU dtype), llama.cpp
runs them quantized as shipped. Threads: torch's and llama.cpp's are both every core of the machine.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_routing import sample_subset  # noqa: E402

import migrations  # noqa: E402
from analyzer.advice.report import build_report  # noqa: E402
from analyzer.analysis.run_records import RunParams, create_run  # noqa: E402
from analyzer.analysis.runs import execute_run  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.prompts.prompt_sets import import_prompt_file, import_sample  # noqa: E402

TARGET, DRAFT = "builtin:smollm2-135m-instruct", "ngram"


def analyse(sessions, engine: str, args, target: str, draft: str, cache_dir: Path) -> dict:
    """One run of the prompt set ``bench`` in ``engine``; its report and wall seconds."""
    params = RunParams(
        engine=engine,
        max_new_tokens=args.max_new_tokens,
        gamma_max=args.gamma_max,
        validate=args.validate,
        limit=args.limit,
        reprofile=True,
    )
    with sessions() as session, session.begin():
        run_id = create_run(session, "bench", target, draft, params).id
    started = time.perf_counter()
    execute_run(
        sessions,
        run_id,
        cache_dir=cache_dir,
        progress=lambda d, t, phase: print(f"\r  {engine}: {phase} {d}/{t}      ", end="", file=sys.stderr),
    )
    elapsed = time.perf_counter() - started
    print(f"\n  {engine}: {elapsed:.0f} s", file=sys.stderr)
    with sessions() as session:
        return {"report": build_report(session, run_id), "wall_s": elapsed}


def engine_row(report: dict) -> dict:
    """The figures of one engine's analysis that the tables compare."""
    profile = report["cost_profiles"]["1"]
    forward = np.asarray(profile["target_k_s"])
    summary = (report.get("validation_summary") or {}).get("run") or {}
    return {
        "engine": report["engine"],
        "dtype": report["dtype"],
        "device": report["device"],
        "plain_ms_per_token": 1000 * (forward[0] + profile["decode_overhead_s"]),
        "verify_ratio": [round(float(t / forward[0]), 2) for t in forward[1:]],
        "draft_step_ms": 1000 * profile["draft_s"],
        "round_overhead_ms": 1000 * profile["round_overhead_s"],
        "quality": profile["quality"],
        "alpha": report["workload"]["alpha_mean"],
        "tasks": {
            task: {
                "best_gamma": t["best_gamma"],
                "speedup": t["predicted_speedup"],
                "speculate": t["speculate"],
            }
            for task, t in report["tasks"].items()
        },
        "workload": {
            "best_gamma": report["workload"]["best_gamma"],
            "speedup": report["workload"]["predicted_speedup"],
            "speculate": report["workload"]["speculate"],
        },
        "validated": summary.get("validated"),
        "identical": summary.get("identical"),
        "passes_equal_rounds": summary.get("passes_equal_rounds"),
        "predicted": summary.get("predicted_speedup"),
        "measured": summary.get("measured_speedup"),
        "mare_pct": summary.get("speedup_error_pct"),
    }


def print_tables(rows: list[dict]) -> None:
    threads = os.cpu_count()
    print(f"\n## Engines ({threads} threads each; {rows[0]['device']})\n")
    print(
        "| engine | weights | plain ms/token | T(k)/T(1), k = 2.. | draft step ms | round overhead ms | profile | "
        "alpha | validated (identical, passes = rounds) | predicted | measured | MARE |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['dtype']} | {r['plain_ms_per_token']:.1f} | "
            f"{', '.join(map(str, r['verify_ratio']))} "
            f"| {r['draft_step_ms']:.2f} | {r['round_overhead_ms']:.2f} | {r['quality']} | {r['alpha']:.3f} | "
            f"{r['validated']} ({r['identical']}, {r['passes_equal_rounds']}) | {_x(r['predicted'])} | "
            f"{_x(r['measured'])} | {_pct(r['mare_pct'])} |"
        )
    tasks = sorted({t for r in rows for t in r["tasks"]})
    print("\n| task | " + " | ".join(f"{r['engine']} g*, S(g*), decision" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for task in tasks + ["(workload)"]:
        cells = []
        for r in rows:
            t = r["workload"] if task == "(workload)" else r["tasks"].get(task)
            cells.append(
                "—"
                if t is None
                else f"{t['best_gamma']}, {_x(t['speedup'])}, {'on' if t['speculate'] else 'off'}"
            )
        print(f"| {task} | " + " | ".join(cells) + " |")


def _x(value) -> str:
    return "—" if value is None else f"{value:.3f}x"


def _pct(value) -> str:
    return "—" if value is None else f"{value:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pair", action="store_true", help="the Qwen2.5-Coder 0.5B -> 1.5B GGUF pair (real_pair.py)"
    )
    parser.add_argument(
        "--per-task", type=int, default=0, help="analyse the first N sample prompts of each task"
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of the set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma-max", type=int, default=8)
    parser.add_argument("--validate", type=int, default=8)
    parser.add_argument("--order", default="transformers,llama.cpp", help="engines in the order they run")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target, draft = TARGET, DRAFT
    if args.pair:
        from real_pair import DEFAULT_FOLDER, pair_specs

        target, draft = pair_specs(DEFAULT_FOLDER)
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/bench.db")
        migrations.upgrade(engine)
        sessions = make_session_factory(engine)
        with sessions() as session, session.begin():
            if args.per_task:
                import_prompt_file(session, "bench", sample_subset(args.per_task), "sample.jsonl")
            else:
                import_sample(session, "bench")
        cache_dir = args.cache_dir or Path(folder) / "cache"
        results = [analyse(sessions, name, args, target, draft, cache_dir) for name in args.order.split(",")]
        engine.dispose()
    rows = [engine_row(r["report"]) for r in results]
    for row, result in zip(rows, results):
        row["analysis_wall_s"] = result["wall_s"]
    print_tables(rows)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "target": target,
                    "draft": draft,
                    "rows": rows,
                },
                indent=1,
            )
        )
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
