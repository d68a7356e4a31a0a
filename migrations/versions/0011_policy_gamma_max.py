"""policy_sets.gamma_max: the largest gamma the published run analysed, so that the router prices and
adapts over the gammas the policies were chosen from (before: a fixed 16); set from each set's run

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 00:30:00
"""

import json
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: Union[str, None] = "0010"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

DEFAULT_GAMMA_MAX = 16  # RunParams' default: a run stored without gamma_max analysed 1..16


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where the foreign keys pointing at policy_sets block it)
    with op.batch_alter_table("policy_sets", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("gamma_max", sa.Integer(), server_default=str(DEFAULT_GAMMA_MAX), nullable=False)
        )
    bind = op.get_bind()
    sets = sa.table(
        "policy_sets",
        sa.column("id", sa.Integer),
        sa.column("run_id", sa.Integer),
        sa.column("gamma_max", sa.Integer),
    )
    runs = sa.table("analysis_runs", sa.column("id", sa.Integer), sa.column("params", sa.JSON))
    rows = bind.execute(sa.select(sets.c.id, runs.c.params).join(runs, runs.c.id == sets.c.run_id)).all()
    for set_id, params in rows:
        params = json.loads(params) if isinstance(params, str) else (params or {})
        gamma_max = int(params.get("gamma_max", DEFAULT_GAMMA_MAX))
        if gamma_max != DEFAULT_GAMMA_MAX:
            bind.execute(sets.update().where(sets.c.id == set_id).values(gamma_max=gamma_max))


def downgrade() -> None:
    op.execute("ALTER TABLE policy_sets DROP COLUMN gamma_max")
