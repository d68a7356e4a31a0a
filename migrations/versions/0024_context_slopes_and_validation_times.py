"""A cost profile keeps how its step times grow with the context: measured at a second, longer context
(``long_context_tokens``), the seconds each T_t(k) adds per token of context (``context_slope_s``, one per k)
and a draft model's step (``draft_context_slope_s``). A validation keeps each timed run (``greedy_times_s``,
``speculative_times_s``, in the order they ran), from which the machine's run-to-run noise is measured, and
the share of the machine's CPU time the hypervisor took meanwhile (``steal_share``).

Existing rows keep NULL: a profile measured at one context prices every prompt alike, as before; a
validation from before has its medians only.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 16:10:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: Union[str, None] = "0023"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

PROFILE_COLUMNS = ("long_context_tokens", "context_slope_s", "draft_context_slope_s")
VALIDATION_COLUMNS = ("greedy_times_s", "speculative_times_s", "steal_share")


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN: no table copy (runs and policy sets reference these tables)
    op.add_column("cost_profiles", sa.Column("long_context_tokens", sa.Integer(), nullable=True))
    op.add_column("cost_profiles", sa.Column("context_slope_s", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("cost_profiles", sa.Column("draft_context_slope_s", sa.Float(), nullable=True))
    op.add_column(
        "validation_results", sa.Column("greedy_times_s", sa.JSON(none_as_null=True), nullable=True)
    )
    op.add_column(
        "validation_results", sa.Column("speculative_times_s", sa.JSON(none_as_null=True), nullable=True)
    )
    op.add_column("validation_results", sa.Column("steal_share", sa.Float(), nullable=True))


def downgrade() -> None:
    for column in reversed(VALIDATION_COLUMNS):
        op.execute(f"ALTER TABLE validation_results DROP COLUMN {column}")
    for column in reversed(PROFILE_COLUMNS):
        op.execute(f"ALTER TABLE cost_profiles DROP COLUMN {column}")
