"""policy intervals: the bootstrap interval of each published policy's expected speedup (and its
lower end at every profiled batch size) and what decided it (the task, or the workload for a task with too
few prompts), with the reason in words

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 10:40:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ("speedup_low", "speedup_high", "speedup_lows_by_batch", "decision_basis", "decision_reason")


def upgrade() -> None:
    # plain ADD COLUMN: no table copy, which task_estimates' and feedback's foreign keys would block
    with op.batch_alter_table("task_policies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("speedup_low", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("speedup_high", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("speedup_lows_by_batch", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("decision_basis", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("decision_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE task_policies DROP COLUMN {column}")
