"""measured_by and priced_by: the engine that measured a run's acceptance and the engine that priced it,
as two fields on runs, cost profiles and policy sets (``engine`` becomes ``priced_by``); and the policy
set as the whole contract of the router: the draft's kind and options and the batch-1 cost it was
priced with, published with it, so that the router reads no analysis run.

Filled for existing rows: a run's ``measured_by`` from its parameters' engine (transformers before
engines were recorded); a profile's from its source ("imported" for an imported one, else the engine
that measured it); a policy set's ``measured_by``, draft and cost from its run as the router read them
until now (the run's draft spec and its current batch-1 cost profile). A policy set without a run keeps
the router's defaults (prompt lookup, n-gram size 2, no cost).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 16:10:00
"""

import json
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: Union[str, None] = "0017"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TABLES = ("analysis_runs", "cost_profiles", "policy_sets")


def _engine_column(name: str) -> sa.Column:
    return sa.Column(name, sa.String(length=32), nullable=False, server_default="transformers")


def upgrade() -> None:
    # RENAME COLUMN and plain ADD COLUMN: no table copy on SQLite, where foreign keys block one
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN engine TO priced_by")
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(_engine_column("measured_by"))
    with op.batch_alter_table("policy_sets", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("draft_kind", sa.String(length=16), nullable=False, server_default="ngram")
        )
        batch_op.add_column(sa.Column("draft_options", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("cost", sa.JSON(), nullable=True))
    connection = op.get_bind()
    _fill_runs(connection)
    op.execute(
        "UPDATE cost_profiles SET measured_by = CASE WHEN source = 'imported' THEN 'imported' ELSE priced_by END"
    )
    _fill_policy_sets(connection)


def _fill_runs(connection) -> None:
    rows = connection.execute(sa.text("SELECT id, params FROM analysis_runs")).fetchall()
    for run_id, params in rows:
        data = json.loads(params) if isinstance(params, str) else (params or {})
        engine = data.get("engine") or "transformers"
        connection.execute(
            sa.text("UPDATE analysis_runs SET measured_by = :engine WHERE id = :id"),
            {"engine": engine, "id": run_id},
        )


def _options(spec: str) -> dict:
    """The options of an ``ngram:key=value,...`` spec as the router read them (numbers as ints)."""
    _, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        options[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return options


def _fill_policy_sets(connection) -> None:
    rows = connection.execute(
        sa.text(
            "SELECT ps.id, r.measured_by, ms.kind, ms.spec, cp.target_forward_s, cp.draft_step_s, "
            "cp.target_prefill_s, cp.draft_prefill_s, cp.context_tokens, cp.round_overhead_s, "
            "cp.decode_overhead_s "
            "FROM policy_sets ps JOIN analysis_runs r ON r.id = ps.run_id "
            "JOIN model_pairs mp ON mp.id = r.pair_id JOIN model_specs ms ON ms.id = mp.draft_id "
            "LEFT JOIN cost_profiles cp ON cp.id = r.cost_profile_id"
        )
    ).fetchall()
    for row in rows:
        set_id, measured_by, kind, spec, forwards, draft_s, t_pre, d_pre, tokens, round_o, decode_o = row
        cost = None
        if forwards is not None:
            forwards = json.loads(forwards) if isinstance(forwards, str) else forwards
            per_token = max(tokens or 0, 1)
            cost = {
                "target_forward_s": list(forwards),
                "draft_step_s": draft_s,
                "draft_cost_per_token": kind != "ngram",
                "target_prefill_s_per_token": (t_pre or 0.0) / per_token,
                "draft_prefill_s_per_token": (d_pre or 0.0) / per_token,
                "round_overhead_s": round_o or 0.0,
                "decode_overhead_s": decode_o or 0.0,
            }
        update = sa.text(
            "UPDATE policy_sets SET measured_by = :measured_by, draft_kind = :kind, "
            "draft_options = :options, cost = :cost WHERE id = :id"
        ).bindparams(sa.bindparam("options", type_=sa.JSON()), sa.bindparam("cost", type_=sa.JSON()))
        connection.execute(
            update,
            {
                "measured_by": measured_by,
                "kind": kind,
                "options": _options(spec) if kind == "ngram" else {},
                "cost": cost,
                "id": set_id,
            },
        )


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    for column in ("cost", "draft_options", "draft_kind"):
        op.execute(f"ALTER TABLE policy_sets DROP COLUMN {column}")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN measured_by")
        op.execute(f"ALTER TABLE {table} RENAME COLUMN priced_by TO engine")
