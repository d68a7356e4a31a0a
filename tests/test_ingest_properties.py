"""Property-based tests of the prompt-file parsers: arbitrary or corrupted bytes never raise
anything but PromptFileError, and generated valid files round-trip exactly (text, labels, ids, order),
through the parser and through the database."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from analyzer.orm import Prompt
from analyzer.prompts.ingest import FORMATS, ParsedFile, PromptFileError, parse_prompt_file
from analyzer.prompts.prompt_sets import create_prompt_set

# Any code point except surrogates (not encodable), NUL (means binary) and the BOM (a leading one
# is taken as the UTF-8 signature). Line breaks are excluded only where the format forbids them.
ANY_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\ufeff")
LINE_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\ufeff\n\r")


def non_blank(alphabet) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=1, max_size=40).filter(lambda s: s.strip())


labels = st.none() | st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
ids = st.none() | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9:_-]{0,11}", fullmatch=True)


@st.composite
def records(draw, alphabet=ANY_CHAR, with_labels=True):
    texts = draw(st.lists(non_blank(alphabet), min_size=1, max_size=12, unique=True))
    rows = []
    used_ids = set()
    for text in texts:
        ident = draw(ids)
        if ident in used_ids:
            ident = None
        used_ids.add(ident)
        rows.append((text, draw(labels) if with_labels else None, ident))
    return rows


def to_jsonl(rows) -> bytes:
    lines = []
    for text, label, ident in rows:
        obj = {"prompt": text}
        if label is not None:
            obj["task"] = label
        if ident is not None:
            obj["id"] = ident
        lines.append(json.dumps(obj, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def to_csv(rows) -> bytes:
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(["id", "prompt", "task"])
    for text, label, ident in rows:
        writer.writerow([ident or "", text, label or ""])
    return out.getvalue().encode()


def to_txt(rows) -> bytes:
    return ("\n".join(text for text, _, _ in rows) + "\n").encode()


def as_rows(parsed: ParsedFile):
    return [(p.text, p.task, p.external_id) for p in parsed.prompts]


@given(data=st.binary(max_size=3000), fmt=st.sampled_from(FORMATS))
@settings(max_examples=400, deadline=None)
def test_arbitrary_bytes_only_raise_the_documented_error(data, fmt):
    _parse_or_documented_error(data, fmt)


@given(
    rows=records(),
    fmt=st.sampled_from(FORMATS),
    cuts=st.lists(st.tuples(st.integers(0, 10_000), st.binary(max_size=4)), max_size=4),
)
@settings(max_examples=400, deadline=None)
@pytest.mark.slow
@pytest.mark.parallel
def test_corrupted_valid_files_only_raise_the_documented_error(rows, fmt, cuts):
    data = bytearray({"txt": to_txt, "jsonl": to_jsonl, "csv": to_csv}[fmt](rows))
    for position, replacement in cuts:  # splice random bytes into a valid file
        position %= len(data) + 1
        data[position : position + len(replacement)] = replacement
    _parse_or_documented_error(bytes(data), fmt)


def _parse_or_documented_error(data: bytes, fmt: str) -> None:
    try:
        parsed = parse_prompt_file(data, f"upload.{fmt}")
    except PromptFileError as exc:
        assert exc.total >= len(exc.issues) >= 1
        assert all(issue.message for issue in exc.issues)
        return
    assert parsed.prompts
    for prompt in parsed.prompts:  # whatever is accepted must be storable text
        (prompt.text or json.dumps(prompt.messages)).encode("utf-8")
        assert (prompt.text is None) != (prompt.messages is None)


@given(rows=records())
@settings(max_examples=200, deadline=None)
def test_jsonl_round_trips(rows):
    assert as_rows(parse_prompt_file(to_jsonl(rows), "p.jsonl")) == rows


@given(rows=records())
@settings(max_examples=200, deadline=None)
def test_csv_round_trips(rows):
    assert as_rows(parse_prompt_file(to_csv(rows), "p.csv")) == rows


@given(rows=records(alphabet=LINE_CHAR, with_labels=False))
@settings(max_examples=200, deadline=None)
def test_txt_round_trips(rows):
    assert as_rows(parse_prompt_file(to_txt(rows), "p.txt")) == [(text, None, None) for text, _, _ in rows]


@given(
    chats=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["system", "user", "assistant"]), non_blank(ANY_CHAR)),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=6,
        unique_by=lambda chat: tuple(chat),
    )
)
@settings(max_examples=200, deadline=None)
def test_jsonl_messages_round_trip(chats):
    data = "".join(
        json.dumps({"messages": [{"role": r, "content": c} for r, c in chat]}) + "\n" for chat in chats
    ).encode()
    parsed = parse_prompt_file(data, "p.jsonl")
    assert [[(m["role"], m["content"]) for m in p.messages] for p in parsed.prompts] == [
        list(c) for c in chats
    ]


@given(rows=records(), fmt=st.sampled_from(["jsonl", "csv"]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_stored_prompt_sets_round_trip_through_the_database(session, rows, fmt):
    data = {"jsonl": to_jsonl, "csv": to_csv}[fmt](rows)
    transaction = session.begin()
    try:
        prompt_set = create_prompt_set(session, "roundtrip", parse_prompt_file(data, f"p.{fmt}"))
        session.flush()
        session.expire_all()
        stored = session.scalars(
            select(Prompt).where(Prompt.prompt_set_id == prompt_set.id).order_by(Prompt.position)
        ).all()
        assert [(p.text, p.task, p.external_id) for p in stored] == rows
    finally:
        transaction.rollback()
