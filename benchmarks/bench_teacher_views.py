"""Which of the teacher's parts earn their place: each view alone, the views averaged, and each with the
neighbour vote (label spreading over the upload's 10-nearest-neighbour graph), on the leave-one-source-out
folds of the bundled corpus (each source is "the upload"; everything is trained on the other 15). Also
k-nearest neighbours over the corpus embeddings (a candidate teacher that was not kept). Transductive
macro-F1 over the tasks that have another source (1,528 prompts), as in bench_adapt.py.

    python benchmarks/bench_teacher_views.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.classify.evaluation import grouped_folds, scores_of  # noqa: E402
from router.classify.teacher import Teacher, embeddings_of, spread  # noqa: E402
from router.classify.training_data import cold_start_data  # noqa: E402

NEAREST = 15


def main() -> None:
    started = time.perf_counter()
    data = cold_start_data()
    texts = np.asarray(data.texts, dtype=object)
    truth = np.asarray(data.labels, dtype=object)
    embeddings = embeddings_of(data.texts)
    labels = sorted(set(data.labels))
    predicted: dict[str, dict[int, str]] = {}

    def keep(name: str, rows, probabilities: np.ndarray) -> None:
        predicted.setdefault(name, {}).update(
            {i: labels[j] for i, j in zip(rows, probabilities.argmax(axis=1))}
        )

    learnable = np.zeros(len(truth), dtype=bool)
    for train, test in grouped_folds(data.groups):
        learnable[test] = np.isin(truth[test], list(set(truth[train])))
        teacher = Teacher(list(texts[train]), list(truth[train]), embeddings=embeddings[train])
        views = teacher.views(list(texts[test]), embeddings[test])
        views["averaged"] = np.mean(list(views.values()), axis=0)
        for name, probabilities in views.items():
            keep(name, test, probabilities)
            keep(f"{name} + neighbour vote", test, spread(probabilities, embeddings[test]))
        similarity = embeddings[test] @ embeddings[train].T
        nearest = np.argsort(-similarity, axis=1)[:, :NEAREST]
        votes = np.zeros((len(test), len(labels)))
        for r, row in enumerate(nearest):
            for j in row:
                votes[r, labels.index(truth[train][j])] += similarity[r, j]
        keep(f"{NEAREST} nearest corpus prompts", test, votes)
    scored = np.nonzero(learnable)[0]
    evaluable = sorted(set(truth[scored]))
    print(f"{len(scored)} prompts, {len(evaluable)} tasks; {time.perf_counter() - started:.0f} s\n")
    print("| teacher candidate | macro-F1 | accuracy |\n|---|---|---|")
    for name, by_row in predicted.items():
        s = scores_of(list(truth[scored]), [by_row[i] for i in scored], evaluable)
        print(f"| {name} | {s['macro_f1']:.3f} | {s['accuracy']:.3f} |")


if __name__ == "__main__":
    main()
