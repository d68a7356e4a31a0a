"""The task classifier's cross-validation with L-BFGS (the solver before session 26) and Newton-CG
(now): the time of every fold a training fits, and whether the two give the same classifier.

On the bundled corpus (router/data/corpus.jsonl), the folds ``specroute train`` fits: 5 stratified and
one per source (leave one source out), each through ``router.classify.evaluation.out_of_fold`` with
the training's pipeline (``build_pipeline(0, "tfidf")``), the solver the only difference. The solvers
alternate within each repeat (interleaved); the table gives the median wall time over the repeats,
its ratio to L-BFGS, the stratified and grouped macro-F1 of the out-of-fold predictions, the share of
predictions equal to L-BFGS' and the largest difference of a decision value.

    python benchmarks/bench_solver.py --repeats 3 --jobs 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sklearn.metrics import f1_score  # noqa: E402

from router.classify.evaluation import grouped_folds, out_of_fold, predictions, stratified_folds  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import cold_start_data  # noqa: E402

SOLVERS = ("lbfgs", "newton-cg")  # the baseline first


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def macro_f1(truth: np.ndarray, scores: np.ndarray, labels: list[str], rows: np.ndarray) -> float:
    predicted = np.asarray(predictions(scores[rows], labels), dtype=object)
    return float(f1_score(truth[rows], predicted, labels=labels, average="macro", zero_division=0))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each solver, interleaved (default 3)")
    parser.add_argument(
        "--jobs", type=int, default=2, help="folds fitted at once, as SPECROUTE_CLASSIFIER_JOBS"
    )
    args = parser.parse_args()

    data = cold_start_data()
    labels = sorted(set(data.labels))
    truth = np.asarray(data.labels, dtype=object)
    stratified = stratified_folds(data.labels, 5, 0)
    grouped = grouped_folds(data.groups)
    print(
        f"{len(truth)} prompts, {len(labels)} tasks, {len(stratified)} stratified + {len(grouped)} grouped folds; "
        f"CPU {cpu_model()}, {os.cpu_count()} cores, {args.jobs} fold jobs",
        flush=True,
    )
    times: dict[str, list[float]] = {s: [] for s in SOLVERS}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for repeat in range(args.repeats):
        for solver in SOLVERS if repeat % 2 == 0 else SOLVERS[::-1]:

            def build(solver: str = solver):
                return build_pipeline(0, "tfidf").set_params(model__solver=solver)

            started = time.perf_counter()
            on_stratified, _ = out_of_fold(build, data.texts, data.labels, stratified, labels, jobs=args.jobs)
            on_grouped, _ = out_of_fold(build, data.texts, data.labels, grouped, labels, jobs=args.jobs)
            times[solver].append(time.perf_counter() - started)
            values[solver] = (on_stratified, on_grouped)
            print(f"  repeat {repeat + 1} {solver}: {times[solver][-1]:.1f} s", flush=True)

    every = np.arange(len(truth))
    base = SOLVERS[0]
    base_time = float(np.median(times[base]))
    print()
    print(
        "| solver | folds' wall time (median) | ratio | stratified macro-F1 | grouped macro-F1 | same predictions "
        "| max decision diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for solver in SOLVERS:
        median = float(np.median(times[solver]))
        same, diffs = [], []
        for mine, theirs in zip(values[solver], values[base]):
            same.append(
                np.mean(np.asarray(predictions(mine, labels)) == np.asarray(predictions(theirs, labels)))
            )
            finite = np.isfinite(mine) & np.isfinite(theirs)
            diffs.append(float(np.abs(mine[finite] - theirs[finite]).max()))
        print(
            f"| {solver} | {median:.1f} s | {median / base_time:.2f} | "
            f"{macro_f1(truth, values[solver][0], labels, every):.4f} | "
            f"{macro_f1(truth, values[solver][1], labels, every):.4f} | {np.mean(same):.4f} | {max(diffs):.4f} |"
        )


if __name__ == "__main__":
    main()
