"""Policy sets published from an analysis in llama-server: the set records the analysis
(``policy_sets.server_analysis_id``; ``run_id`` is then NULL) and each task policy the llama-server
drafter setting it speculates with (``task_policies.setting``, e.g. "ngram-mod 16 2-16"; NULL: off, or
a set published from an analysis run, whose decisions are a gamma). The router names the pool of a
decision by its setting.

``server_analysis_id`` is indexed but not a foreign key: adding one to an existing table would copy it in
SQLite, which the tables referencing policy_sets block (the code checks the analysis exists when it
publishes).

Existing rows keep NULL in both.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 00:50:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: Union[str, None] = "0020"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("policy_sets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("server_analysis_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_policy_sets_server_analysis_id", ["server_analysis_id"])
    with op.batch_alter_table("task_policies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("setting", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL): no table copy, which foreign keys block
    op.execute("ALTER TABLE task_policies DROP COLUMN setting")
    op.drop_index("ix_policy_sets_server_analysis_id", table_name="policy_sets")
    op.execute("ALTER TABLE policy_sets DROP COLUMN server_analysis_id")
