"""Shared fixtures: a migrated temporary SQLite file, sessions on it, a CLI runner pointed at it,
and (once per session) a throw-away PostgreSQL server for the portability tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import migrations
from analyzer.db import make_engine, make_session_factory


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Every test gets its own SPECROUTE_DATA_DIR, so nothing (a generated secret key, a model cache)
    lands in the user's real data folder."""
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(tmp_path / "data"))


def require_shared(path: Path) -> Path:
    """``path`` inside ../shared (the labeled corpus beside the clone). A clone without it skips the
    test with the reason; under CI (CI=1), where ../shared is always there, its absence fails."""
    if not Path(path).exists():
        message = f"the shared corpus is not beside this clone (looked for {path})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return Path(path)


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """Cost profiles judge interference from the machine's other processes and from jitter; tests must
    not depend on what else the machine runs, so they see no other process and treat timing jitter
    below 10 ms (tiny models' forwards take well under that) as noise. Tests of the interference checks
    drive them with a fake clock and fake /proc/stat readings."""
    from analyzer import interference

    monkeypatch.setattr(interference, "_busy_jiffies", lambda: None)
    monkeypatch.setattr(interference, "MIN_SPREAD_S", 0.01)


@pytest.fixture
def db_url(tmp_path) -> str:
    """URL of a fresh, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'specroute.db'}"


@pytest.fixture
def engine(db_url):
    """An engine on a SQLite file migrated to head."""
    engine = make_engine(db_url)
    migrations.upgrade(engine)
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


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """URL of a PostgreSQL server started for this test session in a temporary folder
    (SPECROUTE_TEST_POSTGRES_URL, if set, is used instead). Missing PostgreSQL binaries fail the
    test under CI and skip it elsewhere."""
    given = os.environ.get("SPECROUTE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        message = "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's postgresql"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    as_postgres: list[str] = []
    root = tempfile.mkdtemp(prefix="specroute-pg-", dir="/tmp")
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(root, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(root, "data")
    port = _free_port()
    subprocess.run(as_postgres + [initdb, "-D", data, "-A", "trust", "-U", "specroute", "--no-sync"],
                   check=True, capture_output=True)
    subprocess.run(
        as_postgres + [pg_ctl, "-D", data, "-l", os.path.join(root, "log"), "-w", "-o",
                       f"-p {port} -k {root} -h 127.0.0.1 -F", "start"],
        check=True, capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://specroute@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres + [pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)


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
