"""What one training request trains on (``specroute train``, the classifier page's form): the
training data it names (:data:`TRAINING_SOURCES`, limited to some prompt sets' labels) and, to adapt
to prompt sets, the teacher's pseudo-labels for their unlabelled prompts, suggested afresh
(:mod:`router.classify.suggestions`). The data itself is :mod:`router.classify.training_data`, which the teacher and the
suggestions also read, so asking the teacher is here, above all three."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from router.classify.suggestions import TeacherUnavailable, pseudo_labels, suggest_tasks, suggest_tasks_apart
from router.classify.teacher import Progress
from router.classify.training_data import (
    ClassifierError,
    TrainingData,
    cold_start_data,
    refuse_missing_sets,
    training_data_from_db,
    with_corpus,
    with_pseudo_labels,
)

TRAINING_SOURCES = ("both", "labels", "corpus")


def check_training_request(
    session: Session, source: str, prompt_set_names: Sequence[str] | None = None, adapt: Sequence[str] = ()
) -> None:
    """Refuse at once what :func:`training_data` would refuse before any work: training data other
    than TRAINING_SOURCES, prompt sets named for the bundled corpus alone, and prompt sets (to take
    labels from, or to adapt to) that do not exist. The web form asks this before it starts a job."""
    if source not in TRAINING_SOURCES:
        raise ClassifierError(f"unknown training data {source!r}; use one of {', '.join(TRAINING_SOURCES)}")
    if source == "corpus" and prompt_set_names:
        raise ClassifierError("prompt sets were named but the training data is the bundled corpus only")
    if prompt_set_names or adapt:
        refuse_missing_sets(session, [*(prompt_set_names or ()), *adapt])


def training_data(
    session: Session,
    source: str = "both",
    prompt_set_names: Sequence[str] | None = None,
    *,
    adapt: Sequence[str] = (),
    min_confidence: float | None = None,
    progress: Progress | None = None,
) -> TrainingData:
    """What to train on: ``both`` (the bundled corpus plus your labeled prompts, yours winning for the
    same text), ``labels`` (your labeled prompts only) or ``corpus`` (the bundled corpus only);
    ``prompt_set_names`` limits which sets' labels are used. ``adapt`` names prompt sets whose
    unlabelled prompts the teacher labels afresh (their suggestions stored) and which join the data
    as pseudo-labels at or above ``min_confidence``, weighted by confidence; the data then names them
    in ``adapt``, so that training guards the activation (:func:`router.classify.training.train_classifier`)."""
    data = _base_data(session, source, prompt_set_names, adapt)
    if not adapt:
        return data
    _suggest_for_adapting(lambda: suggest_tasks(session, adapt, progress))
    return _adapted(session, data, adapt, min_confidence)


def training_data_apart(
    sessions: sessionmaker[Session],
    source: str = "both",
    prompt_set_names: Sequence[str] | None = None,
    *,
    adapt: Sequence[str] = (),
    min_confidence: float | None = None,
    progress: Progress | None = None,
) -> TrainingData:
    """:func:`training_data` in short transactions of its own, the teacher's suggestions trained and
    made outside any (:func:`router.classify.suggestions.suggest_tasks_apart`), for a job that other writers
    run beside."""
    with sessions() as session, session.begin():
        data = _base_data(session, source, prompt_set_names, adapt)
    if not adapt:
        return data
    _suggest_for_adapting(lambda: suggest_tasks_apart(sessions, adapt, progress))
    with sessions() as session, session.begin():
        return _adapted(session, data, adapt, min_confidence)


def _suggest_for_adapting(suggest: Callable[[], object]) -> None:
    """Run ``suggest`` (the teacher's suggestions for the sets adapted to); a missing teacher refuses the
    training request."""
    try:
        suggest()
    except TeacherUnavailable as exc:
        raise ClassifierError(f"cannot adapt: {exc}") from None


def _adapted(
    session: Session, data: TrainingData, adapt: Sequence[str], min_confidence: float | None
) -> TrainingData:
    """``data`` with the stored suggestions of the ``adapt`` sets as pseudo-labels."""
    return replace(with_pseudo_labels(data, pseudo_labels(session, adapt), min_confidence), adapt=list(adapt))


def _base_data(
    session: Session, source: str, prompt_set_names: Sequence[str] | None, adapt: Sequence[str]
) -> TrainingData:
    check_training_request(session, source, prompt_set_names, adapt)
    if source == "corpus":
        data = cold_start_data()
    elif source == "both":
        data = with_corpus(session, prompt_set_names)
    else:
        data = training_data_from_db(session, prompt_set_names)
        if not data.texts:
            raise ClassifierError(
                "no labeled prompts in the database; label some on a prompt set's page, "
                "or train on the bundled corpus"
            )
    return data
