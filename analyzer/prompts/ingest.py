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
The only exception this module raises for bad input is :class:`PromptFileError`. The checks on
each record (text, label, id, limits, duplicates) are in :mod:`analyzer.prompts.prompt_checks`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from analyzer.errors import SpecrouteError
from analyzer.prompts.prompt_checks import (
    DuplicateNotice,
    IngestLimits,
    ParsedPrompt,
    PromptCollector,
    ValidationIssue,
    json_type_name,
    message_problem,
)

FORMATS = ("txt", "jsonl", "csv")


class PromptFileError(SpecrouteError, ValueError):
    """A prompt file was rejected. ``issues`` holds the first problems (in line order) and
    ``total`` counts them all (both also in ``details``)."""

    status, code = 400, "invalid_prompt_file"

    def __init__(self, filename: str | None, issues: list[ValidationIssue], total: int):
        self.filename = filename
        self.issues = issues
        self.total = total
        super().__init__(self.summary(), total=total, issues=[issue.as_dict() for issue in issues])

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


@dataclass
class ParsedFile:
    """The outcome of a successful parse, prompts in file order."""

    file_format: str
    sha256: str
    prompts: list[ParsedPrompt]
    duplicates: list[DuplicateNotice] = field(default_factory=list)

    def task_counts(self) -> dict[str | None, int]:
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
        raise fail(
            f"file is {len(data)} bytes, over the limit of {limits.max_bytes} (SPECROUTE_MAX_UPLOAD_BYTES)"
        )
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

    collector = PromptCollector(limits)
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


def _check_utf8(data: bytes, collector: PromptCollector) -> set[int]:
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


def _parse_txt(text: str, bad_lines: set[int], collector: PromptCollector) -> None:
    for number, line in _lines(text):
        if number in bad_lines or not line.strip():
            continue
        if collector.check_string(number, "prompt", line):
            collector.add(number, line, None, None, None, "prompt")


def _parse_jsonl(text: str, bad_lines: set[int], collector: PromptCollector) -> None:
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
            collector.error(number, None, f"expected a JSON object, got {json_type_name(obj)}")
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
            collector.add(
                number, prompt_text, messages, task, external_id, "prompt" if messages is None else "messages"
            )


def _check_messages(number: int, value: Any, collector: PromptCollector) -> list[dict[str, str]] | None:
    problem = message_problem(value)
    if problem is not None:
        collector.error(number, "messages" + problem.where, problem.message)
        return None
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not (
            collector.check_string(number, f"{where}.role", message["role"])
            and collector.check_string(number, f"{where}.content", message["content"])
        ):
            return None
    return messages


def _parse_csv(text: str, bad_lines: set[int], collector: PromptCollector, limits: IngestLimits) -> None:
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
        label_ok, task = collector.label(
            start, task_key, row[columns[task_key]] if task_key in columns else None
        )
        id_ok, external_id = collector.identifier(
            start, "id", row[columns["id"]] if "id" in columns else None
        )
        if prompt_text is not None and label_ok and id_ok:
            collector.add(start, prompt_text, None, task, external_id, "prompt")
