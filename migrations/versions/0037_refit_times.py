"""Each llama-server analysis' prompt rows carry their times under the step costs' leave-one-prompt-out fits:
``refit_plain_ms`` per prompt and ``refit_ms`` per setting, each family's cost its ``refits``
(analyzer/pricing/server_cost.py), and each task's curve the ``fit_errors`` they make. Their spread is the fit's
own uncertainty, which the decision counts (analyzer/pricing/option_curve.py). An analysis stored before has
none: the upgrade gives its rows, costs and curves empty lists, so its intervals hold the prompts' spread alone,
as they did; the downgrade removes them.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-03 12:00:00
"""

import copy
from typing import Any, Callable, Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0037"
down_revision: Union[str, None] = "0036"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_ANALYSES = sa.table(
    "server_analyses",
    sa.column("id", sa.Integer()),
    sa.column("prompts", sa.JSON()),
    sa.column("cost", sa.JSON()),
    sa.column("tasks", sa.JSON()),
)

Change = Callable[[dict[str, Any]], Any]


def _rewrite(change_row: Change, change_cost: Change, change_curve: Change) -> None:
    """Each analysis' prompt rows, family costs and task curves through the three changes, written back where
    they changed (in the migration's transaction)."""
    connection = op.get_bind()
    for analysis_id, prompts, cost, tasks in connection.execute(
        sa.select(_ANALYSES.c.id, _ANALYSES.c.prompts, _ANALYSES.c.cost, _ANALYSES.c.tasks)
    ).all():
        new_prompts, new_cost, new_tasks = copy.deepcopy(prompts), copy.deepcopy(cost), copy.deepcopy(tasks)
        for row in new_prompts or []:
            change_row(row)
        for family_cost in (new_cost or {}).values():
            change_cost(family_cost)
        for task in new_tasks or []:
            if task.get("curve"):
                change_curve(task["curve"])
        if (new_prompts, new_cost, new_tasks) != (prompts, cost, tasks):
            connection.execute(
                _ANALYSES.update()
                .where(_ANALYSES.c.id == analysis_id)
                .values(prompts=new_prompts, cost=new_cost, tasks=new_tasks)
            )


def _add(row: dict[str, Any]) -> None:
    row.setdefault("refit_plain_ms", [])
    for setting in row.get("settings") or []:
        setting.setdefault("refit_ms", [])


def _remove(row: dict[str, Any]) -> None:
    row.pop("refit_plain_ms", None)
    for setting in row.get("settings") or []:
        setting.pop("refit_ms", None)


def upgrade() -> None:
    _rewrite(
        _add, lambda cost: cost.setdefault("refits", []), lambda curve: curve.setdefault("fit_errors", [])
    )


def downgrade() -> None:
    _rewrite(_remove, lambda cost: cost.pop("refits", None), lambda curve: curve.pop("fit_errors", None))
