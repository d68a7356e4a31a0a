"""validation_results.others_cpu: the share of the machine's CPU other processes used while a prompt
was validated (None where /proc/stat cannot be read). A validation measured while others used more
than the interference bar is marked in the report and kept out of its predicted-vs-measured error.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 07:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: Union[str, None] = "0013"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite)
    with op.batch_alter_table("validation_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("others_cpu", sa.Float(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE validation_results DROP COLUMN others_cpu")
