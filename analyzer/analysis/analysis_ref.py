"""One way to name any analysis, whatever measured it: ``7`` (or ``run:7``) is analysis run 7 (transformers,
llama.cpp), ``llama-server:3`` the stored analysis 3 in llama-server, and ``llama-server-job:2`` an analysis in
llama-server that has not stored its result yet (queued, running, failed or cancelled: its job). ``specroute
runs list`` prints every analysis by its reference, and ``specroute report``, ``runs resume``, ``runs cancel``
and ``policies publish --analysis`` take one, so that the commands are the same for every engine.

:func:`resolve_analysis` turns the reference of a job that has finished into the analysis it stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from analyzer.db import MAX_ID
from analyzer.errors import SpecrouteError
from analyzer.orm import ServerAnalysisJob

RUN, SERVER, SERVER_JOB = "run", "llama-server", "llama-server-job"
KINDS = (RUN, SERVER, SERVER_JOB)
FORMS = "7 (a run), llama-server:3 (an analysis in llama-server) or llama-server-job:2 (one not stored yet)"


class AnalysisRefError(SpecrouteError, ValueError):
    """A reference that names no analysis this command can act on; the message says which forms exist."""

    status, code = 400, "invalid_analysis"


class AnalysisNotFound(AnalysisRefError, LookupError):
    """A reference whose analysis (here: a job) does not exist."""

    status, code = 404, "analysis_not_found"


@dataclass(frozen=True)
class AnalysisRef:
    """An analysis by kind (:data:`KINDS`) and id; ``str()`` is how a person types it."""

    kind: str
    id: int

    def __str__(self) -> str:
        return str(self.id) if self.kind == RUN else f"{self.kind}:{self.id}"


def parse_analysis_ref(text: str) -> AnalysisRef:
    """``text`` as a reference (``7``, ``run:7``, ``llama-server:3``, ``llama-server-job:2``), or
    AnalysisRefError naming the forms."""
    kind, _, number = str(text).strip().rpartition(":")
    kind = kind.strip().lower() or RUN
    number = number.strip()
    if kind not in KINDS or not number.isdigit() or not 1 <= int(number) <= MAX_ID:
        raise AnalysisRefError(
            f"{text!r} names no analysis: give it as 'specroute runs list' prints it, {FORMS}"
        )
    return AnalysisRef(kind, int(number))


def resolve_analysis(session: Session, ref: AnalysisRef) -> AnalysisRef:
    """``ref``, or for a job that stored its analysis that analysis; AnalysisRefError for a job that has not
    (saying what it is and how to go on), AnalysisNotFound for a job that does not exist; a run's or a stored
    analysis' id is checked where it is read (its own not-found error)."""
    if ref.kind != SERVER_JOB:
        return ref
    job = session.get(ServerAnalysisJob, ref.id)
    if job is None:
        raise AnalysisNotFound(f"no llama-server analysis job #{ref.id}")
    if job.analysis_id is not None:
        return AnalysisRef(SERVER, job.analysis_id)
    advice = {
        "queued": "it waits for a worker ('specroute worker')",
        "running": "it is running",
        "failed": f"it failed: {job.error}; resume it with 'specroute runs resume {ref}'",
        "cancelled": f"it was cancelled; resume it with 'specroute runs resume {ref}'",
    }.get(job.status, job.status)
    raise AnalysisRefError(f"{ref} has stored no analysis yet: {advice}")
