"""The plots of an analysis' report: which charts of the SVG chart kit (webui/svg_chart.py) show what of
a run's report or of a llama-server analysis, by name, as the report page and the self-contained HTML
export show them."""

from __future__ import annotations

from webui.svg_chart import Background, bar_chart, per_series_chart, scatter


def report_plots(report: dict) -> dict[str, str]:
    """Every plot of a report, by name: acceptance, histograms, speedup, entropy, validation."""
    tasks = {name: t for name, t in report["tasks"].items()}
    names = list(tasks)
    plots = {
        "acceptance": bar_chart(
            "Acceptance rate alpha by task (mean ± std over prompts)",
            names,
            [tasks[n]["alpha_mean"] for n in names],
            errors=[tasks[n]["alpha_std"] for n in names],
            y_label="alpha",
            y_max=1.0,
            css_class="acceptance",
        ),
    }
    histograms = _histograms_plot(tasks)
    if histograms:
        plots["histograms"] = histograms
    plots.update(_speedup_plots(report, tasks))
    entropy = _entropy_plot(report)
    if entropy:
        plots["entropy"] = entropy
    validation = _validation_plot(report)
    if validation:
        plots["validation"] = validation
    return plots


def _histograms_plot(tasks: dict[str, dict]) -> str | None:
    """Each task's share of rounds by the number of drafts accepted (None when no task has rounds)."""
    histogram_series = {}
    for name, task in tasks.items():
        counts = task.get("histogram") or []
        total = sum(counts)
        if total:
            histogram_series[name] = [c / total for c in counts]
    if not histogram_series:
        return None
    longest = max(len(v) for v in histogram_series.values())
    return per_series_chart(
        "Accepted drafts per round at each task's best gamma (share of rounds)",
        list(range(longest)),
        {k: v + [None] * (longest - len(v)) for k, v in histogram_series.items()},
        y_label="share of rounds",
        x_label="accepted drafts in a round",
        css_class="histograms",
    )


def _speedup_plots(report: dict, tasks: dict[str, dict]) -> dict[str, str]:
    """The predicted speedup curves by task: ``speedup`` at the smallest batch size, then
    ``speedup_b{N}`` at each larger profiled batch size N, each against the whole workload in grey."""
    names = list(tasks)
    plots = {}
    curves = {n: tasks[n].get("speedup_curve") or [] for n in names}
    longest = max((len(c) for c in curves.values()), default=0)
    if longest:
        workload = report.get("workload") or {}
        plots["speedup"] = per_series_chart(
            "Predicted speedup S(g) by task"
            + (
                f" at batch size {min(int(b) for b in report['cost_profiles'])}"
                if len(report.get("cost_profiles") or {}) > 1
                else ""
            )
            + " (circle: best gamma)",
            list(range(1, longest + 1)),
            {n: list(c) + [None] * (longest - len(c)) for n, c in curves.items()},
            marks={n: tasks[n]["best_gamma"] for n in names if tasks[n].get("best_gamma")},
            reference=1.0,
            background=Background(workload.get("speedup_curve"), "whole workload"),
            y_label="speedup",
            x_label="gamma (lookahead)",
            css_class="speedup",
        )
    batches = sorted(int(b) for b in (report.get("cost_profiles") or {}))
    for batch in batches[1:] if len(batches) > 1 else []:  # the first is the plot above
        at_batch = {n: (tasks[n].get("by_batch") or {}).get(str(batch)) or {} for n in names}
        batch_curves = {n: at_batch[n].get("speedup_curve") or [] for n in names}
        width = max((len(c) for c in batch_curves.values()), default=0)
        if width:
            workload_at_batch = ((report.get("workload") or {}).get("by_batch") or {}).get(str(batch), {})
            plots[f"speedup_b{batch}"] = per_series_chart(
                f"Predicted speedup S(g) by task at batch size {batch} (circle: best gamma there)",
                list(range(1, width + 1)),
                {n: list(c) + [None] * (width - len(c)) for n, c in batch_curves.items()},
                marks={n: at_batch[n]["best_gamma"] for n in names if at_batch[n].get("best_gamma")},
                reference=1.0,
                background=Background(workload_at_batch.get("speedup_curve"), "whole workload"),
                y_label="speedup",
                x_label="gamma (lookahead)",
                css_class="speedup",
            )
    return plots


def _entropy_plot(report: dict) -> str | None:
    """The probability of a long accepted run by the entropy of the previous token (None without data)."""
    table = report.get("entropy_table")
    if not (table and any(table["positions"])):
        return None
    edges = table["edges"]
    labels = [
        f"{edges[i]:g}–{edges[i + 1]:g}" if edges[i + 1] is not None else f"≥{edges[i]:g}"
        for i in range(len(edges) - 1)
    ]
    return bar_chart(
        f"P(accepted run ≥ {table['run_length']} | entropy of the previous token)",
        labels,
        table["probability"],
        y_label="probability",
        x_label="target entropy (nats)",
        y_max=1.0,
        css_class="entropy",
    )


def _validation_plot(report: dict) -> str | None:
    """Predicted against measured speedup of the validated prompts (None when none is counted)."""
    validation = report.get("validation") or []
    # only what the validation table counts: the disturbed ones (timed while other processes used the
    # machine) are left out there, and numbered as the Prompts table numbers prompts
    counted = [v for v in validation if not v.get("disturbed")]
    number = {p["prompt_id"]: p["position"] + 1 for p in report.get("prompts") or []}
    left_out = len(validation) - len(counted)
    if not counted:
        return None
    return scatter(
        "Predicted vs measured speedup (validated prompts)",
        [
            (
                v["predicted_speedup"],
                v["measured_speedup"],
                f"prompt {number.get(v['prompt_id'], v['prompt_id'])} g={v['gamma']}",
            )
            for v in counted
        ],
        x_label="predicted speedup",
        y_label="measured speedup",
        note="dashed: measured = predicted"
        + (f"; {left_out} timed on a busy machine left out, as in the table" if left_out else ""),
        css_class="validation",
    )


def server_plots(prompts: list[dict]) -> dict[str, str]:
    """Every plot of a llama-server analysis from its stored prompt rows (``ServerAnalysisRecord.prompts``), by
    name: ``validation``, predicted against measured speedup per validated prompt and setting, where the
    server's draft counts equalled the replay's (calibration prompts left out); none without such prompts."""
    points = [
        (
            s.get("validated_prediction") or s["predicted_speedup"],
            s["measured_speedup"],
            f"{s['setting']} · prompt {p['prompt_id']}",
        )
        for p in prompts
        for s in p["settings"]
        if s["measured_speedup"] is not None and not s["calibration"] and s.get("counts_equal")
    ]
    if not points:
        return {}
    return {
        "validation": scatter(
            "Predicted vs measured speedup per prompt and setting",
            points,
            x_label="predicted (replay of the served output + fitted step costs)",
            y_label="measured (llama-server timings)",
            note="validated prompts, each priced from the replay of the output its server served",
        )
    }
