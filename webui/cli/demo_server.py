"""The steps of ``specroute demo`` that differ in llama-server, llama.cpp's own C++ server (the demo's engine
under SPECROUTE_ENGINE's default, auto): analyze the sample there, with llama-server's drafting rules replayed
exactly on each prompt's greedy output and validated through speculating servers; publish its policy set with
a pool per setting; print the analysis. The other steps are :mod:`webui.cli.demo_steps`'."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from analyzer.engine.engine_base import EngineUnavailable
from analyzer.models.specs import DEFAULT_TARGET, parse_spec
from analyzer.orm import PromptSet, ServerAnalysisJob, ServerAnalysisRecord
from webui.cli.base import CliState, _cache_dir

if TYPE_CHECKING:
    from analyzer.analysis.server_jobs import ServerJobParams

DEMO_SERVER_ENGINE = "llama-server"
DEMO_PER_TASK = 3  # prompts per task: 39 over 13 tasks; the fewest a task decides alone on (MIN_TASK_PROMPTS)
DEMO_THREADS = 2
DEMO_CTX = 4096
DEMO_CALIBRATION = 8
DEMO_VALIDATE_REPEATS = 1  # one validation pass over the sample the validation budget pays for


def require_llama_server(state: CliState) -> Path:
    """The llama-server binary, or :class:`EngineUnavailable` saying how to build it and the other way on."""
    from analyzer.engine.llama_server import LlamaServerMissing, find_llama_server

    try:
        return find_llama_server(
            state.settings.llama_server, _cache_dir(state), build_cache=state.settings.resolved_build_cache()
        ).path
    except LlamaServerMissing as exc:
        raise EngineUnavailable(
            f"{exc}; or run the demo in transformers: specroute demo --engine transformers"
        ) from None


def calibration_count(prompts: int) -> int:
    """Calibration prompts for a demo of ``prompts``: :data:`DEMO_CALIBRATION`, or a third of a smaller set
    (at least 2), so the rest are validated."""
    return min(DEMO_CALIBRATION, max(2, prompts // 3))


def demo_prompts(prompt_set: PromptSet, limit: int | None) -> list:
    """The sample's first :data:`DEMO_PER_TASK` prompts of each task, in set order; the first ``limit`` of
    them where given."""
    from analyzer.analysis.server_store import first_per_task, server_prompts

    chosen = first_per_task(server_prompts(prompt_set), DEMO_PER_TASK)
    return chosen[:limit] if limit is not None else chosen


def analyze_sample_in_llama_server(
    state: CliState,
    sessions: sessionmaker[Session],
    prompt_set_id: int,
    binary: Path,
    *,
    n_predict: int,
    validate: bool,
    limit: int | None,
    again: bool,
) -> int:
    """[3/6] The sample analyzed in llama-server with every default drafter setting: a stored analysis of
    the same prompts, new tokens, settings, model and validation is reused unless ``again``; else one is
    measured (a line per step) and stored in one transaction. Returns its id."""
    from analyzer.analysis.server_jobs import ServerJobParams
    from analyzer.engine.llamacpp_engine import gguf_file
    from webui.cli.server_analysis import DEFAULT_DRAFTERS, drafters_of

    drafters = drafters_of(())
    model = gguf_file(parse_spec(DEFAULT_TARGET))
    with sessions() as session:
        prompt_set = session.get(PromptSet, prompt_set_id)
        assert prompt_set is not None  # imported by the step before
        prompts = demo_prompts(prompt_set, limit)
        if not again:
            reused = _stored_analysis(session, prompt_set_id, len(prompts), n_predict, str(model), validate)
            if reused is not None:
                click.echo(f"[3/6] llama-server analysis #{reused} already done (reused)")
                return reused
    click.echo(
        f"[3/6] analyzing {len(prompts)} sample prompts ({DEMO_PER_TASK} per task) in llama-server: "
        f"{DEFAULT_TARGET}, {n_predict} new tokens, the settings {', '.join(DEFAULT_DRAFTERS)}, "
        f"{'validated through speculating servers, one pass' if validate else 'not validated'} ({binary})"
    )
    params = ServerJobParams(
        DEFAULT_TARGET, tuple(d.label for d in drafters), None, n_predict, DEMO_THREADS, DEMO_CTX,
        calibration_count(len(prompts)), DEMO_PER_TASK, limit, validate, DEMO_VALIDATE_REPEATS,
    )  # fmt: skip
    return _execute_demo_job(state, sessions, _demo_job(sessions, prompt_set_id, params, again), binary)


def _demo_job(
    sessions: sessionmaker[Session], prompt_set_id: int, params: ServerJobParams, again: bool
) -> int:
    """The analysis job the demo runs: the newest failed or cancelled one of the same sample and parameters,
    resumed where it stopped (its generations and passes kept), unless ``again``; else a new one."""
    from analyzer.analysis.server_jobs import create_server_job, resume_server_job

    with sessions() as session, session.begin():
        lock_for_write(session)
        stopped = next(
            (
                job
                for job in session.scalars(
                    select(ServerAnalysisJob)
                    .where(
                        ServerAnalysisJob.prompt_set_id == prompt_set_id,
                        ServerAnalysisJob.status.in_(("failed", "cancelled")),
                    )
                    .order_by(ServerAnalysisJob.id.desc())
                )
                if job.params == params.as_json()
            ),
            None,
        )
        if stopped is not None and not again:
            job_id = resume_server_job(session, stopped.id).id
            click.echo(f"      resuming the stopped analysis job #{job_id}")
            return job_id
        return create_server_job(session, session.get_one(PromptSet, prompt_set_id), params).id


def _execute_demo_job(state: CliState, sessions: sessionmaker[Session], job_id: int, binary: Path) -> int:
    """Claim and run the demo's analysis job in this process, a line per step; its analysis' id. Ctrl-C cancels
    it (exit status 130; the next demo resumes it); a job that fails raises its error with what to change."""
    from analyzer.analysis.server_jobs import cancel_server_job, claim_server_job, execute_server_job
    from analyzer.analysis.server_outcomes import ServerAnalysisError

    worker_id = f"{socket.gethostname()}:{os.getpid()}:demo"
    claim_server_job(sessions, worker_id, job_id=job_id)
    try:
        analysis_id = execute_server_job(
            sessions, job_id, worker_id=worker_id, cache_dir=_cache_dir(state),
            llama_server=str(binary), echo=lambda line: click.echo(f"      {line}"),
        )  # fmt: skip
    except KeyboardInterrupt:
        with sessions() as session, session.begin():
            lock_for_write(session)
            cancel_server_job(session, job_id)
        click.echo("\ninterrupted; 'specroute demo' resumes the analysis where it was", err=True)
        sys.exit(130)
    if analysis_id is None:
        with sessions() as session:
            job = session.get_one(ServerAnalysisJob, job_id)
            raise ServerAnalysisError(
                f"{job.error} ({job.error_code}; in the demo: more prompts, without --limit, or longer answers, "
                "--max-new-tokens; 'specroute demo' resumes it)"
            )
    return analysis_id


def _stored_analysis(
    session: Session, prompt_set_id: int, prompts: int, n_predict: int, model: str, validate: bool
) -> int | None:
    """The newest stored analysis of the sample that the demo would measure again, or None."""
    from webui.cli.server_analysis import DEFAULT_DRAFTERS, drafters_of

    labels = [d.label for d in drafters_of(DEFAULT_DRAFTERS)]
    for record in session.scalars(
        select(ServerAnalysisRecord)
        .where(ServerAnalysisRecord.prompt_set_id == prompt_set_id)
        .order_by(ServerAnalysisRecord.id.desc())
    ):
        if (
            len(record.prompts) == prompts
            and record.n_predict == n_predict
            and record.drafters == labels
            and record.model == model
            and record.draft_model is None
            and bool(record.validation_repeats) == validate
        ):
            return record.id
    return None


def publish_and_print_server_analysis(sessions: sessionmaker[Session], analysis_id: int) -> None:
    """[5/6] Publish the analysis' policy set (a policy per task, a pool per setting) unless a set from it
    exists, then print the analysis (which leads with "Advice withheld" where its step-cost fit missed its
    bound or the machine was too noisy; such a set is published but not activated)."""
    from analyzer.analysis.server_store import get_server_analysis
    from router.orm import PolicySet
    from router.policies.server_policy import publish_server_policies
    from webui.cli.server_analysis import server_analysis_text

    with sessions() as session, session.begin():
        lock_for_write(session)
        existing = session.scalar(
            select(PolicySet)
            .where(PolicySet.server_analysis_id == analysis_id)
            .order_by(PolicySet.version.desc())
            .limit(1)
        )
        if existing is None:
            published = publish_server_policies(session, analysis_id, notes="specroute demo")
            state = "active" if published.is_active else "NOT activated: advice withheld"
            click.echo(
                f"[5/6] published policy set v{published.version} from llama-server analysis #{analysis_id} "
                f"({state}; {len(published.pools or {})} pools)"
            )
        else:
            state = "active" if existing.is_active else "not active"
            click.echo(
                f"[5/6] policy set v{existing.version} from llama-server analysis #{analysis_id} already "
                f"published ({state}; reused)"
            )
        record = get_server_analysis(session, analysis_id)
        text, withheld = server_analysis_text(record), record.advice_withheld
    click.echo("\n" + text + "\n")
    if withheld:
        click.echo(
            "The router does not follow this analysis' policies: analyze again on a quiet machine with "
            "'specroute demo --reprofile' (or activate the set anyway: 'specroute policies activate VERSION').\n"
        )
