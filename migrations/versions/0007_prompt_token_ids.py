"""token ids stored with each result: the prompt's token ids as the target saw them and each output
token's text (so the report's drill-down needs no tokenizer), and the EOS ids of the run (the n-gram
walk cuts proposals before them)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 15:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: Union[str, None] = "0006"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN: no table copy, which the foreign keys pointing at these tables would block;
    # results from before stay NULL (the drill-down says they were measured before ids were stored)
    with op.batch_alter_table("prompt_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prompt_token_ids", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("output_token_texts", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("eos_token_ids", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE analysis_runs DROP COLUMN eos_token_ids")
    op.execute("ALTER TABLE prompt_results DROP COLUMN output_token_texts")
    op.execute("ALTER TABLE prompt_results DROP COLUMN prompt_token_ids")
