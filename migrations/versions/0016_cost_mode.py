"""cost_profiles.cost_mode: how a measured profile's steps were timed, "eager" (transformers' own
forwards, as generate() runs them) or "cuda-graphs" (replayed CUDA graphs over a static KV cache, as
serving engines run them); NULL for an imported profile, timed in its engine's own way, and for a
llama.cpp one, which times its own steps. Every transformers profile measured before this revision was
eager.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 10:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: Union[str, None] = "0015"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at this table block it)
    with op.batch_alter_table("cost_profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cost_mode", sa.String(length=16), nullable=True))
    op.execute(
        "UPDATE cost_profiles SET cost_mode = 'eager' WHERE source = 'measured' AND engine = 'transformers'"
    )


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE cost_profiles DROP COLUMN cost_mode")
