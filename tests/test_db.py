"""SQLite connection setup (WAL, foreign keys, busy timeout) and timezone-aware timestamps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from analyzer.db import make_engine
from analyzer.orm import Prompt, PromptSet


def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'nested' / 'x.db'}", sqlite_busy_timeout_ms=1234)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
    engine.dispose()


def test_foreign_keys_and_checks_are_enforced(session):
    with pytest.raises(IntegrityError):
        with session.begin():
            session.add(
                Prompt(prompt_set_id=999, position=0, source_line=1, text="x", content_hash="h", char_count=1)
            )
    with pytest.raises(IntegrityError):
        with session.begin():
            session.add(PromptSet(name="x", file_format="docx", file_sha256="0", prompt_count=0))


def test_timestamps_come_back_timezone_aware_utc(session):
    stamp = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    with session.begin():
        session.add(PromptSet(name="t", file_format="txt", file_sha256="0", prompt_count=0, created_at=stamp))
    session.expire_all()
    with session.begin():
        stored = session.scalar(select(PromptSet.created_at))
    assert stored == stamp and stored.tzinfo == timezone.utc and stored.hour == 1


def test_writers_take_turns_on_a_file_lock_released_at_commit(tmp_path):
    import threading
    import time

    from sqlalchemy import text

    from analyzer.db import lock_for_write, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path}/lock.db")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (writer TEXT, at REAL)"))
    sessions = make_session_factory(engine)
    events: list[tuple[str, float]] = []
    holding = threading.Event()

    def write(name: str, hold_s: float) -> None:
        with sessions() as session, session.begin():
            lock_for_write(session)
            events.append((f"{name} in", time.monotonic()))
            holding.set()
            time.sleep(hold_s)
            session.execute(text("INSERT INTO t VALUES (:w, :a)"), {"w": name, "a": time.monotonic()})
            events.append((f"{name} out", time.monotonic()))

    first = threading.Thread(target=write, args=("first", 0.3))
    first.start()
    holding.wait(5)
    second = threading.Thread(target=write, args=("second", 0.0))
    second.start()
    first.join(10), second.join(10)
    assert [name for name, _ in events] == ["first in", "first out", "second in", "second out"]
    assert (tmp_path / "lock.db.write-lock").exists()
    with sessions() as session, session.begin():  # released: the next writer goes straight in
        lock_for_write(session)
        assert session.execute(text("SELECT count(*) FROM t")).scalar() == 2
    engine.dispose()
