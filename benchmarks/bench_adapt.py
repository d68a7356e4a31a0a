"""What adapting the task classifier to a user's unlabelled prompts gains on sources it never saw.

Leave-one-source-out on the bundled corpus (router/data/corpus.jsonl, 16 source repositories): each
source in turn is "the user's upload". The classifier and the teacher are trained on the other 15
sources; the held-out source's prompts are labelled by the teacher (router/classify/teacher.py) without their
labels; the classifier is retrained on the other sources plus the confident pseudo-labels, weighted by
confidence (router.classify.training.adapted_fit, what ``specroute train --adapt`` does); then scored on the
held-out source's labels. Three protocols:

  - transductive: the upload is adapted to and scored (what the issue asks: "adapted unlabelled,
    scored on its labels");
  - split: the upload is split in two random halves; adapted to one, scored on the other, and the
    other way round (new traffic from the same user);
  - mixed: --mixed draws of three held-out sources pooled into one upload (the teacher's neighbour
    vote sees several tasks at once).

Tasks with a single source in the corpus (customer_support, rag, summarization, translation) cannot be
learnt without it and are left out of the scores, as in bench_classifier.py. Also the in-process p99 of
one decision (TaskClassifier.predict on one prompt) before and after adapting, interleaved.

    python benchmarks/bench_adapt.py --out benchmarks/results/adapt.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.classify.evaluation import decision_matrix, grouped_folds, scores_of, softmax  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.task_classifier import TaskClassifier  # noqa: E402
from router.classify.teacher import Teacher, embed_all  # noqa: E402
from router.classify.training import adapted_fit  # noqa: E402
from router.classify.training_data import DEFAULT_PSEUDO_CONFIDENCE, cold_start_data  # noqa: E402


def predict(model, texts, labels) -> list[str]:
    return [labels[j] for j in softmax(decision_matrix(model, texts, labels)).argmax(axis=1)]


def one_upload(data, embeddings, train, upload, score, labels, seed, min_confidence) -> dict:
    """Before / teacher / after predictions for the ``score`` rows, adapting to the ``upload`` rows."""
    texts = np.asarray(data.texts, dtype=object)
    truth = np.asarray(data.labels, dtype=object)
    base = build_pipeline(seed, "tfidf").fit(list(texts[train]), list(truth[train]))
    teacher = Teacher(list(texts[train]), list(truth[train]), embeddings=embeddings[train], seed=seed)
    suggestions = teacher.suggest(list(texts[upload]), embeddings[upload])
    adapted = adapted_fit(
        list(texts[train]),
        list(truth[train]),
        [(texts[i], s.task, s.confidence) for i, s in zip(upload, suggestions)],
        seed=seed,
        min_confidence=min_confidence,
    )
    by_index = dict(zip(upload, suggestions))
    return {
        "before": predict(base, list(texts[score]), labels),
        "teacher": [by_index[i].task if i in by_index else "" for i in score],
        "after": predict(adapted, list(texts[score]), labels),
        "pseudo": sum(s.confidence >= min_confidence for s in suggestions),
        "pseudo_right": sum(
            s.confidence >= min_confidence and s.task == truth[i] for i, s in zip(upload, suggestions)
        ),
    }


def collect(rows: dict, index, out: dict) -> None:
    for key in ("before", "teacher", "after"):
        out.setdefault(key, {}).update(zip(index, rows[key]))


def scored(truth, predicted: dict, keep) -> dict:
    evaluable = sorted({truth[i] for i in keep})
    return scores_of([truth[i] for i in keep], [predicted[i] for i in keep], evaluable)


def latency(models: dict, texts: list[str], repeats: int = 1) -> dict:
    """p50/p99 ms of one whole routing decision (Router.route: classify, pick the policy, the request's
    rules) per model, interleaved prompt by prompt; every task has a policy, as after publishing."""
    from router.decide.decision import Router
    from router.policies.policy import PolicySnapshot

    def router(model):
        classifier = TaskClassifier(0, 0, list(model.classes_), model, threshold=0.3)
        policies = {
            task: PolicySnapshot(task, True, 4, 0.8, 0.01, 12, 1.5, "RECOMMENDED", (1.2, 1.3, 1.4, 1.5))
            for task in list(model.classes_) + ["*"]
        }
        return Router(classifier, policies, policy_version=1)

    routers = {name: router(m) for name, m in models.items()}
    times = {name: [] for name in routers}
    for text in texts[:20]:
        for r in routers.values():
            r.route(text)
    for _ in range(repeats):
        for text in texts:
            for name, r in routers.items():
                started = time.perf_counter()
                r.route(text)
                times[name].append((time.perf_counter() - started) * 1000)
    return {
        name: {"p50_ms": float(np.percentile(t, 50)), "p99_ms": float(np.percentile(t, 99)), "n": len(t)}
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed", type=int, default=6, help="Draws of three pooled held-out sources.")
    parser.add_argument("--min-confidence", type=float, default=DEFAULT_PSEUDO_CONFIDENCE)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--latency-only", action="store_true", help="Only time the decisions (adds them to --out's report)."
    )
    args = parser.parse_args()
    import torch

    started = time.perf_counter()
    data = cold_start_data()
    if args.latency_only:
        report = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
        report["latency"] = adapted_latency(
            data, embed_all(data.texts), args, np.random.default_rng(args.seed)
        )
        report["latency_threads"] = torch.get_num_threads()
        for name, row in report["latency"].items():
            print(f"| {name} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['n']} |")
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
        return
    truth = np.asarray(data.labels, dtype=object)
    labels = sorted(set(data.labels))
    embeddings = embed_all(data.texts)
    folds = grouped_folds(data.groups)
    learnable = np.zeros(len(truth), dtype=bool)
    for train, test in folds:
        learnable[test] = np.isin(truth[test], list(set(truth[train])))
    rng = np.random.default_rng(args.seed)
    results = {"transductive": {}, "split": {}, "mixed": {}}
    pseudo = {"transductive": [0, 0], "split": [0, 0], "mixed": [0, 0]}

    def run(protocol, train, upload, score):
        rows = one_upload(data, embeddings, train, upload, score, labels, args.seed, args.min_confidence)
        collect(rows, score, results[protocol])
        pseudo[protocol][0] += rows["pseudo"]
        pseudo[protocol][1] += rows["pseudo_right"]

    for train, test in folds:
        run("transductive", train, test, test)
        if len(test) >= 4:
            halves = np.array_split(rng.permutation(test), 2)
            run("split", train, halves[0], halves[1])
            run("split", train, halves[1], halves[0])
        print(
            f"  {data.groups[test[0]]}: {len(test)} prompts ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    groups = sorted(set(data.groups))
    mixed_scores = []
    for draw in range(args.mixed):
        chosen = list(rng.choice(groups, 3, replace=False))
        test = np.nonzero(np.isin(np.asarray(data.groups), chosen))[0]
        train = np.nonzero(~np.isin(np.asarray(data.groups), chosen))[0]
        keep = [i for i in test if truth[i] in set(truth[train])]
        rows = one_upload(
            data, embeddings, train, test, np.asarray(keep), labels, args.seed, args.min_confidence
        )
        evaluable = sorted({truth[i] for i in keep})
        mixed_scores.append(
            {
                "sources": chosen,
                "prompts": len(keep),
                **{
                    k: scores_of([truth[i] for i in keep], rows[k], evaluable)["macro_f1"]
                    for k in ("before", "teacher", "after")
                },
            }
        )
        print(f"  mixed {chosen}: {mixed_scores[-1]}", flush=True)
    keep = np.nonzero(learnable)[0]
    report = {
        "threads": torch.get_num_threads(),
        "min_confidence": args.min_confidence,
        "prompts": len(keep),
        "protocols": {
            protocol: {
                key: scored(truth, predicted, [i for i in keep if i in predicted])
                for key, predicted in results[protocol].items()
            }
            | {"pseudo_labels": pseudo[protocol][0], "pseudo_right": pseudo[protocol][1]}
            for protocol in ("transductive", "split")
        },
        "mixed": mixed_scores,
    }
    report["latency"] = adapted_latency(data, embeddings, args, rng)
    report["seconds"] = time.perf_counter() - started
    print_table(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


def adapted_latency(data, embeddings, args, rng) -> dict:
    """The p99 of one decision: the unadapted classifier on the whole corpus against the one adapted to
    the largest source's upload (arena-hard), interleaved prompt by prompt, 3 passes over 600 prompts."""
    arena = [i for i, g in enumerate(data.groups) if g == "lmarena/arena-hard-auto"]
    teacher = Teacher(data.texts, data.labels, embeddings=embeddings, seed=args.seed)
    base = build_pipeline(args.seed, "tfidf").fit(data.texts, data.labels)
    suggestions = teacher.suggest([data.texts[i] for i in arena], embeddings[arena])
    adapted = adapted_fit(
        data.texts,
        data.labels,
        [(data.texts[i] + " ", s.task, s.confidence) for i, s in zip(arena, suggestions)],
        seed=args.seed,
        min_confidence=args.min_confidence,
    )
    order = rng.permutation(len(data.texts))[:600]
    return latency({"before": base, "after": adapted}, [data.texts[i] for i in order], repeats=3)


def print_table(report: dict) -> None:
    protocols = report["protocols"]
    columns = [(p, k) for p in ("transductive", "split") for k in ("before", "teacher", "after")]
    print(
        f"\n{report['prompts']} prompts scored; {report['threads']} torch threads; {report['seconds']:.0f} s"
    )
    print("| metric | " + " | ".join(f"{p}: {k}" for p, k in columns) + " |")
    print("|---|" + "---|" * len(columns))

    def cell(p, k, value):  # the split protocol's teacher labelled the other half: no figure here
        return "-" if (p, k) == ("split", "teacher") else value

    for metric in ("macro_f1", "accuracy"):
        print(
            f"| {metric} | "
            + " | ".join(cell(p, k, f"{protocols[p][k][metric]:.3f}") for p, k in columns)
            + " |"
        )
    for label, row in protocols["transductive"]["before"]["per_class"].items():
        print(
            f"| F1 {label} (n={int(row['support'])}) | "
            + " | ".join(
                cell(p, k, f"{protocols[p][k]['per_class'][label]['f1-score']:.2f}") for p, k in columns
            )
            + " |"
        )
    for label in ("general",):
        shares = []
        for p, k in columns:
            if (p, k) == ("split", "teacher"):
                shares.append("-")
                continue
            confusion = protocols[p][k]["confusion"]
            j = confusion["labels"].index(label)
            column = [r[j] for r in confusion["matrix"]]
            total = sum(map(sum, confusion["matrix"]))
            shares.append(
                cell(p, k, f"{sum(column) / total:.0%}, {column[j] / max(sum(column), 1):.0%} right")
            )
        print(f"| predicted {label}: share, right | " + " | ".join(shares) + " |")
    for p in ("transductive", "split"):
        n, right = protocols[p]["pseudo_labels"], protocols[p]["pseudo_right"]
        print(f"{p}: {n} pseudo-labels kept, {right / max(n, 1):.1%} right")
    print("\n| mixed upload (3 sources) | prompts | before | teacher | after |\n|---|---|---|---|---|")
    for row in report["mixed"]:
        print(
            f"| {', '.join(s.split('/')[-1] for s in row['sources'])} | {row['prompts']} | {row['before']:.3f} | "
            f"{row['teacher']:.3f} | {row['after']:.3f} |"
        )
    print("\n| classifier | p50 ms | p99 ms | decisions |\n|---|---|---|---|")
    for name, row in report["latency"].items():
        print(f"| {name} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['n']} |")


if __name__ == "__main__":
    main()
