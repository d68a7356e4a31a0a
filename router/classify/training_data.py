"""What the task classifier trains on: the bundled labeled corpus (a cold start), the labeled prompts
in the database, both (the user's label winning for the same text), and pseudo-labels from the teacher
for unlabelled prompt sets (weighted by its confidence); rare labels left out, and a hash of the rows
for the version record (:mod:`router.classify.version_store`). Nothing here asks the teacher, which reads the bundled
corpus from here: which data a training request takes, and the teacher's fresh pseudo-labels when it
adapts, are :mod:`router.classify.training_request`."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.errors import SpecrouteError
from analyzer.orm import Prompt, PromptSet
from analyzer.prompts.ingest import parse_prompt_file
from analyzer.prompts.prompt_checks import ParsedPrompt, request_text
from router.classify.evaluation import USER_GROUP, source_group

CORPUS_FILE = "corpus.jsonl"
MIN_PER_LABEL = 2
# Pseudo-labels below this teacher confidence are not trained on; the others are weighted by it. Chosen
# by leave-one-source-out macro-F1 after adapting (benchmarks/bench_adapt.py, benchmarks/README.md: bars 0.1 /
# 0.2 / 0.3 / 0.5 gave 0.653 / 0.619 / 0.486 / 0.287): the teacher's spread probabilities are spread
# over 13 tasks, so even its right labels are often below 0.5, and weighting already discounts doubt.
DEFAULT_PSEUDO_CONFIDENCE = 0.1
# An adapted version is not activated with fewer than MIN_CONFIDENT_PSEUDO_LABELS pseudo-labels at teacher
# confidence CONFIDENT_PSEUDO_LABEL or more: too few to learn from. From 0.3 the teacher is mostly right
# (benchmarks/README.md: 0.2-0.3 54% right, 0.3-0.4 76%); below it, pseudo-labels are nearly a coin toss.
CONFIDENT_PSEUDO_LABEL = 0.3
MIN_CONFIDENT_PSEUDO_LABELS = 10


class ClassifierError(SpecrouteError, RuntimeError):
    """Training or loading the classifier is not possible; the message says why and what to do (the
    API meets it when the stored classifier cannot be loaded: 503)."""

    status, code = 503, "classifier_unavailable"


@dataclass(frozen=True)
class TrainingData:
    """Texts and labels to train on, the group of each text for grouped CV (the repository it came
    from, or USER_GROUP for a user's own label), their hash, where they came from, and labels left
    out for having fewer than MIN_PER_LABEL prompts. ``weights`` (empty: all 1) and ``kinds``
    ("corpus", "label" or "pseudo" per text; empty: all "label") say what each text is; pseudo-labels
    are trained on, weighted by confidence, and never scored. ``adapt`` names the prompt sets it was
    asked to adapt to (even when none of their pseudo-labels cleared the bar)."""

    texts: list[str]
    labels: list[str]
    sha256: str
    source: str
    dropped: dict[str, int]
    groups: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    adapt: list[str] = field(default_factory=list)

    def weight_array(self) -> np.ndarray:
        """The rows' sample weights (1 each when none were given), float64."""
        return np.asarray(self.weights or [1.0] * len(self.texts), dtype=np.float64)

    def kind_list(self) -> list[str]:
        """The rows' kinds ("corpus", "label", "pseudo"; all "label" when none were given)."""
        return self.kinds or ["label"] * len(self.texts)

    def composition(self) -> dict[str, dict[str, int]]:
        """Per task: how many corpus, user-labelled and pseudo-labelled prompts."""
        out: dict[str, dict[str, int]] = {}
        for label, kind in zip(self.labels, self.kind_list()):
            row = out.setdefault(label, {"corpus": 0, "label": 0, "pseudo": 0})
            row[kind] += 1
        return dict(sorted(out.items()))

    def adapting(self) -> bool:
        """Whether this is data to adapt with: it has pseudo-labels, or adapting was asked for."""
        return bool(self.adapt) or "pseudo" in self.kind_list()

    def without_pseudo_labels(self) -> TrainingData:
        """The same data without its pseudo-labelled rows (its hash is the labelled rows' hash)."""
        keep = [i for i, kind in enumerate(self.kind_list()) if kind != "pseudo"]
        return make_training_data(
            [self.texts[i] for i in keep],
            [self.labels[i] for i in keep],
            self.source,
            [self.groups[i] for i in keep] if self.groups else None,
            weights=[float(self.weight_array()[i]) for i in keep],
            kinds=[self.kind_list()[i] for i in keep],
        )


@dataclass(frozen=True)
class PseudoLabel:
    """A suggested task trained on: the request text, the task, the teacher's confidence (its weight),
    and the prompt set it came from."""

    text: str
    task: str
    confidence: float
    prompt_set: str


def pseudo_label_support(data: TrainingData) -> dict:
    """What the pseudo-labels of ``data`` give to learn from: ``count``, ``confident`` (how many have
    teacher confidence >= CONFIDENT_PSEUDO_LABEL), ``mean_confidence`` (None without any) and
    ``too_few``: why they are too few to learn from (fewer than MIN_CONFIDENT_PSEUDO_LABELS confident
    ones), or None."""
    kinds = data.kind_list()
    confidence = data.weight_array()[np.asarray([k == "pseudo" for k in kinds], dtype=bool)]
    confident = int(np.count_nonzero(confidence >= CONFIDENT_PSEUDO_LABEL))
    mean = float(np.mean(confidence)) if confidence.size else None
    too_few = None
    if confident < MIN_CONFIDENT_PSEUDO_LABELS:
        too_few = (
            f"too few confident pseudo-labels to learn from: {confident} at teacher confidence >= "
            f"{CONFIDENT_PSEUDO_LABEL:.2f} (needs {MIN_CONFIDENT_PSEUDO_LABELS}; {confidence.size} in all"
            + (f", mean confidence {mean:.2f})" if mean is not None else ")")
        )
    return {
        "count": int(confidence.size),
        "confident": confident,
        "mean_confidence": mean,
        "confident_at": CONFIDENT_PSEUDO_LABEL,
        "min_confident": MIN_CONFIDENT_PSEUDO_LABELS,
        "too_few": too_few,
    }


def make_training_data(
    texts: list[str],
    labels: list[str],
    source: str,
    groups: Sequence[str] | None = None,
    *,
    weights: Sequence[float] | None = None,
    kinds: Sequence[str] | None = None,
) -> TrainingData:
    """Training data from parallel texts, labels and groups (default: all in USER_GROUP), weights
    (default 1) and kinds (default "label"); labels with fewer than MIN_PER_LABEL prompts are left
    out (and listed), and the hash covers the kept rows in sorted order."""
    groups = list(groups) if groups is not None else [USER_GROUP] * len(texts)
    weights = list(weights) if weights is not None else [1.0] * len(texts)
    kinds = list(kinds) if kinds is not None else ["label"] * len(texts)
    counts = Counter(labels)
    dropped = {label: n for label, n in counts.items() if n < MIN_PER_LABEL}
    kept = [
        (t, label, g, w, k)
        for t, label, g, w, k in zip(texts, labels, groups, weights, kinds)
        if label not in dropped
    ]
    digest = hashlib.sha256()
    for text, label, _, weight, kind in sorted(kept):
        row = [text, label] if kind != "pseudo" else [text, label, round(weight, 4), kind]
        digest.update(json.dumps(row, ensure_ascii=False).encode("utf-8"))
    return TrainingData(
        [row[0] for row in kept],
        [row[1] for row in kept],
        digest.hexdigest(),
        source,
        dropped,
        [row[2] for row in kept],
        [row[3] for row in kept],
        [row[4] for row in kept],
    )


def trained_on(text: str, confidence: float, labelled: set[str], min_confidence: float) -> bool:
    """Whether a pseudo-label is trained on: the teacher's ``confidence`` is at least
    ``min_confidence`` and ``text`` has no label of its own (among ``labelled``)."""
    return confidence >= min_confidence and text not in labelled


def with_pseudo_labels(
    data: TrainingData, pseudo: Sequence[PseudoLabel], min_confidence: float | None = None
) -> TrainingData:
    """``data`` plus the pseudo-labels at or above ``min_confidence`` (default DEFAULT_PSEUDO_CONFIDENCE),
    weighted by confidence, grouped by their prompt set; a text already in ``data`` keeps its label."""
    bar = DEFAULT_PSEUDO_CONFIDENCE if min_confidence is None else min_confidence
    present = set(data.texts)
    added = [p for p in pseudo if trained_on(p.text, p.confidence, present, bar)]
    added = list({p.text: p for p in added}.values())  # one per distinct text
    if not added:
        return data
    sets = sorted({p.prompt_set for p in added})
    return make_training_data(
        data.texts + [p.text for p in added],
        data.labels + [p.task for p in added],
        f"{data.source} + {len(added)} pseudo-labelled prompts of {', '.join(sets)} "
        f"(teacher confidence >= {bar:.2f})",
        data.groups + [f"pseudo: {p.prompt_set}" for p in added],
        weights=list(data.weight_array()) + [p.confidence for p in added],
        kinds=data.kind_list() + ["pseudo"] * len(added),
    )


def _labeled_prompts(session: Session, prompt_set_names: Sequence[str] | None) -> dict[str, tuple[str, str]]:
    """text -> (task, group) of the labeled prompts of the named sets (all sets when none are named),
    one per distinct text (the first stored label wins)."""
    query = (
        select(Prompt.text, Prompt.messages, Prompt.task, PromptSet.name)
        .join(PromptSet)
        .where(Prompt.task.is_not(None))
    )
    if prompt_set_names:
        query = query.where(PromptSet.name.in_(list(prompt_set_names)))
        refuse_missing_sets(session, prompt_set_names)
    seen: dict[str, tuple[str, str]] = {}
    for text, messages, task, set_name in session.execute(query.order_by(Prompt.id)):
        seen.setdefault(request_text(text, messages), (task, f"{USER_GROUP}: {set_name}"))
    return seen


def refuse_missing_sets(session: Session, names: Sequence[str]) -> None:
    """ClassifierError naming the prompt sets among ``names`` that do not exist."""
    missing = set(names) - set(session.scalars(select(PromptSet.name).where(PromptSet.name.in_(list(names)))))
    if missing:
        raise ClassifierError(f"no prompt set named {', '.join(sorted(missing))}")


def _describe(prompt_set_names: Sequence[str] | None) -> str:
    return (
        "prompt sets " + ", ".join(prompt_set_names)
        if prompt_set_names
        else "all labeled prompts in the database"
    )


def training_data_from_db(session: Session, prompt_set_names: Sequence[str] | None = None) -> TrainingData:
    """The labeled prompts of the named sets (all sets when none are named), one per distinct text
    (the first stored label wins), each grouped by its prompt set for grouped CV."""
    seen = _labeled_prompts(session, prompt_set_names)
    return make_training_data(
        list(seen), [t for t, _ in seen.values()], _describe(prompt_set_names), [g for _, g in seen.values()]
    )


def with_corpus(session: Session, prompt_set_names: Sequence[str] | None = None) -> TrainingData:
    """The bundled corpus plus the user's labeled prompts; for a text in both, the user's label wins
    (the prompt keeps the corpus source as its group). Labels too rare to train on are left out after
    merging, so a single correction of a corpus prompt counts."""
    corpus = cold_start_data()
    own = _labeled_prompts(session, prompt_set_names)
    overridden = sum(1 for t, label in zip(corpus.texts, corpus.labels) if t in own and own[t][0] != label)
    in_corpus = set(corpus.texts)
    extra = [t for t in own if t not in in_corpus]
    texts = corpus.texts + extra
    labels = [own[t][0] if t in own else label for t, label in zip(corpus.texts, corpus.labels)] + [
        own[t][0] for t in extra
    ]
    groups = corpus.groups + [own[t][1] for t in extra]
    kinds = ["label" if t in own else "corpus" for t in corpus.texts] + ["label"] * len(extra)
    source = (
        f"bundled corpus + {len(own)} labeled prompts from {_describe(prompt_set_names)}"
        f" ({overridden} relabel a corpus prompt)"
        if own
        else "bundled corpus"
    )
    return make_training_data(texts, labels, source, groups, kinds=kinds)


def cold_start_data() -> TrainingData:
    """The bundled labeled corpus (router/data/corpus.jsonl; sources and licenses beside it), each
    prompt grouped by the repository it came from."""
    data = resources.files("router.data").joinpath(CORPUS_FILE).read_bytes()
    parsed = parse_prompt_file(data, CORPUS_FILE)
    source_of = {row["id"]: row["source"] for row in map(json.loads, data.decode("utf-8").splitlines())}
    return make_training_data(
        [request_text(p.text, p.messages) for p in parsed.prompts],
        [_corpus_task(p) for p in parsed.prompts],
        "bundled corpus",
        [source_group(source_of[p.external_id]) for p in parsed.prompts],
        kinds=["corpus"] * len(parsed.prompts),
    )


def _corpus_task(prompt: ParsedPrompt) -> str:
    """The task of a bundled corpus prompt (every one has a task; a ClassifierError if one does not)."""
    if prompt.task is None:
        raise ClassifierError(f"{CORPUS_FILE}: prompt {prompt.external_id} has no task")
    return prompt.task
