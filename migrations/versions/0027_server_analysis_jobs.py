"""Analyses in llama-server as queued work: ``server_analysis_jobs`` holds each one's prompt set and parameters,
its status (queued, running, done, failed, cancelled), the worker holding it and its heartbeat, its progress,
the plain generations made so far (a resume on the same machine keeps them), why it failed (a message and a
code) and the analysis it stored (analyzer/orm.py, ServerAnalysisJob; analyzer/analysis/server_jobs.py).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29 02:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: Union[str, None] = "0026"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "server_analysis_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("prompt_set_id", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("progress", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("generated", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("analysis_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed', 'cancelled')",
            name=op.f("ck_server_analysis_jobs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["prompt_set_id"],
            ["prompt_sets.id"],
            name=op.f("fk_server_analysis_jobs_prompt_set_id_prompt_sets"),
        ),
        sa.ForeignKeyConstraint(
            ["analysis_id"],
            ["server_analyses.id"],
            name=op.f("fk_server_analysis_jobs_analysis_id_server_analyses"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_analysis_jobs")),
    )
    with op.batch_alter_table("server_analysis_jobs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_server_analysis_jobs_prompt_set_id"), ["prompt_set_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_server_analysis_jobs_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("server_analysis_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_server_analysis_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_server_analysis_jobs_prompt_set_id"))
    op.drop_table("server_analysis_jobs")
