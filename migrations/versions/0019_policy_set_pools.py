"""The pools a policy set routes to, published with it: the deployment named for each decision ("off",
"k<gamma>") as SPECROUTE_ROUTER_POOLS gave them when the set was published, so that the router's
decisions name the pools the publisher meant, whatever the serving process's own setting says.

Existing sets keep NULL: the router names their pools from its own SPECROUTE_ROUTER_POOLS, as it did.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 19:45:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: Union[str, None] = "0018"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("policy_sets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pools", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL): no table copy, which foreign keys block
    op.execute("ALTER TABLE policy_sets DROP COLUMN pools")
