"""One queued or running background job per key, kept by the database: a partial unique index on
``background_jobs.key`` over the jobs queued or running. Two server processes that queue the same key at once
(on PostgreSQL, where reading the active jobs locks nothing) then get one job; the other is refused as if it
had seen the first. Where that has already happened, every active job of a key but its oldest is failed first.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-02 15:00:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: Union[str, None] = "0034"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ACTIVE = "status IN ('queued', 'running')"


def upgrade() -> None:
    op.execute(
        "UPDATE background_jobs SET status = 'failed', "
        "error = 'queued twice under its key at once; the older job runs' "
        f"WHERE {ACTIVE} AND id NOT IN "
        f"(SELECT MIN(id) FROM background_jobs WHERE {ACTIVE} GROUP BY key)"
    )
    op.create_index(
        "uq_background_jobs_active_key",
        "background_jobs",
        ["key"],
        unique=True,
        sqlite_where=sa.text(ACTIVE),
        postgresql_where=sa.text(ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_background_jobs_active_key", table_name="background_jobs")
