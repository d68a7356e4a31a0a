"""Alembic migrations over the metadata of the analyzer and router tables, and the functions
every entry point uses to bring a database to head or to check that it is there."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from analyzer.errors import SpecrouteError

MIGRATIONS_DIR = Path(__file__).resolve().parent


class SchemaNotCurrent(SpecrouteError, RuntimeError):
    """The database is not at the newest revision; the message says what to run."""

    status, code = 503, "schema_not_current"


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` using this package's scripts (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would choke on a literal '%' in a password.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision id of the migration scripts."""
    heads = ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migration scripts have {len(heads)} heads: {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty (never migrated) database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision``."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the database behind ``engine`` to ``revision`` (``base`` empties it)."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def require_head(engine: Engine) -> None:
    """Raise :class:`SchemaNotCurrent`, naming the command to run, unless the database is at head."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    where = engine.url.render_as_string(hide_password=True)
    if current is None:
        state = f"the database {where} has no specroute schema yet"
    else:
        state = f"the database {where} is at revision {current}, the code needs {head}"
    raise SchemaNotCurrent(f"{state}. Run: specroute db upgrade")
