"""Shared fixtures: a migrated temporary SQLite file (a copy of one migrated once per session), sessions on
it, a CLI runner pointed at it, (once per session) a throw-away PostgreSQL server for the portability tests
and the bundled corpus' classifier as the demo trains it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# In a pytest-xdist worker (the test command runs the quick tier in two), torch and its math libraries get
# one thread each: two processes of two threads each on a 2-core machine stall each other's matmuls (the
# quick tier took 268 s so, 98 s with one thread each, 165 s in one process). Set before torch is imported.
# llama.cpp's default threads follow OMP_NUM_THREADS too (analyzer.engine.llamacpp_engine.default_threads: a
# greedy generation of the embedded model took 9.5 s beside the other worker with two threads, 1.4 s alone).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import pytest
from click.testing import CliRunner

import migrations
from analyzer.db import make_engine, make_session_factory
from benchmarks.pg_server import pg_bin, throwaway_postgres
from router.classify.training import train_classifier
from router.classify.training_data import make_training_data
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from tests.stop_on_sigterm import pytest_configure  # noqa: F401  (a run stopped with SIGTERM tears down as Ctrl-C)

# Keep the bytecode of what the tests import, pytest's assertion-rewritten test modules included, even where
# the environment sets PYTHONDONTWRITEBYTECODE (this machine's does): each pytest process, each xdist worker and
# the pytest runs some tests start would otherwise rewrite and compile every test module anew, seconds of
# collection each (benchmarks/RESULTS.md). The files land in __pycache__ (git ignores them).
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Every test gets its own SPECROUTE_DATA_DIR, so nothing (a generated secret key, a model cache)
    lands in the user's real data folder."""
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(tmp_path / "data"))
    # and its own build cache: a test finds llama-server only where it puts it (or names it)
    monkeypatch.setenv("SPECROUTE_BUILD_CACHE", str(tmp_path / "build-cache"))
    # classifiers trained in tests use TF-IDF features unless a test asks for the encoder: the default (auto:
    # the encoder where installed) is tested on its own, and embedding the corpus would slow every training
    monkeypatch.setenv("SPECROUTE_CLASSIFIER_FEATURES", "tfidf")
    # the teacher's suggestions on import take seconds; tests/test_classifier_adaptation.py turns them on
    # where it tests them
    monkeypatch.setenv("SPECROUTE_SUGGEST_TASKS", "false")
    # tests that fake a busy machine must not wait minutes for it to quiet down (tests of the wait set it)
    monkeypatch.setenv("SPECROUTE_QUIET_WAIT_S", "0")


def require_shared(path: Path) -> Path:
    """``path`` inside ../shared (the labeled corpus beside the clone). A clone without it skips the
    test with the reason; under CI (CI=1), where ../shared is always there, its absence fails."""
    if not Path(path).exists():
        message = f"the shared corpus is not beside this clone (looked for {path})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return Path(path)


def require_modules(modules: list[str], install: str) -> None:
    """Skip the test, with the reason, when an optional module is not installed; under CI (CI=1), which
    installs every extra, its absence fails."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        message = f"{', '.join(missing)} not installed ({install})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """Cost profiles judge interference from the machine's other processes and from jitter; tests must
    not depend on what else the machine runs, so they see no other process and treat timing jitter
    below 10 ms (tiny models' forwards take well under that) as noise. Tests of the interference checks
    drive them with a fake clock and fake /proc/stat readings."""
    from analyzer.measuring import interference

    monkeypatch.setattr(interference, "_busy_jiffies", lambda: None)
    monkeypatch.setattr(interference, "MIN_SPREAD_S", 0.01)


@pytest.fixture
def steady_timings(monkeypatch):
    """A machine without neighbours for tests that time a real model above the jitter floor (the embedded
    SmolLM2): each timed point keeps the median of its real repeats, but every repeat reads as that median
    and as getting its whole CPU share, so a shared VM's noise or stolen time cannot withhold the advice.
    What other processes used (/proc/stat, faked by a test that wants a busy machine) is still judged."""
    import numpy as np

    from analyzer.measuring import interference

    real_judge = interference.judge

    def judge(wall, cpu, others, threads, on_cpu):
        steady = np.broadcast_to(np.median(wall, axis=0), wall.shape).copy()
        return real_judge(steady, steady * threads, others, threads, on_cpu)

    monkeypatch.setattr(interference, "judge", judge)


@pytest.fixture
def db_url(tmp_path) -> str:
    """URL of a fresh, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'specroute.db'}"


@pytest.fixture(scope="session")
def _migrated_template(tmp_path_factory) -> Path:
    """A SQLite file migrated to head once per test session (the migration tests run the real chain on their
    own files); each test's database starts as a copy of it."""
    path = tmp_path_factory.mktemp("template") / "specroute.db"
    template = make_engine(f"sqlite:///{path}")
    migrations.upgrade(template)
    template.dispose()
    return path


@pytest.fixture
def engine(db_url, _migrated_template):
    """An engine on a SQLite file at head: a copy of the session's migrated template."""
    shutil.copyfile(_migrated_template, db_url.removeprefix("sqlite:///"))
    engine = make_engine(db_url)
    assert migrations.current_revision(engine) == migrations.head_revision()
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine):
    """A session on the migrated database; the test commits what it wants kept."""
    with make_session_factory(engine)() as session:
        yield session


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """A CLI runner whose SPECROUTE_DATA_DIR is an empty temporary folder."""
    data_dir = tmp_path / "data"
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(data_dir))
    monkeypatch.delenv("SPECROUTE_DATABASE_URL", raising=False)
    return CliRunner()


@pytest.fixture(scope="session")
def postgres_url():
    """URL of a PostgreSQL server started for this test session in a temporary folder
    (SPECROUTE_TEST_POSTGRES_URL, if set, is used instead). Missing PostgreSQL binaries fail the
    test under CI and skip it elsewhere."""
    given = os.environ.get("SPECROUTE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if not (pg_bin("initdb") and pg_bin("pg_ctl")):
        message = "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's postgresql"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with throwaway_postgres(fsync=False) as url:  # the benchmarks' server (benchmarks/pg_server.py)
        yield url


@pytest.fixture
def app(engine, db_url):
    """The Flask app (routing API) on the migrated SQLite file; ``app.extensions`` holds the service."""
    from webui.app import create_app

    app = create_app({"database_url": db_url, "router_refresh_s": 0, "ui_worker": False, "TESTING": True})
    yield app
    app.extensions["specroute.close"]()


@pytest.fixture
def client(app):
    return app.test_client()


# the user's own data folder and build cache as they are before the autouse fixture above gives each test
# private ones: llama-server is built in the build cache once per machine (once per CI run, on a fresh machine)
_USER_DATA_DIR = os.environ.get("SPECROUTE_DATA_DIR", "")
_USER_BUILD_CACHE = os.environ.get("SPECROUTE_BUILD_CACHE", "")


def _binding_loads_the_cached_llama_cpp() -> None:
    """Installed as the README says (``-DLLAMA_BUILD=OFF``), llama-cpp-python has no llama.cpp of its own and
    loads the one ``specroute llama-server build`` keeps in the user's cache (the test command builds it
    before pytest). Tests get private data folders, so LLAMA_CPP_LIB_PATH names the user's cache for the
    whole run, child processes included; a binding with its own library is left alone."""
    import importlib.util

    from analyzer.engine.llama_server import library_dir
    from analyzer.engine.llamacpp_engine import LIBRARY_PATH_VARIABLE, _binding_has_own_library
    from analyzer.settings import Settings

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None or os.environ.get(LIBRARY_PATH_VARIABLE):
        return
    user = Settings(data_dir=_USER_DATA_DIR, build_cache=_USER_BUILD_CACHE)
    libraries = library_dir(user.resolved_data_dir() / "cache", build_cache=user.resolved_build_cache())
    if libraries is not None and not _binding_has_own_library(Path(spec.origin).parent):
        os.environ[LIBRARY_PATH_VARIABLE] = str(libraries)


_binding_loads_the_cached_llama_cpp()


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """llama.cpp's own server as specroute finds it (SPECROUTE_LLAMA_SERVER, PATH, the user's build
    cache); where there is none, built once into the user's cache with ``specroute llama-server build``'s
    code (4 to 14 minutes on 2 cores; the README's test command builds it before pytest)."""
    from analyzer.engine.llama_server import LlamaServerMissing, build_llama_server, find_llama_server
    from analyzer.settings import Settings

    user = Settings(data_dir=_USER_DATA_DIR, build_cache=_USER_BUILD_CACHE)
    cache, build_cache = user.resolved_data_dir() / "cache", user.resolved_build_cache()
    try:
        return find_llama_server(
            os.environ.get("SPECROUTE_LLAMA_SERVER", ""), cache, build_cache=build_cache
        ).path
    except LlamaServerMissing:
        return build_llama_server(build_cache, also=[cache], say=lambda line: print(line, flush=True))


@pytest.fixture(scope="session")
def _cold_start_classifier(tmp_path_factory) -> tuple[dict, str]:
    """The bundled corpus' task classifier trained once per session by the demo's own steps, on an empty
    database: [1/6] migrates it, [4/6] cross-validates and trains (the settings' feature set and fold jobs).
    Returns the version row's columns and what the two steps printed (tests/test_cli.py's demo checks it)."""
    import contextlib
    import io

    from analyzer.settings import Settings
    from router.orm import ClassifierVersion
    from webui.cli.base import CliState
    from webui.cli.demo_steps import train_classifier_once, upgrade_database

    path = tmp_path_factory.mktemp("cold-start") / "specroute.db"
    state = CliState(Settings(database_url=f"sqlite:///{path}", classifier_features="tfidf"))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            upgrade_database(state)
            train_classifier_once(state, state.sessions())
        with state.sessions()() as session:
            version = session.query(ClassifierVersion).one()
            columns = {
                column: getattr(version, column) for column in ClassifierVersion.__table__.columns.keys()
            }
    finally:
        state.close()
    return columns, printed.getvalue()


@pytest.fixture
def cold_start_training_printed(_cold_start_classifier) -> str:
    """What the demo's steps [1/6] and [4/6] printed as they migrated an empty database and trained the
    session's cold-start classifier."""
    return _cold_start_classifier[1]


@pytest.fixture
def cold_start_classifier_trained(_cold_start_classifier, _migrated_template, runner) -> None:
    """The test's data folder holds a database at head with the session's cold-start classifier active, as a
    demo that ran before would have left it: the demo then reuses it (``classifier v1 already trained``).
    For every demo's test (transformers, llama.cpp, llama-server): step [4/6] trains once per session, in
    ``_cold_start_classifier``, and tests/test_cli.py's demo checks what it printed; half a minute of
    cross-validation per demo otherwise."""
    from analyzer.settings import load_settings
    from router.orm import ClassifierVersion

    url = load_settings().resolved_database_url()
    path = Path(url.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated_template, path)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            session.add(ClassifierVersion(**_cold_start_classifier[0]))
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def small_gguf(tmp_path_factory) -> Path:
    """The embedded SmolLM2 GGUF cut to its first layers (tests/small_gguf.py): its tokenizer, chat template
    and drafting as the embedded model's, each step ~6x quicker. For the llama-server tests of machinery
    (draft counts against the replay, fits, validation, jobs); the demos run the embedded model itself."""
    from analyzer.engine.llamacpp_engine import gguf_file
    from analyzer.models.specs import parse_spec
    from tests.small_gguf import first_layers_of

    folder = tmp_path_factory.mktemp("small-gguf")
    return first_layers_of(
        gguf_file(parse_spec("builtin:smollm2-135m-instruct")), folder / "smollm2-4-layers.gguf"
    )


@pytest.fixture
def published(session):
    """For the routing API's tests: an active policy set (code speculates, qa does not) and a classifier telling
    them apart (a module may define its own ``published``)."""
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.1})
        publish_policies(session, run.id)
        texts = [f"def f{i}(x): return x + {i}  # fix this python function" for i in range(6)] + [
            f"What is the capital of country number {i}? Answer briefly." for i in range(6)
        ]
        train_classifier(session, make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"))
    return run
