"""The database: one declarative base for every table, engine and session construction.

Analyzer tables (``analyzer.orm``) and router tables (``router.orm``) subclass :class:`Base`.
The schema is created and changed only by Alembic (``migrations/``); nothing here calls
``create_all``. Everything here is portable SQL; the SQLite pragmas below are applied only when the
URL is a SQLite one.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData, TypeDecorator, and_, create_engine, event, or_, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: SQLite's busy handler alone
    fcntl = None

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC timestamp on every backend (SQLite stores naive values)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; use utcnow()")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    """The one declarative base; its metadata carries the constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(none_as_null=True),
        list[Any]: JSON(none_as_null=True),
        list[str]: JSON(none_as_null=True),
        list[int]: JSON(none_as_null=True),
        list[float]: JSON(none_as_null=True),
    }


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)


def make_engine(url: str, *, sqlite_busy_timeout_ms: int = 5000) -> Engine:
    """Create an engine for ``url``. For SQLite files the parent folder is created and every
    connection gets WAL journaling, foreign keys and a busy timeout; transactions begin with an
    explicit BEGIN when they start (pysqlite's own BEGIN comes only before the first write, so a
    read-then-write transaction could see stale data), or BEGIN IMMEDIATE (see ``lock_for_write``),
    which on POSIX first takes an exclusive lock on ``<database>.write-lock`` (held to the end of the
    transaction), so that writers of every process take turns in the kernel's queue."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    lock_file = None
    if parsed.database and parsed.database != ":memory:":
        database = Path(parsed.database).expanduser()
        database.parent.mkdir(parents=True, exist_ok=True)
        lock_file = database.with_name(database.name + ".write-lock") if fcntl is not None else None
    engine = create_engine(url, connect_args={"timeout": sqlite_busy_timeout_ms / 1000})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # the "begin" listener below emits BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(sqlite_busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(connection):
        if not connection.get_execution_options().get(_WRITE_LOCK):
            connection.exec_driver_sql("BEGIN")
            return
        if lock_file is not None and fcntl is not None and _LOCK_FD not in connection.info:
            # writers queue on a file lock first: the kernel wakes the next one as soon as it is
            # released, where SQLite's busy handler would sleep in growing steps (up to 100 ms)
            descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            connection.info[_LOCK_FD] = descriptor
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _release_file_lock(connection):
        descriptor = connection.info.pop(_LOCK_FD, None)
        if descriptor is not None:
            os.close(descriptor)  # closing the descriptor releases its lock

    @event.listens_for(engine.pool, "checkin")
    @event.listens_for(engine.pool, "invalidate")
    def _release_with_the_connection(_dbapi_connection, record, *_args):
        descriptor = record.info.pop(_LOCK_FD, None) if record is not None else None
        if descriptor is not None:  # a transaction that ended without commit or rollback
            os.close(descriptor)

    return engine


_WRITE_LOCK = "specroute_write_lock"
_LOCK_FD = "specroute_write_lock_fd"
_LOCKED_TRANSACTION = "specroute_locked_transaction"
MAX_ID = 2**63 - 1  # the largest primary key a database column holds; larger ids from users are "not found"


def lock_for_write(session: Session) -> None:
    """Start the session's transaction holding the write lock (SQLite: BEGIN IMMEDIATE), for a
    transaction that reads rows and writes values computed from them: concurrent ones (other
    threads or processes) then run one after the other instead of failing on a stale snapshot.
    Call it first in the transaction (again in the same transaction: nothing more happens); on other
    backends lock the rows read (SELECT ... FOR UPDATE).

    On SQLite every transaction that writes after it has read must begin so: one begun as a plain
    read fails at its first write, at once and whatever the busy timeout, with "database is locked"
    when another connection committed since its first read (its snapshot is then stale)."""
    transaction = session.get_transaction()
    if transaction is not None and session.info.get(_LOCKED_TRANSACTION) is transaction:
        return
    session.connection(execution_options={_WRITE_LOCK: True})
    session.info[_LOCKED_TRANSACTION] = session.get_transaction()


def claimable(
    session: Session,
    model: Any,
    *,
    cutoff: datetime,
    waiting: str = "queued",
    taken: str = "running",
    where: tuple = (),
    order_by: tuple = (),
    limit: int = 1,
) -> list[Any]:
    """The rows of ``model`` a worker may claim now, oldest first (``order_by``; default the id), at most
    ``limit``: ``waiting``, or ``taken`` by a worker whose heartbeat is older than ``cutoff``, and matching
    ``where``. The one claim of every queue (an analysis' chunks, the llama-server jobs, the web UI's jobs): the
    transaction holds the write lock (SQLite: claims run one after the other), and the rows are locked as they
    are read, skipping those another worker is claiming (PostgreSQL: FOR UPDATE SKIP LOCKED), so that no row is
    taken twice and no claim waits for another. The caller marks what it takes, in the same transaction."""
    lock_for_write(session)
    due = or_(model.status == waiting, and_(model.status == taken, model.heartbeat_at < cutoff))
    query = select(model).where(due, *where).order_by(*(order_by or (model.id,))).limit(limit)
    return list(session.scalars(query.with_for_update(skip_locked=True)))


def engine_from_settings(settings) -> Engine:
    """The engine for a :class:`analyzer.settings.Settings`."""
    return make_engine(
        settings.resolved_database_url(), sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms
    )


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory bound to ``engine``; callers own their transactions
    (``with factory() as s, s.begin(): ...``)."""
    return sessionmaker(bind=engine, expire_on_commit=False)
