"""Do chat-form requests reach their task's policy as often as the same text sent as ``prompt``?

The classifier reads a chat request through :func:`analyzer.prompts.prompt_checks.request_text` (the
contents without role prefixes, system messages apart, rows "now"); the reading it is compared with, rows
"before", is :func:`analyzer.prompts.prompt_checks.prompt_text`'s "role: content" lines, which make a single
user message ("user: Translate into German: ...") a different text from the same words sent as ``prompt``.
This measures, on sources the classifier never saw (the bundled
corpus's leave-one-source-out folds stand in for hidden sources: each source is predicted by a serving
classifier trained on the others), the share of prompts that reach their own task's policy (predicted
task right, calibrated confidence at or above the routing threshold), for each request form, under each
of the two readings. The threshold and temperature are the ones training
chooses from the same out-of-fold decision values of the ``prompt`` form.

    python benchmarks/bench_chat_form.py [--out benchmarks/results/chat_form.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.prompts.prompt_checks import prompt_text, request_text  # noqa: E402
from router.classify.evaluation import calibration, decision_matrix, grouped_folds, softmax  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.training_data import cold_start_data  # noqa: E402

SYSTEM = "You are a helpful assistant."


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _with_system(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


# what the classifier reads for each request form: "before" (prompt_text: "role: content" lines) and "now"
# (request_text, the classifier's own reading)
FORMS = {
    "prompt": lambda text: text,
    "one user message, before": lambda text: prompt_text(messages=_user(text)),
    "one user message, now": lambda text: request_text(messages=_user(text)),
    "system + user message, before": lambda text: prompt_text(messages=_with_system(text)),
    "system + user message, now": lambda text: request_text(messages=_with_system(text)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    data = cold_start_data()
    texts = np.asarray(data.texts, dtype=object)
    truth = np.asarray(data.labels, dtype=object)
    labels = sorted(set(data.labels))
    scores = {form: np.full((len(texts), len(labels)), -np.inf) for form in FORMS}
    learnable = np.zeros(len(texts), dtype=bool)
    folds = grouped_folds(data.groups)
    for number, (train, test) in enumerate(folds, start=1):
        learnable[test] = np.isin(truth[test], list(set(truth[train])))
        model = build_pipeline().fit(list(texts[train]), list(truth[train]))
        for form, shaped in FORMS.items():
            scores[form][test] = decision_matrix(model, [shaped(t) for t in texts[test]], labels)
        print(f"fold {number}/{len(folds)}", file=sys.stderr)
    rows = np.nonzero(learnable)[0]  # prompts whose task has another source (as training scores them)
    chosen = calibration(scores["prompt"][rows], list(truth[rows]), labels)
    index = np.asarray([labels.index(t) for t in truth[rows]])
    results = {}
    for form in FORMS:
        probabilities = softmax(scores[form][rows], chosen["temperature"])
        right = probabilities.argmax(axis=1) == index
        confident = probabilities.max(axis=1) >= chosen["threshold"]
        results[form] = {
            "right_task": float(right.mean()),
            "reaches_its_policy": float((right & confident).mean()),
        }
    print(
        f"{len(rows)} prompts from {len(folds)} sources, each predicted by a classifier trained on the other "
        f"sources; routing threshold {chosen['threshold']:.2f}, temperature {chosen['temperature']:.2f}; "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print("| request form (what the classifier read) | right task | reaches its task's policy |")
    print("|---|---|---|")
    for form, result in results.items():
        print(f"| {form} | {result['right_task']:.1%} | {result['reaches_its_policy']:.1%} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "prompts": len(rows),
                    "sources": len(folds),
                    "threshold": chosen["threshold"],
                    "forms": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
