"""llama-server analysis pages: the stored analyses with the form that queues one and the jobs (queued, running,
failed with why, done), one job's progress, and one analysis' report, the one report page every analysis has
(webui/report_page.py) with this kind's own sections: its step costs, predicted vs measured per drafter setting
(with the share whose draft counts equal the replay's), and the pools its choices need with their command lines;
its exports and publishing it as the active policy set."""

from __future__ import annotations

from flask import Response, abort, jsonify, redirect, render_template, request, url_for
from sqlalchemy import select

from analyzer.advice.option_rows import options_csv
from analyzer.advice.verdict import server_verdict
from analyzer.analysis.analysis_ref import SERVER, AnalysisRef
from analyzer.analysis.server_jobs import (
    DEFAULT_DRAFTERS,
    DEFAULT_MODEL,
    LIMITS,
    ServerJobError,
    ServerJobNotFound,
    ServerJobParams,
    cancel_server_job,
    create_server_job,
    get_server_job,
    job_view,
    list_server_jobs,
    resume_server_job,
)
from analyzer.analysis.server_store import (
    get_server_analysis,
    list_server_analyses,
    pool_plan,
    pool_plan_text,
    server_analysis_json,
)
from analyzer.analysis.server_text import cost_text, divergence_text, noise_text
from analyzer.db import lock_for_write
from analyzer.orm import PromptSet
from analyzer.prompts.prompt_sets import PromptSetError, get_prompt_set
from router import strict_json
from webui.report_page import Link, render_report, server_page
from webui.router_pages import publish_page
from webui.run_pages import model_choices
from webui.ui import bp, flash, sessions

FORM_FIELDS = ("prompt_set", "model", "n_predict", "per_task", "limit", "calibration", "validate_repeats")


def _gguf_targets() -> list[str]:
    """The operator's targets llama-server can load (gguf: and builtin: specs)."""
    targets, _ = model_choices()
    return [t for t in targets if t.startswith(("gguf:", "builtin:"))] or [DEFAULT_MODEL]


def _form_params(
    values: dict[str, str], validate: bool, flags: frozenset[str] = frozenset()
) -> ServerJobParams:
    """The form's values as job parameters (``flags``: the checkboxes ticked of "validate_all" and "refit");
    ServerJobError naming the field that is not a whole number (the bounds are checked by
    :meth:`ServerJobParams.checked`, the command line's too)."""
    numbers: dict[str, int | None] = {}
    for name in ("n_predict", "per_task", "limit", "calibration", "validate_repeats"):
        text = values[name].strip()
        if not text and name in ("per_task", "limit"):
            numbers[name] = None
            continue
        if not text.isdigit():
            low, high = LIMITS[name]
            raise ServerJobError(f"{name} must be a whole number from {low} to {high}, got {text!r}")
        numbers[name] = int(text)
    if values["model"] not in _gguf_targets():
        raise ServerJobError(
            "model: choose a GGUF target from the list (the operator sets it with SPECROUTE_MODELS)"
        )
    return ServerJobParams(
        model=values["model"], n_predict=numbers["n_predict"] or 0, per_task=numbers["per_task"],
        limit=numbers["limit"], calibration=numbers["calibration"] or 0, validate=validate,
        validate_repeats=numbers["validate_repeats"] or 0, validate_all="validate_all" in flags,
        refit="refit" in flags,
    ).checked()  # fmt: skip


def _listing(errors: list[str] | None = None, values: dict[str, str] | None = None, status: int = 200):
    with sessions()() as session:
        rows = [
            {
                "id": r.id,
                "set": r.prompt_set.name,
                "prompts": len(r.prompts),
                "drafters": ", ".join(r.drafters),
                "created_at": r.created_at.strftime("%Y-%m-%d %H:%M UTC"),
            }
            for r in list_server_analyses(session)
        ]
        jobs = [job_view(job) for job in list_server_jobs(session)]
        names = list(session.scalars(select(PromptSet.name).order_by(PromptSet.name)))
    defaults = ServerJobParams()
    shown = {
        "prompt_set": names[0] if names else "",
        "model": _gguf_targets()[0],
        "n_predict": str(defaults.n_predict),
        "per_task": "",
        "limit": "",
        "calibration": str(defaults.calibration),
        "validate_repeats": str(defaults.validate_repeats),
    } | (values or {})
    page = render_template(
        "server_analyses.html", rows=rows, jobs=jobs, prompt_sets=names, targets=_gguf_targets(), values=shown,
        errors=errors or [], limits=LIMITS, drafters=DEFAULT_DRAFTERS,
    )  # fmt: skip
    return page, status


@bp.get("/llama-server")
def server_analyses():
    return _listing()


@bp.post("/llama-server/jobs")
def start_server_job():
    """Queue an analysis in llama-server from the form (the workers execute it); 400 with the form and the
    reason for a bad value."""
    values = {k: request.form.get(k, "") for k in FORM_FIELDS}
    try:
        flags = frozenset(name for name in ("validate_all", "refit") if request.form.get(name) == "on")
        params = _form_params(values, request.form.get("validate") == "on", flags)
        with sessions()() as session, session.begin():
            lock_for_write(session)
            prompt_set = get_prompt_set(session, values["prompt_set"])
            job_id = create_server_job(session, prompt_set, params).id
    except (ServerJobError, PromptSetError) as exc:
        return _listing([str(exc)], values, 400)
    flash(f"llama-server analysis job #{job_id} queued; it starts as soon as a worker is free")
    return redirect(url_for("ui.server_job", job_id=job_id))


@bp.get("/llama-server/jobs/<int:job_id>")
def server_job(job_id: int):
    with sessions()() as session:
        view = job_view(get_server_job(session, job_id))
    return render_template("server_job.html", job=view)


@bp.get("/llama-server/jobs/<int:job_id>/status.json")
def server_job_status(job_id: int):
    with sessions()() as session:
        view = job_view(get_server_job(session, job_id))
    return jsonify(
        {"id": view.id, "status": view.status, "progress": view.progress, "kept": view.kept, "passes": view.passes,
         "error": view.error, "error_code": view.error_code, "analysis_id": view.analysis_id,
         "attempts": view.attempts}
    )  # fmt: skip


@bp.post("/llama-server/jobs/<int:job_id>/<action>")
def change_server_job(job_id: int, action: str):
    """Resume (a failed or cancelled job, where it was) or cancel (a queued or running one)."""
    change = {"resume": resume_server_job, "cancel": cancel_server_job}.get(action)
    if change is None:
        abort(404)
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            status = change(session, job_id).status
    except ServerJobNotFound:
        abort(404)
    except ServerJobError as exc:
        flash(str(exc), "error")
    else:
        flash(f"llama-server analysis job #{job_id} {status}")
    return redirect(url_for("ui.server_job", job_id=job_id))


@bp.get("/llama-server/<int:analysis_id>")
def server_analysis(analysis_id: int):
    """The analysis' report: the one report page every analysis has (webui/report_page.py), with a llama-server
    analysis' own sections (setup, fitted step costs, validation per setting, pools and publishing)."""
    with sessions()() as session:
        record = get_server_analysis(session, analysis_id)
        plan = pool_plan(record)
        exports = (
            Link("JSON", url_for("ui.server_analysis_report_json", analysis_id=analysis_id)),
            Link(
                "per prompt and option CSV",
                url_for("ui.server_analysis_options_csv", analysis_id=analysis_id),
            ),
        )
        page = server_page(
            server_analysis_json(session, record), record, pools=plan["routes"], exports=exports
        )
        return render_report(
            page,
            record=record,
            plan_text=pool_plan_text(record, 8081),
            cost_lines={family: cost_text(cost) for family, cost in record.cost.items()},
            noise_line=noise_text(record.noise),
            divergence_line=divergence_text(record.validation),
            verdict_lines=server_verdict(record).lines(),
        )


@bp.get("/llama-server/<int:analysis_id>/report.json")
def server_analysis_report_json(analysis_id: int):
    """The analysis as ``specroute report --llama-server-analysis ID --format json`` prints it."""
    with sessions()() as session:
        data = server_analysis_json(session, get_server_analysis(session, analysis_id))
    return Response(
        strict_json.dumps(data, indent=1),
        mimetype="application/json",
        headers={"Content-Disposition": f'attachment; filename="specroute-llama-server-{analysis_id}.json"'},
    )


@bp.get("/llama-server/<int:analysis_id>/options.csv")
def server_analysis_options_csv(analysis_id: int):
    """One row per prompt and setting, the columns a run's options.csv has."""
    with sessions()() as session:
        data = server_analysis_json(session, get_server_analysis(session, analysis_id))
    return Response(
        options_csv(data["prompts"]),
        mimetype="text/csv",
        headers={
            "Content-Disposition": f'attachment; filename="specroute-llama-server-{analysis_id}-options.csv"'
        },
    )


@bp.post("/llama-server/<int:analysis_id>/publish")
def publish_server_analysis(analysis_id: int):
    """Publish the analysis' choices (its pools on this machine from port 8081, or where SPECROUTE_ROUTER_POOLS
    names them), as the policies page's form publishes any analysis (``/policies/publish``, where the analysis
    page's button posts); kept for the address earlier pages posted to."""
    return publish_page(AnalysisRef(SERVER, analysis_id))
