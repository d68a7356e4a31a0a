"""The task classifier: a scikit-learn Pipeline (word + character TF-IDF and structural features into
a linear model), trained on the labeled prompts in the database or, for a cold start, on the bundled
labeled corpus; scored by stratified cross-validation beside the keyword baseline; persisted as a
version with its record (library versions, training-data hash, labels, scores) and refused on load
when the record does not match what is installed.

The stored artifact is a pickle that specroute itself wrote into its own database; its SHA-256 is
checked before it is loaded. Nothing a user uploads is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import platform
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Sequence

import numpy as np
import scipy
import sklearn
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import FeatureUnion, Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, MaxAbsScaler
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from analyzer.ingest import parse_prompt_file
from analyzer.models import Prompt, PromptResult, PromptSet
from router.features import (
    FEATURES_VERSION,
    classifier_text,
    keyword_baseline,
    prompt_text,
    structural_features,
    structural_row,
)
from router.models import ClassifierVersion, activate_only

CORPUS_FILE = "corpus.jsonl"
MIN_PER_LABEL = 2


class ClassifierError(RuntimeError):
    """Training or loading the classifier is not possible; the message says why and what to do."""


@dataclass(frozen=True)
class TrainingData:
    """Texts and labels to train on, their hash, where they came from, and labels left out for
    having fewer than MIN_PER_LABEL prompts."""

    texts: list[str]
    labels: list[str]
    sha256: str
    source: str
    dropped: dict[str, int]


def make_training_data(texts: list[str], labels: list[str], source: str) -> TrainingData:
    """Training data from parallel texts and labels; labels with fewer than MIN_PER_LABEL prompts
    are left out (and listed), and the hash covers the kept pairs in sorted order."""
    counts = Counter(labels)
    dropped = {label: n for label, n in counts.items() if n < MIN_PER_LABEL}
    kept = [(t, l) for t, l in zip(texts, labels) if l not in dropped]
    digest = hashlib.sha256()
    for text, label in sorted(kept):
        digest.update(json.dumps([text, label], ensure_ascii=False).encode("utf-8"))
    return TrainingData([t for t, _ in kept], [l for _, l in kept], digest.hexdigest(), source, dropped)


def training_data_from_db(session: Session, prompt_set_names: Sequence[str] | None = None) -> TrainingData:
    """The labeled prompts of the named sets (all sets when none are named), one per distinct text."""
    query = select(Prompt.text, Prompt.messages, Prompt.task).where(Prompt.task.is_not(None))
    if prompt_set_names:
        query = query.join(PromptSet).where(PromptSet.name.in_(list(prompt_set_names)))
        missing = set(prompt_set_names) - set(session.scalars(
            select(PromptSet.name).where(PromptSet.name.in_(list(prompt_set_names)))))
        if missing:
            raise ClassifierError(f"no prompt set named {', '.join(sorted(missing))}")
    seen: dict[str, str] = {}
    for text, messages, task in session.execute(query.order_by(Prompt.id)):
        seen.setdefault(prompt_text(text, messages), task)
    source = "prompt sets " + ", ".join(prompt_set_names) if prompt_set_names else "all labeled prompts in the database"
    return make_training_data(list(seen), list(seen.values()), source)


def cold_start_data() -> TrainingData:
    """The bundled labeled corpus (router/data/corpus.jsonl; sources and licenses beside it)."""
    data = resources.files("router.data").joinpath(CORPUS_FILE).read_bytes()
    parsed = parse_prompt_file(data, CORPUS_FILE)
    return make_training_data([prompt_text(p.text, p.messages) for p in parsed.prompts],
                          [p.task for p in parsed.prompts], "bundled corpus")


def build_pipeline(seed: int = 0) -> Pipeline:
    """Word (1-2) and character (2-5, within words) TF-IDF over the first CLASSIFIER_CHARS characters,
    plus scaled structural features of the whole prompt, into a class-balanced multinomial logistic regression, which
    gives a probability per task."""
    features = FeatureUnion([
        ("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=50_000,
                                  preprocessor=classifier_text)),
        ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2,
                                  max_features=100_000, preprocessor=classifier_text)),
        ("structure", make_pipeline(FunctionTransformer(structural_features), MaxAbsScaler())),
    ])
    model = LogisticRegression(C=20.0, max_iter=3000, class_weight="balanced", random_state=seed)
    return Pipeline([("features", features), ("model", model)])


def library_versions() -> dict[str, str]:
    """The versions a persisted classifier is tied to."""
    return {"python": platform.python_version(), "scikit-learn": sklearn.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__, "specroute-features": FEATURES_VERSION}


def evaluate(data: TrainingData, *, seed: int = 0, folds: int = 5) -> dict:
    """Stratified k-fold cross-validated macro-F1, accuracy, per-class report and confusion matrix
    of the pipeline, and the keyword baseline's scores on the same data."""
    labels = sorted(set(data.labels))
    if len(labels) < 2:
        raise ClassifierError("training needs at least two task types with labeled prompts")
    splits = min(folds, min(Counter(data.labels).values()))
    cv = StratifiedKFold(n_splits=splits, shuffle=True, random_state=seed)
    predicted = cross_val_predict(build_pipeline(seed), data.texts, data.labels, cv=cv)
    baseline = [keyword_baseline(t) for t in data.texts]
    report = classification_report(data.labels, predicted, labels=labels, output_dict=True, zero_division=0)
    return {
        "folds": splits,
        "macro_f1": float(f1_score(data.labels, predicted, labels=labels, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(data.labels, predicted)),
        "per_class": {label: {k: float(report[label][k]) for k in ("precision", "recall", "f1-score", "support")}
                      for label in labels},
        "confusion": {"labels": labels, "matrix": confusion_matrix(data.labels, predicted, labels=labels).tolist()},
        "baseline": {
            "macro_f1": float(f1_score(data.labels, baseline, labels=labels, average="macro", zero_division=0)),
            "accuracy": float(accuracy_score(data.labels, baseline)),
        },
    }


def train_classifier(session: Session, data: TrainingData, *, seed: int = 0, activate: bool = True,
                     cross_validate: bool = True) -> ClassifierVersion:
    """Cross-validate, fit on all the data, and store a new version (the active one unless told not
    to). ``cross_validate=False`` stores no scores (benchmarks that only need a fitted model)."""
    scores = evaluate(data, seed=seed) if cross_validate else {}
    pipeline = build_pipeline(seed).fit(data.texts, data.labels)
    artifact = pickle.dumps(pipeline, protocol=pickle.HIGHEST_PROTOCOL)
    latest = session.scalar(select(func.max(ClassifierVersion.version))) or 0
    version = ClassifierVersion(
        version=latest + 1,
        is_active=False,
        labels=sorted(set(data.labels)),
        training_data_sha256=data.sha256,
        training_prompt_count=len(data.texts),
        library_versions=library_versions(),
        scores={**scores, "source": data.source, "dropped_labels": data.dropped},
        artifact=artifact,
        artifact_sha256=hashlib.sha256(artifact).hexdigest(),
    )
    session.add(version)
    session.flush()
    if activate:
        activate_version(session, version.version)
    return version


def activate_version(session: Session, version: int) -> ClassifierVersion:
    """Make ``version`` the one active classifier."""
    chosen = activate_only(session, ClassifierVersion, version)
    if chosen is None:
        raise ClassifierError(f"no classifier version {version}")
    return chosen


def _char_wb_ngrams(text: str, min_n: int, max_n: int) -> list[str]:
    """The same multiset of n-grams as scikit-learn's ``char_wb`` analyzer (after preprocessing):
    per whitespace-separated word padded with one space each side, every n-gram for n = min_n..max_n,
    and a word no longer than n counted once as a whole."""
    grams: list[str] = []
    for word in text.split():
        padded = f" {word} "
        length = len(padded)
        for n in range(min_n, max_n + 1):
            if length <= n:
                grams.append(padded)
                break
            grams.extend([padded[i:i + n] for i in range(length - n + 1)])
    return grams


_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_LENGTH_SALT = np.uint64(0xD6E8FEB86659FD93)
_SPACE = 32


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


class _CharGramTable:
    """``char_wb`` n-gram lookup in numpy. With min_n >= 2, the char_wb n-grams of a text are exactly
    the length-n windows of " " + " ".join(words) + " " with no space strictly inside (a word's padded
    form, whole, is such a window when it is no longer than n). Each window gets a 64-bit rolling hash
    salted with n; the vocabulary's n-grams are hashed the same way once and sorted (``indices`` maps a
    position in that order to the vocabulary index), and every window of every n is looked up with one
    searchsorted; a word's hits are kept for its next occurrence (in any prompt)."""

    WORD_CACHE_SIZE = 50_000

    def __init__(self, vocabulary: dict[str, int], min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        keys, indices = [], []
        for n in range(min_n, max_n + 1):
            grams = [g for g in vocabulary if len(g) == n]
            if grams:
                codes = _codes("".join(grams)).astype(np.uint64).reshape(len(grams), n)
                hashes = codes[:, 0].copy()
                with np.errstate(over="ignore"):
                    for j in range(1, n):
                        hashes = hashes * _HASH_MULTIPLIER + codes[:, j]
                    keys.append(hashes + np.uint64(n) * _LENGTH_SALT)
                indices.append(np.asarray([vocabulary[g] for g in grams], dtype=np.intp))
        keys_all = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        order = np.argsort(keys_all)
        self.keys = keys_all[order]
        self.indices = (np.concatenate(indices) if indices else np.zeros(0, np.intp))[order]
        if np.any(self.keys[1:] == self.keys[:-1]):
            raise ClassifierError("char n-gram hash collision in the vocabulary")
        with np.errstate(over="ignore"):
            self._salts = [np.uint64(n) * _LENGTH_SALT for n in range(max_n + 1)]
        self._word_hits: dict[str, np.ndarray] = {}

    def warm(self, words: Sequence[str]) -> None:
        """Cache these words' hits now (the loader passes the word vocabulary's single words)."""
        distinct = list(dict.fromkeys(w for w in words if w and not any(c.isspace() for c in w)))
        distinct = distinct[:self.WORD_CACHE_SIZE // 2]
        if distinct and self.keys.shape[0]:
            self._word_hits.update(zip(distinct, self._word_positions(distinct)))

    def positions(self, text: str) -> np.ndarray:
        """Sorted positions in ``keys`` of the text's n-grams found in the vocabulary, one entry per
        occurrence. A word's n-grams do not depend on its neighbours, so each distinct word's hits
        are computed once and kept (at most WORD_CACHE_SIZE words; the cache starts over when full)."""
        words = text.split()
        if not words or self.keys.shape[0] == 0:
            return np.zeros(0, dtype=np.intp)
        cache = self._word_hits
        found = [cache.get(w) for w in words]
        missing = [w for w, hits in zip(words, found) if hits is None]
        if missing:
            distinct = list(dict.fromkeys(missing))
            fresh = dict(zip(distinct, self._word_positions(distinct)))
            if len(cache) + len(fresh) > self.WORD_CACHE_SIZE:
                cache.clear()
            cache.update(fresh)
            found = [hits if hits is not None else fresh[w] for w, hits in zip(words, found)]
        hits = np.concatenate(found)
        hits.sort()
        return hits

    def _word_positions(self, words: list[str]) -> list[np.ndarray]:
        """For each word, the positions in ``keys`` of its padded form's n-grams (all words hashed
        at once: the windows of " " + " ".join(words) + " " with no space strictly inside)."""
        codes = _codes(" " + " ".join(words) + " ").astype(np.uint64)
        spaces = codes == _SPACE
        owner_at = np.cumsum(spaces) - 1  # a window starting at i belongs to word owner_at[i]
        length = codes.shape[0]
        hashes = codes
        inner = None
        queries, owners = [], []
        with np.errstate(over="ignore"):
            for n in range(2, self.max_n + 1):
                count = length - n + 1
                if count <= 0:
                    break
                hashes = hashes[:count] * _HASH_MULTIPLIER + codes[n - 1:n - 1 + count]
                if n > 2:  # windows with a space strictly inside are not n-grams of one word
                    step = spaces[n - 2:n - 2 + count]
                    inner = step if inner is None else inner[:count] | step
                if n >= self.min_n:
                    keys = hashes + self._salts[n]
                    queries.append(keys if inner is None else keys[~inner])
                    owners.append(owner_at[:count] if inner is None else owner_at[:count][~inner])
        query, owner = np.concatenate(queries), np.concatenate(owners)
        position = np.searchsorted(self.keys, query)
        np.minimum(position, self.keys.shape[0] - 1, out=position)
        hit = self.keys.take(position) == query
        position, owner = position[hit], owner[hit]
        order = np.argsort(owner, kind="stable")
        position, owner = position[order], owner[order]
        bounds = np.searchsorted(owner, np.arange(len(words) + 1))
        return [position[bounds[i]:bounds[i + 1]] for i in range(len(words))]

    def features(self, text: str) -> np.ndarray:
        """Vocabulary indices of the text's n-grams, one entry per occurrence."""
        return self.indices[self.positions(text)]


def _runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a sorted array and how often each occurs (in few numpy calls: this
    runs twice per decision)."""
    size = ids.shape[0]
    if size == 0:
        return ids, ids
    first = np.empty(size, dtype=bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    starts = first.nonzero()[0]
    counts = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = size - starts[-1]
    return ids.take(starts), counts


class _WordGrams:
    """A word TfidfVectorizer's analyzer (preprocessor, token pattern, word n-grams) with the
    vocabulary lookup folded in: ``ids`` gives sorted vocabulary indices, one per occurrence."""

    def __init__(self, transformer: TfidfVectorizer):
        if transformer.stop_words is not None or transformer.analyzer != "word":
            raise ClassifierError("FastScorer supports word n-grams without stop words only")
        self.preprocess, self.tokenize = transformer.build_preprocessor(), transformer.build_tokenizer()
        self.low, self.high = transformer.ngram_range
        self.get = transformer.vocabulary_.get

    def ids(self, text: str) -> np.ndarray:
        tokens = self.tokenize(self.preprocess(text))
        grams = list(tokens) if self.low == 1 else []
        for n in range(max(self.low, 2), self.high + 1):
            if n == 2:
                grams += [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]
            else:
                grams += [" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
        get = self.get
        found = [i for i in map(get, grams) if i is not None]
        ids = np.array(found, dtype=np.intp)
        ids.sort()
        return ids


class FastScorer:
    """The fitted pipeline's probabilities without scikit-learn's per-call overhead: the same
    analyzers, vocabularies, idf weights, structural scaling and linear model, evaluated on one
    sparse row with numpy (character n-grams found by vectorised hashing, their weights stored in
    hash order so that the hits index them directly). ``predict_proba`` equals the pipeline's to
    rounding (a test checks it)."""

    def __init__(self, pipeline: Pipeline):
        union, model = pipeline.named_steps["features"], pipeline.named_steps["model"]
        weights = np.asarray(model.coef_.T, dtype=np.float64)  # (n_features, n_classes or 1)
        # per part: (kind, ids function, idf per id, model weights per id (rows), offset)
        self.parts: list[tuple] = []
        self.char_tables: list[_CharGramTable] = []
        offset = 0
        for name, transformer in union.transformer_list:
            if isinstance(transformer, TfidfVectorizer):
                if not (transformer.sublinear_tf and transformer.use_idf and transformer.norm == "l2"):
                    raise ClassifierError(f"FastScorer supports sublinear, idf-weighted, l2-normed TF-IDF only ({name})")
                size = len(transformer.vocabulary_)
                block = weights[offset:offset + size]
                low, high = transformer.ngram_range
                if transformer.analyzer == "char_wb" and low >= 2:
                    preprocess, table = transformer.build_preprocessor(), _CharGramTable(transformer.vocabulary_, low, high)
                    self.char_tables.append(table)
                    self.parts.append(("tfidf", lambda text, p=preprocess, t=table: t.positions(p(text)),
                                       transformer.idf_[table.indices], np.ascontiguousarray(block[table.indices])))
                else:
                    self.parts.append(("tfidf", _WordGrams(transformer).ids, transformer.idf_, block))
                offset += size
            else:
                scaler = transformer.steps[-1][1]
                size = len(scaler.scale_)
                inverse = 1.0 / np.where(scaler.scale_ == 0, 1.0, scaler.scale_)
                self.parts.append(("structure", structural_row, None,
                                   np.ascontiguousarray(weights[offset:offset + size] * inverse[:, None])))
                offset += size
        single_words = [term for transformer in union.transformer_list if isinstance(transformer[1], TfidfVectorizer)
                        and transformer[1].analyzer == "word" for term in transformer[1].vocabulary_ if " " not in term]
        for table in self.char_tables:  # the first prompts then find most of their words cached
            table.warm(single_words)
        self.intercept = model.intercept_.astype(np.float64)
        self.classes_ = model.classes_
        if weights.shape[0] != offset:
            raise ClassifierError("FastScorer: feature count does not match the model")

    def cached_words(self) -> int:
        """How many distinct words' character n-grams are cached."""
        return sum(len(table._word_hits) for table in self.char_tables)

    def scores(self, text: str) -> np.ndarray:
        """The linear model's decision values for one text, shape (n_classes,) or (1,) for two."""
        total = self.intercept.copy()
        for kind, ids_of, idf, rows in self.parts:
            if kind == "structure":
                total += np.array(ids_of(text)) @ rows
                continue
            ids, counts = _runs(ids_of(text))
            if ids.shape[0] == 0:
                continue
            values = (np.log(counts) + 1.0) * idf.take(ids)
            total += (values @ rows.take(ids, axis=0)) / np.sqrt(values @ values)  # take: faster than [ids]
        return total

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """Class probabilities, shape (len(texts), n_classes), as the pipeline computes them."""
        rows = np.array([self.scores(t) for t in texts], dtype=np.float64).reshape(len(texts), -1)
        if rows.shape[1] == 1:  # two classes: a logistic of one decision value
            positive = 1.0 / (1.0 + np.exp(-rows[:, 0]))
            return np.column_stack([1.0 - positive, positive])
        rows -= rows.max(axis=1, keepdims=True)
        np.exp(rows, out=rows)
        rows /= rows.sum(axis=1, keepdims=True)
        return rows


@dataclass
class TaskClassifier:
    """A loaded classifier version: predicts a task type and the probability the model gives it.
    Small batches go through the FastScorer; large ones through the pipeline itself."""

    version_id: int
    version: int
    labels: list[str]
    pipeline: Pipeline
    fast: FastScorer | None = None

    def __post_init__(self) -> None:
        if self.fast is None:
            self.fast = FastScorer(self.pipeline)

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """(task type, confidence) for each text."""
        if not texts:
            return []
        if len(texts) <= 64:
            probabilities, classes = self.fast.predict_proba(list(texts)), self.fast.classes_
        else:
            probabilities, classes = self.pipeline.predict_proba(list(texts)), self.pipeline.classes_
        best = probabilities.argmax(axis=1)
        return [(str(classes[i]), float(probabilities[row, i])) for row, i in enumerate(best)]


def load_version(record: ClassifierVersion) -> TaskClassifier:
    """Load a stored version after checking its hash and that it was trained with the installed
    library versions; otherwise a ClassifierError saying to retrain."""
    if hashlib.sha256(record.artifact).hexdigest() != record.artifact_sha256:
        raise ClassifierError(f"classifier version {record.version} is corrupted (hash mismatch); run: specroute train")
    installed = library_versions()
    stored = dict(record.library_versions)
    differing = {k: (stored.get(k, "none"), installed.get(k, "none")) for k in sorted(set(stored) | set(installed))
                 if stored.get(k) != installed.get(k)}
    if differing:
        detail = ", ".join(f"{k} {old} (installed {new})" for k, (old, new) in sorted(differing.items()))
        raise ClassifierError(f"classifier version {record.version} was trained with {detail}; run: specroute train")
    pipeline = pickle.loads(record.artifact)  # specroute's own artifact, hash-checked above
    return TaskClassifier(record.id, record.version, list(record.labels), pipeline)


def load_active(session: Session) -> TaskClassifier | None:
    """The active classifier, or None when none has been trained."""
    record = session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))
    return load_version(record) if record is not None else None


def label_run_results(session: Session, run_id: int, classifier: TaskClassifier) -> int:
    """Give every unlabelled prompt of a run the classifier's task type, recording the version;
    returns how many results were labelled."""
    results = session.scalars(select(PromptResult).where(PromptResult.run_id == run_id))
    unlabelled = [r for r in results if r.task_source != "label"]
    predictions = classifier.predict([prompt_text(r.prompt.text, r.prompt.messages) for r in unlabelled])
    for result, (task, _confidence) in zip(unlabelled, predictions):
        result.task_type, result.task_source, result.classifier_version_id = task, "classifier", classifier.version_id
    return len(unlabelled)
