"""Analyses in llama-server: one row per analysis of a prompt set in llama.cpp's own server, with the
drafter settings compared, the step costs fitted from the server's timings, and the per-prompt and
per-task outcomes as JSON (analyzer/orm.py, ServerAnalysisRecord).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 21:40:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: Union[str, None] = "0019"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "server_analyses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("prompt_set_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("draft_model", sa.String(length=500), nullable=True),
        sa.Column("server_build", sa.String(length=100), nullable=False),
        sa.Column("machine", sa.String(length=300), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("n_ctx", sa.Integer(), nullable=False),
        sa.Column("n_predict", sa.Integer(), nullable=False),
        sa.Column("drafters", sa.JSON(), nullable=False),
        sa.Column("cost", sa.JSON(), nullable=False),
        sa.Column("prompts", sa.JSON(), nullable=False),
        sa.Column("tasks", sa.JSON(), nullable=False),
        sa.Column("validation", sa.JSON(), nullable=False),
        sa.Column("calibration_prompts", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("validation_seconds", sa.Float(), nullable=False),
        sa.Column("plain_generation_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint(
            "threads >= 1 AND n_ctx >= 1 AND n_predict >= 1", name=op.f("ck_server_analyses_setup_positive")
        ),
        sa.ForeignKeyConstraint(
            ["prompt_set_id"], ["prompt_sets.id"], name=op.f("fk_server_analyses_prompt_set_id_prompt_sets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_analyses")),
    )
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_server_analyses_prompt_set_id"), ["prompt_set_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_server_analyses_prompt_set_id"))
    op.drop_table("server_analyses")
