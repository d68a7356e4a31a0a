"""How well each classifier feature set generalizes to prompts from sources it never saw, how well
its probabilities are calibrated, and what a routing decision costs with it.

On the bundled corpus (router/data/corpus.jsonl: 1,889 prompts, 13 task types, 16 source
repositories), for each option (feature set ``tfidf``, ``minilm`` or ``tfidf+minilm`` and the logistic
regression's C), through ``router.classify.cross_validation.evaluate`` (what ``specroute train`` reports):
  - stratified 5-fold CV and leave-one-source-out CV (grouped by the repository in each prompt's
    ``source``): macro-F1, accuracy and per-class F1;
  - calibration of the grouped out-of-fold probabilities: ECE before and after temperature scaling,
    and the threshold the router would use (predictions at or above it right >= 80% of the time);
then, fitted on the whole corpus, the in-process latency of one decision (``TaskClassifier.predict``
on one prompt, p50/p99 over ``--decisions`` prompts, interleaved across the options) for each option
and for the hybrid (TF-IDF answers when its calibrated confidence clears the fast-path bar, else the
combined model).

    python benchmarks/bench_classifier.py --out benchmarks/results/classifier.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.classify.cross_validation import evaluate  # noqa: E402
from router.classify.evaluation import calibration, grouped_folds, out_of_fold, predictions, scores_of  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.task_classifier import TaskClassifier  # noqa: E402
from router.classify.training_data import cold_start_data, make_training_data  # noqa: E402

DEFAULT_OPTIONS = "tfidf:20,tfidf:1,minilm:5,tfidf+minilm:20"


DEV_ROWS = 1305  # corpus.jsonl is dev.jsonl (these first rows) followed by dev-extra.jsonl


def parse_option(option: str) -> tuple[str, float]:
    features, _, c = option.partition(":")
    return features, float(c or 20)


def before(data, seed: int) -> dict:
    """The baseline classifier, on the same leave-one-source-out folds and the same scored prompts as the
    others: TF-IDF with C = 20, trained on the dev.jsonl rows only (each
    fold's training rows restricted to them; the held-out source's prompts scored whole)."""
    labels = sorted(set(data.labels))
    folds = grouped_folds(data.groups)
    truth = np.asarray(data.labels, dtype=object)
    learnable = np.zeros(len(truth), dtype=bool)
    for train, test in folds:  # the same mask as the others: the task has another source in the corpus
        learnable[test] = np.isin(truth[test], list(set(truth[train])))
    restricted = [(train[train < DEV_ROWS], test) for train, test in folds]
    started = time.perf_counter()
    scores, _ = out_of_fold(
        lambda: build_pipeline(seed, "tfidf", 20.0), data.texts, data.labels, restricted, labels
    )
    kept = np.nonzero(learnable)[0]
    evaluable = sorted({data.labels[i] for i in kept})
    dev_only = make_training_data(
        data.texts[:DEV_ROWS], data.labels[:DEV_ROWS], "dev.jsonl", data.groups[:DEV_ROWS]
    )
    stratified = evaluate(dev_only, seed=seed, features="tfidf", c=20.0)
    return stratified | {
        "grouped": scores_of([data.labels[i] for i in kept], predictions(scores[kept], labels), evaluable),
        "calibration": calibration(scores[kept], [data.labels[i] for i in kept], labels),
        "seconds": time.perf_counter() - started,
    }


def latency(classifiers: dict, texts: list[str], repeats: int) -> dict:
    """Per option: p50/p99 ms of one decision, options interleaved prompt by prompt (outside training
    nothing caches embeddings: every decision encodes its prompt, as in serving)."""
    times = {name: [] for name in classifiers}
    for text in texts[:20]:  # warm-up
        for c in classifiers.values():
            c.predict([text])
    for _ in range(repeats):
        for text in texts:
            for name, c in classifiers.items():
                started = time.perf_counter()
                c.predict([text])
                times[name].append(time.perf_counter() - started)
    return {
        name: {
            "p50_ms": 1000 * float(np.percentile(t, 50)),
            "p99_ms": 1000 * float(np.percentile(t, 99)),
            "n": len(t),
        }
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", default=DEFAULT_OPTIONS, help="feature set:C, comma-separated")
    parser.add_argument("--decisions", type=int, default=500, help="prompts timed per option")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--before",
        action="store_true",
        help="also the classifier before dev-extra and C selection (tfidf C=20 trained on dev.jsonl only)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--from-json", type=Path, help="print the tables of a saved --out file")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print_tables(saved["results"], saved["latency"], saved["corpus"])
        return
    import torch

    torch.set_num_threads(2)
    data = cold_start_data()
    corpus = {
        "prompts": len(data.texts),
        "labels": dict(Counter(data.labels)),
        "sources": len(set(data.groups)),
        "threads": torch.get_num_threads(),
    }
    assert len(data.texts) == 1889, "DEV_ROWS assumes the corpus is dev.jsonl + dev-extra.jsonl"
    results = {}
    if args.before:
        results["before: tfidf:20, dev.jsonl only"] = before(data, args.seed)
    for option in args.options.split(","):
        features, c = parse_option(option)
        started = time.perf_counter()
        results[option] = evaluate(data, seed=args.seed, features=features, c=c)
        results[option]["seconds"] = time.perf_counter() - started
        print(
            f"{option}: stratified {results[option]['macro_f1']:.3f}, unseen sources "
            f"{results[option]['grouped']['macro_f1']:.3f} ({results[option]['seconds']:.0f} s)",
            file=sys.stderr,
        )
    if args.out:  # saved before timing, so a failure there keeps the (slow) cross-validation
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "corpus": corpus,
                    "results": results,
                    "latency": {},
                },
                indent=1,
            )
        )
    classifiers = {}
    for option in results:
        if option.startswith("before"):
            continue
        features, c = parse_option(option)
        pipeline = build_pipeline(args.seed, features, c).fit(data.texts, data.labels)
        classifiers[option] = TaskClassifier(0, 0, sorted(corpus["labels"]), pipeline)
    rng = random.Random(args.seed)
    timing = latency(classifiers, rng.sample(data.texts, min(args.decisions, len(data.texts))), 1)
    print_tables(results, timing, corpus)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "corpus": corpus,
                    "results": results,
                    "latency": timing,
                },
                indent=1,
            )
        )
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


def print_tables(results: dict, timing: dict, corpus: dict) -> None:
    names = list(results)
    print(
        f"\n{corpus['prompts']} prompts, {len(corpus['labels'])} task types, {corpus['sources']} sources; "
        f"torch threads {corpus['threads']}. Grouped = leave one source repository out; tasks with one "
        f"source are not scored there (-)."
    )
    print("\n| metric | " + " | ".join(f"{n} strat. | {n} unseen" for n in names) + " |")
    print("|---|" + "---|" * (2 * len(names)))
    for metric in ("macro_f1", "accuracy"):
        print(
            f"| {metric} | "
            + " | ".join(f"{results[n][metric]:.3f} | {results[n]['grouped'][metric]:.3f}" for n in names)
            + " |"
        )
    for label in sorted(corpus["labels"]):
        cells = []
        for n in names:
            grouped = results[n]["grouped"]["per_class"].get(label)
            cells.append(
                f"{results[n]['per_class'][label]['f1-score']:.2f} | "
                + (f"{grouped['f1-score']:.2f}" if grouped else "-")
            )
        print(f"| F1 {label} (n={corpus['labels'][label]}) | " + " | ".join(cells) + " |")
    print(
        "\n| option | temperature | ECE before | ECE after | threshold | coverage | precision at "
        "threshold | p50 ms | p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in names:
        c = results[n]["calibration"]
        print(
            f"| {n} | {c['temperature']:.2f} | {c['ece_before']:.3f} | {c['ece_after']:.3f} | {c['threshold']:.2f} "
            f"| {c['coverage']:.2f} | {c['precision'] or 0:.2f} | {timing.get(n, {}).get('p50_ms', float('nan')):.3f} "
            f"| {timing.get(n, {}).get('p99_ms', float('nan')):.3f} |"
        )


if __name__ == "__main__":
    main()
