"""What the task classifier sees of a prompt: its text, and a few structural features that word and
character n-grams miss (code fences, JSON shape, script, length). Also the keyword baseline the
classifier has to beat."""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

_CODE_WORDS = re.compile(r"\b(def|function|class|return|import|const|var|let|public|void|#include|SELECT)\b")
_JSON_KEY = re.compile(r'"[^"\n]{1,40}"\s*:')
_NON_LATIN_LETTER = re.compile(r"[^\W\d_\u0000-\u024F]")
CLASSIFIER_CHARS = 500
# Bumped whenever what the classifier sees changes; stored classifiers of another version are refused.
FEATURES_VERSION = "2"
STRUCTURAL_FEATURES = (
    "log_chars",
    "log_lines",
    "code_fences",
    "code_words",
    "braces",
    "json_keys",
    "non_ascii",
    "non_latin_letters",
    "digits",
    "question_marks",
    "urls",
    "starts_translate",
    "starts_summarize",
)


def structural_row(text: str) -> list[float]:
    """The structural features of one prompt, in STRUCTURAL_FEATURES order (counts are log-scaled)."""
    chars = max(len(text), 1)
    ascii_only = text.isascii()
    # share of the non-space characters that are letters beyond Latin (Cyrillic, CJK, Arabic, ...)
    non_latin = (
        0.0 if ascii_only else len(_NON_LATIN_LETTER.findall(text)) / max(len(text) - text.count(" "), 1)
    )
    non_ascii = 0 if ascii_only else len(text) - len(text.encode("ascii", "ignore"))
    head = text.lstrip()[:40].lower()
    return [
        math.log1p(len(text)),
        math.log1p(text.count("\n")),
        math.log1p(text.count("```")),
        math.log1p(len(_CODE_WORDS.findall(text))),
        math.log1p(text.count("{") + text.count("}")),
        math.log1p(len(_JSON_KEY.findall(text))),
        non_ascii / chars,
        non_latin,
        sum(text.count(digit) for digit in "0123456789") / chars,
        math.log1p(text.count("?")),
        math.log1p(text.count("http://") + text.count("https://")),
        1.0 if head.startswith("translate") else 0.0,
        1.0 if head.startswith(("summarize", "summarise", "tl;dr")) else 0.0,
    ]


def classifier_text(text: str) -> str:
    """What the word and character n-grams see: the lower-cased first CLASSIFIER_CHARS characters
    (the task shows in how a prompt starts, and this keeps a decision on a long prompt under a
    millisecond); the structural features see the whole prompt."""
    return text[:CLASSIFIER_CHARS].lower()


def structural_features(texts: Sequence[str]) -> np.ndarray:
    """Structural features of many prompts, shape (n, len(STRUCTURAL_FEATURES)); used inside the
    scikit-learn pipeline through a FunctionTransformer."""
    return np.asarray([structural_row(t) for t in texts], dtype=np.float64).reshape(
        len(texts), len(STRUCTURAL_FEATURES)
    )


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
