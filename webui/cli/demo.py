"""``specroute settings`` and ``demo`` (the main job on the embedded defaults; its steps are
:mod:`webui.cli.demo_steps`)."""

import json

import click

from analyzer.names import AUTO_ENGINE, ENGINES
from analyzer.settings import SECRET_SETTINGS, describe_settings
from webui.cli import demo_server, demo_steps
from webui.cli.analysis import run_input_option
from webui.cli.base import CliState, cli
from webui.cli.demo_server import DEMO_SERVER_ENGINE

# ---------------------------------------------------------------- settings and the main job


@cli.command("settings")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def settings_command(state: CliState, as_json: bool) -> None:
    """Print every setting: environment variable, value in force, default and meaning."""
    rows = [
        {**row, "value": _shown_value(row["name"], getattr(state.settings, row["name"]))}
        for row in describe_settings()
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"data folder in force: {state.settings.resolved_data_dir()}")
    click.echo(f"database in force:    {state.engine.url.render_as_string(hide_password=True)}")
    for row in rows:
        click.echo(f"\n{row['env']} = {row['value']!r}  (default {row['default']!r}, {row['type']})")
        click.echo(f"    {row['help']}")


def _shown_value(name: str, value):
    """A setting's value as printed: secrets hidden, passwords in URLs masked."""
    if name in SECRET_SETTINGS:
        return "(set, hidden)" if value else ""
    if name == "database_url" and value:
        from sqlalchemy.engine import make_url

        try:
            return make_url(value).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - an unparsable URL is shown as the server would report it
            return "(unparsable URL)"
    return value


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to serve on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to serve on."
)
@run_input_option("max_new_tokens", "New tokens generated per prompt")
@run_input_option("validate", "Prompts to validate with real speculative decoding", dest="validate_n")
@run_input_option("limit", "Analyze only the first N sample prompts (a quick look)")
@click.option("--no-serve", is_flag=True, help="Stop after the report instead of serving it.")
@click.option(
    "--engine",
    metavar="|".join((AUTO_ENGINE, DEMO_SERVER_ENGINE, *ENGINES)),
    help="Engine of the analysis (default: SPECROUTE_ENGINE; its default, auto, analyzes the demo in "
    "llama-server, llama.cpp's own server, which 'specroute llama-server build' compiles; llama.cpp analyzes "
    "in llama-cpp-python's loop, transformers in PyTorch).",
)
@click.option(
    "--reprofile",
    is_flag=True,
    help="Analyze again instead of reusing the finished analysis, measuring the cost profiles anew (never "
    "reusing a stored one): for a run whose advice was withheld because the machine was busy.",
)
@click.pass_obj
def demo(
    state: CliState,
    host: str,
    port: int,
    max_new_tokens: str | None,
    validate_n: str | None,
    limit: str | None,
    no_serve: bool,
    engine: str | None,
    reprofile: bool,
) -> None:
    """The main job on the embedded defaults: upgrade the database, import the bundled sample
    prompts, analyze them with SmolLM2-135M-Instruct and n-gram drafting, train the classifier on the
    bundled corpus, publish the policies, print the report, and serve the web UI and the router.

    Under SPECROUTE_ENGINE's default, auto (or --engine llama-server), the analysis runs in llama-server:
    3 sample prompts per task, llama-server's drafting settings replayed exactly on each prompt's greedy
    output and priced from the servers' timings, validated in one pass through speculating servers (--validate
    0: not validated), published with a pool per setting. With --engine llama.cpp or transformers it is a run
    with every gamma (--validate N prompts validated). A rerun reuses what exists (the set, a finished
    analysis with the same settings, the classifier, the policies) and resumes a stopped llama-server analysis
    (Ctrl-C, a server that died) with the greedy outputs it made; --reprofile analyzes again. Policies
    from an analysis whose advice was withheld (a busy or noisy machine, a step-cost fit that missed its
    bound) are published but not activated."""
    chosen = (engine or state.settings.engine).strip()
    in_server = chosen in (DEMO_SERVER_ENGINE, AUTO_ENGINE)  # auto: the demo analyzes in llama-server
    inputs = demo_steps.demo_run_inputs(
        state,
        {
            "max_new_tokens": max_new_tokens,
            "validate": validate_n,
            "limit": limit,
            "engine": None if in_server else engine,
            "reprofile": reprofile or None,
        },
    )
    if in_server:
        binary = demo_server.require_llama_server(state)
    else:
        demo_steps.require_engine(inputs.params.engine)
    demo_steps.upgrade_database(state)
    sessions = state.sessions()
    prompt_set_id = demo_steps.import_sample_prompts(sessions)
    if in_server:
        params = inputs.params
        analysis_id = demo_server.analyze_sample_in_llama_server(
            state, sessions, prompt_set_id, binary, n_predict=params.max_new_tokens,
            validate=params.validate > 0, limit=params.limit, again=reprofile,
        )  # fmt: skip
        demo_steps.train_classifier_once(state, sessions)
        demo_server.publish_and_print_server_analysis(sessions, analysis_id)
        demo_steps.serve_report(state, host, port, f"/llama-server/{analysis_id}", serve=not no_serve)
        return
    run_id = demo_steps.analyze_sample(state, sessions, prompt_set_id, inputs)
    demo_steps.train_classifier_once(state, sessions)
    demo_steps.publish_policies_and_print_report(sessions, run_id)
    demo_steps.serve_report(state, host, port, f"/runs/{run_id}", serve=not no_serve)
