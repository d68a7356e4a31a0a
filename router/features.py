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
    letters = [c for c in text if c.isalpha()]
    non_latin = sum(1 for c in letters if ord(c) > 0x24F) / max(len(letters), 1)
    head = text.lstrip().lower()[:40]
    return [
        np.log1p(len(text)),
        np.log1p(text.count("\n")),
        np.log1p(len(_FENCE.findall(text))),
        np.log1p(len(_CODE_WORDS.findall(text))),
        np.log1p(text.count("{") + text.count("}")),
        np.log1p(len(_JSON_KEY.findall(text))),
        sum(1 for c in text if ord(c) > 127) / chars,
        non_latin,
        sum(c.isdigit() for c in text) / chars,
        np.log1p(text.count("?")),
        np.log1p(len(_URL.findall(text))),
        1.0 if head.startswith("translate") else 0.0,
        1.0 if head.startswith(("summarize", "summarise", "tl;dr")) else 0.0,
    ]


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
