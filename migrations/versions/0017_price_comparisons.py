"""analysis_runs.price_comparisons: a finished run's acceptance priced on each other stored cost
profile of its pair, by profile id, as the report's side-by-side comparison shows it. Each row is
computed once (a stored profile never changes) instead of on every view of the report, and dropped
whenever the run's summary is computed anew.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 10:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: Union[str, None] = "0016"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("price_comparisons", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE analysis_runs DROP COLUMN price_comparisons")
