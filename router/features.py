"""What the task classifier sees of a prompt: its text, and a few structural features that word and
character n-grams miss (code fences, JSON shape, script, length). Also the keyword baseline the
classifier has to beat."""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

_FENCE = re.compile(r"```")
_CODE_WORDS = re.compile(r"\b(def|function|class|return|import|const|var|let|public|void|#include|SELECT)\b")
_JSON_KEY = re.compile(r'"[^"\n]{1,40}"\s*:')
_URL = re.compile(r"https?://")
_LETTER = re.compile(r"[^\W\d_]")
_NON_LATIN_LETTER = re.compile(r"[^\W\d_\u0000-\u024F]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_DIGIT = re.compile(r"\d")
CHAR_NGRAM_CHARS = 1000
# Bumped whenever what the classifier sees changes; stored classifiers of another version are refused.
FEATURES_VERSION = "2"
STRUCTURAL_FEATURES = (
    "log_chars", "log_lines", "code_fences", "code_words", "braces", "json_keys", "non_ascii",
    "non_latin_letters", "digits", "question_marks", "urls", "starts_translate", "starts_summarize",
)


def prompt_text(text: str | None = None, messages: Sequence[dict[str, Any]] | None = None) -> str:
    """The text to classify: the plain prompt, or the chat messages as "role: content" lines."""
    if messages:
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)
    return text or ""


def structural_row(text: str) -> list[float]:
    """The structural features of one prompt, in STRUCTURAL_FEATURES order (counts are log-scaled)."""
    chars = max(len(text), 1)
    letters = len(_LETTER.findall(text))
    non_latin = len(_NON_LATIN_LETTER.findall(text)) / max(letters, 1)
    head = text.lstrip()[:40].lower()
    return [
        np.log1p(len(text)),
        np.log1p(text.count("\n")),
        np.log1p(len(_FENCE.findall(text))),
        np.log1p(len(_CODE_WORDS.findall(text))),
        np.log1p(text.count("{") + text.count("}")),
        np.log1p(len(_JSON_KEY.findall(text))),
        len(_NON_ASCII.findall(text)) / chars,
        non_latin,
        len(_DIGIT.findall(text)) / chars,
        np.log1p(text.count("?")),
        np.log1p(len(_URL.findall(text))),
        1.0 if head.startswith("translate") else 0.0,
        1.0 if head.startswith(("summarize", "summarise", "tl;dr")) else 0.0,
    ]


def char_ngram_text(text: str) -> str:
    """What the character n-grams see: the lower-cased first CHAR_NGRAM_CHARS characters (the task
    shows in how a prompt starts; this keeps a decision on a long prompt well under a millisecond)."""
    return text[:CHAR_NGRAM_CHARS].lower()


def structural_features(texts: Sequence[str]) -> np.ndarray:
    """Structural features of many prompts, shape (n, len(STRUCTURAL_FEATURES)); used inside the
    scikit-learn pipeline through a FunctionTransformer."""
    return np.asarray([structural_row(t) for t in texts], dtype=np.float64).reshape(len(texts), len(STRUCTURAL_FEATURES))


def keyword_baseline(text: str) -> str:
    """The seed's keyword rules: ``` or "def " or "function" -> code; "{" and ":" -> structured_output;
    "summarize" -> summarization; "write a story" or "create" -> creative_writing; else general."""
    lowered = text.lower()
    if "```" in text or "def " in text or "function" in lowered:
        return "code"
    if "{" in text and ":" in text:
        return "structured_output"
    if "summarize" in lowered:
        return "summarization"
    if "write a story" in lowered or "create" in lowered:
        return "creative_writing"
    return "general"
