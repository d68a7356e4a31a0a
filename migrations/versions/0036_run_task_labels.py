"""The task labels a run's unlabelled prompts get, given when the run is created: ``analysis_runs.task_labels``,
``{"version": classifier version id, "tasks": {prompt id: task}}`` (None: no classifier, or every prompt
labelled). Each result takes its prompt's label as it is stored, so the run's summary is computed once, with
its tasks, when the run finishes.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-03 08:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: Union[str, None] = "0035"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.add_column("analysis_runs", sa.Column("task_labels", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ and PostgreSQL drop a column in place; batch mode would copy the table, which other tables
    # reference
    op.execute("ALTER TABLE analysis_runs DROP COLUMN task_labels")
