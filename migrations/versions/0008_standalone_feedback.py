"""feedback that stands alone: a route_id names its policy set version and task (longer route_id
columns), and the online estimate moves the published S(g) curve (no burstiness factor)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 16:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: Union[str, None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("route_decisions", schema=None) as batch_op:
        batch_op.alter_column(
            "route_id",
            existing_type=sa.String(length=36),
            type_=sa.String(length=128),
            existing_nullable=False,
        )
    with op.batch_alter_table("feedback_events", schema=None) as batch_op:
        batch_op.alter_column(
            "route_id",
            existing_type=sa.String(length=36),
            type_=sa.String(length=128),
            existing_nullable=True,
        )
    with op.batch_alter_table("task_estimates", schema=None) as batch_op:
        batch_op.drop_column("burstiness")


def downgrade() -> None:
    # route_ids longer than 36 characters do not fit revision 0007's column (nor mean anything to its code)
    op.execute("DELETE FROM route_decisions WHERE length(route_id) > 36")
    op.execute("UPDATE feedback_events SET route_id = NULL WHERE length(route_id) > 36")
    with op.batch_alter_table("task_estimates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("burstiness", sa.Float(), nullable=False, server_default="1.0"))
    with op.batch_alter_table("feedback_events", schema=None) as batch_op:
        batch_op.alter_column(
            "route_id",
            existing_type=sa.String(length=128),
            type_=sa.String(length=36),
            existing_nullable=True,
        )
    with op.batch_alter_table("route_decisions", schema=None) as batch_op:
        batch_op.alter_column(
            "route_id",
            existing_type=sa.String(length=128),
            type_=sa.String(length=36),
            existing_nullable=False,
        )
