"""An analysis in llama-server keeps the machine's run-to-run noise it measured (``noise``: pairs of identical
plain runs, the floor, one run's error, steal and clock), why its advice is withheld where it is
(``advice_withheld``: a step-cost fit that missed its bound on prompts it was not fitted on, twice, or a
machine too noisy to time advice on), the passes validation made (``validation_repeats``) and the three
routing numbers (``routing``: best static setting, routing by task, per-prompt oracle, with intervals).

Existing rows keep NULL (no noise measured, advice not withheld, one validation pass, no routing numbers).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 13:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: Union[str, None] = "0022"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ("noise", "advice_withheld", "validation_repeats", "routing")


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN: no table copy (policy sets reference server_analyses)
    op.add_column("server_analyses", sa.Column("noise", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("server_analyses", sa.Column("advice_withheld", sa.Text(), nullable=True))
    op.add_column("server_analyses", sa.Column("validation_repeats", sa.Integer(), nullable=True))
    op.add_column("server_analyses", sa.Column("routing", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.execute(f"ALTER TABLE server_analyses DROP COLUMN {column}")
