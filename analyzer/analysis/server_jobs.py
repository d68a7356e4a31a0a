"""Analyses in llama-server as queued work, executed by the same workers as runs (analyzer/analysis/worker.py):
the command line, the web form and the demo queue one, any worker claims it, and its progress, heartbeat,
failure and result are stored as it goes.

A job is one analysis (its servers time each other, so it is not split across workers). A worker claims a
queued job, or a running one whose heartbeat is older than ``stale_after_s`` (its worker died), marks it
running and executes it: every progress line renews the heartbeat and is stored, every plain generation is
stored as it is made, and the analysis is stored with the job marked done in one transaction. A job that
fails keeps its message and code (:class:`ServerJobFailed`'s); ``resume`` queues a failed, cancelled or stale
job again. A resumed job on the machine that made its plain generations and passes keeps them: it generates
only the rest, and calibration and validation go on from the first pass through the servers the earlier
attempt did not finish (a pass is one prompt on the plain server, every setting's server and the plain server
again, the unit in which the servers are timed against each other). A resume on another machine starts over:
its outputs and timings would not be that machine's.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from analyzer.analysis.analysis_ref import SERVER, SERVER_JOB, AnalysisRef
from analyzer.db import claimable, lock_for_write, utcnow
from analyzer.errors import SpecrouteError
from analyzer.measuring.validation_plan import DEFAULT_BUDGET_SHARE
from analyzer.orm import PromptSet, ServerAnalysisJob, ServerAnalysisRecord
from analyzer.run_params import LIMITS as RUN_LIMITS
from analyzer.settings import STALE_AFTER_S

HEARTBEAT_EVERY_S = 5.0  # a job stores its progress and renews its heartbeat at most this often
DEFAULT_DRAFTERS = ("ngram-simple", "ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod", "ngram-mod 16 8-32")
DEFAULT_MODEL = "builtin:smollm2-135m-instruct"


class ServerJobError(SpecrouteError, ValueError):
    """A job that cannot be queued or changed as asked; the message names the field or the job."""

    status, code = 400, "invalid_server_job"


class ServerJobNotFound(ServerJobError, LookupError):
    status, code = 404, "server_job_not_found"


class ServerJobStopped(SpecrouteError, RuntimeError):
    """The job was cancelled, or another worker took it over, while this worker executed it."""

    status, code = 409, "server_job_stopped"


# the bounds every surface shares (the command line's options, the web form's inputs); new tokens and the
# prompts to analyze are a run's (analyzer/run_params.py LIMITS), but for a job's two new tokens at least (a
# speculative round needs a step after the first token)
LIMITS: dict[str, tuple[int, int]] = {
    "n_predict": (2, int(RUN_LIMITS["max_new_tokens"].high or 0)),
    "threads": (1, 256),
    "n_ctx": (256, 131072),
    "calibration": (1, 1000),
    "per_task": (1, 100000),
    "limit": (int(RUN_LIMITS["limit"].low), int(RUN_LIMITS["limit"].high or 0)),
    "validate_repeats": (1, 20),
}


@dataclass(frozen=True)
class ServerJobParams:
    """What a job analyzes with (``specroute llama-server analyze``'s options): the model, the drafter settings
    by label, the draft model of draft-simple settings, new tokens per prompt, threads and context per server,
    calibration prompts, at most ``per_task`` prompts per task and the first ``limit`` prompts, validation and
    its passes, ``urls``: servers the user runs ({"off" or a setting's label: URL}; None: start our own),
    ``long_prompts``: what to do with prompts the context cannot hold ("leave-out" or "refuse"), and ``refit``:
    fit the step costs on this workload even where an earlier analysis on the same setup has a fit to reuse."""

    model: str = DEFAULT_MODEL
    drafters: tuple[str, ...] = DEFAULT_DRAFTERS
    draft_model: str | None = None
    n_predict: int = 64
    threads: int = 2
    n_ctx: int = 4096
    calibration: int = 8
    per_task: int | None = None
    limit: int | None = None
    validate: bool = True
    validate_repeats: int = 3
    urls: Mapping[str, str] | None = field(default=None)
    long_prompts: str = "leave-out"
    validate_all: bool = False  # every held-out prompt, not the sample the validation budget pays for
    refit: bool = False  # fit the step costs anew, not reusing an earlier analysis' fit on this setup

    def checked(self) -> "ServerJobParams":
        """These parameters, or ServerJobError naming the first bad field."""
        from analyzer.measuring.server_drafting import parse_drafter
        from analyzer.run_params import LONG_PROMPT_RULES

        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if value is None and name in ("per_task", "limit"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ServerJobError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        if not self.drafters:
            raise ServerJobError("drafters: give at least one drafter setting")
        labels = []
        for text in self.drafters:
            try:
                labels.append(parse_drafter(text).label)
            except ValueError as exc:
                raise ServerJobError(f"drafters: {exc}") from None
        if len(set(labels)) < len(labels):
            raise ServerJobError("drafters: a setting is named twice")
        if self.draft_model is None and any(parse_drafter(t).needs_draft_model for t in self.drafters):
            raise ServerJobError("draft_model: a draft-simple setting needs the draft model")
        if self.long_prompts not in LONG_PROMPT_RULES:
            raise ServerJobError(
                f"long_prompts must be one of {', '.join(LONG_PROMPT_RULES)}, got {self.long_prompts!r}"
            )
        if not isinstance(self.model, str) or not self.model.strip():
            raise ServerJobError("model: give a GGUF spec (gguf:<folder>#<file.gguf> or builtin:<name>)")
        return self

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["drafters"] = list(self.drafters)
        data["urls"] = dict(self.urls) if self.urls is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ServerJobParams":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "drafters" in values:
            values["drafters"] = tuple(values["drafters"])
        return cls(**values)


@dataclass(frozen=True)
class JobView:
    """A job as the pages and the command line show it."""

    id: int
    prompt_set: str
    status: str
    params: dict[str, Any]
    progress: dict[str, Any] | None
    kept: int  # plain generations stored
    error: str | None
    error_code: str | None
    analysis_id: int | None
    worker_id: str | None
    attempts: int
    passes: int = 0  # passes through the servers stored (calibration and validation)

    @property
    def line(self) -> str:
        """Its last progress line (or why it failed)."""
        if self.error:
            return f"failed ({self.error_code}): {self.error}"
        return (self.progress or {}).get("line", "")


def job_view(job: ServerAnalysisJob) -> JobView:
    return JobView(
        job.id, job.prompt_set.name, job.status, dict(job.params), job.progress,
        len((job.generated or {}).get("outputs", {})), job.error, job.error_code, job.analysis_id, job.worker_id,
        job.attempts, len((job.generated or {}).get("passes", {})),
    )  # fmt: skip


def create_server_job(session: Session, prompt_set: PromptSet, params: ServerJobParams) -> ServerAnalysisJob:
    """Queue an analysis of ``prompt_set`` (the caller commits); ServerJobError naming a bad parameter."""
    job = ServerAnalysisJob(prompt_set_id=prompt_set.id, params=params.checked().as_json(), status="queued")
    session.add(job)
    session.flush()
    return job


def get_server_job(session: Session, job_id: int) -> ServerAnalysisJob:
    job = session.get(ServerAnalysisJob, job_id)
    if job is None:
        raise ServerJobNotFound(f"no llama-server analysis job #{job_id}")
    return job


def list_server_jobs(session: Session, limit: int = 50) -> list[ServerAnalysisJob]:
    return list(session.scalars(select(ServerAnalysisJob).order_by(ServerAnalysisJob.id.desc()).limit(limit)))


@dataclass(frozen=True)
class ListedAnalysis:
    """A llama-server analysis as the lists of every analysis show it (``specroute runs list``, the runs page):
    a stored one (``kind`` "server", done), or a job that stored none yet (``kind`` "job": queued, running,
    failed or cancelled), with its prompt set, model, drafter settings, progress and error."""

    kind: str
    id: int
    status: str
    prompt_set: str
    model: str
    drafters: tuple[str, ...]
    done: int
    total: int
    error: str | None
    created_at: datetime
    seconds: float | None

    @property
    def ref(self) -> str:
        """How ``specroute runs list`` names it (:mod:`analyzer.analysis.analysis_ref`)."""
        return str(AnalysisRef(SERVER if self.kind == "server" else SERVER_JOB, self.id))


def listed_analyses(session: Session, limit: int = 1000) -> list[ListedAnalysis]:
    """The stored llama-server analyses, then the jobs that stored none, newest first within each."""
    rows = [
        ListedAnalysis(
            "server",
            r.id,
            "done",
            r.prompt_set.name,
            r.model,
            tuple(r.drafters),
            len(r.prompts),
            len(r.prompts),
            None,
            r.created_at,
            r.seconds,
        )  # fmt: skip
        for r in session.scalars(
            select(ServerAnalysisRecord).order_by(ServerAnalysisRecord.id.desc()).limit(limit)
        )
    ]
    for job in list_server_jobs(session, limit):
        if job.analysis_id is None:
            progress = job.progress or {}
            rows.append(
                ListedAnalysis(
                    "job",
                    job.id,
                    job.status,
                    job.prompt_set.name,
                    job.params.get("model", ""),
                    tuple(job.params.get("drafters", ())),
                    progress.get("done", 0),
                    progress.get("total", 0),
                    job.error,
                    job.created_at,
                    None,
                )  # fmt: skip
            )
    return rows


def claim_server_job(
    sessions: sessionmaker[Session],
    worker_id: str,
    *,
    job_id: int | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> int | None:
    """Claim the oldest queued job (or job ``job_id``), or a running one whose heartbeat is older than
    ``stale_after_s``; mark it running for ``worker_id``. None when there is none."""
    now = utcnow()
    cutoff = now - timedelta(seconds=stale_after_s)
    with sessions() as session, session.begin():
        where = (ServerAnalysisJob.id == job_id,) if job_id is not None else ()
        found = claimable(session, ServerAnalysisJob, cutoff=cutoff, where=where)
        if not found:
            return None
        job = found[0]
        job.status, job.worker_id, job.heartbeat_at = "running", worker_id, now
        job.started_at = job.started_at or now
        job.attempts += 1
        job.error = job.error_code = None
        return job.id


def resume_server_job(session: Session, job_id: int) -> ServerAnalysisJob:
    """Queue a failed or cancelled job again (its plain generations and passes kept, on the machine that made
    them); ServerJobError for one that is queued, running or done."""
    job = get_server_job(session, job_id)
    if job.status not in ("failed", "cancelled"):
        raise ServerJobError(f"job #{job_id} is {job.status}: only a failed or cancelled job resumes")
    job.status, job.worker_id, job.finished_at = "queued", None, None
    return job


def cancel_server_job(session: Session, job_id: int) -> ServerAnalysisJob:
    """Cancel a queued or running job (a running one stops at its next progress line)."""
    job = get_server_job(session, job_id)
    if job.status not in ("queued", "running"):
        raise ServerJobError(f"job #{job_id} is {job.status}: only a queued or running job is cancelled")
    job.status, job.finished_at = "cancelled", utcnow()
    return job


def _timed_json(run: Any) -> dict[str, Any]:
    completion = run.completion
    return {
        "tokens": completion.tokens,
        "stop_type": completion.stop_type,
        "timings": completion.timings,
        "text": completion.text,
        "others_cpu": run.others_cpu,
        "steal": run.steal,
        "mhz": run.mhz,
    }


def _timed(value: Mapping[str, Any]) -> Any:
    from analyzer.analysis.server_outcomes import TimedCompletion
    from analyzer.engine.llama_server_process import Completion

    return TimedCompletion(
        Completion(list(value["tokens"]), value["stop_type"], dict(value["timings"]), value["text"]),
        value["others_cpu"],
        value["steal"],
        value["mhz"],
    )


def _pass_json(runs: Any) -> dict[str, Any]:
    return {
        "plain": _timed_json(runs.plain),
        "measured": [_timed_json(run) for run in runs.measured],
        "plain_after": _timed_json(runs.plain_after),
    }


def _kept(job: ServerAnalysisJob, host: str) -> tuple[dict[str, tuple[list[int], Any]], dict[str, Any]]:
    """The plain generations and the passes through the servers an earlier attempt on this machine stored
    (both empty on another machine)."""
    from analyzer.analysis.server_passes import PassRuns

    stored = job.generated or {}
    if stored.get("host") != host:
        return {}, {}
    outputs = {key: (list(value["ids"]), _timed(value)) for key, value in stored.get("outputs", {}).items()}
    passes = {
        key: PassRuns(
            _timed(value["plain"]), [_timed(run) for run in value["measured"]], _timed(value["plain_after"])
        )
        for key, value in stored.get("passes", {}).items()
    }
    return outputs, passes


class _Reporter:
    """The analysis' progress lines: each is stored (at most every HEARTBEAT_EVERY_S, and always with a
    phase change), renewing the job's heartbeat; ServerJobStopped once the job is no longer this worker's."""

    def __init__(
        self, sessions: sessionmaker[Session], job_id: int, worker_id: str, echo: Callable[[str], None]
    ):
        self.sessions, self.job_id, self.worker_id, self.echo = sessions, job_id, worker_id, echo
        self.stored_at = 0.0
        self.phase = ""

    def __call__(self, line: str) -> None:
        self.echo(line)
        phase = line.split()[0] if line else ""
        if phase == self.phase and time.monotonic() - self.stored_at < HEARTBEAT_EVERY_S:
            return
        self.phase, self.stored_at = phase, time.monotonic()
        self.store({"phase": phase, "line": line})

    def store(self, progress: dict[str, Any] | None = None, generated: dict[str, Any] | None = None) -> None:
        values: dict[str, Any] = {"heartbeat_at": utcnow()}
        if progress is not None:
            values["progress"] = progress
        if generated is not None:
            values["generated"] = generated
        with self.sessions() as session, session.begin():
            lock_for_write(session)
            held = session.execute(
                update(ServerAnalysisJob)
                .where(
                    ServerAnalysisJob.id == self.job_id,
                    ServerAnalysisJob.worker_id == self.worker_id,
                    ServerAnalysisJob.status == "running",
                )
                .values(**values)
            )
            if not getattr(held, "rowcount", 1):
                raise ServerJobStopped(f"job #{self.job_id} was cancelled or taken over by another worker")


def execute_server_job(
    sessions: sessionmaker[Session],
    job_id: int,
    *,
    worker_id: str,
    cache_dir: Path,
    llama_server: str = "",
    echo: Callable[[str], None] = lambda line: None,
) -> int | None:
    """Execute claimed job ``job_id``: the analysis in llama-server (analyzer/analysis/server_analysis.py) with
    its progress and plain generations stored as they come, then the analysis stored and the job done in one
    transaction. Returns the analysis' id; None when the job failed (its message and code stored) or stopped
    (cancelled, or taken over by another worker). ``llama_server``: SPECROUTE_LLAMA_SERVER."""
    from analyzer.analysis.server_passes import Attempt
    from analyzer.analysis.server_store import first_per_task, server_prompts

    host = socket.gethostname()
    report = _Reporter(sessions, job_id, worker_id, echo)
    with sessions() as session:
        job = get_server_job(session, job_id)
        params = ServerJobParams.from_json(job.params)
        prompts = server_prompts(job.prompt_set)
        set_id = job.prompt_set_id
        kept, kept_passes = _kept(job, host)
        outputs = dict((job.generated or {}).get("outputs", {})) if kept else {}
        stored_passes = dict((job.generated or {}).get("passes", {})) if kept else {}
    passes: dict[str, Any] = {}  # this attempt's passes in order, the kept ones first
    if params.per_task is not None:
        prompts = first_per_task(prompts, params.per_task)
    if params.limit is not None:
        prompts = prompts[: params.limit]

    def generated(prompt: Any, ids: list[int], run: Any) -> None:
        outputs[prompt.key] = {"ids": ids, **_timed_json(run)}
        report.store(generated={"host": host, "outputs": outputs, "passes": passes or stored_passes})

    def passed(key: str, runs: Any, new: bool) -> None:
        passes[key] = _pass_json(runs) if new else stored_passes[key]
        if new:
            report.store(generated={"host": host, "outputs": outputs, "passes": passes})

    try:
        analysis, setup, build = _analyze_job(
            sessions, params, prompts, Attempt(kept, kept_passes, generated, passed), report,
            cache_dir=cache_dir, llama_server=llama_server, where=f"job #{job_id} on {host}",
        )  # fmt: skip
    except ServerJobStopped:
        return None
    except Exception as exc:  # every failure is the job's, stored with its message and code
        code = getattr(exc, "code", None) or type(exc).__name__
        _fail(sessions, job_id, worker_id, str(exc) or type(exc).__name__, str(code))
        return None
    return _store_done(sessions, job_id, worker_id, set_id, analysis, setup, build)


def _analyze_job(
    sessions: sessionmaker[Session],
    params: ServerJobParams,
    prompts: list,
    attempt: Any,
    report: Callable[[str], None],
    *,
    cache_dir: Path,
    llama_server: str,
    where: str,
) -> tuple[Any, Any, str]:
    """The analysis a job's ``params`` ask for on ``prompts`` (its servers started here or the user's), told to
    ``report``, with an earlier analysis' fit where one holds; (the analysis, its setup, the server build)."""
    from analyzer.analysis.server_analysis import ValidationAsk, analyze_in_llama_server
    from analyzer.measuring.server_drafting import parse_drafter

    drafters = [parse_drafter(text) for text in params.drafters]
    setup, build = _setup(params, cache_dir, llama_server)
    servers = (
        f"the servers at {', '.join(params.urls.values())}"
        if params.urls
        else f"{setup.binary}, {params.threads} threads"
    )
    report(f"analyzing {len(prompts)} prompts in llama-server ({servers})")
    report(where)
    analysis = analyze_in_llama_server(
        setup, prompts, drafters,
        n_predict=params.n_predict, calibration_prompts=params.calibration, validate=params.validate,
        validation=ValidationAsk(
            params.validate_repeats, budget_share=None if params.validate_all else DEFAULT_BUDGET_SHARE
        ),
        say=report, attempt=attempt, long_prompts=params.long_prompts,
        prior=_prior(sessions, params, setup, build, report),
    )  # fmt: skip
    return analysis, setup, build


def _store_done(
    sessions: sessionmaker[Session],
    job_id: int,
    worker_id: str,
    set_id: int,
    analysis: Any,
    setup: Any,
    build: str,
) -> int | None:
    """Store a finished job's analysis and mark the job done, in one transaction; the analysis' id, or None
    when the job is no longer this worker's (cancelled or taken over meanwhile: nothing stored)."""
    from analyzer.analysis.server_store import store_server_analysis

    with sessions() as session, session.begin():
        lock_for_write(session)
        job = get_server_job(session, job_id)
        if job.status != "running" or job.worker_id != worker_id:
            return None
        record = store_server_analysis(
            session,
            session.get_one(PromptSet, set_id),
            analysis,
            model=str(setup.model),
            server_build=build,
            draft_model=str(setup.draft_model) if setup.draft_model else None,
        )
        job.status, job.finished_at, job.analysis_id = "done", utcnow(), record.id
        job.progress = {"phase": "done", "line": f"stored llama-server analysis #{record.id}"}
        return record.id


def _prior(
    sessions: sessionmaker[Session],
    params: ServerJobParams,
    setup: Any,
    build: str,
    say: Callable[[str], None],
) -> Any:
    """The fit an earlier analysis made on this setup (:func:`analyzer.analysis.server_store.prior_fit`), said
    where there is one; None with ``refit`` or the user's servers (another machine's, maybe)."""
    from analyzer.analysis.server_store import prior_fit

    if params.refit or params.urls:
        return None
    with sessions() as session:
        prior = prior_fit(
            session, model=str(setup.model), server_build=build, threads=params.threads, n_ctx=setup.n_ctx,
            draft_model=str(setup.draft_model) if setup.draft_model else None,
        )  # fmt: skip
    if prior is not None:
        say(f"an earlier fit on this setup (llama-server analysis #{prior.analysis_id}) is checked first")
    return prior


def _setup(params: ServerJobParams, cache_dir: Path, llama_server: str) -> tuple[Any, str]:
    """The servers the job analyzes with (our own, or the user's at ``params.urls``) and their build."""
    from analyzer.analysis.server_generation import ServerSetup
    from analyzer.engine.llama_server import find_llama_server
    from analyzer.engine.llama_server_process import RemoteServer, server_version
    from analyzer.engine.llamacpp_engine import gguf_file
    from analyzer.models.specs import parse_spec

    draft_path = gguf_file(parse_spec(params.draft_model)) if params.draft_model else None
    if params.urls:  # the user's servers: the model and context are the plain one's
        plain = RemoteServer(params.urls["off"]).start()
        model_text, n_ctx = plain.setup()
        props = plain.client.props()
        model_path = Path(str(props.get("model_path", model_text)))
        build = str(props.get("build_info", "unknown"))[:100]
        return ServerSetup(None, model_path, params.threads, n_ctx, draft_path, params.urls), build
    binary = find_llama_server(llama_server, cache_dir).path
    setup = ServerSetup(binary, gguf_file(parse_spec(params.model)), params.threads, params.n_ctx, draft_path)
    return setup, server_version(binary)


def _fail(sessions: sessionmaker[Session], job_id: int, worker_id: str, message: str, code: str) -> None:
    with sessions() as session, session.begin():
        lock_for_write(session)
        session.execute(
            update(ServerAnalysisJob)
            .where(ServerAnalysisJob.id == job_id, ServerAnalysisJob.worker_id == worker_id)
            .values(status="failed", error=message[:2000], error_code=code[:64], finished_at=utcnow())
        )


def run_next_server_job(
    sessions: sessionmaker[Session],
    *,
    worker_id: str,
    cache_dir: Path,
    llama_server: str = "",
    stale_after_s: float = STALE_AFTER_S,
) -> int | None:
    """Claim and execute one job; its id (None when there was none to claim)."""
    job_id = claim_server_job(sessions, worker_id, stale_after_s=stale_after_s)
    if job_id is None:
        return None
    execute_server_job(sessions, job_id, worker_id=worker_id, cache_dir=cache_dir, llama_server=llama_server)
    return job_id
