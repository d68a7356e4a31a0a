"""Prompt-set services: import a parsed file as a named set, list sets with counts per task,
page through a set's prompts, set or correct their task labels (one prompt, or every prompt a filter
matches), delete a set. Used by the CLI and the web UI alike.

Every function takes the caller's ``Session``; the caller owns the transaction, so an import either
stores the whole set or nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import cast

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from analyzer.errors import SpecrouteError
from analyzer.orm import AnalysisRun, Prompt, PromptSet
from analyzer.prompts.ingest import IngestLimits, ParsedFile, parse_prompt_file

SAMPLE_NAME = "sample"
SAMPLE_FILE = "sample_prompts.jsonl"
MAX_NAME_CHARS = 100
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")


class PromptSetError(SpecrouteError, ValueError):
    """A prompt-set request that cannot be carried out; ``code`` names the kind of problem."""

    status, code = 400, "invalid_prompt_set"


class PromptSetExists(PromptSetError):
    status, code = 409, "prompt_set_exists"


class PromptSetNotFound(PromptSetError, LookupError):
    status, code = 404, "prompt_set_not_found"


class PromptSetInUse(PromptSetError):
    status, code = 409, "prompt_set_in_use"


class UnknownTaskType(PromptSetError):
    status, code = 400, "unknown_task_type"


# The default task types (DESIGN.md); labels users uploaded are known too.
DEFAULT_TASK_TYPES = (
    "code",
    "structured_output",
    "summarization",
    "translation",
    "rag",
    "qa",
    "math",
    "reasoning",
    "creative_writing",
    "roleplay",
    "extraction",
    "customer_support",
    "general",
)


@dataclass(frozen=True)
class PromptSetSummary:
    """A prompt set with its prompt count per task label (``None`` = unlabelled)."""

    id: int
    name: str
    file_format: str
    source_filename: str | None
    prompt_count: int
    duplicates_merged: int
    task_counts: dict[str | None, int]
    created_at: datetime


def checked_name(name: str) -> str:
    """The stripped name, or :class:`PromptSetError` saying what a name may contain."""
    cleaned = (name or "").strip()
    if not cleaned:
        raise PromptSetError("a prompt set needs a name")
    if len(cleaned) > MAX_NAME_CHARS:
        raise PromptSetError(f"name is longer than {MAX_NAME_CHARS} characters")
    if not _NAME_PATTERN.match(cleaned):
        raise PromptSetError(
            f"name {cleaned!r} may contain only letters, digits, spaces, '.', '_' and '-',"
            " and must start with a letter or digit"
        )
    return cleaned


def create_prompt_set(
    session: Session, name: str, parsed: ParsedFile, source_filename: str | None = None
) -> PromptSet:
    """Store ``parsed`` as a new prompt set called ``name`` (prompts keep file order)."""
    name = checked_name(name)
    if session.scalar(select(PromptSet.id).where(PromptSet.name == name)) is not None:
        raise PromptSetExists(
            f"a prompt set named {name!r} already exists; choose another name or delete it first"
        )
    prompt_set = PromptSet(
        name=name,
        source_filename=source_filename,
        file_format=parsed.file_format,
        file_sha256=parsed.sha256,
        prompt_count=len(parsed.prompts),
        duplicates_merged=len(parsed.duplicates),
    )
    session.add(prompt_set)
    session.flush()
    if parsed.prompts:
        session.execute(
            insert(Prompt),
            [
                {
                    "prompt_set_id": prompt_set.id,
                    "position": position,
                    "source_line": p.line,
                    "external_id": p.external_id,
                    "text": p.text,
                    "messages": p.messages,
                    "task": p.task,
                    "content_hash": p.content_hash,
                    "char_count": p.char_count,
                }
                for position, p in enumerate(parsed.prompts)
            ],
        )
    return prompt_set


def import_prompt_file(
    session: Session,
    name: str,
    data: bytes,
    filename: str | None,
    *,
    file_format: str | None = None,
    limits: IngestLimits | None = None,
) -> tuple[PromptSet, ParsedFile]:
    """Check ``data`` completely, then store it as a set; raises
    :class:`analyzer.prompts.ingest.PromptFileError` (nothing stored) on any problem."""
    name = checked_name(name)
    parsed = parse_prompt_file(data, filename, file_format=file_format, limits=limits)
    return create_prompt_set(session, name, parsed, filename), parsed


def sample_bytes() -> bytes:
    """The bundled sample workload (JSONL; see analyzer/sample_data/LICENSES.md)."""
    return resources.files("analyzer.sample_data").joinpath(SAMPLE_FILE).read_bytes()


def import_sample(session: Session, name: str = SAMPLE_NAME) -> tuple[PromptSet, ParsedFile]:
    """Import the bundled sample prompts as the set ``name``."""
    return import_prompt_file(session, name, sample_bytes(), SAMPLE_FILE)


def get_prompt_set(session: Session, name: str) -> PromptSet:
    """The set called ``name``, or :class:`PromptSetNotFound` listing the names that exist."""
    prompt_set = session.scalar(select(PromptSet).where(PromptSet.name == name))
    if prompt_set is None:
        names = session.scalars(select(PromptSet.name).order_by(PromptSet.name)).all()
        known = ", ".join(names) if names else "none yet; import one with 'specroute prompts import'"
        raise PromptSetNotFound(f"no prompt set named {name!r} (known: {known})")
    return prompt_set


def task_counts(
    session: Session, prompt_set_ids: list[int] | None = None
) -> dict[int, dict[str | None, int]]:
    """Prompt counts per task label for each set id (all sets when ``prompt_set_ids`` is None)."""
    query = select(Prompt.prompt_set_id, Prompt.task, func.count()).group_by(
        Prompt.prompt_set_id, Prompt.task
    )
    if prompt_set_ids is not None:
        query = query.where(Prompt.prompt_set_id.in_(prompt_set_ids))
    counts: dict[int, dict[str | None, int]] = {}
    for set_id, task, count in session.execute(query):
        counts.setdefault(set_id, {})[task] = count
    return counts


def summarize(session: Session, prompt_sets: list[PromptSet]) -> list[PromptSetSummary]:
    """Summaries (with per-task counts) of the given sets, in the given order."""
    counts = task_counts(session, [s.id for s in prompt_sets])
    return [
        PromptSetSummary(
            id=s.id,
            name=s.name,
            file_format=s.file_format,
            source_filename=s.source_filename,
            prompt_count=s.prompt_count,
            duplicates_merged=s.duplicates_merged,
            task_counts=dict(
                sorted(counts.get(s.id, {}).items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
            ),
            created_at=s.created_at,
        )
        for s in prompt_sets
    ]


def list_prompt_sets(session: Session) -> list[PromptSetSummary]:
    """Every prompt set, newest first, with per-task counts."""
    sets = list(session.scalars(select(PromptSet).order_by(PromptSet.created_at.desc(), PromptSet.id.desc())))
    return summarize(session, sets)


def list_prompts(
    session: Session,
    prompt_set: PromptSet,
    *,
    offset: int = 0,
    limit: int = 50,
    search: str | None = None,
    task: str | None = None,
) -> tuple[list[Prompt], int]:
    """One page of a set's prompts in file order, optionally filtered by a case-insensitive
    substring of the plain text or the id, and by task label (``""`` = unlabelled); returns the page
    and the filtered total."""
    query = _filtered(prompt_set, search, task)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    page = session.scalars(query.order_by(Prompt.position).offset(max(offset, 0)).limit(max(limit, 0))).all()
    return list(page), int(total or 0)


def known_task_types(session: Session) -> list[str]:
    """The default task types and every label a stored prompt carries, sorted."""
    used = session.scalars(select(Prompt.task).where(Prompt.task.is_not(None)).distinct())
    return sorted(set(DEFAULT_TASK_TYPES) | {task for task in used if task is not None})


def _checked_task(session: Session, task: str | None) -> str | None:
    """``task`` stripped; "" or None unlabels; a name that is neither a default task type nor already
    used by a stored prompt is refused (a typo would otherwise become a task type of its own)."""
    task = (task or "").strip()
    if not task:
        return None
    known = known_task_types(session)
    if task not in known:
        raise UnknownTaskType(
            f"unknown task type {task!r}; use one of {', '.join(known)} (or empty to unlabel)"
        )
    return task


def set_prompt_task(session: Session, prompt_set: PromptSet, position: int, task: str | None) -> Prompt:
    """Set (or with "" clear) the task label of the prompt at 1-based ``position`` of the set."""
    checked = _checked_task(session, task)
    prompt = session.scalar(
        select(Prompt).where(Prompt.prompt_set_id == prompt_set.id, Prompt.position == position - 1)
    )
    if prompt is None:
        raise PromptSetNotFound(f"prompt set {prompt_set.name!r} has no prompt #{position}")
    prompt.task = checked
    return prompt


def relabel_prompts(
    session: Session,
    prompt_set: PromptSet,
    task: str | None,
    *,
    search: str | None = None,
    current_task: str | None = None,
) -> int:
    """Give every prompt of the set that the filter matches (as :func:`list_prompts` filters) the
    label ``task`` ("" clears it); returns how many prompts changed."""
    checked = _checked_task(session, task)
    ids = select(Prompt.id).where(_filtered(prompt_set, search, current_task).whereclause)
    # an UPDATE's result is a CursorResult (Session.execute is typed for any statement)
    result = cast(
        CursorResult,
        session.execute(
            update(Prompt)
            .where(Prompt.id.in_(ids))
            .where(
                Prompt.task.is_not(None)
                if checked is None
                else or_(Prompt.task.is_(None), Prompt.task != checked)
            )
            .values(task=checked)
            .execution_options(synchronize_session=False)
        ),
    )
    return int(result.rowcount or 0)


def _filtered(prompt_set: PromptSet, search: str | None, task: str | None):
    """A select of the set's prompts matching the search text (plain text or id, case-insensitive)
    and task label (``""`` = unlabelled)."""
    query = select(Prompt).where(Prompt.prompt_set_id == prompt_set.id)
    if task is not None:
        query = query.where(Prompt.task == task if task else Prompt.task.is_(None))
    if search:
        pattern = f"%{_escape_like(search.lower())}%"
        query = query.where(
            or_(
                func.lower(Prompt.text).like(pattern, escape="\\"),
                func.lower(Prompt.external_id).like(pattern, escape="\\"),
            )
        )
    return query


def delete_prompt_set(session: Session, name: str) -> None:
    """Delete a set and its prompts; refused while an analysis run uses it."""
    prompt_set = get_prompt_set(session, name)
    runs = session.scalar(select(func.count()).where(AnalysisRun.prompt_set_id == prompt_set.id))
    if runs:
        raise PromptSetInUse(f"prompt set {name!r} is used by {runs} analysis run(s); it is kept")
    session.execute(delete(Prompt).where(Prompt.prompt_set_id == prompt_set.id))
    session.delete(prompt_set)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
