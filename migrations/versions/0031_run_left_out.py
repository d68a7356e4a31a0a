"""What an analysis run could not take: ``analysis_runs.left_out`` holds the prompts left out because the
engine's context cannot hold their tokens and the new tokens (analyzer/analysis/runs.py writes it; None where
the run took every prompt).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-02 05:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: Union[str, None] = "0030"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("left_out", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE analysis_runs DROP COLUMN left_out")
