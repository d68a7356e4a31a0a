"""What a transformers or llama.cpp run's validation took and what stopped it: ``analysis_runs.validation_plan``
(validated, held_out, budget_s, spent_s, passes, target, half_width, stopped, why; None: not validated, or
validated before validation stopped by its rule).

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-02 12:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: Union[str, None] = "0033"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("validation_plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE analysis_runs DROP COLUMN validation_plan")
