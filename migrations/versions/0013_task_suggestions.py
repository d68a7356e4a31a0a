"""prompts.suggested_task, suggested_confidence, suggested_by: the teacher's suggested task for an
unlabelled prompt, its confidence, and where the suggestion came from (teacher version, what it was
trained on, when). Suggestions are never labels: a person accepts them on the prompt set page, and
training uses them (weighted by confidence) only when told to adapt to the set.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 03:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: Union[str, None] = "0012"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ("suggested_task", "suggested_confidence", "suggested_by")


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where the foreign keys pointing at prompts block it)
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("suggested_task", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("suggested_confidence", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("suggested_by", sa.String(length=300), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL); suggestions are derived data
    for column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE prompts DROP COLUMN {column}")
