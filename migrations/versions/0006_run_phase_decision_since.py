"""run phase and decision age: what an analysis worker is doing now (shown by the web UI while it
loads models and profiles), and since when a task's online decision has been in force

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 11:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

import analyzer.db

revision: str = "0006"
down_revision: Union[str, None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN: no table copy, which the foreign keys pointing at these tables would block
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(length=300), nullable=True))
    with op.batch_alter_table("task_estimates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("decision_since", analyzer.db.UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE task_estimates DROP COLUMN decision_since")
    op.execute("ALTER TABLE analysis_runs DROP COLUMN phase")
