"""Feedback adapts a policy set published from a llama-server analysis.

- ``task_policies.option_curve``: the policy's curve over the analysis' settings (per setting its speedup and
  bootstrap interval, the rule's code and basis), the prior the online estimate moves;
- ``policy_sets.plain_cost``: the analysis' plain step cost (``step_ms``, ``per_context_ms``), which prices a
  pool's request as plain decoding would have run it;
- ``task_estimates.setting``: the llama-server setting a task's estimate has in force (None: off), and
  ``task_estimates.options``: per setting the decayed plain and served time of the feedback it had.

Existing rows keep NULL: sets published before take no feedback (republish them), run sets have no setting.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 02:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: Union[str, None] = "0025"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = (
    ("task_policies", "option_curve"),
    ("policy_sets", "plain_cost"),
    ("task_estimates", "setting"),
    ("task_estimates", "options"),
)


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN: no table copy (estimates and decisions reference these tables)
    op.add_column("task_policies", sa.Column("option_curve", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("policy_sets", sa.Column("plain_cost", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("task_estimates", sa.Column("setting", sa.String(64), nullable=True))
    op.add_column("task_estimates", sa.Column("options", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    for table, column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
