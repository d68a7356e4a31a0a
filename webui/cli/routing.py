"""``specroute train``, ``policies``, ``decisions`` and ``route``: the classifier and the router."""

import click
from sqlalchemy import select

from analyzer.analysis.analysis_ref import AnalysisRef
from analyzer.db import MAX_ID, lock_for_write
from router import strict_json
from router.classify.pipeline import resolve_features, routing_reach_text
from webui.cli.base import ANALYSIS, CliState, cli

# ---------------------------------------------------------------- task classifier


@cli.command("train")
@click.option(
    "--prompts",
    "prompt_sets",
    multiple=True,
    help="Use the labeled prompts of this set only (repeatable; default: every set).",
)
@click.option(
    "--data",
    "source",
    type=click.Choice(["both", "labels", "corpus"]),
    default="both",
    show_default=True,
    help="both: the bundled corpus plus your labeled prompts (yours win for the same text); "
    "labels: your labeled prompts only; corpus: the bundled corpus only.",
)
@click.option("--cold-start", is_flag=True, help="Same as --data corpus.")
@click.option(
    "--features",
    type=click.Choice(["auto", "tfidf", "minilm", "tfidf+minilm"]),
    default=None,
    help="Feature set (default: SPECROUTE_CLASSIFIER_FEATURES, auto: tfidf+minilm where the sentence encoder is "
    "installed, else tfidf).",
)
@click.option(
    "--adapt",
    "adapt",
    multiple=True,
    metavar="NAME",
    help="Adapt to this prompt set's unlabelled prompts (repeatable): the teacher labels them afresh "
    "(the suggestions are stored) and the confident ones join the training data, weighted by confidence.",
)
@click.option(
    "--min-confidence",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="With --adapt: the teacher confidence a pseudo-label needs to be trained on "
    "(default: 0.1, from benchmarks/bench_adapt.py); each is weighted by its confidence.",
)
@click.option(
    "--activate",
    "force_activate",
    is_flag=True,
    help="With --adapt: make the new version active even when it is worse than the active one on the "
    "same held-out folds or had too few confident pseudo-labels (without this it is stored, not activated).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the new version's record as JSON.")
@click.pass_obj
def train(
    state: CliState,
    prompt_sets: tuple[str, ...],
    source: str,
    cold_start: bool,
    features: str | None,
    adapt: tuple[str, ...],
    min_confidence: float | None,
    force_activate: bool,
    seed: int,
    as_json: bool,
) -> None:
    """Train the task classifier; score it by stratified and by leave-one-source-out cross-validation
    beside the keyword baseline; calibrate its confidence and choose the routing threshold on the
    grouped folds; mark the task types it rarely reaches; store it as a new version and make it active.

    With --adapt NAME, the classifier also learns the named sets' unlabelled prompts: the teacher
    (sentence-embedding models and task descriptions, whose neighbours vote; needs the sentence
    encoder) labels them, and those it is confident of are trained on, weighted by its confidence.
    They are never scored: only labels are truth. An adapted version becomes active only when it is
    no worse than the active one on the same held-out folds and had enough confident pseudo-labels;
    otherwise it is stored but not activated, and the numbers say why (--activate forces it).
    """
    if cold_start:
        source = "corpus"
    _check_adapt_options(adapt, min_confidence, force_activate)
    features, fallback = resolve_features(features or state.settings.classifier_features)
    if fallback:
        click.echo(fallback, err=True)
    record, verdict = _train_new_version(
        state, source, prompt_sets, features, adapt, min_confidence, force_activate, seed
    )
    if verdict and not record["active"]:
        verdict += (
            f". To use v{record['version']} anyway: its Activate button on the classifier page, or "
            "train again with --activate"
        )
    if as_json:
        click.echo(strict_json.dumps(record))
        if verdict:
            click.echo(verdict, err=True)
        return
    _print_training_report(record)
    if verdict:
        click.echo(verdict)


def _check_adapt_options(adapt: tuple[str, ...], min_confidence: float | None, force_activate: bool) -> None:
    """Refuse the options that only mean something together with --adapt."""
    if min_confidence is not None and not adapt:
        raise click.UsageError("--min-confidence needs --adapt")
    if force_activate and not adapt:
        raise click.UsageError("--activate needs --adapt (training without it always activates)")


def _train_new_version(
    state: CliState,
    source: str,
    prompt_sets: tuple[str, ...],
    features: str,
    adapt: tuple[str, ...],
    min_confidence: float | None,
    force_activate: bool,
    seed: int,
) -> tuple[dict, str | None]:
    """Gather the training data, train and store a classifier version; return its record and verdict."""
    from router.classify.activation import activation_message
    from router.classify.pipeline import fold_jobs
    from router.classify.training import train_classifier_apart
    from router.classify.training_request import training_data_apart
    from router.policies.records import classifier_dict

    sessions = state.sessions()
    data = training_data_apart(
        sessions,
        source,
        prompt_sets or None,
        adapt=adapt,
        min_confidence=min_confidence,
        progress=lambda line: click.echo(f"  {line}", err=True),
    )
    click.echo(
        f"training on {len(data.texts)} prompts ({data.source}), {len(set(data.labels))} task types, "
        f"{len(set(data.groups))} sources, features {features}; cross-validating ...",
        err=True,
    )
    version = train_classifier_apart(
        sessions,
        data,
        seed=seed,
        features=features,
        force_activate=force_activate,
        progress=lambda line: click.echo(f"  {line}", err=True),
        jobs=fold_jobs(state.settings.classifier_jobs, features),
    )
    return {**classifier_dict(version), "scores": version.scores}, activation_message(version)


def _print_training_report(record: dict) -> None:
    """Print a new classifier version's scores, calibration, catch-all tasks and adaptation as text."""
    scores = record["scores"]
    state_word = "active" if record["active"] else "stored, NOT active"
    click.echo(
        f"classifier v{record['version']} {state_word} ({scores['features']}): stratified {scores['folds']}-fold CV "
        f"macro-F1 {scores['macro_f1']:.3f}, accuracy {scores['accuracy']:.3f}; keyword baseline macro-F1 "
        f"{scores['baseline']['macro_f1']:.3f}"
        + (f"; trained in {scores['training_seconds']:.0f} s" if "training_seconds" in scores else "")
    )
    _print_per_class_scores(scores)
    reach = routing_reach_text(scores)
    if reach:
        click.echo(reach[0].upper() + reach[1:])
    calibration = scores["calibration"]
    click.echo(
        f"calibration ({calibration['on']} folds): temperature {calibration['temperature']:.2f}, ECE "
        f"{calibration['ece_before']:.3f} -> {calibration['ece_after']:.3f}; routing threshold "
        f"{calibration['threshold']:.2f} ({100 * calibration['coverage']:.0f}% of prompts clear it, "
        f"{100 * (calibration['precision'] or 0):.0f}% of those right)"
    )
    following = scores.get("following") or {}
    if following.get("catch_all"):
        rows = following["tasks"]
        click.echo(
            "catch-all (followed predictions right less than half the time; the router uses the workload "
            f"policy for them, {100 * following['share']:.0f}% of prompts): "
            + ", ".join(
                f"{t} ({rows[t]['right']} of {rows[t]['followed']} right)" for t in following["catch_all"]
            )
        )
    if scores.get("dropped_labels"):
        click.echo(f"left out (fewer than 2 prompts): {scores['dropped_labels']}")
    _print_adaptation(scores)


def _print_per_class_scores(scores: dict) -> None:
    """Print the leave-one-source-out summary and the per-task F1 table with reachability."""
    grouped = scores.get("grouped")
    if grouped:
        click.echo(
            f"leave-one-source-out ({grouped['folds']} sources, what unseen traffic will see): "
            f"macro-F1 {grouped['macro_f1']:.3f}, accuracy {grouped['accuracy']:.3f}"
            + (
                f"; single-source, not scored there: {', '.join(grouped['single_source'])}"
                if grouped["single_source"]
                else ""
            )
        )
    else:
        click.echo("leave-one-source-out: not possible, the training data has one source")
    click.echo(f"  {'task':<18} {'F1 strat.':>9} {'F1 unseen':>9} {'n':>5}  reached")
    for label, row in scores["per_class"].items():
        row_unseen = grouped["per_class"].get(label) if grouped else None
        unseen = f"{row_unseen['f1-score']:.2f}" if row_unseen else "-"
        reach = scores["reachability"][label]
        click.echo(
            f"  {label:<18} {row['f1-score']:>9.2f} {unseen:>9} {int(row['support']):>5}  "
            + ("yes" if reach["reachable"] else f"RARELY: {reach['reason']}")
        )


def _print_adaptation(scores: dict) -> None:
    """Print what adapting to unlabelled prompt sets added, when the version was adapted."""
    adaptation = scores.get("adaptation")
    if adaptation:
        click.echo(
            f"adapted to {', '.join(adaptation['sets'])}: {adaptation['pseudo_labels']} pseudo-labels "
            f"(mean teacher confidence {adaptation['mean_confidence']:.2f}); the classifier agrees with "
            f"{100 * adaptation['agreement']:.0f}% of them"
        )
        for label, row in scores["composition"].items():
            click.echo(
                f"  {label:<18} corpus {row['corpus']:>5}  your labels {row['label']:>5}  pseudo {row['pseudo']:>5}"
            )


# ---------------------------------------------------------------- policies and routing


@cli.group()
def policies() -> None:
    """Publish routing policies from an analysis run, list them, re-activate an older set."""


def _print_policy_set(data: dict) -> None:
    state = "active" if data["active"] else "inactive"
    source = f"analysis {data['analysis']}" if data.get("analysis") else "an analysis that is gone"
    click.echo(
        f"policy set v{data['version']} ({state}) from {source}, priced in {data['engine']}, "
        f"margin {data['margin']}"
    )
    for p in data["policies"]:
        label = "* (fallback)" if p["fallback"] else p["task_type"]
        decision = p["option"] or "off"  # a run's gamma ("gamma 4") or a llama-server setting, the same way
        click.echo(
            f"  {label:<18} {decision:<20} S={p['expected_speedup']:.2f}x  alpha={p['alpha_mean']:.2f}"
            f"  n={p['n_prompts']}  {p['tier']}"
        )


@policies.command("publish")
@click.option(
    "--analysis",
    type=ANALYSIS,
    help="The analysis as 'specroute runs list' names it: 7 (a run), llama-server:3 (an analysis in "
    "llama-server, each task's policy naming its drafter setting and the pool that runs it), "
    "llama-server-job:2 (the analysis that job stored).",
)
@click.option(
    "--run", "run_id", type=click.IntRange(1, MAX_ID), help="A finished analysis run (--analysis 7)."
)
@click.option(
    "--llama-server-analysis",
    "server_analysis_id",
    type=click.IntRange(1, MAX_ID),
    help="A stored llama-server analysis (--analysis llama-server:ID).",
)
@click.option(
    "--first-port",
    type=click.IntRange(1, 65000),
    default=8081,
    show_default=True,
    help="For an analysis in llama-server: the pools SPECROUTE_ROUTER_POOLS does not name serve on this "
    "machine at http://127.0.0.1:<port>, the plain one at this port and each setting at the next.",
)
@click.option("--notes", help="A note stored with the policy set.")
@click.option("--no-activate", is_flag=True, help="Store the set without making it active.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def policies_publish(
    state: CliState,
    analysis: AnalysisRef | None,
    run_id: int | None,
    server_analysis_id: int | None,
    first_port: int,
    notes: str | None,
    no_activate: bool,
    as_json: bool,
) -> None:
    """Turn an analysis (--analysis; or --run, --llama-server-analysis) into a new,
    versioned policy set (active unless --no-activate, or unless the run's advice is withheld because its
    cost profile was measured on a busy machine: then 'specroute policies activate VERSION' activates it if
    you trust it anyway). 'specroute pools plan' prints the llama-server pools a set from a llama-server
    analysis needs."""
    from analyzer.analysis.analysis_ref import RUN, SERVER, AnalysisRef
    from router.policies.publishing import publish_analysis
    from router.policies.records import policy_set_dict

    if sum(x is not None for x in (analysis, run_id, server_analysis_id)) != 1:
        raise click.UsageError("give one of --analysis, --run or --llama-server-analysis")
    if run_id is not None:  # the two other spellings of a reference
        analysis = AnalysisRef(RUN, run_id)
    elif server_analysis_id is not None:
        analysis = AnalysisRef(SERVER, server_analysis_id)
    assert analysis is not None  # one of the three, checked above
    with state.sessions()() as session, session.begin():
        lock_for_write(session)  # read-then-write: a serving process's decision log waits, not fails
        published = publish_analysis(
            session, analysis, notes=notes, activate=False if no_activate else None, first_port=first_port
        )
        policy_set, withheld = published.policy_set, published.withheld
        data = policy_set_dict(policy_set)
    if as_json:
        click.echo(strict_json.dumps(data))
    else:
        _print_policy_set(data)
    if withheld:
        click.echo(
            f"policy set v{data['version']} NOT activated. {withheld} To route with it anyway: "
            f"specroute policies activate {data['version']}",
            err=True,
        )


@policies.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def policies_list(state: CliState, as_json: bool) -> None:
    """Every policy set, newest first."""
    from router.policies.policy import list_policy_sets
    from router.policies.records import policy_set_dict

    with state.sessions()() as session:
        data = [policy_set_dict(p) for p in list_policy_sets(session)]
    if as_json:
        click.echo(strict_json.dumps(data))
        return
    if not data:
        click.echo("no policy sets yet; publish one with 'specroute policies publish --run RUN'")
    for item in data:
        _print_policy_set(item)


@policies.command("activate")
@click.argument("version", type=click.IntRange(1, MAX_ID))
@click.pass_obj
def policies_activate(state: CliState, version: int) -> None:
    """Make policy set VERSION the active one."""
    from router.policies.policy import activate_policy_set

    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        activate_policy_set(session, version)
    click.echo(f"policy set v{version} is active")


@cli.group()
def decisions() -> None:
    """The log of routing decisions."""


@decisions.command("prune")
@click.option(
    "--older-than-days", required=True, type=click.FloatRange(0.0), help="Delete decisions older than this."
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def decisions_prune(state: CliState, older_than_days: float, yes: bool) -> None:
    """Delete logged routing decisions older than N days, in one transaction (feedback events and
    the estimates they moved are kept; feedback naming a pruned route_id gets 404)."""
    from datetime import timedelta
    from typing import cast

    from sqlalchemy import delete, func
    from sqlalchemy.engine import CursorResult

    from analyzer.db import utcnow
    from router.orm import RouteDecision

    cutoff = utcnow() - timedelta(days=older_than_days)
    sessions = state.sessions()
    with sessions() as session:
        count = session.scalar(
            select(func.count()).select_from(RouteDecision).where(RouteDecision.created_at < cutoff)
        )
    if count and not yes:
        click.confirm(f"Delete {count} routing decisions older than {older_than_days:g} days?", abort=True)
    with sessions() as session, session.begin():
        lock_for_write(session)
        result = session.execute(delete(RouteDecision).where(RouteDecision.created_at < cutoff))
        deleted = cast(CursorResult, result).rowcount
    click.echo(f"deleted {deleted} routing decisions older than {cutoff.isoformat(timespec='seconds')}")


@cli.command("route")
@click.argument("prompt")
@click.option("--max-new-tokens", type=click.IntRange(1), help="Expected output length.")
@click.option("--batch-size", type=click.IntRange(1), help="Batch size or concurrency of the request.")
@click.option("--temperature", type=click.FloatRange(0.0), help="Sampling temperature of the request.")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@click.pass_obj
def route(state: CliState, prompt: str, max_new_tokens, batch_size, temperature, as_json: bool) -> None:
    """Print the routing decision for PROMPT with the active classifier and policy set."""
    from router.decide.decision import DECISION_KEYS, RouterConfig, router_from_database
    from webui.security import resolve_secret_key

    # signed with the server's key, so feedback on this route_id to a server on the same data is accepted
    config = RouterConfig.from_settings(state.settings, resolve_secret_key(state.settings))
    with state.sessions()() as session:
        router = router_from_database(session, config)
    decision = router.route(
        prompt, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature
    )
    data = decision.to_data()
    if as_json:
        click.echo(decision.to_json().decode())
        return
    verdict = f"speculate with gamma {decision.gamma}" if decision.speculate else "do not speculate"
    click.echo(
        f"{verdict} (task {decision.task_type}, confidence {decision.confidence:.2f}, "
        f"expected speedup {decision.expected_speedup:.2f}x, policy v{decision.policy_version})"
    )
    for reason in decision.reasons:
        click.echo(f"  - {reason}")
    click.echo(f"  pool: {decision.engine.pool}; priced by: {decision.engine.priced_by or 'no policy set'}")
    for name, settings in data["engine"].items():  # each serving engine that can run it, in its own terms
        if name not in DECISION_KEYS:
            click.echo(f"  {name}: {strict_json.dumps(settings)}")
