"""Cost profiles from an engine's own benchmarks (``specroute costs import FILE``, the web UI's cost
profiles page): the step times vLLM, SGLang, TensorRT-LLM or llama.cpp measure with CUDA graphs and
fused kernels, stored beside the profiles analyses measure, to price stored acceptance with
(:mod:`analyzer.analysis.repricing`). The acceptance side of speculative decoding is engine-independent (the
same greedy tokens); the cost side must come from the engine that serves.

A file is JSON (one profile object, a list of them, or ``{"profiles": [...]}``) or CSV (a header,
then one profile per row). Each profile gives the engine (and its version), the device, the dtype,
the batch size, optionally the pair (``target`` and ``draft`` model specs; else the pair of the run
named on import) and its step times in milliseconds, in one of two shapes:

- **forwards**: ``target_step_ms`` = T_t(1..K), one target forward over k new tokens with a warm
  cache, and ``draft_step_ms`` (one draft step: a model's single-token forward, or one n-gram
  lookup), with optional ``round_overhead_ms`` / ``decode_overhead_ms`` (the engine's own time per
  speculative round and per plain step);
- **rounds**: ``plain_step_ms`` (one plain decoding step) and ``round_ms`` = the whole speculative
  round at num_speculative_tokens = 1..K (drafting, verifying and bookkeeping), what an engine's
  latency benchmark gives at several num_speculative_tokens. It is stored as T_t(1) = plain step,
  T_t(k+1) = round at k, with no separate draft cost or overhead.

In CSV the list columns are ``t1_ms, t2_ms, ...`` (forwards) or ``round1_ms, round2_ms, ...``
(rounds). The whole file is checked before anything is stored: every problem is reported with its
line and field, and nothing is stored if there is one. Refused like a bad value:

- an implausible magnitude: a step time (``target_step_ms``, ``plain_step_ms``, ``round_ms``) under
  MIN_STEP_MS (times in seconds, most likely) or any time over MAX_STEP_MS (in microseconds, or a
  whole generation), a batch size over MAX_BATCH_SIZE, more than MAX_K step times; a draft step of 0
  stays allowed (an n-gram lookup);
- a physically implausible shape (T(k)/T(1) below 0.9, or above 1.5 k; a round above 3 (g + 1) plain
  steps);
- a profile already stored (:func:`store_imported_profiles`: the same engine, engine_version, device,
  dtype, batch size, pair and times), or one the file gives twice;
- a ``target`` or ``draft`` that no stored run or model spec knows (a typo, most likely), unless the
  import is told it is a new pair (``new_pair``: ``--new-pair``, the web form's "new pair" box).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from analyzer.analysis.run_records import get_or_create_pair
from analyzer.errors import SpecrouteError
from analyzer.json_input import JsonInputError, loads_untrusted
from analyzer.measuring.interference import MAX_RATIO_PER_TOKEN, MIN_RATIO, implausible_ratios
from analyzer.models.specs import SpecError, parse_spec
from analyzer.orm import AnalysisRun, CostProfile, ModelPair, ModelSpec

MAX_LISTED = 50  # problems listed in a rejection (the total is always given)
MAX_FILE_BYTES = 2_000_000
MAX_K = 64  # the longest T_t(k) list accepted (gamma up to 63)
TEXT_LIMITS = {"engine": 32, "engine_version": 64, "device": 200, "dtype": 16}
IMPORTED = "imported"
# one decoding step of any model in any engine takes longer than 0.1 ms (a kernel launch alone is several
# microseconds, a forward dozens of them): a smaller value is, in practice, seconds typed as milliseconds
MIN_STEP_MS = 0.1
# and no warm step takes a minute: a larger time is in microseconds, or a whole generation's
MAX_STEP_MS = 60_000.0
# sequences decoded together: vLLM's and SGLang's largest default (max_num_seqs, max_running_requests)
# is 1024; a larger "batch size" is, in practice, a count of tokens
MAX_BATCH_SIZE = 1024
NEW_PAIR_HINT = "import with --new-pair (on the web page: tick 'new pair')"
SAME_FIELDS = "engine, engine_version, device, dtype, batch_size, target, draft and times"
# a whole round drafting g tokens: at most g draft steps (each at most about a plain step) plus a verify
# pass over g + 1 tokens (at most 1.5 (g + 1) plain steps): 3 (g + 1) plain steps leaves room for both
MAX_ROUND_RATIO_PER_TOKEN = 3.0
# how a check reports a problem: (field, message), the line found from the field
ProblemSink = Callable[[str, str], None]


class CostFileError(SpecrouteError, ValueError):
    """A cost profile file was rejected: ``problems`` (the first MAX_LISTED, in file order, each
    naming its line and field) and ``total``; nothing was stored."""

    status, code = 400, "invalid_cost_file"

    def __init__(self, filename: str, problems: list[str]):
        self.filename, self.problems, self.total = filename, problems[:MAX_LISTED], len(problems)
        noun = "problem" if self.total == 1 else "problems"
        super().__init__(
            f"{filename}: {self.total} {noun}; nothing was imported", problems=self.problems, total=self.total
        )

    def report(self) -> str:
        """The summary, then one line per listed problem."""
        lines = [str(self)] + [f"  {p}" for p in self.problems]
        if self.total > len(self.problems):
            lines.append(f"  ... and {self.total - len(self.problems)} more")
        return "\n".join(lines)


@dataclass(frozen=True)
class ImportedProfile:
    """One checked profile of a file, in seconds as profiles store them; ``line`` is where it starts."""

    line: int
    engine: str
    engine_version: str | None
    device: str
    dtype: str
    batch_size: int
    target: str | None
    draft: str | None
    target_forward_s: list[float]
    draft_step_s: float
    round_overhead_s: float | None
    decode_overhead_s: float | None
    shape: str  # forwards | rounds
    # the line of each field the row gave (a JSON object's fields may each have their own line)
    field_lines: dict[str, int] = dataclass_field(default_factory=dict, compare=False)

    def line_of(self, name: str) -> int:
        """The line of field ``name``, else the line where the profile starts."""
        return self.field_lines.get(name, self.line)

    def times_s(self) -> tuple:
        """Every time of the profile, in seconds (None for an overhead not given): what makes two
        profiles of one engine, device, dtype, batch size and pair the same."""
        return (
            tuple(self.target_forward_s),
            self.draft_step_s,
            self.round_overhead_s,
            self.decode_overhead_s,
        )


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
        profile = _checked(line, fields, row, problems)
        if profile is not None:
            profiles.append(profile)
    if not rows and not problems:
        problems.append("line 1: no cost profile in the file")
    problems.extend(_repeated_in_file(profiles))
    if problems:
        raise CostFileError(filename, problems)
    return profiles


def _repeated_in_file(profiles: list[ImportedProfile]) -> list[str]:
    """A problem for each profile that repeats an earlier one of the same file (every field the same:
    rows without a pair both take the pair given on import)."""
    first_line: dict[tuple, int] = {}
    problems = []
    for p in profiles:
        key = (p.engine, p.engine_version, p.device, p.dtype, p.batch_size, p.target, p.draft, p.times_s())
        if key in first_line:
            problems.append(
                f"line {p.line}: the same profile as line {first_line[key]} (the same {SAME_FIELDS})"
            )
        else:
            first_line[key] = p.line
    return problems


# ---------------------------------------------------------------- reading the two formats


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
    rows = []
    for number, (obj, (begin, end)) in enumerate(zip(objects, spans), start=1):
        line = text.count("\n", 0, begin) + 1
        if not isinstance(obj, dict):
            problems.append(f"line {line}: profile {number} is not an object")
            continue
        key_lines = {}
        for key in obj:
            found = re.compile(r'"' + re.escape(str(key)) + r'"\s*:').search(text, begin, end)
            key_lines[key] = text.count("\n", 0, found.start()) + 1 if found else line
        rows.append((line, key_lines, obj))
    return rows


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


LIST_COLUMN = re.compile(r"^(t|round)(\d+)_ms$")
REPORTED = object()  # a value whose problem is already listed (no follow-on problems for it)


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


# ---------------------------------------------------------------- checking one profile

KNOWN_FIELDS = {
    "engine",
    "engine_version",
    "device",
    "dtype",
    "batch_size",
    "target",
    "draft",
    "target_step_ms",
    "draft_step_ms",
    "round_overhead_ms",
    "decode_overhead_ms",
    "plain_step_ms",
    "round_ms",
}


def _checked(
    line: int, lines: dict[str, int], row: dict[str, Any], problems: list[str]
) -> ImportedProfile | None:
    """The profile of one row, or None after adding its problems (each with its line and field)."""
    before = len(problems)

    def problem(field: str, message: str) -> None:
        problems.append(f"line {lines.get(field.split('[')[0], line)}, field '{field}': {message}")

    for field in sorted(set(row) - KNOWN_FIELDS):
        problem(field, f"unknown field (known: {', '.join(sorted(KNOWN_FIELDS))})")
    texts = _texts(row, problem)
    batch_size = _batch_size(row, problem)
    pair = _pair(row, problem)
    forwards = "target_step_ms" in row
    rounds = "plain_step_ms" in row or "round_ms" in row
    if forwards == rounds:
        problem(
            "target_step_ms",
            "give target_step_ms (T_t(1..K)) with draft_step_ms, or plain_step_ms with round_ms, not both",
        )
        return None
    steps, draft, overheads = _forwards_times(row, problem) if forwards else _rounds_times(row, problem)
    if steps is not None and not _plausible_steps(steps, forwards, problem):
        steps = None
    engine, device, dtype = texts["engine"], texts["device"], texts["dtype"]
    if len(problems) > before or steps is None or draft is None or batch_size is None:
        return None
    if engine is None or device is None or dtype is None:  # each was reported as required above
        return None
    return ImportedProfile(
        line=line,
        engine=engine,
        engine_version=texts["engine_version"],
        device=device,
        dtype=dtype,
        batch_size=int(batch_size),
        target=pair["target"],
        draft=pair["draft"],
        target_forward_s=[s / 1000 for s in steps],
        draft_step_s=draft / 1000,
        round_overhead_s=None if overheads[0] is None else overheads[0] / 1000,
        decode_overhead_s=None if overheads[1] is None else overheads[1] / 1000,
        shape="forwards" if forwards else "rounds",
        field_lines=dict(lines),
    )


def _texts(row: dict[str, Any], problem: ProblemSink) -> dict[str, str | None]:
    """The text fields of :data:`TEXT_LIMITS`, stripped (None when blank: a problem unless optional)."""
    texts: dict[str, str | None] = {}
    for field, limit in TEXT_LIMITS.items():
        value = row.get(field)
        if value is None or str(value).strip() == "":
            if field != "engine_version":
                problem(field, "required")
            texts[field] = None
            continue
        text = str(value).strip()
        if len(text) > limit:
            problem(field, f"at most {limit} characters, got {len(text)}")
        texts[field] = text
    return texts


def _batch_size(row: dict[str, Any], problem: ProblemSink) -> int | None:
    """The row's batch size (1 when not given), or None after a problem."""
    batch_size = _number(row.get("batch_size", 1), "batch_size", problem, integer=True, minimum=1)
    if batch_size is not None and batch_size > MAX_BATCH_SIZE:
        problem(
            "batch_size",
            f"at most {MAX_BATCH_SIZE} sequences decoded together, got {batch_size}; the batch size counts "
            "sequences, not tokens",
        )
        return None
    return batch_size


def _pair(row: dict[str, Any], problem: ProblemSink) -> dict[str, str | None]:
    """The canonical ``target`` and ``draft`` specs the row names (None where not given or refused)."""
    pair: dict[str, str | None] = {}
    given = [f for f in ("target", "draft") if row.get(f) is not None and str(row[f]).strip()]
    for field in ("target", "draft"):
        pair[field] = None
        if field in given:
            try:
                ref = parse_spec(str(row[field]))
            except SpecError as exc:
                problem(field, str(exc))
                continue
            if field == "target" and ref.kind == "ngram":
                problem(
                    field,
                    "the target must be a model, not 'ngram' (n-gram lookup drafts, it does not verify)",
                )
                continue
            pair[field] = ref.canonical
    if len(given) == 1:
        problem("draft" if given == ["target"] else "target", "give both target and draft, or neither")
    return pair


def _forwards_times(
    row: dict[str, Any], problem: ProblemSink
) -> tuple[list[float] | None, float | None, list]:
    """(T_t(1..K), draft step, [round overhead, decode overhead]) in ms of a forwards row (None where
    refused; an overhead not given is None)."""
    steps = _ms_list(row.get("target_step_ms"), "target_step_ms", problem, minimum_length=2)
    # a draft step or an overhead may be 0 (an n-gram lookup, an engine that overlaps its bookkeeping)
    draft = _number(row.get("draft_step_ms"), "draft_step_ms", problem, minimum=0.0, maximum=MAX_STEP_MS)
    overheads = [
        _number(row[f], f, problem, minimum=0.0, maximum=MAX_STEP_MS) if f in row else None
        for f in ("round_overhead_ms", "decode_overhead_ms")
    ]
    return steps, draft, overheads


def _rounds_times(row: dict[str, Any], problem: ProblemSink) -> tuple[list[float] | None, float | None, list]:
    """As :func:`_forwards_times` for a rounds row: the plain step, then the round at 1..K speculative
    tokens, as T_t(1..K+1), with no draft step or overhead of its own."""
    plain = _number(row.get("plain_step_ms"), "plain_step_ms", problem, minimum=0.0, positive=True)
    round_ms = _ms_list(row.get("round_ms"), "round_ms", problem, minimum_length=1)
    steps = [plain] + round_ms if plain is not None and round_ms is not None else None
    for field in ("draft_step_ms", "round_overhead_ms", "decode_overhead_ms"):
        if field in row:
            problem(field, "not with plain_step_ms and round_ms (a round's time includes it)")
    return steps, 0.0, [None, None]


def _plausible_steps(steps: list[float], forwards: bool, problem: ProblemSink) -> bool:
    """Whether the step times pass the count and magnitude checks (False after a magnitude problem;
    a count or shape problem is reported and left to the caller's problem count)."""
    if len(steps) > MAX_K:
        problem("target_step_ms" if forwards else "round_ms", f"at most {MAX_K} step times, got {len(steps)}")
    named = (
        [(f"target_step_ms[{k}]", t) for k, t in enumerate(steps, start=1)]
        if forwards
        else [("plain_step_ms", steps[0])] + [(f"round_ms[{k}]", t) for k, t in enumerate(steps[1:], start=1)]
    )
    if not _plausible_magnitudes(named, problem):
        return False
    _check_shape(steps, forwards, problem)
    return True


def _check_shape(steps: list[float], forwards: bool, problem: ProblemSink) -> None:
    """A problem when T(k)/T(1) (forwards) or round / plain step (rounds) is physically implausible."""
    bound = MAX_RATIO_PER_TOKEN if forwards else MAX_ROUND_RATIO_PER_TOKEN
    odd = implausible_ratios(steps, bound, tolerance_s=0.0)  # an engine's own medians: no jitter allowance
    if odd and forwards:
        listed = ", ".join(f"{ratio:.2f} at k = {k}" for k, ratio in sorted(odd.items()))
        problem(
            "target_step_ms",
            f"physically implausible T_t(k)/T_t(1) = {listed} (a pass over k tokens takes {MIN_RATIO:g} to "
            f"{bound:g} k times a pass over one); were the times warm and in milliseconds?",
        )
    elif odd:
        listed = ", ".join(f"{ratio:.2f} at {k - 1} speculative tokens" for k, ratio in sorted(odd.items()))
        problem(
            "round_ms",
            f"physically implausible round / plain step = {listed} (a round drafting g tokens takes "
            f"{MIN_RATIO:g} to {bound:g} (g + 1) plain steps); were the times warm and in milliseconds?",
        )


def _plausible_magnitudes(named: list[tuple[str, float]], problem: ProblemSink) -> bool:
    """Whether every step time (``(field, milliseconds)`` in file order) is within MIN_STEP_MS to
    MAX_STEP_MS; else one problem per list field, at its first time outside, and False."""
    reported = set()
    for name, ms in named:
        listed = name.split("[")[0]
        if listed in reported or MIN_STEP_MS <= ms <= MAX_STEP_MS:
            continue
        reported.add(listed)
        if ms < MIN_STEP_MS:
            problem(
                name,
                f"{ms:g} ms is under {MIN_STEP_MS:g} ms, shorter than any engine's decoding step: were the "
                "times in seconds? the fields are in milliseconds",
            )
        else:
            problem(name, _too_long(ms))
    return not reported


def _too_long(ms: float) -> str:
    return (
        f"{ms:g} ms is over {MAX_STEP_MS:g} ms, a minute for one step: were the times in microseconds, "
        "or of a whole generation? the fields are in milliseconds"
    )


def _number(value, field, problem, *, integer=False, minimum=None, positive=False, maximum=None):
    """``value`` as a finite number (an int with ``integer``) at least ``minimum`` (above 0 with
    ``positive``), and at most ``maximum`` milliseconds, or None after a problem."""
    if value is None or (isinstance(value, str) and not value.strip()):
        problem(field, "required")
        return None
    if isinstance(value, bool):
        problem(field, f"expected a number, got {value!r}")
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        problem(field, f"expected a number, got {value!r}")
        return None
    if not math.isfinite(number):
        problem(field, f"expected a finite number, got {value!r}")
        return None
    if integer and number != int(number):
        problem(field, f"expected a whole number, got {value!r}")
        return None
    if (minimum is not None and number < minimum) or (positive and number <= 0):
        problem(
            field,
            f"must be {'above' if positive else 'at least'} {0 if positive else minimum:g}, got {value!r}",
        )
        return None
    if maximum is not None and number > maximum:
        problem(field, _too_long(number))
        return None
    return int(number) if integer else number


def _ms_list(value, field, problem, *, minimum_length):
    """A list of positive millisecond values, or None after a problem."""
    if value is REPORTED:
        return None
    if not isinstance(value, list) or len(value) < minimum_length:
        problem(field, f"expected a list of at least {minimum_length} times in milliseconds")
        return None
    numbers = []
    for i, item in enumerate(value, start=1):
        number = _number(item, f"{field}[{i}]", problem, positive=True)
        if number is None:
            return None
        numbers.append(number)
    return numbers


# ---------------------------------------------------------------- storing


def store_imported_profiles(
    session: Session,
    profiles: list[ImportedProfile],
    filename: str,
    *,
    for_run: int | None = None,
    new_pair: bool = False,
) -> list[CostProfile]:
    """Store checked profiles (the caller's transaction: all or nothing; hold the write lock, so that
    two imports cannot both store one profile), each for the pair its row names, else for the pair of
    run ``for_run``. A :class:`CostFileError` lists, with line and field, every profile with no pair,
    with a ``target`` or ``draft`` no stored run or model spec knows (unless ``new_pair``), or already
    stored; nothing is stored then."""
    run_pair: ModelPair | None = None
    if for_run is not None:
        run = session.get(AnalysisRun, for_run)
        if run is None:
            raise CostFileError(filename, [f"--for-run: no analysis run {for_run}"])
        run_pair = run.pair
    problems = _unstorable(session, profiles, run_pair, new_pair)
    if problems:
        raise CostFileError(filename, problems)
    stored = []
    for p in profiles:
        if p.target is None:
            # a profile without a pair was refused above unless the import is for a run
            assert run_pair is not None
            pair = run_pair
        else:
            pair = get_or_create_pair(session, parse_spec(p.target), parse_spec(p.draft or ""))
        profile = _imported_profile(p, pair, filename)
        session.add(profile)
        stored.append(profile)
    session.flush()
    return stored


def _unstorable(
    session: Session, profiles: list[ImportedProfile], run_pair: ModelPair | None, new_pair: bool
) -> list[str]:
    """A problem, with line and field, for each profile that has no pair, names a pair no stored run
    or model spec knows (unless ``new_pair``), is stored already, or repeats an earlier one."""
    problems: list[str] = []
    first_line: dict[tuple, int] = {}
    for p in profiles:
        if p.target is None and run_pair is None:
            problems.append(
                f"line {p.line}, field 'target': required (the pair the times are for), unless the "
                "profiles are imported for a run (--for-run RUN)"
            )
            continue
        if p.target is not None and not new_pair:
            unknown = _unknown_specs(session, p)
            problems.extend(unknown)
            if unknown:
                continue
        pair = run_pair if p.target is None else _stored_pair(session, p.target, p.draft or "")
        same = _stored_duplicate(session, p, pair) if pair is not None else None
        if same is not None:
            problems.append(f"line {p.line}: already stored as cost profile #{same} (the same {SAME_FIELDS})")
            continue
        # a row naming the run's pair and one taking it from --for-run (the file's own check cannot see it)
        key = (
            pair.id if pair is not None else (p.target, p.draft),
            p.engine,
            p.engine_version,
            p.device,
            p.dtype,
            p.batch_size,
            p.times_s(),
        )
        if key in first_line:
            problems.append(
                f"line {p.line}: the same profile as line {first_line[key]} (the same {SAME_FIELDS})"
            )
        first_line.setdefault(key, p.line)
    return problems


def _unknown_specs(session: Session, p: ImportedProfile) -> list[str]:
    """A problem for the ``target`` and the ``draft`` of ``p`` that no stored model spec is."""
    return [
        f"line {p.line_of(name)}, field '{name}': no stored run or model spec knows {spec}; check "
        f"the spelling, or {NEW_PAIR_HINT} to store a profile for a pair not analysed yet"
        for name, spec in (("target", p.target), ("draft", p.draft))
        if not _known(session, spec)
    ]


def _imported_profile(p: ImportedProfile, pair: ModelPair, filename: str) -> CostProfile:
    """The cost profile row that stores ``p`` for ``pair``."""
    return CostProfile(
        pair_id=pair.id,
        priced_by=p.engine,
        measured_by=IMPORTED,
        source=IMPORTED,
        engine_version=p.engine_version,
        device=p.device,
        dtype=p.dtype,
        batch_size=p.batch_size,
        threads=None,
        context_tokens=0,
        repeats=1,
        target_forward_s=p.target_forward_s,
        draft_step_s=p.draft_step_s,
        target_prefill_s=None,
        draft_prefill_s=None,
        round_overhead_s=p.round_overhead_s,
        decode_overhead_s=p.decode_overhead_s,
        target_forward_spread=None,
        quality=None,  # not judged here: the engine's benchmark measured it
        quality_notes=[f"imported from {filename} (line {p.line}, {p.shape})"],
        library_versions={p.engine: p.engine_version} if p.engine_version else {},
    )


def _known(session: Session, spec: str | None) -> bool:
    """Whether a stored model spec (every run stores its pair's) is ``spec``, canonical."""
    return session.scalar(select(ModelSpec.id).where(ModelSpec.spec == spec)) is not None


def _stored_pair(session: Session, target: str, draft: str) -> ModelPair | None:
    """The stored pair of these canonical specs, without creating one."""
    target_spec, draft_spec = aliased(ModelSpec), aliased(ModelSpec)
    return session.scalar(
        select(ModelPair)
        .join(target_spec, ModelPair.target_id == target_spec.id)
        .join(draft_spec, ModelPair.draft_id == draft_spec.id)
        .where(target_spec.spec == target, draft_spec.spec == draft)
    )


def _stored_duplicate(session: Session, p: ImportedProfile, pair: ModelPair) -> int | None:
    """The id of a stored profile of ``pair`` with every field and time of ``p``, else None."""
    candidates = session.scalars(
        select(CostProfile)
        .where(
            CostProfile.pair_id == pair.id,
            CostProfile.priced_by == p.engine,
            CostProfile.engine_version.is_(None)
            if p.engine_version is None
            else CostProfile.engine_version == p.engine_version,
            CostProfile.device == p.device,
            CostProfile.dtype == p.dtype,
            CostProfile.batch_size == p.batch_size,
        )
        .order_by(CostProfile.id)
    )
    for stored in candidates:
        times = (
            tuple(stored.target_forward_s),
            stored.draft_step_s,
            stored.round_overhead_s,
            stored.decode_overhead_s,
        )
        if times == p.times_s():
            return stored.id
    return None
