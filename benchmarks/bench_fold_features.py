"""The task classifier's cross-validation with each fold's whole pipeline fitted (the baseline) and with every
prompt's terms counted once for all folds (what training does, router/classify/fold_features.py): the time of every
fold a training fits, and whether the two give the same out-of-fold values.

On the bundled corpus (router/data/corpus.jsonl), the folds ``specroute train`` fits: 5 stratified and one per
source (leave one source out), each through ``router.classify.evaluation.out_of_fold`` with the training's
pipeline (``build_pipeline(0, "tfidf")``), ``count_terms_once`` the only difference. The two alternate within
each repeat (interleaved); the table gives the median wall time over the repeats, its ratio to the baseline,
the stratified and grouped macro-F1 of the out-of-fold predictions, the share of predictions equal to the
baseline's and the largest difference of a decision value.

    python benchmarks/bench_fold_features.py --repeats 3 --jobs 2
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_solver import Fit, Folds, compare  # noqa: E402
from router.classify.evaluation import out_of_fold  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import TrainingData  # noqa: E402

WAYS = {"each fold's pipeline": False, "terms counted once": True}  # the baseline first


def main() -> None:
    def way(count_terms_once: bool) -> Fit:
        def fit(data: TrainingData, folds: Folds, labels: list[str], jobs: int) -> np.ndarray:
            def build():
                return build_pipeline(0, "tfidf")

            values, _ = out_of_fold(
                build, data.texts, data.labels, folds, labels, jobs=jobs, count_terms_once=count_terms_once
            )
            return values

        return fit

    compare(__doc__ or "", "way", {name: way(once) for name, once in WAYS.items()})


if __name__ == "__main__":
    main()
