"""run chunks: a run's cost profile, slices of its prompts and its validation, each claimed by any
worker (FOR UPDATE SKIP LOCKED on PostgreSQL) and claimed again when its worker's heartbeat stops

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 16:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

import analyzer.db

revision: str = "0009"
down_revision: Union[str, None] = "0008"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # runs queued or running before this revision get their chunks when a worker first claims them
    op.create_table(
        "run_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("prompt_ids", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_at", analyzer.db.UTCDateTime(), nullable=True),
        sa.Column("heartbeat_at", analyzer.db.UTCDateTime(), nullable=True),
        sa.Column("done_at", analyzer.db.UTCDateTime(), nullable=True),
        sa.CheckConstraint("kind IN ('profile', 'measure', 'validate')", name=op.f("ck_run_chunks_kind")),
        sa.CheckConstraint("status IN ('pending', 'claimed', 'done')", name=op.f("ck_run_chunks_status")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["analysis_runs.id"],
            name=op.f("fk_run_chunks_run_id_analysis_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_chunks")),
        sa.UniqueConstraint("run_id", "position", name=op.f("uq_run_chunks_run_id_position")),
    )
    with op.batch_alter_table("run_chunks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_chunks_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_chunks_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_chunks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_chunks_status"))
        batch_op.drop_index(batch_op.f("ix_run_chunks_run_id"))
    op.drop_table("run_chunks")
