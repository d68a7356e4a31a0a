"""The schema comes only from Alembic: upgrade an empty database to head, compare with the models
(no difference), downgrade to base, upgrade again. On SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

import analyzer.models  # noqa: F401
import migrations
import router.models  # noqa: F401
from analyzer.db import Base, make_engine

EXPECTED_TABLES = {
    "prompt_sets", "prompts", "model_specs", "model_pairs", "cost_profiles", "analysis_runs",
    "prompt_results", "gamma_counts", "validation_results", "classifier_versions", "policy_sets",
    "task_policies", "task_estimates", "route_decisions", "feedback_events",
}


def _differences(engine) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def _roundtrip(url: str) -> None:
    engine = make_engine(url)
    try:
        assert migrations.current_revision(engine) is None
        migrations.upgrade(engine)
        assert migrations.current_revision(engine) == migrations.head_revision()
        assert EXPECTED_TABLES <= set(inspect(engine).get_table_names())
        assert _differences(engine) == []
        migrations.downgrade(engine, "base")
        assert migrations.current_revision(engine) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        migrations.upgrade(engine)
        assert _differences(engine) == []
        migrations.require_head(engine)
    finally:
        engine.dispose()


def test_sqlite_upgrade_matches_models_and_downgrades(db_url):
    _roundtrip(db_url)


def test_postgresql_upgrade_matches_models_and_downgrades(postgres_url):
    engine = make_engine(postgres_url)
    with engine.begin() as connection:  # a clean slate if a previous test left tables
        connection.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    _roundtrip(postgres_url)


def test_every_table_is_on_the_one_base_and_follows_the_naming_convention():
    assert set(Base.metadata.tables) == EXPECTED_TABLES
    for table in Base.metadata.tables.values():
        assert table.primary_key.name == f"pk_{table.name}"
        for constraint in table.constraints:
            assert constraint.name, f"{table.name} has an unnamed constraint"


def test_require_head_names_the_command_for_an_empty_or_old_database(db_url):
    engine = make_engine(db_url)
    with pytest.raises(migrations.SchemaNotCurrent, match="no specroute schema yet. Run: specroute db upgrade"):
        migrations.require_head(engine)
    migrations.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'abc123'"))
    with pytest.raises(migrations.SchemaNotCurrent, match="is at revision abc123, the code needs .* Run: specroute db upgrade"):
        migrations.require_head(engine)
    engine.dispose()
