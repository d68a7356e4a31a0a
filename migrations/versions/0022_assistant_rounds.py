"""Each prompt result of a transformers run with a draft model keeps the rounds of transformers' assisted
generation as people run it (its defaults: 20 assistant tokens, the "constant" schedule, confidence
threshold 0.4 moved by its ROC rule), replayed exactly: ``prompt_results.assistant_rounds``, a JSON list
of [drafted, accepted] per round (analyzer/measuring/assistant_defaults.py). The report prices them
beside the fixed-gamma curve, and ``specroute export --for transformers`` exports whichever is faster.

Existing rows keep NULL (nothing replayed: the report shows no price for the defaults).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 03:40:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: Union[str, None] = "0021"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN: no table copy (gamma_counts and validation_results reference prompt_results)
    op.add_column("prompt_results", sa.Column("assistant_rounds", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE prompt_results DROP COLUMN assistant_rounds")
