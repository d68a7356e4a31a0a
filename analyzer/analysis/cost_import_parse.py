"""Reading a cost profile file (:mod:`analyzer.analysis.cost_import`, the file format): JSON (one profile
object, a list of them, or ``{"profiles": [...]}``) or CSV, each profile with the line of each of its
fields, then checked (:mod:`analyzer.analysis.cost_import_checks`); :func:`parse_cost_file` raises one
:class:`~analyzer.analysis.cost_import.CostFileError` with every problem of the file."""

from __future__ import annotations

import bisect
import csv
import io
import json
import re
from typing import Any

from analyzer.analysis.cost_import import CostFileError, ImportedProfile
from analyzer.analysis.cost_import_checks import REPORTED, checked, repeated_in_file
from analyzer.json_input import JsonInputError, loads_untrusted

MAX_FILE_BYTES = 2_000_000
LIST_COLUMN = re.compile(r"^(t|round)(\d+)_ms$")
# a JSON string token (escapes included) and, where it is a key, the colon after it
STRING_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")(\s*:)?', re.DOTALL)


def parse_cost_file(data: bytes, filename: str) -> list[ImportedProfile]:
    """Every profile of a JSON or CSV cost file (by extension, else by its first character), checked;
    a :class:`CostFileError` lists every problem with its line and field."""
    if len(data) > MAX_FILE_BYTES:
        raise CostFileError(
            filename, [f"the file has {len(data)} bytes; at most {MAX_FILE_BYTES} are accepted"]
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CostFileError(
            filename, [f"line {line}: invalid UTF-8 (byte 0x{data[exc.start]:02x})"]
        ) from None
    lowered = filename.lower()
    is_json = lowered.endswith(".json") or (not lowered.endswith(".csv") and text.lstrip()[:1] in "[{")
    problems: list[str] = []
    rows = _json_rows(text, problems) if is_json else _csv_rows(text, problems)
    profiles = []
    for line, fields, row in rows:
        profile = checked(line, fields, row, problems)
        if profile is not None:
            profiles.append(profile)
    if not rows and not problems:
        problems.append("line 1: no cost profile in the file")
    problems.extend(repeated_in_file(profiles))
    if problems:
        raise CostFileError(filename, problems)
    return profiles


def _json_rows(text: str, problems: list[str]) -> list[tuple[int, dict[str, int], dict[str, Any]]]:
    """(line of the object, line of each key, the object) for each profile of a JSON file."""
    try:
        document = loads_untrusted(text, subject="the file")
    except JsonInputError as exc:
        details = exc.details
        problems.append(
            f"line {details['line']}: bad JSON: {details['reason']} at column {details['column']}"
            if "reason" in details
            else f"line 1: {exc.message}"
        )
        return []
    if isinstance(document, dict) and "profiles" in document:
        objects, start = document["profiles"], _after(text, r'"profiles"\s*:\s*\[')
    elif isinstance(document, list):
        objects, start = document, _after(text, r"\[")
    else:
        objects, start = [document], None
    if not isinstance(objects, list):
        problems.append("line 1, field 'profiles': expected a list of profile objects")
        return []
    spans = _element_spans(text, start) if start is not None else [(text.index("{"), len(text))]
    newlines = [found.start() for found in re.finditer("\n", text)]
    rows = []
    for number, (obj, (begin, end)) in enumerate(zip(objects, spans), start=1):
        line = bisect.bisect_left(newlines, begin) + 1
        if not isinstance(obj, dict):
            problems.append(f"line {line}: profile {number} is not an object")
            continue
        found = _key_offsets(text, begin, end, set(obj))
        key_lines = {
            key: bisect.bisect_left(newlines, found[key]) + 1 if key in found else line for key in obj
        }
        rows.append((line, key_lines, obj))
    return rows


def _key_offsets(text: str, begin: int, end: int, keys: set[str]) -> dict[str, int]:
    """Where each of ``keys`` first stands as a key (``"key":``) in ``text[begin:end]``: one pass over the
    span's strings, so a file is read in time linear in its size (a search per key, each counting lines from
    the file's start, would take time growing with keys times size)."""
    found: dict[str, int] = {}
    for match in STRING_TOKEN.finditer(text, begin, end):
        if match.group(2) is None:  # a string that is not followed by a colon: a value
            continue
        try:
            key = json.loads(match.group(1))
        except ValueError:
            continue
        if key in keys and key not in found:
            found[key] = match.start()
            if len(found) == len(keys):
                break
    return found


def _after(text: str, pattern: str) -> int | None:
    found = re.search(pattern, text)
    return found.end() if found else None


def _element_spans(text: str, position: int) -> list[tuple[int, int]]:
    """The (start, end) offsets of each element of the JSON array whose body starts at ``position``."""
    decoder, spans = json.JSONDecoder(), []
    whitespace = re.compile(r"[\s,]*")
    position = whitespace.match(text, position).end()  # type: ignore[union-attr]
    while position < len(text) and text[position] != "]":
        _, end = decoder.raw_decode(text, position)
        spans.append((position, end))
        position = whitespace.match(text, end).end()  # type: ignore[union-attr]
    return spans


def _csv_rows(text: str, problems: list[str]) -> list[tuple[int, dict[str, int], dict[str, Any]]]:
    """Each data row of a CSV file as a profile object: the ``t<k>_ms`` / ``round<k>_ms`` columns
    gathered into ``target_step_ms`` / ``round_ms`` (in k order, blank cells ending the list)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return []
    except csv.Error as exc:
        problems.append(f"line 1: bad CSV: {exc}")
        return []
    rows = []
    for values in reader:
        line = reader.line_num
        if not any(v.strip() for v in values):
            continue
        if len(values) != len(header):
            problems.append(f"line {line}: {len(values)} cells for {len(header)} columns")
            continue
        row = _csv_profile(line, header, values, problems)
        rows.append((line, {key: line for key in row}, row))
    return rows


def _csv_profile(line: int, header: list[str], values: list[str], problems: list[str]) -> dict[str, Any]:
    """The profile object of one CSV row: its non-blank cells by column, the list columns gathered."""
    row: dict[str, Any] = {}
    lists: dict[str, dict[int, str]] = {"target_step_ms": {}, "round_ms": {}}
    for name, value in zip(header, values):
        value = value.strip()
        listed = LIST_COLUMN.match(name)
        if listed:
            key = "target_step_ms" if listed.group(1) == "t" else "round_ms"
            if value:
                lists[key][int(listed.group(2))] = value
        elif value:
            row[name] = value
    for key, cells in lists.items():
        if cells:
            ks = sorted(cells)
            if ks != list(range(1, len(ks) + 1)):
                column = "t" if key == "target_step_ms" else "round"
                problems.append(
                    f"line {line}, field '{key}': {column}<k>_ms cells must run from k = 1 without gaps"
                )
                row[key] = REPORTED
                continue
            row[key] = [cells[k] for k in ks]
    return row
