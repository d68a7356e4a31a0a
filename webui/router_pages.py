"""Router pages: the task classifier (train, cross-validated scores, confusion matrix, versions), the
routing playground, and the policy sets (publish from a run, re-activate an older set)."""

from __future__ import annotations

from flask import current_app, redirect, render_template, request, url_for
from markupsafe import Markup
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from analyzer.advice.report import run_advice_withheld
from analyzer.analysis.analysis_ref import RUN, SERVER, AnalysisRef, AnalysisRefError, parse_analysis_ref
from analyzer.analysis.run_records import get_run
from analyzer.db import MAX_ID, lock_for_write
from analyzer.orm import AnalysisRun, Prompt, PromptSet, ServerAnalysisRecord
from analyzer.prompts.prompt_checks import prompt_text
from router.classify.encoder import encoder_available
from router.classify.pipeline import FEATURE_SETS, regularisation, resolve_features
from router.classify.training_data import ClassifierError
from router.classify.training_request import check_training_request
from router.classify.version_store import activate_version, rarely_reached
from router.decide.contract import RouteRequest
from router.orm import ClassifierVersion
from router.policies.policy import PolicyContract, PolicyError, activate_policy_set, list_policy_sets
from router.policies.publishing import publish_analysis
from router.policies.records import policy_set_dict
from webui.export_pages import export_card
from webui.prompt_pages import PAGE_SIZE
from webui.svg_chart import heatmap
from webui.ui import bp, flash, sessions, settings

TRAIN_JOB = "train"
LEAST_SURE = 15  # the unlabelled prompts the classifier page lists for a person to label


def _router_service():
    return current_app.extensions["specroute.router"]


@bp.get("/classifier")
def classifier():
    """The classifier page: every trained version with its scores, the active one's confusion matrix,
    the training form, the unlabelled prompts per set and those the teacher is least sure of."""
    with sessions()() as session:
        versions = list(session.scalars(select(ClassifierVersion).order_by(ClassifierVersion.version.desc())))
        rows = [_version_row(v) for v in versions]
        active = next((v for v in versions if v.is_active), None)
        scores = dict(active.scores or {}) if active else {}
    confusion = scores.get("confusion")
    plot = (
        Markup(heatmap("Confusion matrix (cross-validated)", confusion["labels"], confusion["matrix"]))
        if confusion
        else None
    )
    with sessions()() as session:
        prompt_sets = list(session.scalars(select(PromptSet.name).order_by(PromptSet.name)))
        unlabelled = _unlabelled_counts(session)
        least_sure = _least_sure_prompts(session)
    return render_template(
        "classifier.html",
        versions=rows,
        scores=scores,
        plot=plot,
        prompt_sets=prompt_sets,
        feature_sets=FEATURE_SETS,
        default_features=resolve_features(settings().classifier_features)[0],
        encoder=encoder_available(),
        unlabelled=unlabelled,
        least_sure=least_sure,
        training=_jobs().state(TRAIN_JOB),
    )


def _version_row(version: ClassifierVersion) -> dict:
    """One row of the classifier page's versions table."""
    scores = version.scores or {}
    return {
        "version": version.version,
        "active": version.is_active,
        "labels": len(version.labels),
        "prompts": version.training_prompt_count,
        "source": scores.get("source"),
        "macro_f1": scores.get("macro_f1"),
        "accuracy": scores.get("accuracy"),
        "features": scores.get("features", "tfidf"),
        "unseen_f1": (scores.get("grouped") or {}).get("macro_f1"),
        "baseline_f1": (scores.get("baseline") or {}).get("macro_f1"),
        "created_at": version.created_at.isoformat(timespec="seconds"),
        "withheld": _withheld(version),
    }


def _unlabelled_counts(session) -> dict[str, int]:
    """The number of unlabelled prompts of each prompt set that has any, by set name."""
    return dict(
        session.execute(
            select(PromptSet.name, func.count(Prompt.id))
            .join(Prompt)
            .where(Prompt.task.is_(None))
            .group_by(PromptSet.name)
            .order_by(PromptSet.name)
        ).all()
    )


def _least_sure_prompts(session) -> list[dict]:
    """The unlabelled prompts whose suggested task the teacher is least sure of, least sure first."""
    return [
        {
            "set": name,
            "position": position + 1,
            "page": position // PAGE_SIZE + 1,
            "task": task,
            "confidence": confidence,
            "text": prompt_text(text, messages)[:160],
        }
        for name, position, task, confidence, text, messages in session.execute(
            select(
                PromptSet.name,
                Prompt.position,
                Prompt.suggested_task,
                Prompt.suggested_confidence,
                Prompt.text,
                Prompt.messages,
            )
            .join(PromptSet)
            .where(Prompt.task.is_(None), Prompt.suggested_task.is_not(None))
            .order_by(Prompt.suggested_confidence, Prompt.id)
            .limit(LEAST_SURE)
        )
    ]


@bp.post("/classifier/train")
def train():
    """Train a new version in the background (cross-validation takes minutes); the classifier page
    shows it running, then its outcome. An adapted version is activated only when it is no worse
    than the active one on the same held-out folds, unless the form's "activate" box is ticked."""
    names = [n for n in request.form.getlist("prompt_sets") if n]
    adapt = [n for n in request.form.getlist("adapt") if n]
    force_activate = bool(adapt) and request.form.get("activate") == "1"
    source = request.form.get("source", "both")
    features, fallback = resolve_features(request.form.get("features") or settings().classifier_features)
    if fallback:
        flash(fallback)
    sessions_, service = sessions(), _router_service()
    try:  # what can be refused at once is refused before anything starts
        regularisation(features)  # an unknown feature set
        with sessions_() as session:
            check_training_request(session, source, names, adapt)
    except ClassifierError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.classifier"))

    params = {
        "source": source, "names": names, "adapt": adapt, "features": features, "force_activate": force_activate,
    }  # fmt: skip
    if _jobs().start(TRAIN_JOB, "train", params, on_done=lambda kind: service.reload()):
        flash("training a new classifier version in the background; this page shows its progress")
    else:
        flash("a classifier is already being trained", "error")
    return redirect(url_for("ui.classifier"))


def _withheld(version: ClassifierVersion) -> str | None:
    """Why an inactive adapted version was not activated when it was trained (None otherwise)."""
    check = (version.scores or {}).get("activation") or {}
    if version.is_active or check.get("activated", True):
        return None
    return "; ".join(check["reasons"])


def _jobs():
    return current_app.extensions["specroute.jobs"]


@bp.post("/classifier/<int:version>/activate")
def activate_classifier(version: int):
    """Make classifier VERSION the active one and reload the router; an error is flashed on the page."""
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            activate_version(session, version)
    except ClassifierError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.classifier"))
    _router_service().reload()
    flash(f"classifier v{version} is active")
    return redirect(url_for("ui.classifier"))


def _positive(value: str | None, name: str, errors: list[str]) -> int | None:
    if not value:
        return None
    try:
        number = int(value)
        if number < 1:
            raise ValueError
        return number
    except ValueError:
        errors.append(f"{name} must be a positive whole number")
        return None


@bp.route("/playground", methods=["GET", "POST"])
def playground():
    """The routing playground: on POST, route the typed prompt with the active classifier and policy
    set and show the decision, or the form's errors with status 400."""
    decision = None
    errors: list[str] = []
    values = {"prompt": "", "max_new_tokens": "", "batch_size": ""}
    if request.method == "POST":
        values = {k: request.form.get(k, "") for k in values}
        max_new = _positive(values["max_new_tokens"], "max new tokens", errors)
        batch = _positive(values["batch_size"], "batch size", errors)
        if not values["prompt"].strip():
            errors.append("type a prompt")
        if not errors:
            try:
                asked = RouteRequest.of(values["prompt"], max_new_tokens=max_new, batch_size=batch)
                decision = _router_service().route([asked])[0].to_data()
            except ClassifierError as exc:
                errors.append(str(exc))
    return render_template(
        "playground.html", decision=decision, errors=errors, values=values
    ), 400 if errors else 200


@bp.get("/policies")
def policies():
    """The policies page: every policy set, the finished analyses to publish from, runs and analyses in
    llama-server by reference (one whose advice is withheld never preselected), the live estimates, why advice
    was withheld and the task types rarely reached."""
    with sessions()() as session:
        sets = [policy_set_dict(p) for p in list_policy_sets(session)]
        runs = _publishable(session)
        classifier_version, rarely = rarely_reached(session)
        withheld = {
            s["run_id"]: reason
            for s in sets
            if s["run_id"] and (reason := run_advice_withheld(get_run(session, s["run_id"])))
        }
        cost_modes = {  # how the profile that priced each set's run timed its steps
            s["run_id"]: run.cost_profile.cost_mode
            for s in sets
            if s["run_id"] and (run := session.get(AnalysisRun, s["run_id"])) and run.cost_profile
        }
        active = next((s["version"] for s in sets if s["active"]), None)
        asked = request.args.get("version", type=int)
        chosen = asked if asked is not None and 1 <= asked <= MAX_ID else active  # another number: the active
        export = export_card(session, version=chosen) if chosen is not None else None
    served = _router_service().policies().active
    estimates = {e.task_type: e.to_data() for e in (served.estimates if served is not None else [])}
    return render_template(
        "policies.html",
        sets=sets,
        runs=runs,
        preselected=next((r["ref"] for r in runs if not r["withheld"]), None),  # never a withheld one
        estimates=estimates,
        withheld=withheld,
        cost_modes=cost_modes,
        rarely=rarely,
        classifier_version=classifier_version,
        export=export,
        export_version=chosen,
    )


def _publishable(session: Session) -> list[dict]:
    """The finished analyses a set can be published from, newest first (runs, then analyses in llama-server):
    each one's reference, label and why its advice is withheld (None: it is not)."""
    runs = [
        {
            "ref": str(AnalysisRef(RUN, r.id)),
            "label": f"run #{r.id} · {r.prompt_set.name} · {r.pair.draft.spec}",
            "withheld": "noisy cost profile: measured on a busy machine"
            if any(link.cost_profile.quality == "noisy" for link in r.batch_profiles)
            else None,
        }
        for r in session.scalars(
            select(AnalysisRun).where(AnalysisRun.status == "done").order_by(AnalysisRun.id.desc())
        )
    ]
    return runs + [
        {
            "ref": str(AnalysisRef(SERVER, a.id)),
            "label": f"llama-server analysis #{a.id} · {a.name} · {', '.join(a.drafters)}",
            "withheld": f"advice withheld: {a.advice_withheld}" if a.advice_withheld else None,
        }
        for a in session.execute(  # the columns the choice shows, not each analysis' rows of JSON
            select(
                ServerAnalysisRecord.id,
                PromptSet.name,
                ServerAnalysisRecord.drafters,
                ServerAnalysisRecord.advice_withheld,
            )
            .join(PromptSet, PromptSet.id == ServerAnalysisRecord.prompt_set_id)
            .order_by(ServerAnalysisRecord.id.desc())
        )
    ]


@bp.post("/policies/publish")
def publish():
    """Publish a new policy set from the chosen finished analysis (``analysis``: its reference, as the runs page
    names it; ``run_id``: a run's number, the form's other field); it becomes active (and the router reloads)
    unless the analysis' advice is withheld, which the page then says."""
    try:
        typed = request.form.get("analysis") or request.form.get("run_id", "")
        ref = parse_analysis_ref(typed)
    except AnalysisRefError:
        flash("choose a finished analysis", "error")
        return redirect(url_for("ui.policies"))
    return publish_page(ref, request.form.get("notes") or None)


def publish_page(ref: AnalysisRef, notes: str | None = None):
    """Publish analysis ``ref`` (:func:`router.policies.publishing.publish_analysis`) and show the policies page
    with what became of it: every publish form of the UI ends here."""
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)  # read-then-write: wait for the decision log instead of failing
            published = publish_analysis(session, ref, notes=notes)
            version, active = published.policy_set.version, published.policy_set.is_active
            pools = PolicyContract.of(published.policy_set).published_settings
    except (AnalysisRefError, PolicyError) as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.policies"))
    if not active:
        flash(
            f"policy set v{version} published from analysis {ref} but NOT activated. {published.withheld} "
            "Activate it below only if you trust it anyway.",
            "error",
        )
        return redirect(url_for("ui.policies"))
    _router_service().reload()
    start = ": start its pools with 'specroute pools start'" if pools else ""
    flash(f"policy set v{version} published from analysis {ref} and active{start}")
    return redirect(url_for("ui.policies"))


@bp.post("/policies/<int:version>/activate")
def activate_policies(version: int):
    """Make policy set VERSION the active one and reload the router; an error is flashed on the page."""
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            activate_policy_set(session, version)
    except PolicyError as exc:
        flash(str(exc), "error")
        return redirect(url_for("ui.policies"))
    _router_service().reload()
    flash(f"policy set v{version} is active")
    return redirect(url_for("ui.policies"))
