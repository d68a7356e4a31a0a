"""Checks on one record of a prompt file, and the collector that gathers every problem in a file.

A record is checked field by field (prompt text, task label, id) and then offered to a
:class:`PromptCollector`, which enforces the limits (:class:`IngestLimits`), rejects an id reused by
another prompt and merges a prompt repeated within the file into its first occurrence (two prompts
are the same when their :func:`content_hash` is). Every problem becomes a :class:`ValidationIssue`
with its line and field; nothing here raises for bad input. The file formats themselves are read in
:mod:`analyzer.prompts.ingest`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

MAX_LABEL_CHARS = 64
MAX_ID_CHARS = 200
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATES = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class IngestLimits:
    """Limits applied while parsing (see the ``max_*`` settings)."""

    max_bytes: int = 20_000_000
    max_prompt_chars: int = 100_000
    max_prompts: int = 50_000
    max_reported_errors: int = 50

    @classmethod
    def from_settings(cls, settings) -> "IngestLimits":
        """The limits configured in a :class:`analyzer.settings.Settings`."""
        return cls(
            max_bytes=settings.max_upload_bytes,
            max_prompt_chars=settings.max_prompt_chars,
            max_prompts=settings.max_prompts,
            max_reported_errors=settings.max_reported_errors,
        )


@dataclass(frozen=True)
class ValidationIssue:
    """One problem: the 1-based line it starts on (None for the whole file), the field, and what is wrong."""

    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "file"
        if self.field:
            where += f", field '{self.field}'"
        return f"{where}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class ParsedPrompt:
    """A checked prompt: exactly one of ``text`` and ``messages`` is set."""

    line: int
    text: str | None
    messages: list[dict[str, str]] | None
    task: str | None
    external_id: str | None
    content_hash: str
    char_count: int


@dataclass(frozen=True)
class DuplicateNotice:
    """A prompt on ``line`` repeated the one on ``first_line`` and was merged into it."""

    line: int
    first_line: int
    note: str

    def __str__(self) -> str:
        return f"line {self.line}: same prompt as line {self.first_line}, merged{self.note}"


def content_hash(text: str | None, messages: list[dict[str, str]] | None) -> str:
    """SHA-256 of the canonical JSON form of a prompt: the key two prompts are duplicates by."""
    payload = {"text": text} if messages is None else {"messages": messages}
    canonical = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class PromptCollector:
    """The issues and accepted prompts of one file. Every issue is kept (the caller reports the first
    few and counts them all); the field checks record an issue and return a verdict, so a parser can
    check every field of a record before deciding whether to :meth:`add` it."""

    def __init__(self, limits: IngestLimits):
        self.limits = limits
        self.issues: list[ValidationIssue] = []
        self.records = 0
        self.prompts: list[ParsedPrompt] = []
        self.duplicates: list[DuplicateNotice] = []
        self._by_hash: dict[str, ParsedPrompt] = {}
        self._id_lines: dict[str, tuple[int, str]] = {}

    def error(self, line: int | None, field_name: str | None, message: str) -> None:
        """Record a problem on ``line`` (None: the whole file) in ``field_name`` (None: the record)."""
        # text quoted from an undecodable line holds surrogates; show them as escapes, never raw
        message = _SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", message)
        self.issues.append(ValidationIssue(line, field_name, message))

    def check_string(self, line: int, field_name: str, value: str) -> bool:
        """Whether ``value`` is free of unpaired surrogates (from invalid UTF-8 or a bad ``\\u`` escape)."""
        if _SURROGATES.search(value):
            self.error(line, field_name, "contains an unpaired UTF-16 surrogate (invalid \\u escape)")
            return False
        return True

    def check_text(self, line: int, field_name: str, value: Any) -> str | None:
        """``value`` if it is a non-blank string without surrogates, else None (and an issue)."""
        if not isinstance(value, str):
            self.error(line, field_name, f"expected a string, got {json_type_name(value)}")
            return None
        if not self.check_string(line, field_name, value):
            return None
        if not value.strip():
            self.error(line, field_name, "empty prompt")
            return None
        return value

    def label(self, line: int, field_name: str, value: Any) -> tuple[bool, str | None]:
        """(ok, task label): the label stripped and lower-cased, None when absent or empty; not ok for a
        non-string, one over MAX_LABEL_CHARS or one with control characters."""
        if value is None:
            return True, None
        if not isinstance(value, str):
            self.error(line, field_name, f"expected a string, got {json_type_name(value)}")
            return False, None
        label = value.strip().lower()
        if not self.check_string(line, field_name, label):
            return False, None
        if len(label) > MAX_LABEL_CHARS:
            self.error(line, field_name, f"task label longer than {MAX_LABEL_CHARS} characters")
            return False, None
        if _CONTROL_CHARS.search(label):
            self.error(line, field_name, "task label contains control characters")
            return False, None
        return True, label or None

    def identifier(self, line: int, field_name: str, value: Any) -> tuple[bool, str | None]:
        """(ok, external id): a string or integer as a stripped string, None when absent or empty; not ok
        for another type or one over MAX_ID_CHARS."""
        if value is None:
            return True, None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            self.error(line, field_name, f"expected a string or an integer, got {json_type_name(value)}")
            return False, None
        ident = str(value).strip()
        if not self.check_string(line, field_name, ident):
            return False, None
        if len(ident) > MAX_ID_CHARS:
            self.error(line, field_name, f"id longer than {MAX_ID_CHARS} characters")
            return False, None
        return True, ident or None

    def add(
        self,
        line: int,
        text: str | None,
        messages: list[dict[str, str]] | None,
        task: str | None,
        external_id: str | None,
        length_field: str,
    ) -> None:
        """Count a record; check its length and id; keep it unless it repeats an earlier prompt."""
        self.records += 1
        if self.records == self.limits.max_prompts + 1:
            self.error(
                line,
                None,
                f"more than {self.limits.max_prompts} prompts (SPECROUTE_MAX_PROMPTS); split the file",
            )
        chars = len(text) if text is not None else sum(len(m["content"]) for m in messages or [])
        if chars > self.limits.max_prompt_chars:
            self.error(
                line,
                length_field,
                f"prompt is {chars} characters, over the limit of {self.limits.max_prompt_chars}"
                " (SPECROUTE_MAX_PROMPT_CHARS)",
            )
            return
        digest = content_hash(text, messages)
        first = self._by_hash.get(digest)
        if external_id is not None:
            seen = self._id_lines.get(external_id)
            if seen is not None and seen[1] != digest:
                self.error(
                    line, "id", f"id '{external_id}' is already used on line {seen[0]} by another prompt"
                )
                return
            self._id_lines.setdefault(external_id, (line, digest))
        if first is not None:
            note = ""
            if task != first.task:
                note = f"; kept task '{first.task}' from line {first.line}, dropped '{task}'"
            self.duplicates.append(DuplicateNotice(line, first.line, note))
            return
        prompt = ParsedPrompt(line, text, messages, task, external_id, digest, chars)
        self._by_hash[digest] = prompt
        self.prompts.append(prompt)


def json_type_name(value: Any) -> str:
    """What a decoded JSON value is, as an error message names it (``"a list"``, ``"null"``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class MessageProblem(NamedTuple):
    """What is wrong with a chat message list: ``where`` relative to the list ("", "[2]",
    "[2].role"), ``message`` in words, and ``code``, what callers branch on (one of
    :data:`MESSAGE_PROBLEMS`)."""

    where: str
    message: str
    code: str


MESSAGE_PROBLEMS = ("not_a_list", "empty_list", "not_an_object", "bad_role", "bad_content", "empty_prompt")


def message_problem(messages: Any) -> MessageProblem | None:
    """The first thing wrong with a chat message list; None for a non-empty list of objects with a
    non-empty string ``role`` and a string ``content``, some content not blank. The one rule for
    files, the API and the tokenizer."""
    if not isinstance(messages, list):
        return MessageProblem(
            "", f"expected a list of messages, got {json_type_name(messages)}", "not_a_list"
        )
    if not messages:
        return MessageProblem("", "empty message list", "empty_list")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return MessageProblem(
                f"[{index}]",
                f"expected an object with 'role' and 'content', got {json_type_name(message)}",
                "not_an_object",
            )
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role.strip():
            return MessageProblem(f"[{index}].role", "expected a non-empty string", "bad_role")
        if not isinstance(content, str):
            return MessageProblem(
                f"[{index}].content", f"expected a string, got {json_type_name(content)}", "bad_content"
            )
    if not any(m["content"].strip() for m in messages):
        return MessageProblem("", "empty prompt: every message content is blank", "empty_prompt")
    return None


def request_text(text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None) -> str:
    """What the task classifier reads of a prompt, the same for both request forms: the plain prompt,
    or the chat messages' contents without role prefixes, one per line. System messages are left out
    when anything else has content (a deployment's system prompt is the same for every task, so it
    would pull every request towards one class); a single user message reads exactly as ``prompt``."""
    if not messages:
        return text or ""
    spoken = [str(m.get("content") or "") for m in messages if m.get("role") != "system"]
    if not any(part.strip() for part in spoken):
        spoken = [str(m.get("content") or "") for m in messages]
    return "\n".join(part for part in spoken if part.strip())


def prompt_text(
    text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None, separator: str = "\n"
) -> str:
    """A prompt as one text for people: the plain prompt, or the chat messages as "role: content"
    lines (joined by ``separator``). The classifier reads :func:`request_text` instead."""
    if messages:
        return separator.join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)
    return text or ""
