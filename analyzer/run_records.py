"""Analysis runs, their bookkeeping: parameters, create a run (queued), choose its prompts, cancel
it, show its status, record its phase, finish it, and pick the prompts to validate. No model is
loaded here (nothing imports torch), so the web server and the CLI's listing commands use this
module; executing a run is :mod:`analyzer.runs`.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import utcnow
from analyzer.devices import (
    MAX_PROFILE_BATCH_SIZE,
    DeviceError,
    Placement,
    check_device_name,
    check_dtype_name,
    default_batch_sizes,
    resolve,
)
from analyzer.engines import DEFAULT_ENGINE, LLAMA_CPP, EngineError, check_engine_name
from analyzer.entropy import ENTROPY_EDGES_NATS
from analyzer.errors import SpecrouteError
from analyzer.specs import ModelSpecRef, display_name, parse_spec
from analyzer.orm import AnalysisRun, ModelPair, ModelSpec, Prompt
from analyzer.prompt_sets import get_prompt_set
from analyzer.summary import AnalysisSummary, PromptSummary

UNLABELLED = "unlabelled"


class RunError(SpecrouteError, ValueError):
    """A run cannot be created or executed as asked; the message says why."""

    status, code = 400, "invalid_run"


class RunNotFound(RunError, LookupError):
    """No analysis run has the id asked for."""

    status, code = 404, "run_not_found"


@dataclass(frozen=True)
class RunParams:
    """Parameters of an analysis run (stored as JSON on the run)."""

    max_new_tokens: int = 128
    gamma_max: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    validate: int = 0
    limit: int | None = None
    chat_template: bool = True
    batch_size: int = 1
    margin: float = 0.05
    seed: int = 0
    reprofile: bool = False
    max_prompt_tokens: int | None = None
    engine: str = DEFAULT_ENGINE  # transformers | llama.cpp (analyzer/engines.py): what measures and prices the run
    device: str = "auto"  # auto | cpu | cuda | cuda:N, resolved by the worker that executes the run
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    profile_batch_sizes: tuple[int, ...] | None = None  # None: 1,4,16 on a GPU, 1 on the CPU
    chunk_size: int = 32  # prompts per chunk that one worker claims (analyzer/chunks.py)
    # stored with the run so its entropy table keeps its buckets if the defaults change (None = inf)
    entropy_edges: tuple[float | None, ...] = tuple(e if e != float("inf") else None for e in ENTROPY_EDGES_NATS)

    def check(self) -> "RunParams":
        """Raise :class:`RunError` naming the first parameter out of range."""
        if not 1 <= self.max_new_tokens <= 4096:
            raise RunError("max_new_tokens must be between 1 and 4096")
        if not 1 <= self.gamma_max <= 64:
            raise RunError("gamma_max must be between 1 and 64")
        if self.temperature < 0:
            raise RunError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise RunError("top_p must be in (0, 1]")
        if self.validate < 0 or (self.limit is not None and self.limit < 1):
            raise RunError("validate must be >= 0 and limit >= 1")
        if self.batch_size < 1:
            raise RunError("batch_size must be >= 1")
        if self.batch_size > 1 and self.temperature > 0:
            raise RunError("batching is for greedy runs only (sampling uses one seed per prompt)")
        if self.margin < 0:
            raise RunError("margin must be >= 0")
        if not 1 <= self.chunk_size <= 100_000:
            raise RunError("chunk_size must be between 1 and 100,000")
        try:
            check_device_name(self.device), check_dtype_name(self.dtype), check_engine_name(self.engine)
        except (DeviceError, EngineError) as error:
            raise RunError(str(error)) from None
        sizes = self.profile_batch_sizes
        if sizes is not None and (not sizes or any(not 1 <= int(b) <= MAX_PROFILE_BATCH_SIZE for b in sizes)):
            raise RunError(f"profile batch sizes must be integers from 1 to {MAX_PROFILE_BATCH_SIZE}")
        if self.engine == LLAMA_CPP:
            self._check_llama_cpp()
        return self

    def _check_llama_cpp(self) -> None:
        """Raise :class:`RunError` for the first setting the llama.cpp engine cannot measure."""
        if self.temperature != 0:
            raise RunError("the llama.cpp engine measures greedy decoding only; use temperature 0")
        if check_device_name(self.device) not in ("auto", "cpu"):
            raise RunError(f"the llama.cpp engine runs on the CPU here; use device auto or cpu, not {self.device!r}")
        if check_dtype_name(self.dtype) != "auto":
            raise RunError("the llama.cpp engine measures the GGUF file's own quantization (Q4_1, Q8_0, ...) as "
                           f"shipped; leave dtype auto, not {self.dtype!r}")
        if self.batch_size != 1 or tuple(self.profile_batch_sizes or (1,)) != (1,):
            raise RunError("the llama.cpp engine runs one sequence per context (llama-cpp-python): use batch size 1 "
                           "and profile batch size 1 only")

    @classmethod
    def from_json(cls, data: dict) -> "RunParams":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "entropy_edges" in values:
            values["entropy_edges"] = tuple(values["entropy_edges"])
        if values.get("profile_batch_sizes") is not None:
            values["profile_batch_sizes"] = tuple(int(b) for b in values["profile_batch_sizes"])
        return cls(**values)

    def placement(self) -> Placement:
        """The device and dtype this run asks for, resolved on this machine (DeviceError if absent)."""
        return resolve(self.device, self.dtype)

    def batch_sizes(self, placement: Placement) -> tuple[int, ...]:
        """The batch sizes to profile: the ones asked for, else the device's default."""
        return tuple(self.profile_batch_sizes) if self.profile_batch_sizes else default_batch_sizes(placement)


ProgressCallback = Callable[[int, int, str], None]


def _get_or_create_spec(session: Session, ref: ModelSpecRef) -> ModelSpec:
    spec = session.scalar(select(ModelSpec).where(ModelSpec.spec == ref.canonical))
    if spec is None:
        spec = ModelSpec(spec=ref.canonical, kind=ref.kind, display_name=display_name(ref), details=dict(ref.options))
        session.add(spec)
        session.flush()
    return spec


def get_or_create_pair(session: Session, target: ModelSpecRef, draft: ModelSpecRef) -> ModelPair:
    """The stored pair for these specs, created on first use."""
    target_spec, draft_spec = _get_or_create_spec(session, target), _get_or_create_spec(session, draft)
    pair = session.scalar(
        select(ModelPair).where(ModelPair.target_id == target_spec.id, ModelPair.draft_id == draft_spec.id)
    )
    if pair is None:
        pair = ModelPair(target=target_spec, draft=draft_spec)
        session.add(pair)
        session.flush()
    return pair


def create_run(session: Session, prompt_set_name: str, target: str, draft: str, params: RunParams) -> AnalysisRun:
    """Queue an analysis of the named prompt set with ``target`` and ``draft`` spec strings."""
    params.check()
    target_ref, draft_ref = parse_spec(target), parse_spec(draft)
    if target_ref.kind == "ngram":
        raise RunError("the target must be a model, not 'ngram'")
    if params.engine == LLAMA_CPP:
        _check_llama_cpp_specs(target_ref, draft_ref)
    prompt_set = get_prompt_set(session, prompt_set_name)
    pair = get_or_create_pair(session, target_ref, draft_ref)
    total = prompt_set.prompt_count if params.limit is None else min(params.limit, prompt_set.prompt_count)
    run = AnalysisRun(prompt_set=prompt_set, pair=pair, status="queued", params=asdict(params),
                      progress_total=total, engine=params.engine)
    session.add(run)
    session.flush()
    return run


LLAMA_CPP_SPEC_KINDS = ("gguf", "builtin")  # the spec kinds llama.cpp loads natively (GGUF files)


def _check_llama_cpp_specs(target: ModelSpecRef, draft: ModelSpecRef) -> None:
    """Raise :class:`RunError` unless llama.cpp can load the pair: a GGUF target (``gguf:`` or
    ``builtin:``) and a GGUF or n-gram draft."""
    if target.kind not in LLAMA_CPP_SPEC_KINDS:
        raise RunError(f"the llama.cpp engine loads GGUF files only: the target must be gguf:<folder>#<file.gguf> "
                       f"or builtin:<name>, not {target.canonical!r}")
    if draft.kind not in LLAMA_CPP_SPEC_KINDS + ("ngram",):
        raise RunError(f"the llama.cpp engine loads GGUF files only: the draft must be ngram, "
                       f"gguf:<folder>#<file.gguf> or builtin:<name>, not {draft.canonical!r}")


def selected_prompts(session: Session, run: AnalysisRun) -> list[Prompt]:
    """The run's prompts in file order (the first ``limit`` of the set)."""
    query = select(Prompt).where(Prompt.prompt_set_id == run.prompt_set_id).order_by(Prompt.position)
    if run.params.get("limit"):
        query = query.limit(run.params["limit"])
    return list(session.scalars(query))


def request_cancel(session: Session, run_id: int) -> AnalysisRun:
    """Ask a queued or running run to stop after the prompt it is on."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise RunNotFound(f"no analysis run {run_id}")
    if run.status == "queued":
        run.status, run.finished_at = "cancelled", utcnow()
    elif run.status == "running":
        run.cancel_requested = True
    return run


INTERRUPTED_AFTER_S = 180.0


def shown_status(run: AnalysisRun, now: datetime | None = None) -> str:
    """The status to show: "interrupted" for a run stored as running whose worker has not written a
    heartbeat for INTERRUPTED_AFTER_S (it died or was killed; ``specroute analyze --resume RUN`` or
    any worker after ten minutes picks it up again), else the stored status."""
    if run.status == "running" and run.heartbeat_at is not None:
        heartbeat = run.heartbeat_at if run.heartbeat_at.tzinfo else run.heartbeat_at.replace(tzinfo=timezone.utc)
        if ((now or utcnow()) - heartbeat).total_seconds() > INTERRUPTED_AFTER_S:
            return "interrupted"
    return run.status


def recording_phases(session_factory: sessionmaker, run_id: int,
                      progress: ProgressCallback | None) -> ProgressCallback:
    """A progress callback that also stores each new phase text on the run (with a heartbeat), so
    that the web UI shows what a worker is doing while it loads models or profiles, then calls
    ``progress``."""
    last: list[str | None] = [None]

    def record(done: int, total: int, phase: str) -> None:
        if phase != last[0]:
            last[0] = phase
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                run.phase, run.heartbeat_at = phase[:300], utcnow()
        if progress:
            progress(done, total, phase)

    return record


def run_status(session_factory: sessionmaker, run_id: int) -> str | None:
    """The stored status of a run (None when there is no such run)."""
    with session_factory() as session:
        return session.scalar(select(AnalysisRun.status).where(AnalysisRun.id == run_id))


def cancelled(session_factory: sessionmaker, run_id: int) -> bool:
    with session_factory() as session:
        return bool(session.scalar(select(AnalysisRun.cancel_requested).where(AnalysisRun.id == run_id)))


def finish(session_factory: sessionmaker, run_id: int, status: str, error: str | None = None) -> AnalysisRun:
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        run.status, run.error, run.finished_at = status, error, utcnow()
        run.cancel_requested, run.phase = False, None
        session.flush()
        return run


def error_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt); rerun to resume"
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def validation_sample(summary: AnalysisSummary, count: int, *,
                      already: Sequence[PromptSummary] = ()) -> list[PromptSummary]:
    """Up to ``count`` prompts of a run's summary to validate (minus those ``already`` validated),
    stratified: one prompt per task in turn, the tasks predicted to speculate first (highest
    predicted speedup first), then the others (most prompts first); within a task in file order. So
    a sample of N covers min(N, number of tasks) tasks, and the decisions that matter most (where
    speculation is switched on) are checked first."""
    tasks = summary.tasks
    order = sorted(tasks, key=lambda t: (not tasks[t].speculate, -(tasks[t].predicted_speedup or 0.0)
                                         if tasks[t].speculate else -tasks[t].n, t))
    done = {p.prompt_id for p in already}
    queues = {t: [p for p in sorted(summary.prompts, key=lambda p: p.position)
                  if p.task == t and p.prompt_id not in done] for t in order}
    taken = {t: sum(1 for p in already if p.task == t) for t in order}
    chosen: list[PromptSummary] = []
    while len(chosen) + len(done) < count and any(queues.values()):
        # the task with the fewest validated so far, ties broken by the order above
        task = min((t for t in order if queues[t]), key=lambda t: (taken[t], order.index(t)))
        chosen.append(queues[task].pop(0))
        taken[task] += 1
    return chosen
