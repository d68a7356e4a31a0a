"""One set of limits for every surface (analyzer.run_params.LIMITS): the command line and the web form
accept exactly the values at the bounds and refuse the next ones out, the form's inputs carry the
bounds as min/max, and the analysis page's table (docs/analysis.md) states them."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import click
import pytest
from sqlalchemy import select

from analyzer.db import engine_from_settings, make_session_factory
from analyzer.names import DEFAULT_GAMMA_MAX, DEFAULT_MARGIN
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.run_params import LIMITS, RunParams, range_words
from analyzer.settings import load_settings
from webui.app import create_app
from webui.cli import cli

ANALYSIS_PAGE = (Path(__file__).resolve().parent.parent / "docs" / "analysis.md").read_text("utf-8")
FORM_FIELDS = ("max_new_tokens", "gamma_max", "temperature", "validate", "limit", "chunk_size")
FORM_BASE = {
    "prompt_set": "one",
    "target": "hf:/models/target",
    "draft": "ngram",
    "max_new_tokens": "32",
    "gamma_max": "8",
    "temperature": "0",
    "validate": "0",
    "limit": "",
    "chunk_size": "",
}
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def _whole(name: str) -> bool:
    declared = typing.get_type_hints(RunParams)[name]
    return declared is int or int in typing.get_args(declared)


def _text(name: str, value: float) -> str:
    return str(int(value)) if _whole(name) else repr(float(value))


def _edges(name: str) -> tuple[list[float], list[float]]:
    """(accepted, refused): the bounds themselves where closed, and one step beyond each bound."""
    limit, step = LIMITS[name], (1 if _whole(name) else 0.5)
    accepted = ([] if limit.low_open else [limit.low]) + ([] if limit.high is None else [limit.high])
    refused = [limit.low if limit.low_open else limit.low - step]
    refused += [] if limit.high is None else [limit.high + step]
    return accepted, refused


def _cases(names) -> list:
    return [
        pytest.param(name, value, ok, id=f"{name}={_text(name, value)}")
        for name in names
        for ok, values in zip((True, False), _edges(name))
        for value in values
    ]


def test_the_limits_are_the_ones_issue_23_names():
    assert LIMITS["gamma_max"].admits(64) and not LIMITS["gamma_max"].admits(65)
    assert LIMITS["max_new_tokens"].admits(4096) and not LIMITS["max_new_tokens"].admits(4097)
    assert {name: _edges(name)[1] for name in ("gamma_max", "max_new_tokens")} == {
        "gamma_max": [0, 65],
        "max_new_tokens": [0, 4097],
    }


# ---------------------------------------------------------------- the command line


@pytest.fixture
def cli_one(runner, tmp_path):
    """A migrated database in the runner's data folder holding the one-prompt set 'one'."""
    (tmp_path / "one.txt").write_text("hello\n")
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    imported = runner.invoke(cli, ["prompts", "import", str(tmp_path / "one.txt"), "--name", "one"])
    assert imported.exit_code == 0
    return runner


def _stored_params(run_id: int) -> dict:
    engine = engine_from_settings(load_settings())  # the runner's SPECROUTE_DATA_DIR
    try:
        with make_session_factory(engine)() as session:
            return session.get(AnalysisRun, run_id).params
    finally:
        engine.dispose()


@pytest.mark.parametrize("name, value, accepted", _cases(LIMITS))
def test_analyze_accepts_and_refuses_exactly_at_the_limits(cli_one, name, value, accepted):
    option = f"--{name.replace('_', '-')}={_text(name, value)}"
    result = cli_one.invoke(
        cli,
        [
            "analyze",
            "--prompts",
            "one",
            "--target",
            "hf:/models/target",
            "--draft",
            "ngram",
            "--device",
            "cpu",
            "--queue",
            "--json",
            option,
        ],
    )
    if accepted:
        assert result.exit_code == 0, result.stderr
        assert _stored_params(json.loads(result.stdout)["run_id"])[name] == value
    else:  # read by RunParams.from_inputs: the web form's words, the option named as typed
        kind = "a whole number" if _whole(name) else "a number"
        blank = "blank (all) or " if name == "limit" else ""
        words = f"--{name.replace('_', '-')} must be {blank}{kind} {range_words(LIMITS[name])}, got "
        assert result.exit_code == 1 and words + repr(_text(name, value)) in result.stderr, result.stderr
        assert json.loads(cli_one.invoke(cli, ["runs", "list", "--json"]).stdout) == []


@pytest.mark.parametrize(
    "command, names",
    [
        ("analyze", tuple(LIMITS)),
        ("demo", ("max_new_tokens", "validate", "limit")),
    ],
)
def test_every_cli_option_of_a_run_parameter_has_its_limit(command, names):
    """Each option is taken as typed and read by RunParams.from_inputs, which checks it against LIMITS
    (and gives its default when it is left out); its help states that limit."""
    options = {p.name: p for p in cli.commands[command].params}
    dests = {"validate": "validate_n"}
    for name in names:
        option = options[dests.get(name, name)]
        assert option.type is click.STRING, name
        assert f"{range_words(LIMITS[name])};" in option.help, (name, option.help)


def test_analyze_defaults_come_from_run_params():
    options = {p.name: p for p in cli.commands["analyze"].params}
    assert f"default: {DEFAULT_GAMMA_MAX})" in options["gamma_max"].help
    assert f"default: {DEFAULT_MARGIN})" in options["margin"].help
    assert f"default: {RunParams.max_new_tokens})" in options["max_new_tokens"].help


# ---------------------------------------------------------------- the web form


@pytest.fixture
def web(engine, db_url, tmp_path, session):
    with session.begin():
        import_prompt_file(session, "one", b"hello\n", "one.txt")
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": "hf:/models/target,ngram",
            "TESTING": True,
        }
    )
    yield app.test_client()
    app.extensions["specroute.close"]()


def _runs(session) -> list[AnalysisRun]:
    session.expire_all()
    return list(session.scalars(select(AnalysisRun).order_by(AnalysisRun.id)))


@pytest.mark.parametrize("name, value, accepted", _cases(FORM_FIELDS))
def test_the_run_form_accepts_and_refuses_exactly_at_the_limits(web, session, name, value, accepted):
    token = TOKEN.search(web.get("/runs/new").get_data(as_text=True)).group(1)
    response = web.post("/runs", data={**FORM_BASE, "csrf_token": token, name: _text(name, value)})
    if accepted:
        assert response.status_code == 302, response.get_data(as_text=True)
        assert [run.params[name] for run in _runs(session)] == [value]
    else:
        words = {"limit": "prompts to analyze"}.get(name, name.replace("_", " "))
        text = response.get_data(as_text=True)
        assert response.status_code == 400 and f"{words} must be" in text, text
        assert _runs(session) == []


def test_the_run_form_says_the_limits_in_its_messages(web):
    token = TOKEN.search(web.get("/runs/new").get_data(as_text=True)).group(1)
    response = web.post(
        "/runs",
        data={
            **FORM_BASE,
            "csrf_token": token,
            "max_new_tokens": "4097",
            "gamma_max": "65",
            "temperature": "nan",
            "limit": "0",
        },
    )
    text = response.get_data(as_text=True)
    assert "max new tokens must be a whole number from 1 to 4096" in text
    assert "gamma max must be a whole number from 1 to 64" in text
    assert "temperature must be a number from 0 to 5" in text
    assert "prompts to analyze must be blank (all) or a whole number from 1 to 10000000" in text


def test_the_run_form_inputs_carry_the_limits_as_min_and_max(web):
    page = web.get("/runs/new").get_data(as_text=True)
    for name in FORM_FIELDS:
        tag = re.search(rf'<input type="number" name="{name}"[^>]*>', page).group(0)
        limit = LIMITS[name]
        assert float(re.search(r' min="([^"]+)"', tag).group(1)) == limit.low, tag
        bound = re.search(r' max="([^"]+)"', tag)
        assert (None if bound is None else float(bound.group(1))) == limit.high, tag
    assert f'name="gamma_max" min="1" max="64" value="{DEFAULT_GAMMA_MAX}"' in page


# ---------------------------------------------------------------- the docs


def test_the_analysis_page_states_the_limits_once_as_declared():
    row = re.compile(r"^\| `([a-z_]+)` \| `--[a-z-]+` \|[^|]*\| ([^|]+) \|$", flags=re.M)
    rows = {m.group(1): m.group(2) for m in row.finditer(ANALYSIS_PAGE)}
    assert rows == {name: limit.text() for name, limit in LIMITS.items()}
