"""analysis_runs.summary: the run's analysis summary (JSON), computed once when the run finishes and
read by the report, publishing and the web pages; None until then (the runs stored before are
summarised, and stored, the first time one is read)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 02:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: Union[str, None] = "0011"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where the foreign keys pointing at analysis_runs block it)
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL) rather than a batch table copy; the
    # summaries are derived data, computed again from the stored counts
    op.execute("ALTER TABLE analysis_runs DROP COLUMN summary")
