"""cost profile quality: the spread of each point's repeats, a verdict (clean | remeasured | noisy)
and notes on the interference seen; profiles from before stay unjudged (NULL)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 10:20:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ("target_forward_spread", "quality", "quality_notes")


def upgrade() -> None:
    # plain ADD COLUMN: no table copy, which analysis_runs' foreign key would block on SQLite
    with op.batch_alter_table("cost_profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target_forward_spread", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("quality", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("quality_notes", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE cost_profiles DROP COLUMN {column}")
