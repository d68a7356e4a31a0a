"""Prompt-set pages: list with counts per task type and an upload form (errors inline, with line
numbers), one set's prompts (paginated, searchable, filterable by task), their task labels set or
corrected one at a time or for every prompt the filter matches (each change one transaction), delete."""

from __future__ import annotations

from flask import current_app, redirect, render_template, request, url_for

from analyzer.db import lock_for_write
from analyzer.prompts.ingest import IngestLimits, PromptFileError
from analyzer.prompts.prompt_checks import prompt_text
from analyzer.prompts.prompt_sets import (
    PromptSetError,
    delete_prompt_set,
    get_prompt_set,
    import_prompt_file,
    known_task_types,
    list_prompt_sets,
    list_prompts,
    relabel_prompts,
    set_prompt_task,
    summarize,
)
from router.classify.encoder import EncoderUnavailable, encoder_folder
from router.classify.suggestions import accept_suggestions, suggestion_stats
from router.classify.teacher import TeacherUnavailable, teacher_available
from webui.ui import bp, flash, sessions, settings

PAGE_SIZE = 25


def _list_page(errors=None, status: int = 200, form_name: str = ""):
    with sessions()() as session:
        summaries = list_prompt_sets(session)
    return render_template(
        "prompt_sets.html",
        sets=summaries,
        errors=errors,
        form_name=form_name,
        max_upload_mb=settings().max_upload_bytes / 1e6,
    ), status


@bp.get("/prompts")
def prompt_sets():
    return _list_page()


@bp.post("/prompts")
def upload_prompts():
    upload = request.files.get("file")
    name = (request.form.get("name") or "").strip()
    if upload is None or not upload.filename:
        return _list_page({"summary": "choose a prompt file to upload", "issues": []}, 400, name)
    data = upload.read(settings().max_upload_bytes + 1)
    name = name or upload.filename.rsplit(".", 1)[0]
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            prompt_set, parsed = import_prompt_file(
                session, name, data, upload.filename, limits=IngestLimits.from_settings(settings())
            )
            set_name = prompt_set.name
    except PromptFileError as exc:
        return _list_page(
            {"summary": exc.summary(), "issues": [str(i) for i in exc.issues], "total": exc.total}, 400, name
        )
    except PromptSetError as exc:
        return _list_page({"summary": str(exc), "issues": []}, 400, name)
    merged = f"; {len(parsed.duplicates)} duplicate(s) merged" if parsed.duplicates else ""
    unlabelled = sum(1 for p in parsed.prompts if p.task is None)
    suggesting = ""
    if unlabelled and settings().suggest_tasks and teacher_available():
        _start_suggesting(set_name)
        suggesting = f"; suggesting a task for its {unlabelled} unlabelled prompts"
    flash(f"imported {len(parsed.prompts)} prompts as '{set_name}'{merged}{suggesting}")
    return redirect(url_for("ui.prompt_set", name=set_name))


def _jobs():
    return current_app.extensions["specroute.jobs"]


def _start_suggesting(name: str) -> bool:
    """Suggest tasks for the set's unlabelled prompts in the background (one transaction); False when
    that is already under way."""
    return _jobs().start(f"suggest:{name}", "suggest", {"set": name})


def _filter_args(source) -> tuple[str | None, str | None]:
    """(search text, task filter) from a request's args or form; task "*" or absent = any."""
    search = (source.get("q") or "").strip() or None
    task = source.get("task")
    return search, (task if task is not None and task != "*" else None)


def _why_no_suggestions() -> str | None:
    """Why the teacher cannot suggest tasks on this machine, in the words `specroute prompts suggest`
    prints after "no task suggestions: " (the sentence encoder is missing, and how to install it), or
    None when it can."""
    try:
        encoder_folder()
    except EncoderUnavailable as exc:
        return f"suggesting tasks needs the sentence encoder: {exc}"
    return None


def _set_page(
    name: str, page: int, search: str | None, task: str | None, error: str | None = None, status: int = 200
):
    with sessions()() as session:
        found = get_prompt_set(session, name)  # PromptSetNotFound: the app's 404 page
        summary = summarize(session, [found])[0]
        prompts, total = list_prompts(
            session, found, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE, search=search, task=task
        )
        rows = [
            {
                "position": p.position + 1,
                "id": p.external_id,
                "task": p.task,
                "line": p.source_line,
                "text": prompt_text(p.text, p.messages),
                "suggested": p.suggested_task if p.task is None else None,
                "confidence": p.suggested_confidence,
            }
            for p in prompts
        ]
        tasks = known_task_types(session)
        suggested = suggestion_stats(session, found)
    pages = max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1)
    return render_template(
        "prompt_set.html",
        summary=summary,
        rows=rows,
        total=total,
        page=page,
        pages=pages,
        q=search or "",
        task=task if task is not None else "*",
        known_tasks=tasks,
        error=error,
        suggested=suggested,
        suggesting=_jobs().state(f"suggest:{name}"),
        no_suggestions=(why := _why_no_suggestions()),
        can_suggest=why is None,
    ), status


@bp.get("/prompts/<name>")
def prompt_set(name: str):
    page = min(max(request.args.get("page", 1, type=int), 1), 1_000_000)  # an offset the database can take
    search, task = _filter_args(request.args)
    return _set_page(name, page, search, task)


@bp.post("/prompts/<name>/labels")
def label_prompts(name: str):
    """Set the task of one prompt (``position``) or of every prompt the filter (``q``, ``task``)
    matches (``bulk``) to ``new_task`` ("" unlabels); one transaction either way."""
    search, task = _filter_args(request.form)
    page = min(max(request.form.get("page", 1, type=int), 1), 1_000_000)
    new_task = request.form.get("new_task")
    position = request.form.get("position", type=int)
    if new_task is None or (position is None and not request.form.get("bulk")):
        return _set_page(
            name, page, search, task, "choose the task to set (and either a prompt or all matching)", 400
        )
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            found = get_prompt_set(session, name)
            if position is not None:
                set_prompt_task(session, found, position, new_task)
                message = f"prompt #{position} is now {new_task.strip() or 'unlabelled'}"
            else:
                changed = relabel_prompts(session, found, new_task, search=search, current_task=task)
                message = f"{changed} prompt(s) relabelled {new_task.strip() or 'unlabelled'}"
    except PromptSetError as exc:  # shown on the set's page; a set that is not there is the app's 404 page
        return _set_page(name, page, search, task, str(exc), exc.status)
    flash(message + " (used by the next classifier training; past analyses keep their labels)")
    return redirect(
        url_for("ui.prompt_set", name=name, page=page, q=search or "", task=task if task is not None else "*")
    )


@bp.post("/prompts/<name>/suggest")
def suggest_prompts(name: str):
    """Suggest a task for every unlabelled prompt of the set, in the background."""
    with sessions()() as session:
        get_prompt_set(session, name)  # a set that is not there is the app's 404 page
    if not teacher_available():
        flash(f"no suggestions: {TeacherUnavailable.__doc__}", "error")
    elif _start_suggesting(name):
        flash("suggesting a task for each unlabelled prompt; reload this page in a moment")
    else:
        flash("already suggesting tasks for this set")
    return redirect(url_for("ui.prompt_set", name=name))


@bp.post("/prompts/<name>/accept")
def accept_prompt_suggestions(name: str):
    """Make the suggested task the label of every unlabelled prompt whose suggestion's confidence is
    at least ``min_confidence`` (one transaction)."""
    raw = (request.form.get("min_confidence") or "").strip()
    try:
        bar = float(raw)
    except ValueError:
        bar = float("nan")
    if not 0.0 <= bar <= 1.0:
        return _set_page(
            name, 1, None, None, f"the confidence must be a number from 0 to 1, not {raw!r}", 400
        )
    with sessions()() as session, session.begin():
        lock_for_write(session)
        accepted = accept_suggestions(session, get_prompt_set(session, name), bar)
    flash(
        f"{accepted} suggestion(s) with confidence {bar:.2f} or more are labels now "
        "(used by the next classifier training)"
    )
    return redirect(url_for("ui.prompt_set", name=name))


@bp.post("/prompts/<name>/delete")
def delete_prompts(name: str):
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            delete_prompt_set(session, name)
    except PromptSetError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.prompt_sets"))
    flash(f"deleted prompt set '{name}'")
    return redirect(url_for("ui.prompt_sets"))
