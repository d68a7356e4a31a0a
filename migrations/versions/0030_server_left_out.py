"""What an analysis in llama-server could not take: ``server_analyses.left_out`` holds the settings left out
because their servers disagreed with their replays (label: why) and the prompts left out because the context
cannot hold them (analyzer/analysis/server_store.py writes it; None where the analysis took everything).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-02 02:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: Union[str, None] = "0029"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("left_out", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_analyses", schema=None) as batch_op:
        batch_op.drop_column("left_out")
