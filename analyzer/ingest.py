"""Parse and check a prompt file (.txt, .jsonl or .csv) completely before anything is stored.

Formats:
- ``.txt``: one prompt per line; blank (whitespace-only) lines are skipped; a trailing ``\\r`` is
  dropped, everything else on the line is the prompt.
- ``.jsonl``: one JSON object per line with ``prompt`` (string) or ``messages`` (a non-empty list of
  ``{"role": str, "content": str}``), optional ``task`` (or ``category``), optional ``id`` (string or
  integer). Other keys are ignored.
- ``.csv``: a header row with a ``prompt`` column, optional ``task`` (or ``category``) and ``id``
  columns; other columns are ignored. RFC 4180 quoting, so prompts may span lines.

Every problem is collected and reported at once (the first ``max_reported_errors``, each with its
line and field, plus the total), so a user fixes a file in one pass. A file with any error yields no
prompts at all. Prompts repeated within a file are merged into the first occurrence and reported as
notices, not errors. Task labels are stripped and lower-cased; an empty label means "unlabelled".
The only exception this module raises for bad input is :class:`PromptFileError`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

FORMATS = ("txt", "jsonl", "csv")
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


class PromptFileError(ValueError):
    """A prompt file was rejected. ``issues`` holds the first problems (in line order) and
    ``total`` counts them all."""

    def __init__(self, filename: str | None, issues: list[ValidationIssue], total: int):
        self.filename = filename
        self.issues = issues
        self.total = total
        super().__init__(self.summary())

    def summary(self) -> str:
        name = self.filename or "prompt file"
        noun = "error" if self.total == 1 else "errors"
        return f"{name}: {self.total} {noun}; nothing was imported"

    def report(self) -> str:
        """A multi-line report: the summary, then one line per listed issue."""
        lines = [self.summary()] + [f"  {issue}" for issue in self.issues]
        if self.total > len(self.issues):
            lines.append(f"  ... and {self.total - len(self.issues)} more")
        return "\n".join(lines)


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


@dataclass
class ParsedFile:
    """The outcome of a successful parse, prompts in file order."""

    file_format: str
    sha256: str
    prompts: list[ParsedPrompt]
    duplicates: list[DuplicateNotice] = field(default_factory=list)

    def task_counts(self) -> dict[str, int]:
        """Number of prompts per task label (``None`` for unlabelled)."""
        return dict(Counter(p.task for p in self.prompts))


def detect_format(filename: str | None) -> str:
    """The format named by the file's extension; a :class:`PromptFileError` for any other."""
    suffix = PurePath(filename or "").suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    raise PromptFileError(
        filename,
        [ValidationIssue(None, None, f"unsupported file type '.{suffix}'; use .txt, .jsonl or .csv")],
        1,
    )


def content_hash(text: str | None, messages: list[dict[str, str]] | None) -> str:
    """SHA-256 of the canonical JSON form of a prompt: the key two prompts are duplicates by."""
    payload = {"text": text} if messages is None else {"messages": messages}
    canonical = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class _Collector:
    """Collects issues (all counted, the first ``keep`` kept) and accepted prompts."""

    def __init__(self, limits: IngestLimits):
        self.limits = limits
        self.issues: list[ValidationIssue] = []
        self.records = 0
        self.prompts: list[ParsedPrompt] = []
        self.duplicates: list[DuplicateNotice] = []
        self._by_hash: dict[str, ParsedPrompt] = {}
        self._id_lines: dict[str, tuple[int, str]] = {}

    def error(self, line: int | None, field_name: str | None, message: str) -> None:
        # text quoted from an undecodable line holds surrogates; show them as escapes, never raw
        message = _SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", message)
        self.issues.append(ValidationIssue(line, field_name, message))

    def check_string(self, line: int, field_name: str, value: str) -> bool:
        if _SURROGATES.search(value):
            self.error(line, field_name, "contains an unpaired UTF-16 surrogate (invalid \\u escape)")
            return False
        return True

    def check_text(self, line: int, field_name: str, value: Any) -> str | None:
        if not isinstance(value, str):
            self.error(line, field_name, f"expected a string, got {_json_type(value)}")
            return None
        if not self.check_string(line, field_name, value):
            return None
        if not value.strip():
            self.error(line, field_name, "empty prompt")
            return None
        return value

    def label(self, line: int, field_name: str, value: Any) -> tuple[bool, str | None]:
        if value is None:
            return True, None
        if not isinstance(value, str):
            self.error(line, field_name, f"expected a string, got {_json_type(value)}")
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
        if value is None:
            return True, None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            self.error(line, field_name, f"expected a string or an integer, got {_json_type(value)}")
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
                self.error(line, "id", f"id '{external_id}' is already used on line {seen[0]} by another prompt")
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


def parse_prompt_file(
    data: bytes,
    filename: str | None = None,
    *,
    file_format: str | None = None,
    limits: IngestLimits | None = None,
) -> ParsedFile:
    """Parse and check ``data`` as a prompt file. The format comes from ``file_format`` or
    else from the extension of ``filename``. Returns the prompts in file order, or raises
    :class:`PromptFileError` listing every problem found."""
    limits = limits or IngestLimits()
    fmt = file_format.lower() if file_format else detect_format(filename)
    if fmt not in FORMATS:
        raise PromptFileError(filename, [ValidationIssue(None, None, f"unknown format '{fmt}'")], 1)

    def fail(message: str, line: int | None = None) -> PromptFileError:
        return PromptFileError(filename, [ValidationIssue(line, None, message)], 1)

    if len(data) > limits.max_bytes:
        raise fail(f"file is {len(data)} bytes, over the limit of {limits.max_bytes} (SPECROUTE_MAX_UPLOAD_BYTES)")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise fail("file is UTF-16 encoded; save it as UTF-8")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        column = nul - data.rfind(b"\n", 0, nul)
        raise fail(f"binary content (NUL byte at column {column}); expected a UTF-8 text file", line)
    if not data.strip():
        raise fail("file is empty")

    collector = _Collector(limits)
    bad_lines = _check_utf8(data, collector)
    text = data.decode("utf-8", errors="surrogateescape")
    if fmt == "txt":
        _parse_txt(text, bad_lines, collector)
    elif fmt == "jsonl":
        _parse_jsonl(text, bad_lines, collector)
    else:
        _parse_csv(text, bad_lines, collector, limits)

    if not collector.issues and not collector.prompts:
        collector.error(None, None, "no prompts found")
    if collector.issues:
        ordered = sorted(collector.issues, key=lambda i: (i.line is not None, i.line or 0))
        raise PromptFileError(filename, ordered[: limits.max_reported_errors], len(ordered))
    return ParsedFile(fmt, hashlib.sha256(data).hexdigest(), collector.prompts, collector.duplicates)


def _check_utf8(data: bytes, collector: _Collector) -> set[int]:
    bad: set[int] = set()
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.add(number)
            collector.error(
                number, None, f"invalid UTF-8 at column {exc.start + 1} (byte 0x{raw[exc.start]:02x})"
            )
    return bad


def _lines(text: str):
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line[:-1] if line.endswith("\r") else line


def _parse_txt(text: str, bad_lines: set[int], collector: _Collector) -> None:
    for number, line in _lines(text):
        if number in bad_lines or not line.strip():
            continue
        if collector.check_string(number, "prompt", line):
            collector.add(number, line, None, None, None, "prompt")


def _parse_jsonl(text: str, bad_lines: set[int], collector: _Collector) -> None:
    for number, line in _lines(text):
        if number in bad_lines or not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            collector.error(number, None, f"bad JSON: {detail}")
            continue
        if not isinstance(obj, dict):
            collector.error(number, None, f"expected a JSON object, got {_json_type(obj)}")
            continue
        ok = True
        has_prompt, has_messages = "prompt" in obj, "messages" in obj
        prompt_text = messages = None
        if has_prompt and has_messages:
            collector.error(number, "messages", "give either 'prompt' or 'messages', not both")
            ok = False
        elif has_prompt:
            prompt_text = collector.check_text(number, "prompt", obj["prompt"])
            ok = prompt_text is not None
        elif has_messages:
            messages = _check_messages(number, obj["messages"], collector)
            ok = messages is not None
        else:
            collector.error(number, "prompt", "missing field: each line needs 'prompt' or 'messages'")
            ok = False
        task_key = "task" if "task" in obj else "category"
        label_ok, task = collector.label(number, task_key, obj.get(task_key))
        id_ok, external_id = collector.identifier(number, "id", obj.get("id"))
        if ok and label_ok and id_ok:
            collector.add(number, prompt_text, messages, task, external_id,
                          "prompt" if messages is None else "messages")


def _check_messages(number: int, value: Any, collector: _Collector) -> list[dict[str, str]] | None:
    if not isinstance(value, list):
        collector.error(number, "messages", f"expected a list of messages, got {_json_type(value)}")
        return None
    if not value:
        collector.error(number, "messages", "empty message list")
        return None
    messages: list[dict[str, str]] = []
    for index, item in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            collector.error(number, where, f"expected an object with 'role' and 'content', got {_json_type(item)}")
            return None
        role, content = item.get("role"), item.get("content")
        if not isinstance(role, str) or not role.strip():
            collector.error(number, f"{where}.role", "expected a non-empty string")
            return None
        if not isinstance(content, str):
            collector.error(number, f"{where}.content", f"expected a string, got {_json_type(content)}")
            return None
        if not (collector.check_string(number, f"{where}.role", role)
                and collector.check_string(number, f"{where}.content", content)):
            return None
        messages.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in messages):
        collector.error(number, "messages", "empty prompt: every message content is blank")
        return None
    return messages


def _parse_csv(text: str, bad_lines: set[int], collector: _Collector, limits: IngestLimits) -> None:
    # The csv module's field limit is process-wide; only ever raise it, to what this file may need.
    csv.field_size_limit(max(csv.field_size_limit(), limits.max_bytes))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    columns: dict[str, int] = {}
    last_line = 0
    while True:
        start = last_line + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            collector.error(reader.line_num or start, None, f"bad CSV: {exc}")
            return
        end = reader.line_num
        last_line = end
        spans_bad = any(n in bad_lines for n in range(start, end + 1))
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if header is None:
            header = [name.strip().lower() for name in row]
            repeated = sorted({name for name in header if header.count(name) > 1 and name})
            if repeated:
                collector.error(start, None, f"header repeats column(s): {', '.join(repeated)}")
                return
            if "prompt" not in header:
                found = ", ".join(name for name in header if name) or "none"
                collector.error(start, "prompt", f"missing column 'prompt' in the header (found: {found})")
                return
            columns = {name: i for i, name in enumerate(header)}
            continue
        if spans_bad:
            continue
        if len(row) != len(header):
            collector.error(start, None, f"expected {len(header)} fields as in the header, got {len(row)}")
            continue
        prompt_text = collector.check_text(start, "prompt", row[columns["prompt"]])
        task_key = "task" if "task" in columns else "category"
        label_ok, task = collector.label(start, task_key, row[columns[task_key]] if task_key in columns else None)
        id_ok, external_id = collector.identifier(start, "id", row[columns["id"]] if "id" in columns else None)
        if prompt_text is not None and label_ok and id_ok:
            collector.add(start, prompt_text, None, task, external_id, "prompt")


def _json_type(value: Any) -> str:
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
