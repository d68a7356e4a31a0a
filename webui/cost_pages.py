"""Cost profile pages: every stored profile (measured by analyses, or imported from an engine's own
benchmark) with an import form, and the re-price action of a finished run's report."""

from __future__ import annotations

from flask import redirect, render_template, request, url_for
from sqlalchemy import select

from analyzer.advice.report import profile_dict
from analyzer.analysis.cost_import import CostFileError
from analyzer.analysis.cost_import_parse import MAX_FILE_BYTES, parse_cost_file
from analyzer.analysis.cost_import_store import store_imported_profiles
from analyzer.analysis.repricing import RepriceError, reprice_run
from analyzer.db import MAX_ID, lock_for_write
from analyzer.orm import AnalysisRun, CostProfile
from webui.ui import bp, flash, sessions


def _list_page(errors: dict | None = None, status: int = 200, for_run: str = "", new_pair: bool = False):
    with sessions()() as session:
        profiles = [
            {
                **row,
                "pair": f"{row['target']} → {row['draft']}",
                "target_step_ms": row["target_k_s"][0] * 1000,
                "ratios": [t / row["target_k_s"][0] for t in row["target_k_s"][1:9]],
                "draft_step_ms": row["draft_s"] * 1000,
                "created_at": p.created_at.strftime("%Y-%m-%d %H:%M UTC"),
            }
            for p in session.scalars(select(CostProfile).order_by(CostProfile.id.desc()))
            for row in [profile_dict(p)]
        ]
        runs = [
            {
                "id": r.id,
                "label": f"run #{r.id} · {r.prompt_set.name} · {r.pair.target.spec} → {r.pair.draft.spec}",
            }
            for r in session.scalars(
                select(AnalysisRun).where(AnalysisRun.status == "done").order_by(AnalysisRun.id.desc())
            )
        ]
    return render_template(
        "costs.html",
        profiles=profiles,
        runs=runs,
        errors=errors,
        for_run=for_run,
        new_pair=new_pair,
        max_kb=MAX_FILE_BYTES // 1000,
    ), status


@bp.get("/costs")
def cost_profiles():
    return _list_page(for_run=request.args.get("for_run", ""))


@bp.post("/costs")
def import_costs():
    upload = request.files.get("file")
    for_run_text = (request.form.get("for_run") or "").strip()
    new_pair = request.form.get("new_pair") == "1"  # the "new pair" box: a pair no run knows yet
    if upload is None or not upload.filename:
        return _list_page(
            {"summary": "choose a cost profile file to import", "problems": []}, 400, for_run_text, new_pair
        )
    for_run = int(for_run_text) if for_run_text.isdigit() and 1 <= int(for_run_text) <= MAX_ID else None
    try:
        profiles = parse_cost_file(upload.read(MAX_FILE_BYTES + 1), upload.filename)
        with sessions()() as session, session.begin():
            lock_for_write(session)  # the check for a stored copy and the insert, one import at a time
            stored = [
                p.id
                for p in store_imported_profiles(
                    session, profiles, upload.filename, for_run=for_run, new_pair=new_pair
                )
            ]
    except CostFileError as exc:
        return _list_page(
            {"summary": str(exc), "problems": exc.problems, "total": exc.total}, 400, for_run_text, new_pair
        )
    flash(
        f"imported {len(stored)} cost profile(s) from {upload.filename}: "
        + ", ".join(f"#{i}" for i in stored)
        + (f"; run #{for_run}'s report prices its acceptance on them" if for_run else "")
    )
    return redirect(url_for("ui.run", run_id=for_run) if for_run else url_for("ui.cost_profiles"))


@bp.post("/runs/<int:run_id>/reprice")
def reprice(run_id: int):
    """A new run with this run's acceptance priced on the chosen profile; shows its report."""
    profile_id = request.form.get("profile_id", type=int)
    if profile_id is None or not 1 <= profile_id <= MAX_ID:
        flash("choose a cost profile to price this run with", "error")
        return redirect(url_for("ui.run", run_id=run_id))
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            priced = reprice_run(session, run_id, [profile_id]).id
    except RepriceError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.run", run_id=run_id))
    flash(
        f"run #{priced}: run #{run_id}'s acceptance priced with cost profile #{profile_id}, without measuring again"
    )
    return redirect(url_for("ui.run", run_id=priced))
