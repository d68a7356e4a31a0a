"""devices, dtypes and batch sizes: cost profiles keyed by dtype and batch size with the measured
machinery overhead, the profiles a run uses per batch size, the resolved dtype of a run, replay
fidelity per prompt and per validation, per-batch S(g) curves on published policies

Existing cost profiles become float32 at batch 1 and stay linked to their runs at batch 1.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 10:30:00
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: Union[str, None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # plain ADD COLUMN (no table copy on SQLite, where analysis_runs' foreign key would block it)
    with op.batch_alter_table("cost_profiles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("dtype", sa.String(length=16), server_default="float32", nullable=False)
        )
        batch_op.add_column(sa.Column("batch_size", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("round_overhead_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("decode_overhead_s", sa.Float(), nullable=True))
    op.create_table(
        "run_cost_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("cost_profile_id", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cost_profile_id"],
            ["cost_profiles.id"],
            name=op.f("fk_run_cost_profiles_cost_profile_id_cost_profiles"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["analysis_runs.id"],
            name=op.f("fk_run_cost_profiles_run_id_analysis_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_cost_profiles")),
        sa.UniqueConstraint("run_id", "batch_size", name=op.f("uq_run_cost_profiles_run_id_batch_size")),
    )
    with op.batch_alter_table("run_cost_profiles", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_run_cost_profiles_cost_profile_id"), ["cost_profile_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_run_cost_profiles_run_id"), ["run_id"], unique=False)
    # every run that has a profile keeps it, as its batch-1 profile
    op.execute(
        "INSERT INTO run_cost_profiles (run_id, cost_profile_id, batch_size) "
        "SELECT id, cost_profile_id, 1 FROM analysis_runs WHERE cost_profile_id IS NOT NULL"
    )
    with op.batch_alter_table("analysis_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dtype", sa.String(length=16), nullable=True))
    with op.batch_alter_table("prompt_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replay_mismatches", sa.Integer(), nullable=True))
    with op.batch_alter_table("validation_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replayed_rounds", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("replay_identical", sa.Boolean(), nullable=True))
    with op.batch_alter_table("task_policies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("speedup_curves_by_batch", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL) rather than batch table copies, which
    # the foreign keys pointing at these tables would block on SQLite once they hold rows
    for table, column in (
        ("task_policies", "speedup_curves_by_batch"),
        ("validation_results", "replay_identical"),
        ("validation_results", "replayed_rounds"),
        ("prompt_results", "replay_mismatches"),
        ("analysis_runs", "dtype"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    with op.batch_alter_table("run_cost_profiles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_cost_profiles_run_id"))
        batch_op.drop_index(batch_op.f("ix_run_cost_profiles_cost_profile_id"))
    op.drop_table("run_cost_profiles")
    # profiles measured in another dtype or at another batch size have no meaning before 0003
    op.execute(
        "UPDATE analysis_runs SET cost_profile_id = NULL WHERE cost_profile_id IN "
        "(SELECT id FROM cost_profiles WHERE dtype <> 'float32' OR batch_size <> 1)"
    )
    op.execute("DELETE FROM cost_profiles WHERE dtype <> 'float32' OR batch_size <> 1")
    for column in ("decode_overhead_s", "round_overhead_s", "batch_size", "dtype"):
        op.execute(f"ALTER TABLE cost_profiles DROP COLUMN {column}")
