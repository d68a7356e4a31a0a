"""The schema comes only from Alembic: upgrade an empty database to head, compare with the models
(no difference), downgrade to base, upgrade again. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

import analyzer.orm  # noqa: F401
import migrations
import router.orm  # noqa: F401
from analyzer.db import Base, make_engine

EXPECTED_TABLES = {
    "prompt_sets",
    "prompts",
    "model_specs",
    "model_pairs",
    "cost_profiles",
    "run_cost_profiles",
    "analysis_runs",
    "prompt_results",
    "gamma_counts",
    "validation_results",
    "option_results",
    "background_jobs",
    "classifier_versions",
    "policy_sets",
    "task_policies",
    "task_estimates",
    "route_decisions",
    "feedback_events",
    "run_chunks",
    "server_analyses",
    "server_analysis_jobs",
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
    with pytest.raises(
        migrations.SchemaNotCurrent, match="no specroute schema yet. Run: specroute db upgrade"
    ):
        migrations.require_head(engine)
    migrations.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'abc123'"))
    with pytest.raises(
        migrations.SchemaNotCurrent,
        match="is at revision abc123, the code needs .* Run: specroute db upgrade",
    ):
        migrations.require_head(engine)
    engine.dispose()


def _revisions_oldest_first() -> list[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrations.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _realistic_rows(url: str) -> None:
    """A database at head with rows in every table, written by the code that writes them."""
    from sqlalchemy import select

    from analyzer.analysis.chunks import plan_chunks
    from analyzer.analysis.server_jobs import ServerJobParams, create_server_job
    from analyzer.db import make_session_factory
    from analyzer.orm import Prompt, ValidationResult
    from router.classify.training import train_classifier
    from router.classify.training_data import make_training_data
    from router.decide.decision import Router
    from router.decide.feedback import parse_feedback, record_feedback
    from router.orm import BackgroundJob
    from router.policies.policy import PolicySnapshot, publish_policies
    from router.policies.server_policy import publish_server_policies
    from router.serve.decision_log import DecisionLog
    from tests.factories import make_done_run, make_server_analysis

    engine = make_engine(url)
    migrations.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run = make_done_run(session, {"code": 0.8, "qa": 0.3, "translation": 0.6}, per_task=3)
        plan_chunks(session, run)  # a done run's chunks (its prompts are measured: the profile alone)
        session.add(
            ValidationResult(
                run_id=run.id,
                prompt_id=session.scalars(select(Prompt.id)).first(),
                gamma=3,
                greedy_time_s=1.0,
                speculative_time_s=0.8,
                measured_speedup=1.25,
                predicted_speedup=1.2,
                outputs_identical=True,
                target_forward_passes=40,
            )
        )
        publish_policies(session, run.id)
        record = make_server_analysis(session, run.prompt_set, {"code": "copy"})
        publish_server_policies(session, record.id, activate=False)
        job = create_server_job(session, run.prompt_set, ServerJobParams(limit=9))
        job.status, job.analysis_id, job.progress = (
            "done",
            record.id,
            {"phase": "done", "done": 9, "total": 9},
        )
        session.add(
            BackgroundJob(
                key="train",
                kind="train",
                params={"source": "both", "features": "tfidf"},
                status="done",
                attempts=1,
                progress="fold 5/5",
                message="classifier v2 trained",
            )  # fmt: skip
        )
        texts = [f"def f{i}(x): return x + {i}" for i in range(4)] + [f"What is {i} + {i}?" for i in range(4)]
        train_classifier(
            session, make_training_data(texts, ["code"] * 4 + ["qa"] * 4, "test"), cross_validate=False
        )
    log = DecisionLog(sessions)
    router = Router(
        None,
        {"*": PolicySnapshot("*", True, 3, 0.5, 0.01, 10, 1.2, "CONDITIONAL", (1.2,) * 4)},
        policy_version=1,
    )
    decisions = [router.route(f"prompt {i}") for i in range(5)]
    log.add(decisions, policy_set_id=1, classifier_version_id=1)
    log.close()
    with sessions() as session, session.begin():
        for d in decisions[:3]:
            record_feedback(
                session, parse_feedback({"route_id": d.route_id, "rounds": 5, "drafted": 12, "accepted": 7})
            )
        record_feedback(
            session,
            parse_feedback(
                {"task_type": "code", "timings": {"draft_n": 10, "draft_n_accepted": 6, "predicted_n": 20}}
            ),
        )
    engine.dispose()


# columns a later revision drops, with the value an old row holds there (0008: the online estimate
# moves the published curve, no burstiness factor)
DROPPED_LATER = {("task_estimates", "burstiness"): 1.0}
# columns a later revision renames, with their name at head (0018: the engine that priced, beside the one
# that measured)
RENAMED_LATER = {(t, "engine"): "priced_by" for t in ("analysis_runs", "cost_profiles", "policy_sets")}


def _at_head(columns: dict[str, list[str]]) -> dict[str, list[str]]:
    """The same columns under their names at head."""
    return {name: [RENAMED_LATER.get((name, c), c) for c in cols] for name, cols in columns.items()}


def _tables(engine) -> dict[str, list[str]]:
    """Table -> column names, parents before children (raw SQL below: values are copied as stored)."""
    from sqlalchemy import MetaData

    meta = MetaData()
    meta.reflect(engine)
    return {t.name: list(t.c.keys()) for t in meta.sorted_tables if t.name != "alembic_version"}


def _snapshot(engine, columns: dict[str, list[str]]) -> dict[str, list[tuple]]:
    with engine.connect() as connection:
        return {
            name: [
                tuple(row)
                for row in connection.exec_driver_sql(f"SELECT {', '.join(cols)} FROM {name} ORDER BY id")
            ]
            for name, cols in columns.items()
        }


@pytest.fixture(scope="module")
def realistic(tmp_path_factory) -> Path:
    """A database at head with the realistic rows (:func:`_realistic_rows`), written once for the module's
    tests: each reads its rows from it (0.4 s each, 33 tests)."""
    path = tmp_path_factory.mktemp("realistic") / "source.db"
    _realistic_rows(f"sqlite:///{path}")
    return path


def _database_at(tmp_path, revision: str, realistic: Path):
    """An engine on a database at ``revision`` holding the realistic rows (as far as its schema has
    columns for them, read from ``realistic``), and that schema's tables."""
    source_url, old_url = f"sqlite:///{realistic}", f"sqlite:///{tmp_path}/old.db"
    source, old = make_engine(source_url), make_engine(old_url)
    migrations.upgrade(old, revision)
    old_tables, source_tables = _tables(old), _tables(source)
    with source.connect() as read, old.begin() as write:  # the rows, as far as the old schema has columns
        for name, columns in old_tables.items():
            kept = [c for c in columns if RENAMED_LATER.get((name, c), c) in source_tables[name]]
            dropped = [c for c in columns if (name, c) in DROPPED_LATER]
            read_as = [RENAMED_LATER.get((name, c), c) for c in kept]
            rows = [
                tuple(r) + tuple(DROPPED_LATER[name, c] for c in dropped)
                for r in read.exec_driver_sql(f"SELECT {', '.join(read_as)} FROM {name}")
            ]
            assert rows, f"no rows for {name}: the filler must cover every table"
            names = kept + dropped
            write.exec_driver_sql(
                f"INSERT INTO {name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", rows
            )
    source.dispose()
    return old, {
        name: [c for c in columns if (name, c) not in DROPPED_LATER] for name, columns in old_tables.items()
    }


@pytest.mark.slow  # 28 databases migrated from each revision: about 20 s
@pytest.mark.parallel
@pytest.mark.parametrize("revision", _revisions_oldest_first()[:-1])
def test_rows_stored_at_an_earlier_revision_survive_the_upgrade(tmp_path, revision, realistic):
    old, old_tables = _database_at(tmp_path, revision, realistic)
    before = _snapshot(old, old_tables)
    migrations.upgrade(old)
    assert migrations.current_revision(old) == migrations.head_revision()
    assert _snapshot(old, _at_head(old_tables)) == before
    assert _differences(old) == []
    old.dispose()


def test_profiles_from_before_devices_become_float32_at_batch_1_and_keep_working(tmp_path, realistic):
    from analyzer.advice.report import build_report
    from analyzer.db import make_session_factory
    from router.decide.decision import RouterConfig, router_from_database
    from router.policies.policy import publish_policies

    old, _ = _database_at(tmp_path, "0002", realistic)
    with old.connect() as connection:
        run_id, profile_id = connection.exec_driver_sql("SELECT id, cost_profile_id FROM analysis_runs").one()
    migrations.upgrade(old)
    with old.connect() as connection:
        assert connection.exec_driver_sql(
            "SELECT dtype, batch_size, round_overhead_s FROM cost_profiles"
        ).all() == [("float32", 1, None)]
        assert connection.exec_driver_sql(
            "SELECT run_id, cost_profile_id, batch_size FROM run_cost_profiles"
        ).all() == [(run_id, profile_id, 1)]
    sessions = make_session_factory(old)
    with sessions() as session, session.begin():
        report = build_report(session, run_id)
        assert report["dtype"] == "float32" and report["guarantee"].startswith("float32: the replay is exact")
        assert (
            set(report["cost_profiles"]) == {"1"} and report["cost_profiles"]["1"]["round_overhead_s"] is None
        )
        for summary in list(report["tasks"].values()) + [report["workload"]]:
            assert summary["by_batch"]["1"]["speedup_curve"] == summary["speedup_curve"]
            assert summary["by_batch"]["1"]["best_gamma"] == summary["best_gamma"]
        published = publish_policies(session, run_id)
        assert all(set(p.speedup_curves_by_batch) == {"1"} for p in published.policies)
        assert {p.task_type: p.speculate for p in published.policies}["code"]
        router = router_from_database(session, RouterConfig(max_batch_size=8, min_confidence=0.0))
    code = "def f9(x): return x + 9"
    single = router.route(code, max_new_tokens=100, batch_size=4)
    assert single.task_type == "code" and single.speculate  # the batch-1 curve, under the cut-off
    batched = router.route(code, max_new_tokens=100, batch_size=16)
    assert not batched.speculate and batched.codes[-1] == "batch_not_profiled"
    migrations.downgrade(old, "0002")  # and back, with the data in place
    with old.connect() as connection:
        assert connection.exec_driver_sql("SELECT id FROM cost_profiles").all() == [(profile_id,)]
        assert (
            connection.exec_driver_sql(
                "SELECT cost_profile_id FROM analysis_runs WHERE id = ?", (run_id,)
            ).scalar()
            == profile_id
        )
    old.dispose()


def test_there_is_an_earlier_revision_to_upgrade_from():
    assert len(_revisions_oldest_first()) >= 2  # else the test above checks nothing


ENGINE_TABLES = ("analysis_runs", "cost_profiles", "policy_sets")


def _engines(engine, column: str = "priced_by") -> dict[str, list[str]]:
    with engine.connect() as connection:
        return {
            table: [e for (e,) in connection.exec_driver_sql(f"SELECT {column} FROM {table} ORDER BY id")]
            for table in ENGINE_TABLES
        }


def test_rows_from_before_engines_become_transformers_and_the_column_goes_on_downgrade(tmp_path, realistic):
    from analyzer.db import make_session_factory
    from analyzer.orm import AnalysisRun
    from router.policies.policy import publish_policies

    old, _ = _database_at(tmp_path, "0009", realistic)
    assert all("engine" not in {c["name"] for c in inspect(old).get_columns(t)} for t in ENGINE_TABLES)
    migrations.upgrade(old)
    # the filler's two policy sets (one from a run, one from a llama-server analysis) hold no engine at 0009
    before = {t: ["transformers"] * (2 if t == "policy_sets" else 1) for t in ENGINE_TABLES}
    assert _engines(old) == _engines(old, "measured_by") == before
    with make_session_factory(old)() as session, session.begin():
        run = session.scalar(select(AnalysisRun))
        run.priced_by = run.cost_profile.priced_by = "llama.cpp"
        assert publish_policies(session, run.id).priced_by == "llama.cpp"
    assert _engines(old) == {
        "analysis_runs": ["llama.cpp"],
        "cost_profiles": ["llama.cpp"],
        "policy_sets": ["transformers", "transformers", "llama.cpp"],
    }
    migrations.downgrade(old, "0009")
    assert all("engine" not in {c["name"] for c in inspect(old).get_columns(t)} for t in ENGINE_TABLES)
    with old.connect() as connection:  # the rows stay
        assert connection.exec_driver_sql("SELECT count(*) FROM policy_sets").scalar() == 3
    migrations.upgrade(old)
    assert _engines(old) == {t: ["transformers"] * (3 if t == "policy_sets" else 1) for t in ENGINE_TABLES}
    assert _differences(old) == []
    old.dispose()


def test_0018_fills_measured_by_and_the_policy_sets_contract_as_the_router_read_it_from_the_run(
    tmp_path, realistic
):
    from analyzer.advice.summary import cost_for_run
    from analyzer.db import make_session_factory
    from analyzer.orm import AnalysisRun, CostProfile
    from router.decide.decision import router_from_database
    from router.orm import PolicySet

    old, _ = _database_at(tmp_path, "0017", realistic)
    with old.begin() as connection:
        run_id, params = connection.exec_driver_sql("SELECT id, params FROM analysis_runs").first()
        params = {**json.loads(params), "engine": "llama.cpp"}
        connection.exec_driver_sql(
            "UPDATE analysis_runs SET params = ? WHERE id = ?", (json.dumps(params), run_id)
        )
        connection.exec_driver_sql("UPDATE cost_profiles SET source = 'imported', engine = 'vllm'")
        policy_sets = connection.exec_driver_sql("SELECT count(*) FROM policy_sets").scalar()
    migrations.upgrade(old)
    with make_session_factory(old)() as session:
        run = session.get(AnalysisRun, run_id)
        assert (run.measured_by, run.priced_by) == ("llama.cpp", "transformers")
        assert {(p.measured_by, p.priced_by) for p in session.scalars(select(CostProfile))} == {
            ("imported", "vllm")
        }
        sets = session.scalars(select(PolicySet)).all()
        assert len(sets) == policy_sets >= 1
        # the filler's set from a llama-server analysis (a later revision's) has no run to fill from
        for policy_set in [s for s in sets if s.run_id is not None]:
            source = session.get(AnalysisRun, policy_set.run_id)
            assert policy_set.measured_by == source.measured_by
            assert policy_set.draft_kind == source.pair.draft.kind
            expected = cost_for_run(source)
            assert policy_set.cost == (expected.as_json() if expected is not None else None)
        router = router_from_database(session)
        active = next(s for s in sets if s.is_active)
        assert router.cost.as_json() == cost_for_run(session.get(AnalysisRun, active.run_id)).as_json()
    old.dispose()


def test_0028_fills_the_option_rows_as_the_code_writes_them(tmp_path, realistic):
    """A run's rows (from its stored summary, gamma counts and validation) and a llama-server analysis' rows
    (from its stored prompt rows) come out of the upgrade equal to those the code stores at head."""
    old, _ = _database_at(tmp_path, "0027", realistic)
    migrations.upgrade(old)
    source = make_engine(f"sqlite:///{realistic}")
    query = (
        "SELECT run_id, server_analysis_id, prompt_id, task_type, option, position, rounds, drafted, accepted, "
        "predicted_speedup, measured_speedup FROM option_results ORDER BY id"
    )
    with source.connect() as written_db, old.connect() as filled_db:
        written = [tuple(r) for r in written_db.exec_driver_sql(query)]
        filled = [tuple(r) for r in filled_db.exec_driver_sql(query)]
    source.dispose()
    old.dispose()
    # 9 prompts x 8 gammas of the run, 9 prompts x 2 settings of the analysis
    assert len(written) == 9 * 8 + 9 * 2
    assert filled == written
    assert [r[5] for r in written[:8]] == list(range(1, 9)) and written[0][4] == "gamma 1"
    assert {r[4] for r in written if r[1] is not None} == {"ngram-simple 3/8", "ngram-mod 16 2-16"}
    assert [r[10] for r in written if r[10] is not None] == [1.25]  # the one validation, at its gamma


def test_0035_keeps_the_oldest_active_job_of_a_key_and_the_index_refuses_a_second(db_url):
    from sqlalchemy.exc import IntegrityError

    engine = make_engine(db_url)
    migrations.upgrade(engine, "0034")
    insert = (
        "INSERT INTO background_jobs (key, kind, params, status, attempts, created_at) "
        "VALUES (?, 'train', '{}', ?, 0, '2026-12-01 00:00:00')"
    )
    with engine.begin() as connection:  # "train" queued three times by processes racing before the index
        for key, status in [
            ("train", "queued"),
            ("train", "running"),
            ("train", "queued"),
            ("suggest:1", "queued"),
        ]:
            connection.exec_driver_sql(insert, (key, status))
        connection.exec_driver_sql(insert, ("train", "done"))
    migrations.upgrade(engine)
    with engine.connect() as connection:
        rows = connection.exec_driver_sql("SELECT key, status FROM background_jobs ORDER BY id").all()
    assert [tuple(r) for r in rows] == [
        ("train", "queued"),
        ("train", "failed"),
        ("train", "failed"),
        ("suggest:1", "queued"),
        ("train", "done"),
    ]
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.exec_driver_sql(insert, ("train", "running"))
    with engine.begin() as connection:  # an ended job under the key is not active: any number of them
        connection.exec_driver_sql(insert, ("train", "failed"))
    engine.dispose()


def test_0037_gives_older_analyses_empty_fits_and_their_decisions_stay(tmp_path, realistic):
    """An analysis stored before the leave-one-out fits: the downgrade to 0036 removes them from its rows and
    costs, the upgrade gives them back empty, and the policy set it publishes decides as before."""
    import shutil

    from analyzer.db import make_session_factory
    from analyzer.orm import ServerAnalysisRecord
    from router.policies.server_policy import server_policy_set

    def decisions(engine) -> tuple[list, dict]:
        with make_session_factory(engine)() as session:
            record = session.query(ServerAnalysisRecord).one()
            made = server_policy_set(session, record, pools={})
            return [(p.task_type, p.setting, p.speedup_low) for p in made.policies], record.cost

    path = tmp_path / "copy.db"
    shutil.copy(realistic, path)
    engine = make_engine(f"sqlite:///{path}")
    at_head, cost = decisions(engine)
    assert all(family["refits"] == [] for family in cost.values())
    migrations.downgrade(engine, "0036")
    with engine.connect() as connection:
        prompts, stored_cost = connection.exec_driver_sql("SELECT prompts, cost FROM server_analyses").one()
    assert "refit_plain_ms" not in prompts and "refit_ms" not in prompts and "refits" not in stored_cost
    with engine.connect() as connection:
        assert "fit_errors" not in connection.exec_driver_sql("SELECT tasks FROM server_analyses").scalar()
    migrations.upgrade(engine)
    again, cost = decisions(engine)
    assert again == at_head and all(family["refits"] == [] for family in cost.values())
    with engine.connect() as connection:
        prompts = json.loads(connection.exec_driver_sql("SELECT prompts FROM server_analyses").scalar())
    assert all(row["refit_plain_ms"] == [] for row in prompts)
    assert all(s["refit_ms"] == [] for row in prompts for s in row["settings"])
    with engine.connect() as connection:
        tasks = json.loads(connection.exec_driver_sql("SELECT tasks FROM server_analyses").scalar())
    assert tasks and all(task["curve"]["fit_errors"] == [] for task in tasks)
    engine.dispose()
