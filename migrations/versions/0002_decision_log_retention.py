"""decision log retention: index route_decisions.created_at (specroute decisions prune);
task_estimates running totals as 64-bit integers

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 04:40:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

TOTALS = ("events", "total_rounds", "total_drafted", "total_accepted")


revision: str = "0002"
down_revision: Union[str, None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("route_decisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_route_decisions_created_at"), ["created_at"], unique=False)
    with op.batch_alter_table("task_estimates", schema=None) as batch_op:
        for name in TOTALS:
            batch_op.alter_column(
                name, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False
            )


def downgrade() -> None:
    with op.batch_alter_table("task_estimates", schema=None) as batch_op:
        for name in TOTALS:
            batch_op.alter_column(
                name, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False
            )
    with op.batch_alter_table("route_decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_route_decisions_created_at"))
