"""``specroute export`` in the web UI: the report and the policies pages show a run's or a policy set's
config for the engine the viewer picks (a copy button beside it), and ``export.txt`` serves the same text
as a file."""

from __future__ import annotations

from typing import Any

from flask import Response, request
from sqlalchemy.orm import Session

from analyzer.errors import SpecrouteError
from router.export.export_plan import ExportPlan, plan_for_policy_set, plan_for_run
from router.export.serving import EXPORTERS, exporter_named, render_export
from webui.ui import bp, sessions

DEFAULT_ENGINE = "vllm"


def export_card(session: Session, *, run_id: int | None = None, version: int | None = None) -> dict[str, Any]:
    """What the export card shows for the run (or policy set) and the engine and format the page's query
    asks for (``export``, ``format``): the engines and their formats, the chosen ones, the text, or the
    error that stopped it (an unknown engine or format is named, and the default shown)."""
    asked, fmt = request.args.get("export", DEFAULT_ENGINE), request.args.get("format") or None
    card: dict[str, Any] = {
        "engines": [(e.name, e.title, e.formats) for e in EXPORTERS.values()],
        "engine": asked if asked in EXPORTERS else DEFAULT_ENGINE,
        "format": None,
        "text": None,
        "error": None,
    }
    exporter = EXPORTERS[card["engine"]]
    card["format"] = fmt if fmt in exporter.formats else exporter.formats[0]
    if asked not in EXPORTERS:
        card["error"] = f"unknown engine {asked!r}; use one of: {', '.join(EXPORTERS)}"
    elif fmt is not None and fmt not in exporter.formats:
        card["error"] = f"{exporter.title} exports as {', '.join(exporter.formats)}, not {fmt!r}"
    try:
        plan = _plan(session, run_id, version)
        card["text"] = render_export(plan, card["engine"], card["format"])
    except SpecrouteError as exc:  # a run not done, no policy set, an engine that cannot run it
        card["error"] = exc.message
    return card


def _plan(session: Session, run_id: int | None, version: int | None) -> ExportPlan:
    return plan_for_run(session, run_id) if run_id is not None else plan_for_policy_set(session, version)


def _text_response(run_id: int | None, version: int | None, name: str) -> Response:
    """The export as text; what stops it (an unknown engine or format, --strict's refusal, no such run or
    set) as text too, with its 4xx status, for whoever fetches it with curl."""
    engine = request.args.get("for", DEFAULT_ENGINE)
    try:
        exporter = exporter_named(engine)
        fmt = request.args.get("format") or exporter.formats[0]
        strict = request.args.get("strict") in ("1", "true")
        with sessions()() as session:
            text = render_export(_plan(session, run_id, version), engine, fmt, strict=strict)
    except SpecrouteError as exc:
        return Response(f"{exc.code}: {exc.message}\n", status=exc.status, mimetype="text/plain")
    suffix = {"json": "json", "yaml": "yaml", "python": "py"}.get(fmt, "sh")
    return Response(
        text,
        mimetype="text/plain",
        headers={"Content-Disposition": f'inline; filename="specroute-{name}-{engine}.{suffix}"'},
    )


@bp.get("/runs/<int:run_id>/export.txt")
def run_export(run_id: int):
    """Run ``run_id``'s decisions as ``?for=ENGINE`` config (``&format=``, ``&strict=1``), as text."""
    return _text_response(run_id, None, f"run-{run_id}")


@bp.get("/policies/<int:version>/export.txt")
def policies_export(version: int):
    """Policy set ``version``'s decisions as ``?for=ENGINE`` config, as text."""
    return _text_response(None, version, f"policies-v{version}")
