"""One reader of a run's inputs and one set of defaults.

The same bad inputs go to every surface that takes them: ``RunParams.from_inputs`` itself (what an API
would call), ``specroute analyze``, ``specroute demo`` (the inputs it has options for) and the web form's
POST /runs. Each must refuse them with the same words, the field named as that surface's user typed it
(``--max-new-tokens`` on the command line, ``max new tokens`` in the form, ``max_new_tokens`` for the
API), and store nothing. The worker reads no inputs: it executes what ``create_run`` stored, read back by
``RunParams.from_json``, which refuses a stored value of the wrong type with the same words.

Then the defaults: inputs left out give the same parameters on the command line, in the form and in the
demo (engine included: ``auto``, which measures the demo's run in llama.cpp and a Hugging Face model in
transformers), and the form says which engine it preselects and why."""

from __future__ import annotations

import json
import re

import pytest
from markupsafe import escape
from sqlalchemy import select

from analyzer.analysis.run_inputs import params_from_inputs, read_inputs
from analyzer.db import engine_from_settings, make_session_factory
from analyzer.engine.engines import REGISTRY
from analyzer.names import DEFAULT_VALIDATE
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.run_params import RunInputError, RunParams
from analyzer.settings import load_settings
from webui.app import create_app
from webui.cli import cli
from webui.cli.demo_steps import DEMO_DRAFT, DEMO_TARGET, demo_run_inputs
from webui.run_pages import form_words

BUILTIN = "builtin:smollm2-135m-instruct"
HF = "hf:/models/target"
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
ENGINE_ONE_OF = "use one of: auto, transformers, llama.cpp"

# (inputs as a user types them, [(field, words, whether the words follow the field's name)])
BAD_INPUTS = [
    ({"max_new_tokens": "0"}, [("max_new_tokens", "must be a whole number from 1 to 4096, got '0'", True)]),
    (
        {"max_new_tokens": "abc"},
        [("max_new_tokens", "must be a whole number from 1 to 4096, got 'abc'", True)],
    ),
    (
        {"max_new_tokens": "64.5"},
        [("max_new_tokens", "must be a whole number from 1 to 4096, got '64.5'", True)],
    ),
    ({"gamma_max": "999"}, [("gamma_max", "must be a whole number from 1 to 64, got '999'", True)]),
    ({"temperature": "nan"}, [("temperature", "must be a number from 0 to 5, got 'nan'", True)]),
    ({"temperature": "inf"}, [("temperature", "must be a number from 0 to 5, got 'inf'", True)]),
    ({"temperature": "-0.5"}, [("temperature", "must be a number from 0 to 5, got '-0.5'", True)]),
    ({"validate": "-1"}, [("validate", "must be a whole number from 0 to 10000, got '-1'", True)]),
    ({"limit": "0"}, [("limit", "must be blank (all) or a whole number from 1 to 10000000, got '0'", True)]),
    ({"engine": "vllm"}, [("engine", f"unknown engine 'vllm'; {ENGINE_ONE_OF}", False)]),
    ({"engine": "Llama.cpp"}, [("engine", f"unknown engine 'Llama.cpp'; {ENGINE_ONE_OF}", False)]),
    (
        {"cost_mode": "graphs"},
        [("cost_mode", "unknown cost mode 'graphs'; use one of: eager, cuda-graphs", False)],
    ),
    ({"device": "tpu"}, [("device", "unknown device 'tpu'; use one of: auto, cpu, cuda, cuda:N", False)]),
    (
        {"dtype": "fp8"},
        [("dtype", "unknown dtype 'fp8'; use one of: auto, float32, bfloat16, float16", False)],
    ),
    (
        {"batch_sizes": "1,0"},
        [
            (
                "batch_sizes",
                "batch sizes must be integers from 1 to 256, comma-separated (e.g. 1,4,16); got '0'",
                False,
            )
        ],
    ),
    (  # validating a sampling run: refused everywhere, never dropped silently
        {"temperature": "0.7", "validate": "2"},
        [
            (
                "validate",
                "must be 0 when temperature is above 0, got '2': only greedy runs are validated (real "
                "speculative decoding is compared token for token with greedy decoding); leave it blank "
                "or use temperature 0",
                True,
            )
        ],
    ),
    (  # every problem at once, in the form's order
        {"max_new_tokens": "0", "gamma_max": "999", "temperature": "nan", "engine": "vllm", "device": "tpu"},
        [
            ("max_new_tokens", "must be a whole number from 1 to 4096, got '0'", True),
            ("gamma_max", "must be a whole number from 1 to 64, got '999'", True),
            ("temperature", "must be a number from 0 to 5, got 'nan'", True),
            ("engine", f"unknown engine 'vllm'; {ENGINE_ONE_OF}", False),
            ("device", "unknown device 'tpu'; use one of: auto, cpu, cuda, cuda:N", False),
        ],
    ),
]
CASES = [
    pytest.param(inputs, expected, id=",".join(f"{k}={v}" for k, v in inputs.items()))
    for inputs, expected in BAD_INPUTS
]
DEMO_OPTIONS = {"max_new_tokens", "validate", "limit", "engine"}  # the run inputs `demo` has options for


def _cli_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _messages(expected, spell) -> list[str]:
    return [f"{spell(field)} {words}" if named else words for field, words, named in expected]


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch):
    """The declared defaults of the run settings, whatever the machine's environment says."""
    for name in ("ENGINE", "COST_MODE", "DEVICE", "DTYPE"):
        monkeypatch.delenv(f"SPECROUTE_{name}", raising=False)


@pytest.fixture
def cli_one(runner, tmp_path):
    """A migrated database in the runner's data folder holding the one-prompt set 'one'."""
    (tmp_path / "one.txt").write_text("hello\n")
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    assert (
        runner.invoke(cli, ["prompts", "import", str(tmp_path / "one.txt"), "--name", "one"]).exit_code == 0
    )
    return runner


@pytest.fixture
def web(engine, db_url, tmp_path, session):
    with session.begin():
        import_prompt_file(session, "one", b"hello\n", "one.txt")
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": f"{BUILTIN},{HF},ngram",
            "TESTING": True,
        }
    )
    yield app
    app.extensions["specroute.close"]()


def _runs(app) -> list[AnalysisRun]:
    with app.extensions["specroute.sessions"]() as session:
        return list(session.scalars(select(AnalysisRun).order_by(AnalysisRun.id)))


def _stored_runs(runner) -> list[dict]:
    return json.loads(runner.invoke(cli, ["runs", "list", "--json"]).stdout)


def _stored_params(runner) -> list[RunParams]:
    """The parameters of the runs the runner's database holds, as the worker reads them."""
    database = engine_from_settings(load_settings())  # the runner's SPECROUTE_DATA_DIR
    try:
        with make_session_factory(database)() as session:
            runs = session.scalars(select(AnalysisRun).order_by(AnalysisRun.id))
            return [RunParams.from_json(run.params) for run in runs]
    finally:
        database.dispose()


def _post(app, **fields):
    client = app.test_client()
    token = TOKEN.search(client.get("/runs/new").get_data(as_text=True)).group(1)
    form = {"csrf_token": token, "prompt_set": "one", "target": HF, "draft": "ngram", **fields}
    return client.post("/runs", data=form)


# ---------------------------------------------------------------- the same bad inputs, every surface


@pytest.mark.parametrize("inputs, expected", CASES)
def test_from_inputs_names_every_problem(inputs, expected):
    with pytest.raises(RunInputError) as refused:
        params_from_inputs({"target": HF, "draft": "ngram", **inputs}, load_settings(), engines=REGISTRY)
    assert [p.field for p in refused.value.problems] == [field for field, _, _ in expected]
    assert str(refused.value).splitlines() == _messages(expected, str)


@pytest.mark.parametrize("inputs, expected", CASES)
def test_analyze_refuses_them_in_the_same_words_and_stores_nothing(cli_one, inputs, expected):
    options = [f"{_cli_name(field)}={value}" for field, value in inputs.items()]
    result = cli_one.invoke(
        cli,
        ["analyze", "--prompts", "one", "--target", HF, "--draft", "ngram", "--queue", "--json", *options],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    for message in _messages(expected, _cli_name):
        assert message in result.stderr, (message, result.stderr)
    assert _stored_runs(cli_one) == []


@pytest.mark.parametrize("inputs, expected", [case for case in CASES if set(case.values[0]) <= DEMO_OPTIONS])
def test_demo_refuses_them_in_the_same_words_before_doing_anything(runner, inputs, expected):
    options = [f"{_cli_name(field)}={value}" for field, value in inputs.items()]
    result = runner.invoke(cli, ["demo", "--no-serve", *options])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    for message in _messages(expected, _cli_name):
        assert message in result.stderr, (message, result.stderr)
    assert "[1/6]" not in result.output  # refused before the database is touched


@pytest.mark.parametrize("inputs, expected", CASES)
def test_the_web_form_refuses_them_in_the_same_words_and_stores_nothing(web, inputs, expected):
    response = _post(web, **inputs)
    page = response.get_data(as_text=True)
    assert response.status_code == 400
    shown = re.search(r'<div class="errors" role="alert"><ul>(.*?)</ul></div>', page).group(1)
    assert re.findall(r"<li>(.*?)</li>", shown) == [str(escape(m)) for m in _messages(expected, form_words)]
    assert _runs(web) == []


TYPE_CASES = [  # what a hand-edited row can hold that a stored run cannot be read with
    ({"max_new_tokens": "abc"}, ("max_new_tokens", "must be a whole number from 1 to 4096, got 'abc'")),
    ({"max_new_tokens": 64.5}, ("max_new_tokens", "must be a whole number from 1 to 4096, got '64.5'")),
    ({"temperature": "nan"}, ("temperature", "must be a number from 0 to 5, got 'nan'")),
    ({"gamma_max": True}, ("gamma_max", "must be a whole number from 1 to 64, got 'True'")),
    ({"limit": "lots"}, ("limit", "must be blank (all) or a whole number from 1 to 10000000, got 'lots'")),
    ({"chat_template": "maybe"}, ("chat_template", "must be true or false, got 'maybe'")),
]


@pytest.mark.parametrize("stored, expected", TYPE_CASES)
def test_the_worker_reads_stored_params_whose_types_are_wrong_as_the_inputs_are_refused(stored, expected):
    """The worker's only reader is RunParams.from_json: a value of the wrong type gets the inputs' words."""
    with pytest.raises(RunInputError) as refused:
        RunParams.from_json({**RunParams().to_json(), **stored})
    assert str(refused.value) == " ".join(expected)
    # ... and the same value typed as an input is refused in the same words
    if expected[0] != "chat_template":
        with pytest.raises(RunInputError) as typed:
            params_from_inputs({"target": HF, "draft": "ngram", **stored}, load_settings(), engines=REGISTRY)
        assert str(typed.value) == " ".join(expected)


def test_stored_params_are_not_checked_against_todays_limits_again():
    """A stored run whose values today's limits refuse (a gamma_max above them, a sampling run with
    validation) still reads back: its report must open; it was checked when it was created."""
    old = RunParams.from_json({**RunParams().to_json(), "gamma_max": 100, "temperature": 0.7, "validate": 2})
    assert (old.gamma_max, old.validate) == (100, 2)
    assert [p.field for p in old.problems()] == ["gamma_max", "validate"]  # a new run like it is refused


# ---------------------------------------------------------------- one set of defaults


def test_blank_inputs_give_the_same_run_on_the_command_line_in_the_form_and_in_the_demo(cli_one, web, runner):
    settings = load_settings()
    expected = params_from_inputs({"target": BUILTIN, "draft": "ngram"}, settings, engines=REGISTRY)
    assert (expected.engine, expected.max_new_tokens, expected.gamma_max, expected.validate) == (
        "llama.cpp",
        64,
        16,
        DEFAULT_VALIDATE,
    )
    assert (expected.chunk_size, expected.cost_mode, expected.device, expected.dtype) == (
        32,
        "eager",
        "auto",
        "auto",
    )

    queued = cli_one.invoke(
        cli, ["analyze", "--prompts", "one", "--target", BUILTIN, "--draft", "ngram", "--queue", "--json"]
    )
    assert queued.exit_code == 0, queued.stderr
    assert (
        "engine llama.cpp: SPECROUTE_ENGINE is auto and llama.cpp can measure this run as asked"
        in queued.stderr
    )
    assert _stored_params(cli_one) == [expected]

    blank = {name: "" for name in ("max_new_tokens", "gamma_max", "temperature", "validate", "limit")}
    blank |= {name: "" for name in ("engine", "cost_mode", "device", "dtype", "batch_sizes", "chunk_size")}
    posted = _post(web, target=BUILTIN, **blank)
    assert posted.status_code == 302, posted.get_data(as_text=True)
    [run] = _runs(web)
    assert RunParams.from_json(run.params) == expected

    demo = demo_run_inputs(type("State", (), {"settings": settings})(), {})
    assert (DEMO_TARGET, DEMO_DRAFT) == (BUILTIN, "ngram") and demo.params == expected
    assert demo.engine_why == "SPECROUTE_ENGINE is auto and llama.cpp can measure this run as asked"


def test_the_cli_stores_what_from_inputs_gives(cli_one):
    queued = cli_one.invoke(
        cli, ["analyze", "--prompts", "one", "--target", HF, "--draft", "ngram", "--device", "cpu", "--queue"]
    )
    assert queued.exit_code == 0, queued.stderr
    why = "transformers can measure this run as asked; llama.cpp cannot: the llama.cpp engine loads GGUF files only"
    assert why in queued.stderr
    expected = params_from_inputs(
        {"target": HF, "draft": "ngram", "device": "cpu"}, load_settings(), engines=REGISTRY
    )
    assert _stored_params(cli_one) == [expected] and expected.engine == "transformers"


@pytest.mark.parametrize(
    "inputs, engine",
    [
        ({"target": BUILTIN}, "llama.cpp"),
        ({"target": HF}, "transformers"),
        ({"target": BUILTIN, "draft": "hf:/models/draft"}, "transformers"),
        ({"target": BUILTIN, "temperature": "0.7"}, "transformers"),
        ({"target": BUILTIN, "device": "cuda"}, "transformers"),
        ({"target": BUILTIN, "dtype": "float32"}, "transformers"),
        ({"target": BUILTIN, "batch_sizes": "1,4"}, "transformers"),
        ({"target": BUILTIN, "cost_mode": "cuda-graphs"}, "transformers"),
        ({"target": BUILTIN, "engine": "transformers"}, "transformers"),
        ({"target": HF, "engine": "llama.cpp"}, "llama.cpp"),  # asked for: create_run refuses the pair
        ({"target": BUILTIN, "engine": "auto"}, "llama.cpp"),  # auto asked for (the form preselects it)
        ({"target": HF, "engine": "auto"}, "transformers"),
    ],
)
def test_auto_is_the_first_engine_whose_own_checks_accept_the_run(inputs, engine):
    """auto asks the engines (llama.cpp first), so it never picks one that then refuses the run."""
    read = read_inputs({"draft": "ngram", **inputs}, load_settings(), engines=REGISTRY)
    assert read.params.engine == engine
    if inputs.get("engine") not in (None, "auto"):
        assert read.engine_why is None
    else:
        REGISTRY[engine].check_params(read.params)


def test_sampling_leaves_validate_at_0_when_blank_and_the_setting_decides_where_it_is_set():
    settings = load_settings()
    sampling = params_from_inputs({"target": HF, "temperature": "0.7"}, settings, engines=REGISTRY)
    assert (sampling.validate, sampling.sampling) == (0, True)
    pinned = load_settings({"engine": "transformers"})
    read = read_inputs({"target": BUILTIN, "draft": "ngram"}, pinned, engines=REGISTRY)
    assert (read.params.engine, read.engine_why) == ("transformers", "SPECROUTE_ENGINE is transformers")


def test_the_form_says_which_engine_it_preselects_and_why(engine, db_url, tmp_path, session):
    with session.begin():
        import_prompt_file(session, "one", b"hello\n", "one.txt")
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": f"{HF},ngram",
            "TESTING": True,
        }
    )
    try:
        page = app.test_client().get("/runs/new").get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    assert "Preselected: <code>auto</code>, from <code>SPECROUTE_ENGINE</code>" in page
    note = re.search(r'<strong id="engine-choice">(.*?)</strong>', page, flags=re.S).group(1)
    assert note.startswith("transformers: SPECROUTE_ENGINE is auto and transformers can measure this run")
    assert "llama.cpp cannot: the llama.cpp engine loads GGUF files only" in note
    # the numbers it prefills are the defaults every surface takes; validate is blank (greedy: 3)
    assert f'name="max_new_tokens" min="1" max="4096" value="{RunParams.max_new_tokens}"' in page
    assert f'name="validate" min="0" max="10000" value="" placeholder="{DEFAULT_VALIDATE}"' in page
