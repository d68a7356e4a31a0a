"""The checks of an imported cost profile (:mod:`analyzer.analysis.cost_import`, the file format): each
row's fields, one by one (known fields, texts, batch size, pair, the step times of either shape, their
magnitudes and their physical shape) into an :class:`~analyzer.analysis.cost_import.ImportedProfile`, and
the file's profiles given twice. Every problem names its line and field; the caller gathers them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from analyzer.analysis.cost_import import SAME_FIELDS, ImportedProfile
from analyzer.measuring.interference import MAX_RATIO_PER_TOKEN, MIN_RATIO, implausible_ratios
from analyzer.models.specs import SpecError, parse_spec

MAX_K = 64  # the longest T_t(k) list accepted (gamma up to 63)
TEXT_LIMITS = {"engine": 32, "engine_version": 64, "device": 200, "dtype": 16}
# one decoding step of any model in any engine takes longer than 0.1 ms (a kernel launch alone is several
# microseconds, a forward dozens of them): a smaller value is, in practice, seconds typed as milliseconds
MIN_STEP_MS = 0.1
# and no warm step takes a minute: a larger time is in microseconds, or a whole generation's
MAX_STEP_MS = 60_000.0
# sequences decoded together: vLLM's and SGLang's largest default (max_num_seqs, max_running_requests)
# is 1024; a larger "batch size" is, in practice, a count of tokens
MAX_BATCH_SIZE = 1024
# a whole round drafting g tokens: at most g draft steps (each at most about a plain step) plus a verify
# pass over g + 1 tokens (at most 1.5 (g + 1) plain steps): 3 (g + 1) plain steps leaves room for both
MAX_ROUND_RATIO_PER_TOKEN = 3.0
# how a check reports a problem: (field, message), the line found from the field
ProblemSink = Callable[[str, str], None]
REPORTED = object()  # a value whose problem is already listed (no follow-on problems for it)

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


def checked(
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


def repeated_in_file(profiles: list[ImportedProfile]) -> list[str]:
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
