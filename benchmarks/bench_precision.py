"""The task classifier's cross-validation with its logistic regression fitted in double precision (scikit-learn's
LogisticRegression on the float64 features, the baseline) and in single precision (what training fits:
``router.classify.pipeline.SinglePrecisionLogisticRegression``, a float32 copy of the features, the coefficients
kept as float64): the time of every fold a training fits, and whether the two give the same classifier.

On the bundled corpus, the folds ``specroute train`` fits (5 stratified and one per source), each through
``router.classify.evaluation.out_of_fold`` with the training's pipeline (``build_pipeline(0, "tfidf")``), the
model's class the only difference, interleaved; the table is :func:`benchmarks.bench_solver.print_comparison`'s.

    python benchmarks/bench_precision.py --repeats 3 --jobs 2
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sklearn.linear_model import LogisticRegression  # noqa: E402

from benchmarks.bench_solver import Fit, Folds, compare  # noqa: E402
from router.classify.evaluation import out_of_fold  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import TrainingData  # noqa: E402


def main() -> None:
    def way(double: bool) -> Fit:
        def fit(data: TrainingData, folds: Folds, labels: list[str], jobs: int) -> np.ndarray:
            def build():
                pipeline = build_pipeline(0, "tfidf")
                if double:
                    pipeline.set_params(
                        model=LogisticRegression(**pipeline.named_steps["model"].get_params())
                    )
                return pipeline

            return out_of_fold(build, data.texts, data.labels, folds, labels, jobs=jobs)[0]

        return fit

    compare(__doc__ or "", "fitted in", {"float64 (before)": way(True), "float32 (now)": way(False)})


if __name__ == "__main__":
    main()
