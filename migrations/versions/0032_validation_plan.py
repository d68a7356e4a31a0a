"""Which held-out prompts an analysis in llama-server validated: ``server_analyses.validation_plan`` holds the
sample (how many of how many, chosen across tasks and predicted speedups), its budget and why (None: not
validated, or stored before validation sampled).

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-02 06:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: Union[str, None] = "0031"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("validation_plan", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE server_analyses DROP COLUMN validation_plan")
