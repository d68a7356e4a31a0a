"""A cost profile keeps how its T_t(k) were scaled to the target's own forwards in real generation
(``generate_ratio``: for each k seen there, their median over the timed T_t(k) at the same context). Timed one
k after another, the plain step came out 4.5% dearer than inside ``generate()`` on a 2-core Xeon, which
over-predicted gamma 6 by 3.6-4.5% (benchmarks/README.md).

Existing rows keep NULL: their T_t(k) were timed alone, as before.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 20:05:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: Union[str, None] = "0024"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN: no table copy (runs and policy sets reference this table)
    op.add_column("cost_profiles", sa.Column("generate_ratio", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE cost_profiles DROP COLUMN generate_ratio")
