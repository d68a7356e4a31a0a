"""Per prompt and drafting option, the rows every engine's analysis stores in one table
(:class:`analyzer.orm.OptionResult`): a run's gammas and a llama-server analysis' settings alike.

An analysis writes its rows where it writes its findings: a run where its summary is stored
(:func:`analyzer.advice.summary_store.store_summary`: on finishing, repricing, relabelling and validating),
a llama-server analysis where it is stored (:func:`analyzer.analysis.server_store.store_server_analysis`).
Both kinds are read back by :func:`prompt_options`, which ``specroute analyze --json`` prints per prompt, in
one shape: the option's label, the replay's rounds, drafted and accepted counts, the predicted speedup and,
where validation ran that option on that prompt, the measured one.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from analyzer.orm import GammaCount, OptionResult, PromptResult, ValidationResult


def gamma_option(gamma: int) -> str:
    """A run's option at lookahead ``gamma``, as its rows are labelled."""
    return f"gamma {gamma}"


@dataclass(frozen=True)
class OptionRow:
    """One prompt under one option (a row of ``option_results`` without its analysis)."""

    prompt_id: int
    task: str | None
    option: str
    position: int
    rounds: int
    drafted: int
    accepted: int
    predicted_speedup: float | None
    measured_speedup: float | None

    def as_json(self) -> dict[str, Any]:
        """The row as ``--json`` prints it per prompt (``label`` for the option; the prompt's id and task are
        the prompt's)."""
        data = asdict(self)
        for key in ("prompt_id", "task", "position"):
            del data[key]
        for key in ("predicted_speedup", "measured_speedup"):  # JSON has no NaN: a speedup not finite is null
            data[key] = _finite(data[key])
        return {"label": data.pop("option"), **data}


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def replace_options(
    session: Session,
    rows: Iterable[OptionRow],
    *,
    run_id: int | None = None,
    server_analysis_id: int | None = None,
) -> int:
    """Store ``rows`` as the options of run ``run_id`` or of llama-server analysis ``server_analysis_id`` (one of
    them), in place of any stored before; the caller commits. Returns how many rows it stored."""
    if (run_id is None) == (server_analysis_id is None):
        raise ValueError("name one analysis: run_id or server_analysis_id")
    owner = (
        OptionResult.run_id == run_id
        if run_id is not None
        else OptionResult.server_analysis_id == server_analysis_id
    )
    session.execute(delete(OptionResult).where(owner))
    values = [
        {
            "run_id": run_id,
            "server_analysis_id": server_analysis_id,
            "prompt_id": row.prompt_id,
            "task_type": row.task,
            "option": row.option,
            "position": row.position,
            "rounds": row.rounds,
            "drafted": row.drafted,
            "accepted": row.accepted,
            "predicted_speedup": _finite(row.predicted_speedup),
            "measured_speedup": _finite(row.measured_speedup),
        }
        for row in rows
    ]
    if values:
        session.execute(insert(OptionResult), values)
    return len(values)


def run_option_rows(session: Session, run_id: int, prompts: Sequence[Any]) -> list[OptionRow]:
    """A run's rows: per measured prompt and gamma its stored counts, the summary's predicted speedup
    (``prompts``: the summary's :class:`analyzer.advice.summary.PromptSummary` rows) and the validation's
    measured speedup at that gamma."""
    counts = session.execute(
        select(
            PromptResult.prompt_id,
            GammaCount.gamma,
            GammaCount.rounds,
            GammaCount.drafted,
            GammaCount.accepted,
        )
        .join(GammaCount, GammaCount.result_id == PromptResult.id)
        .where(PromptResult.run_id == run_id)
    ).all()
    measured = {
        (prompt_id, gamma): speedup
        for prompt_id, gamma, speedup in session.execute(
            select(
                ValidationResult.prompt_id, ValidationResult.gamma, ValidationResult.measured_speedup
            ).where(ValidationResult.run_id == run_id)
        )
    }
    found = {p.prompt_id: p for p in prompts}
    rows = []
    for prompt_id, gamma, rounds, drafted, accepted in counts:
        prompt = found.get(prompt_id)
        if prompt is None:
            continue
        curve = prompt.speedup_curve
        rows.append(
            OptionRow(
                prompt_id,
                prompt.task,
                gamma_option(gamma),
                gamma,
                rounds,
                drafted,
                accepted,
                curve[gamma - 1] if gamma <= len(curve) else None,
                measured.get((prompt_id, gamma)),
            )
        )
    return sorted(rows, key=lambda r: (found[r.prompt_id].position, r.position))


def server_option_rows(prompts: Sequence[Mapping[str, Any]]) -> list[OptionRow]:
    """A llama-server analysis' rows from its stored prompt rows (``ServerAnalysisRecord.prompts``): per prompt
    and setting, in the analysis' order of settings; the measured speedup is the one the advice's prediction is
    compared with (``advised_speedup``: the first pass for a drafter whose state carries across requests; an
    analysis stored without it has only the mean over every pass)."""
    return [
        OptionRow(
            int(row["prompt_id"]),
            row["task"],
            s["setting"],
            position,
            s["rounds"],
            s["draft_n"],
            s["draft_n_accepted"],
            s["predicted_speedup"],
            s["advised_speedup"] if "advised_speedup" in s else s.get("measured_speedup"),
        )
        for row in prompts
        for position, s in enumerate(row["settings"], start=1)
    ]


def prompt_options(
    session: Session, *, run_id: int | None = None, server_analysis_id: int | None = None
) -> dict[int, list[OptionRow]]:
    """The stored rows of one analysis (run ``run_id`` or llama-server analysis ``server_analysis_id``) by
    prompt id, each prompt's in the analysis' order of options."""
    owner = (
        OptionResult.run_id == run_id
        if run_id is not None
        else OptionResult.server_analysis_id == server_analysis_id
    )
    return by_prompt(
        OptionRow(
            r.prompt_id,
            r.task_type,
            r.option,
            r.position,
            r.rounds,
            r.drafted,
            r.accepted,
            r.predicted_speedup,
            r.measured_speedup,
        )  # fmt: skip
        for r in session.scalars(select(OptionResult).where(owner).order_by(OptionResult.id))
    )


def by_prompt(rows: Iterable[OptionRow]) -> dict[int, list[OptionRow]]:
    """``rows`` by prompt id (prompts in the order they come), each prompt's in the order of its options."""
    grouped: dict[int, list[OptionRow]] = {}
    for row in rows:
        grouped.setdefault(row.prompt_id, []).append(row)
    for options in grouped.values():
        options.sort(key=lambda row: row.position)
    return grouped


OPTION_CSV_COLUMNS = [
    "prompt_id", "task", "option", "rounds", "drafted", "accepted", "predicted_speedup", "measured_speedup",
]  # fmt: skip


def options_csv(prompts: Sequence[Mapping[str, Any]]) -> str:
    """One CSV row per prompt and option from an analysis' JSON prompt rows (each with ``prompt_id``, ``task``
    and ``options`` as :meth:`OptionRow.as_json` gives them): the same columns for every engine."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(OPTION_CSV_COLUMNS)
    for row in prompts:
        for option in row["options"]:
            writer.writerow(
                [row["prompt_id"], row["task"] or "", option["label"], option["rounds"], option["drafted"]]
                + [option["accepted"], _cell(option["predicted_speedup"]), _cell(option["measured_speedup"])]
            )
    return out.getvalue()


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
