"""cost_profiles.source and engine_version: where a profile's step times come from ("measured" by an
analysis, or "imported" from an engine's own benchmark with `specroute costs import`) and the version of
the engine that timed it; analysis_runs.repriced_from_run_id: a run whose stored acceptance (copied from
that run) is priced with another profile, without measuring again (`specroute reprice`).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 07:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: Union[str, None] = "0014"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where foreign keys pointing at these tables block it)
    with op.batch_alter_table("cost_profiles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("source", sa.String(length=16), nullable=False, server_default="measured")
        )
        batch_op.add_column(sa.Column("engine_version", sa.String(length=64), nullable=True))
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("repriced_from_run_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL)
    op.execute("ALTER TABLE analysis_runs DROP COLUMN repriced_from_run_id")
    op.execute("ALTER TABLE cost_profiles DROP COLUMN engine_version")
    op.execute("ALTER TABLE cost_profiles DROP COLUMN source")
