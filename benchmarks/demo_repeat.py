"""Does the demo say the same thing twice? ``specroute demo --no-serve`` run ``--runs`` times in a row, each in a
fresh data folder (the llama-server build shared, as every data folder on a machine shares it), as a new user's
first command runs it after the install: per run its wall time, the product's own noise verdict, whether the
advice was withheld and why, what stopped calibration, and every task's decision; then whether every run
withheld nothing and every task got the same decision in each.

    python benchmarks/demo_repeat.py [--runs 5] [--keep DIR]

Writes benchmarks/results/demo_repeat.json and rewrites benchmarks/README.md. Run it with nothing else on the
machine; every figure is for the CPU model it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analyzer.models.devices import cpu_model_name

HERE = Path(__file__).resolve().parent
SPECROUTE = Path(sys.executable).with_name("specroute")


def one_demo(folder: Path) -> dict:
    """One ``specroute demo --no-serve`` in the data folder ``folder``: its seconds, and its analysis as
    ``specroute report --llama-server-analysis 1 --format json`` prints it (the first analysis of a new folder)."""
    env = {**os.environ, "SPECROUTE_DATA_DIR": str(folder)}
    started = time.perf_counter()
    done = subprocess.run([str(SPECROUTE), "demo", "--no-serve"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"specroute demo failed ({done.returncode}):\n{done.stderr[-3000:]}")
    shown = subprocess.run(
        [str(SPECROUTE), "report", "--llama-server-analysis", "1", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    analysis = json.loads(shown.stdout)
    return {
        "seconds": seconds,
        "printed": done.stdout.splitlines()[:12],
        "advice_withheld": analysis["advice_withheld"],
        "calibration": analysis["calibration"],
        "validation_plan": analysis["validation_plan"],
        "noise": analysis["noise"],
        "decisions": {t["task"]: t["chosen"] or "off" for t in analysis["tasks"]},
        "margins": {t["task"]: margin(t) for t in analysis["tasks"]},
    }


def margin(task: dict) -> dict:
    """How far a task's decision sat from the rule: its best setting's predicted speedup, the lower end of its
    interval and the fit's standard error in it (None where the analysis stored no leave-one-out fit)."""
    options = [o for o in task["options"] if o["speedup"] is not None]
    if not options:
        return {"best": None}
    best = max(range(len(options)), key=lambda i: options[i]["speedup"])
    errors = task.get("fit_errors") or []
    return {
        "best": options[best]["label"],
        "speedup": options[best]["speedup"],
        "low": options[best]["low"],
        "fit_error": errors[best] if errors else None,
    }


def agreement(runs: list[dict]) -> dict:
    """Whether every run withheld nothing, and per task whether every run chose the same."""
    tasks = sorted({task for run in runs for task in run["decisions"]})
    differing = {
        task: [run["decisions"].get(task, "missing") for run in runs]
        for task in tasks
        if len({run["decisions"].get(task, "missing") for run in runs}) > 1
    }
    return {
        "withheld": sum(run["advice_withheld"] is not None for run in runs),
        "tasks": len(tasks),
        "differing": differing,
        "agree": not differing and all(run["advice_withheld"] is None for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep each run's data folder here (run-1, run-2, ...) to inspect",
    )
    args = parser.parse_args()
    machine = f"{cpu_model_name()}, {os.cpu_count()} CPUs"
    print(f"{args.runs} demo runs in fresh data folders, {machine}", flush=True)
    runs = []
    for number in range(1, args.runs + 1):
        folder = Path(tempfile.mkdtemp(prefix="specroute-demo-"))
        try:
            runs.append(one_demo(folder))
        finally:
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.move(str(folder), str(args.keep / f"run-{number}"))
            else:
                shutil.rmtree(folder, ignore_errors=True)
        run = runs[-1]
        print(
            f"run {number}/{args.runs}: {run['seconds']:.0f} s, withheld: {run['advice_withheld'] or 'no'}, "
            f"decisions: {', '.join(f'{t} {d}' for t, d in run['decisions'].items())}",
            flush=True,
        )
    result = {
        "machine": machine,
        "runs": runs,
        "agreement": agreement(runs),
        "command": f"python benchmarks/demo_repeat.py --runs {args.runs}",
    }
    print(json.dumps(result["agreement"]))
    out = HERE / "results" / "demo_repeat.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    print(f"rewrote {write_readme()}")


if __name__ == "__main__":
    main()
