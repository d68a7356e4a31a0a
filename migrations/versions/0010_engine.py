"""engine: the engine that measured and priced a run (transformers | llama.cpp), recorded on the run,
on each cost profile and on each policy set; everything stored before was transformers

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 22:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: Union[str, None] = "0009"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TABLES = ("analysis_runs", "cost_profiles", "policy_sets")


def upgrade() -> None:
    # plain ADD COLUMN with a server default (no table copy on SQLite, where the foreign keys pointing at
    # these tables would block it): the rows already stored become transformers
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("engine", sa.String(length=32), server_default="transformers", nullable=False)
            )


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL) rather than batch table copies. llama.cpp
    # profiles stay: their dtype (the GGUF quantization, e.g. Q4_1) matches no transformers run's, so the
    # code before 0010 never reuses one
    for table in reversed(TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN engine")
