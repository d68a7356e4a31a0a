"""Suggested task types for a user's unlabelled prompts, from the teacher (router/classify/teacher.py), and
what they are used for: shown beside each unlabelled prompt on the prompt set page, accepted there as
labels above a confidence ("accept suggestions above X"), and trained on as pseudo-labels, weighted
by confidence, when the classifier adapts to a set (``specroute train --adapt NAME``).

Every suggestion is stored with where it came from (``prompts.suggested_by``: the teacher's version,
what it was trained on, when); a suggestion never overwrites a label, and labelling a prompt keeps its
suggestion on record but out of training (a label wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write, utcnow
from analyzer.orm import Prompt, PromptSet
from analyzer.prompts.prompt_checks import request_text
from router.classify.teacher import Progress, Suggestion, TeacherUnavailable, cached_teacher
from router.classify.training_data import ClassifierError, PseudoLabel, TrainingData, with_corpus

__all__ = [
    "PseudoLabel",
    "SuggestionSummary",
    "TeacherUnavailable",
    "accept_suggestions",
    "suggestion_stats",
    "pseudo_labels",
    "suggest_tasks",
    "suggest_tasks_apart",
]


@dataclass(frozen=True)
class SuggestionSummary:
    """What one suggestion pass did: prompts suggested per set, and the provenance recorded."""

    suggested: dict[str, int]
    suggested_by: str

    @property
    def total(self) -> int:
        return sum(self.suggested.values())


def _sets(session: Session, names: Sequence[str]) -> list[PromptSet]:
    found = list(session.scalars(select(PromptSet).where(PromptSet.name.in_(list(names)))))
    missing = sorted(set(names) - {s.name for s in found})
    if missing:
        raise ClassifierError(f"no prompt set named {', '.join(missing)}")
    return found


@dataclass(frozen=True)
class _Unlabelled:
    """What a suggestion pass reads: the named sets (id to name), their unlabelled prompts (id, set id,
    request text) and the teacher's training data."""

    set_names: dict[int, str]
    prompts: list[tuple[int, int, str]]
    data: TrainingData | None


def _unlabelled(session: Session, names: Sequence[str]) -> _Unlabelled:
    sets = _sets(session, names)
    prompts = [
        (p.id, p.prompt_set_id, request_text(p.text, p.messages))
        for p in session.scalars(
            select(Prompt)
            .where(Prompt.prompt_set_id.in_([s.id for s in sets]), Prompt.task.is_(None))
            .order_by(Prompt.id)
        )
    ]
    return _Unlabelled({s.id: s.name for s in sets}, prompts, with_corpus(session) if prompts else None)


def _suggestions(unlabelled: _Unlabelled, progress: Progress | None) -> tuple[list[Suggestion], str]:
    """The teacher's suggestion for each unlabelled prompt, and the provenance to record."""
    data = unlabelled.data
    assert data is not None
    teacher = cached_teacher(data.sha256, data.texts, data.labels, progress)
    suggestions = teacher.suggest([text for _, _, text in unlabelled.prompts], progress=progress)
    return suggestions, f"{teacher.describe()} ({data.source}), {utcnow().isoformat(timespec='seconds')}"[
        :300
    ]


def _store_suggestions(
    session: Session, unlabelled: _Unlabelled, suggestions: list[Suggestion], by: str
) -> SuggestionSummary:
    """Store each suggestion on its prompt; a prompt deleted or labelled since it was read keeps none."""
    counts = dict.fromkeys(unlabelled.set_names.values(), 0)
    for (prompt_id, set_id, _), suggestion in zip(unlabelled.prompts, suggestions):
        prompt = session.get(Prompt, prompt_id)
        if prompt is None or prompt.task is not None:
            continue
        prompt.suggested_task = suggestion.task
        prompt.suggested_confidence = round(suggestion.confidence, 4)
        prompt.suggested_by = by
        counts[unlabelled.set_names[set_id]] += 1
    session.flush()
    return SuggestionSummary(counts, by)


def suggest_tasks(
    session: Session, names: Sequence[str], progress: Progress | None = None
) -> SuggestionSummary:
    """Suggest a task for every unlabelled prompt of the named sets (their suggestions replaced), with
    a teacher trained on the bundled corpus plus every label in the database. The sets' unlabelled
    prompts are labelled together, so alike prompts vote with each other. In the caller's transaction
    (which holds it while the teacher trains and suggests: where other writers run beside it, use
    :func:`suggest_tasks_apart`)."""
    unlabelled = _unlabelled(session, names)
    if not unlabelled.prompts:
        return SuggestionSummary(dict.fromkeys(unlabelled.set_names.values(), 0), "")
    return _store_suggestions(session, unlabelled, *_suggestions(unlabelled, progress))


def suggest_tasks_apart(
    sessions: sessionmaker[Session], names: Sequence[str], progress: Progress | None = None
) -> SuggestionSummary:
    """:func:`suggest_tasks` in two short transactions of its own: one reads the prompts and the
    teacher's data, the teacher trains and suggests outside any, and one that holds the write lock
    stores the suggestions. Other writers (an analysis, feedback) go on meanwhile; a long transaction
    would hold them up or fail at its first write on a snapshot they overtook (SQLite)."""
    with sessions() as session, session.begin():
        unlabelled = _unlabelled(session, names)
    if not unlabelled.prompts:
        return SuggestionSummary(dict.fromkeys(unlabelled.set_names.values(), 0), "")
    suggestions, by = _suggestions(unlabelled, progress)
    with sessions() as session, session.begin():
        lock_for_write(session)
        return _store_suggestions(session, unlabelled, suggestions, by)


def pseudo_labels(session: Session, names: Sequence[str]) -> list[PseudoLabel]:
    """Every stored suggestion of an unlabelled prompt in the named sets (all confidences; the
    training step applies its bar)."""
    sets = _sets(session, names)
    name_of = {s.id: s.name for s in sets}
    rows = session.execute(
        select(
            Prompt.text,
            Prompt.messages,
            Prompt.suggested_task,
            Prompt.suggested_confidence,
            Prompt.prompt_set_id,
        )
        .where(
            Prompt.prompt_set_id.in_(list(name_of)),
            Prompt.task.is_(None),
            Prompt.suggested_task.is_not(None),
        )
        .order_by(Prompt.id)
    )
    return [
        PseudoLabel(request_text(text, messages), task, float(confidence), name_of[set_id])
        for text, messages, task, confidence, set_id in rows
    ]


def suggestion_stats(session: Session, prompt_set: PromptSet) -> dict:
    """How many of the set's unlabelled prompts carry a suggestion, the confidence quartiles, and the
    provenance of the newest suggestion."""
    rows = session.execute(
        select(Prompt.suggested_confidence, Prompt.suggested_by)
        .where(
            Prompt.prompt_set_id == prompt_set.id, Prompt.task.is_(None), Prompt.suggested_task.is_not(None)
        )
        .order_by(Prompt.id)
    ).all()
    confidences = np.asarray([c for c, _ in rows], dtype=np.float64)
    return {
        "count": len(rows),
        "by": rows[-1][1] if rows else None,
        "quartiles": [float(q) for q in np.percentile(confidences, [25, 50, 75])] if len(rows) else [],
        "at_least": {bar: int((confidences >= bar).sum()) for bar in (0.5, 0.7, 0.9)},
    }


def accept_suggestions(session: Session, prompt_set: PromptSet, min_confidence: float) -> int:
    """Make the suggested task the label of every unlabelled prompt of the set whose suggestion's
    confidence is at least ``min_confidence``; returns how many. In the caller's transaction."""
    prompts = session.scalars(
        select(Prompt).where(
            Prompt.prompt_set_id == prompt_set.id,
            Prompt.task.is_(None),
            Prompt.suggested_task.is_not(None),
            Prompt.suggested_confidence >= min_confidence,
        )
    )
    accepted = 0
    for prompt in prompts:
        prompt.task = prompt.suggested_task
        accepted += 1
    session.flush()
    return accepted
