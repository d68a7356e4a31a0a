"""What stopped an analysis in llama-server's calibration where it did: ``server_analyses.calibration_why``
says after how many prompts its fit held on prompts it was not fitted on, or that it still missed at the most
asked (None: stored before calibration stopped by its rule).

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-02 08:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: Union[str, None] = "0032"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("calibration_why", sa.Text(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE server_analyses DROP COLUMN calibration_why")
