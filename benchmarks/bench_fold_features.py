"""The task classifier's cross-validation with each fold's whole pipeline fitted (before session 28) and with
every prompt's terms counted once for all folds (now, router/classify/fold_features.py): the time of every fold
a training fits, and whether the two give the same out-of-fold values.

On the bundled corpus (router/data/corpus.jsonl), the folds ``specroute train`` fits: 5 stratified and one per
source (leave one source out), each through ``router.classify.evaluation.out_of_fold`` with the training's
pipeline (``build_pipeline(0, "tfidf")``), ``count_terms_once`` the only difference. The two alternate within
each repeat (interleaved); the table gives the median wall time over the repeats, its ratio to the baseline,
the stratified and grouped macro-F1 of the out-of-fold predictions, the share of predictions equal to the
baseline's and the largest difference of a decision value.

    python benchmarks/bench_fold_features.py --repeats 3 --jobs 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_solver import cpu_model, macro_f1  # noqa: E402
from router.classify.evaluation import grouped_folds, out_of_fold, predictions, stratified_folds  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import cold_start_data  # noqa: E402

WAYS = {"each fold's pipeline": False, "terms counted once": True}  # the baseline first


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, interleaved (default 3)")
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
    names = list(WAYS)
    times: dict[str, list[float]] = {name: [] for name in names}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            build = lambda: build_pipeline(0, "tfidf")  # noqa: E731
            started = time.perf_counter()
            on_stratified, on_grouped = (
                out_of_fold(
                    build, data.texts, data.labels, folds, labels, jobs=args.jobs, count_terms_once=WAYS[name]
                )[0]
                for folds in (stratified, grouped)
            )
            times[name].append(time.perf_counter() - started)
            values[name] = (on_stratified, on_grouped)
            print(f"  repeat {repeat + 1} {name}: {times[name][-1]:.1f} s", flush=True)

    every = np.arange(len(truth))
    base = names[0]
    base_time = float(np.median(times[base]))
    print()
    print(
        "| way | folds' wall time (median) | ratio | stratified macro-F1 | grouped macro-F1 | same predictions "
        "| max decision diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        median = float(np.median(times[name]))
        same, diffs = [], []
        for mine, theirs in zip(values[name], values[base]):
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
