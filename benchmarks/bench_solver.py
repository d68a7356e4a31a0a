"""The task classifier's cross-validation with L-BFGS (scikit-learn's default solver, the baseline) and
Newton-CG (the solver training uses): the time of every fold a training fits, and whether the two give the same
classifier.

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
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sklearn.metrics import f1_score  # noqa: E402

from router.classify.evaluation import grouped_folds, out_of_fold, predictions, stratified_folds  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import TrainingData, cold_start_data  # noqa: E402

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
    def way(solver: str) -> Fit:
        def fit(data: TrainingData, folds: Folds, labels: list[str], jobs: int) -> np.ndarray:
            def build():
                return build_pipeline(0, "tfidf").set_params(model__solver=solver)

            return out_of_fold(build, data.texts, data.labels, folds, labels, jobs=jobs)[0]

        return fit

    compare(__doc__ or "", "solver", {solver: way(solver) for solver in SOLVERS})


Folds = list[tuple[np.ndarray, np.ndarray]]
Fit = Callable[[TrainingData, Folds, list[str], int], np.ndarray]


def compare(doc: str, column: str, ways: dict[str, Fit]) -> None:
    """The command line of a comparison of ways to cross-validate the bundled corpus (``ways``: name -> the
    out-of-fold values of (data, folds, labels, jobs), the baseline first): --repeats runs of each, interleaved,
    on the 5 stratified and the leave-one-source-out folds, then :func:`print_comparison`'s table."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeats", type=int, default=3, help=f"runs of each {column}, interleaved (default 3)"
    )
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
    names = list(ways)
    times: dict[str, list[float]] = {name: [] for name in names}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            on_stratified = ways[name](data, stratified, labels, args.jobs)
            on_grouped = ways[name](data, grouped, labels, args.jobs)
            times[name].append(time.perf_counter() - started)
            values[name] = (on_stratified, on_grouped)
            print(f"  repeat {repeat + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    print_comparison(column, times, values, truth, labels)


def print_comparison(
    column: str,
    times: dict[str, list[float]],
    values: dict[str, tuple[np.ndarray, np.ndarray]],
    truth: np.ndarray,
    labels: list[str],
) -> None:
    """The table of ways to cross-validate (``times`` and ``values`` per way, the baseline first): median wall
    time, its ratio to the baseline's, the stratified and grouped macro-F1 of the out-of-fold values, the share
    of predictions equal to the baseline's and the largest difference of a decision value."""
    every = np.arange(len(truth))
    names = list(times)
    base_time = float(np.median(times[names[0]]))
    print()
    print(
        f"| {column} | folds' wall time (median) | ratio | stratified macro-F1 | grouped macro-F1 | same predictions "
        "| max decision diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        median = float(np.median(times[name]))
        same, diffs = [], []
        for mine, theirs in zip(values[name], values[names[0]]):
            same.append(
                np.mean(np.asarray(predictions(mine, labels)) == np.asarray(predictions(theirs, labels)))
            )
            finite = np.isfinite(mine) & np.isfinite(theirs)
            diffs.append(float(np.abs(mine[finite] - theirs[finite]).max()))
        print(
            f"| {name} | {median:.1f} s | {median / base_time:.2f} | "
            f"{macro_f1(truth, values[name][0], labels, every):.4f} | "
            f"{macro_f1(truth, values[name][1], labels, every):.4f} | {np.mean(same):.4f} | {max(diffs):.1e} |"
        )


if __name__ == "__main__":
    main()
