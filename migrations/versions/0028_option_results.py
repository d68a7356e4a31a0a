"""One table of per prompt and drafting option rows for every engine's analysis: ``option_results`` holds, per
prompt and option (a run's ``gamma g``, a llama-server analysis' setting), the replay's rounds, drafted and
accepted counts, the predicted speedup and the measured one where validation ran it (analyzer/orm.py,
OptionResult; analyzer/advice/option_rows.py).

The upgrade fills it from what is stored: a run's rows from its stored summary (the predicted speedups), its
gamma counts and its validations, as :func:`analyzer.advice.option_rows.run_option_rows` makes them; a llama-server
analysis' rows from its stored prompt rows. A run without a stored summary gets its rows when its summary is
next stored.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 05:00:00
"""

import math
from typing import Any, Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: Union[str, None] = "0027"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    table = op.create_table(
        "option_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("server_analysis_id", sa.Integer(), nullable=True),
        sa.Column("prompt_id", sa.Integer(), nullable=False),
        sa.Column("task_type", sa.String(length=64), nullable=True),
        sa.Column("option", sa.String(length=100), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("drafted", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("predicted_speedup", sa.Float(), nullable=True),
        sa.Column("measured_speedup", sa.Float(), nullable=True),
        sa.CheckConstraint(
            "(run_id IS NULL) <> (server_analysis_id IS NULL)", name=op.f("ck_option_results_one_analysis")
        ),
        sa.CheckConstraint(
            "accepted <= drafted AND rounds >= 0 AND position >= 1", name=op.f("ck_option_results_counts")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["analysis_runs.id"],
            name=op.f("fk_option_results_run_id_analysis_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["server_analysis_id"],
            ["server_analyses.id"],
            name=op.f("fk_option_results_server_analysis_id_server_analyses"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["prompt_id"], ["prompts.id"], name=op.f("fk_option_results_prompt_id_prompts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_option_results")),
        sa.UniqueConstraint(
            "run_id", "prompt_id", "option", name=op.f("uq_option_results_run_id_prompt_id_option")
        ),
        sa.UniqueConstraint(
            "server_analysis_id",
            "prompt_id",
            "option",
            name=op.f("uq_option_results_server_analysis_id_prompt_id_option"),
        ),
    )
    with op.batch_alter_table("option_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_option_results_prompt_id"), ["prompt_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_option_results_run_id"), ["run_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_option_results_server_analysis_id"), ["server_analysis_id"], unique=False
        )
    connection = op.get_bind()
    rows = _run_rows(connection) + _server_rows(connection)
    if rows:
        op.bulk_insert(table, rows)


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _run_rows(connection) -> list[dict[str, Any]]:
    runs = sa.table("analysis_runs", sa.column("id"), sa.column("summary", sa.JSON))
    results = sa.table("prompt_results", sa.column("id"), sa.column("run_id"), sa.column("prompt_id"))
    counts = sa.table(
        "gamma_counts",
        sa.column("result_id"),
        sa.column("gamma"),
        sa.column("rounds"),
        sa.column("drafted"),
        sa.column("accepted"),
    )
    validations = sa.table(
        "validation_results",
        sa.column("run_id"),
        sa.column("prompt_id"),
        sa.column("gamma"),
        sa.column("measured_speedup"),
    )
    rows: list[dict[str, Any]] = []
    for run_id, stored in connection.execute(sa.select(runs.c.id, runs.c.summary).order_by(runs.c.id)):
        if not stored or not stored.get("summary"):
            continue
        found = {p["prompt_id"]: p for p in stored["summary"]["prompts"]}
        measured = {
            (p, g): s
            for p, g, s in connection.execute(
                sa.select(validations.c.prompt_id, validations.c.gamma, validations.c.measured_speedup).where(
                    validations.c.run_id == run_id
                )
            )
        }
        made = []
        for prompt_id, gamma, rounds, drafted, accepted in connection.execute(
            sa.select(
                results.c.prompt_id, counts.c.gamma, counts.c.rounds, counts.c.drafted, counts.c.accepted
            )
            .select_from(results.join(counts, counts.c.result_id == results.c.id))
            .where(results.c.run_id == run_id)
        ):
            prompt = found.get(prompt_id)
            if prompt is None:
                continue
            curve = prompt["speedup_curve"]
            made.append(
                {
                    "run_id": run_id,
                    "server_analysis_id": None,
                    "prompt_id": prompt_id,
                    "task_type": prompt["task"],
                    "option": f"gamma {gamma}",
                    "position": gamma,
                    "rounds": rounds,
                    "drafted": drafted,
                    "accepted": accepted,
                    "predicted_speedup": _finite(curve[gamma - 1] if gamma <= len(curve) else None),
                    "measured_speedup": _finite(measured.get((prompt_id, gamma))),
                }
            )
        rows += sorted(made, key=lambda r: (found[r["prompt_id"]]["position"], r["position"]))
    return rows


def _server_rows(connection) -> list[dict[str, Any]]:
    analyses = sa.table("server_analyses", sa.column("id"), sa.column("prompts", sa.JSON))
    rows: list[dict[str, Any]] = []
    for analysis_id, prompts in connection.execute(
        sa.select(analyses.c.id, analyses.c.prompts).order_by(analyses.c.id)
    ):
        for row in prompts or []:
            for position, s in enumerate(row["settings"], start=1):
                rows.append(
                    {
                        "run_id": None,
                        "server_analysis_id": analysis_id,
                        "prompt_id": int(row["prompt_id"]),
                        "task_type": row["task"],
                        "option": s["setting"],
                        "position": position,
                        "rounds": s["rounds"],
                        "drafted": s["draft_n"],
                        "accepted": s["draft_n_accepted"],
                        "predicted_speedup": _finite(s["predicted_speedup"]),
                        "measured_speedup": _finite(s.get("measured_speedup")),
                    }
                )
    return rows


def downgrade() -> None:
    with op.batch_alter_table("option_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_option_results_server_analysis_id"))
        batch_op.drop_index(batch_op.f("ix_option_results_run_id"))
        batch_op.drop_index(batch_op.f("ix_option_results_prompt_id"))
    op.drop_table("option_results")
