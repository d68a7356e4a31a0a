"""A throw-away PostgreSQL server for the benchmarks: ``initdb`` into a temporary folder, ``pg_ctl
start`` on a free loopback port (its unix socket in that folder), stopped and removed on exit. The
server binaries are found on PATH or under /usr/lib/postgresql/<version>/bin (Debian's layout); as
root, the server runs as the ``postgres`` user (PostgreSQL refuses to run as root). The tests'
``postgres_url`` fixture uses it too (benchmarks import nothing from the tests).

    with throwaway_postgres() as url:   # postgresql+psycopg://specroute@127.0.0.1:<port>/postgres
        ...
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def pg_bin(name: str) -> str | None:
    """The path of PostgreSQL's ``name`` binary (initdb, pg_ctl), or None."""
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


@contextmanager
def throwaway_postgres(*, fsync: bool = True, max_connections: int = 200) -> Iterator[str]:
    """Start a PostgreSQL server in a temporary folder and yield its SQLAlchemy URL (database
    ``postgres``, user ``specroute``, trust authentication on loopback only); stop it and delete the
    folder afterwards. ``fsync``: False turns durability off (``-F``), as the tests do; a benchmark
    keeps it on, as SQLite's WAL commits are durable too."""
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        raise SystemExit(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's postgresql "
            "(or measure SQLite only: --database sqlite)"
        )
    as_postgres: list[str] = []
    root = tempfile.mkdtemp(prefix="specroute-bench-pg-", dir="/tmp")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(root, "data")
    port = _free_port()
    options = f"-p {port} -k {root} -h 127.0.0.1 -c max_connections={max_connections}" + (
        "" if fsync else " -F"
    )
    try:
        for command in (
            [initdb, "-D", data, "-A", "trust", "-U", "specroute", "--no-sync"],
            [pg_ctl, "-D", data, "-l", os.path.join(root, "log"), "-w", "-o", options, "start"],
        ):
            done = subprocess.run(as_postgres + command, capture_output=True, text=True)
            if done.returncode:
                log = Path(root, "log")
                raise SystemExit(
                    f"{' '.join(command)} failed: {done.stderr.strip()}"
                    + (f"\n{log.read_text()}" if log.exists() else "")
                )
        yield f"postgresql+psycopg://specroute@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres + [pg_ctl, "-D", data, "-m", "fast", "stop"], capture_output=True)
        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server at ``server_url``; returns its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)
