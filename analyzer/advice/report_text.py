"""The report as text for people: a CSV of the prompts and a plain-text summary (the recommendation in
words, the cost per batch size with the profile's quality, the per-task table with intervals, the
reasons, validation), both made from :func:`analyzer.advice.report.build_report`'s dict."""

from __future__ import annotations

import csv
import io

from analyzer.advice.report import ADVICE_WITHHELD, withheld_notes
from analyzer.advice.verdict import left_out_lines, run_verdict
from analyzer.engine.engines import pricing_entry
from analyzer.names import DEFAULT_ENGINE

CSV_COLUMNS = [
    "prompt_id",
    "external_id",
    "task",
    "prompt_tokens",
    "output_tokens",
    "alpha",
    "best_gamma",
    "predicted_speedup_best",
    "measured_speedup",
]


def report_csv(report: dict) -> str:
    """One CSV row per prompt, plus S(g) columns for every g."""
    gammas = sorted({int(g) for row in report["prompts"] for g in row["predicted_speedup"]})
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS + [f"speedup_g{g}" for g in gammas])
    for row in report["prompts"]:
        best = row["predicted_speedup"].get(str(row["best_gamma"])) if row["best_gamma"] else None
        writer.writerow(
            [
                row["prompt_id"],
                row["external_id"] or "",
                row["task"],
                row["prompt_tokens"],
                row["output_tokens"],
                _fmt(row["alpha"]),
                row["best_gamma"] or "",
                _fmt(best),
                _fmt(row["measured_speedup"]),
            ]
            + [_fmt(row["predicted_speedup"].get(str(g))) for g in gammas]
        )
    return out.getvalue()


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"


def report_text(report: dict) -> str:
    """A plain-text summary: the verdict first (:mod:`analyzer.advice.verdict`: per task the decision, the
    workload routed, off and at its best single gamma, withheld or not, the machine), then the run, its cost,
    the per-task table, routing and validation."""
    lines = run_verdict(report).lines() + [""]
    lines.append(_run_line(report))
    lines.extend(left_out_lines(report.get("left_out")))
    lines.extend(_cost_lines(report))
    if report.get("guarantee"):
        lines.append(report["guarantee"])
    workload = report.get("workload")
    if workload and workload.get("best_gamma"):
        verdict = "speculate" if workload["speculate"] else "do not speculate"
        lines.append(
            f"workload: {verdict} (best gamma {workload['best_gamma']}, predicted speedup "
            f"{workload['predicted_speedup']:.2f}x, alpha {workload['alpha_mean']:.2f})"
        )
    on = [t for t, s in report["tasks"].items() if s["speculate"]]
    lines.append("speculate for: " + (", ".join(on) if on else "no task type") + "\n")
    lines.extend(_task_table(report))
    lines.extend(_batch_table(report))
    lines.extend(_routing_lines(report))
    lines.extend(_validation_lines(report))
    return "\n".join(lines)


def _routing_lines(report: dict) -> list[str]:
    """The three routing numbers per task and overall (nothing for a sampling run)."""
    rows = report.get("routing")
    if not rows:
        return []

    def number(value: float, interval) -> str:
        return f"{value:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}]"

    lines = [
        "\nhow much a finer router could win (predicted from the replays, time-weighted, 95% intervals):",
        f"  {'group':<18} {'prompts':>7}  {'best single gamma':<34} {'routing by task':<26} per-prompt oracle",
    ]
    for row in rows:
        static = f"{number(row['static'], row['static_interval'])} ({row['static_option'] or 'off'})"
        lines.append(
            f"  {row['group']:<18} {row['prompts']:>7}  {static:<34} "
            f"{number(row['by_task'], row['by_task_interval']):<26} {number(row['oracle'], row['oracle_interval'])}"
        )
    return lines


def _run_line(report: dict) -> str:
    """The run's first line: its pair and mode, and what measured and priced it."""
    measured_on = f"{report.get('dtype') or 'float32'} on {report.get('device') or 'an unknown device'}"
    if report.get("repriced_from"):
        priced = report.get("cost_profile") or {}
        version = f" {priced['engine_version']}" if priced.get("engine_version") else ""
        return (
            f"run {report['run_id']} ({report['status']}): {report['target']} with draft {report['draft']}, "
            f"{report['mode']}; acceptance from run {report['repriced_from']} (measured in "
            f"{report.get('measured_in')}, {measured_on}), priced by {report.get('engine')}{version} on "
            f"{priced.get('device')} in {priced.get('dtype')} (cost profile {priced.get('id')}, nothing measured again)"
        )
    return (
        f"run {report['run_id']} ({report['status']}): {report['target']} with draft {report['draft']}, "
        f"{report['mode']}, {report.get('engine') or DEFAULT_ENGINE} engine"
        + (f" ({report['cost_mode']} cost mode)" if report.get("cost_mode") else "")
        + f", {measured_on}"
    )


def _cost_lines(report: dict) -> list[str]:
    """One line per batch size's cost profile: T_t(1), the curve's ratios, the draft step, quality."""
    lines = []
    for batch, cp in (report.get("cost_profiles") or {}).items():
        shown = cp["target_k_s"][:8]
        ratios = ", ".join(f"{t / shown[0]:.2f}" for t in shown)
        overhead = (
            f"; machinery {cp['round_overhead_s'] * 1000:.2f} ms/round, {cp['decode_overhead_s'] * 1000:.2f} ms/step"
            if cp.get("round_overhead_s") is not None
            else ""
        )
        scaled = (
            "; scaled to generate()'s own forwards ("
            + ", ".join(f"k={k} x{r:.3f}" for k, r in cp["generate_ratio"].items())
            + ")"
            if cp.get("generate_ratio")
            else ""
        )
        lines.append(
            f"cost at batch {batch}: T_t(1) = {cp['target_k_s'][0] * 1000:.1f} ms, "
            f"T_t(k)/T_t(1) for k=1..{len(shown)}: {ratios}{scaled}; "
            f"draft step {cp['draft_s'] * 1000:.3f} ms{overhead}; {quality_text(cp)}"
        )
    return lines


def _task_table(report: dict) -> list[str]:
    """The per-task table, then why (a task on the workload's decision, a tier's note)."""
    header = (
        f"{'task':<18} {'n':>3} {'alpha':>6} {'±std':>6} {'AL':>5} {'g*':>3} {'S(g*) [90% interval]':>22} "
        f"{'meas.':>6}  {'tier':<19} decision"
    )
    lines = [header]
    notes = []
    for task, s in report["tasks"].items():
        lines.append(
            f"{task:<18} {s['n']:>3} {_num(s['alpha_mean'], 6, 3)} {_num(s['alpha_std'], 6, 3)} {_num(s['al'], 5, 2)} "
            f"{(s['best_gamma'] or 0):>3} {speedup_with_interval(s):>22} {_num(s.get('measured_speedup'), 6, 2)}  "
            f"{s['tier']:<19} {decision_text(s)}"
        )
        if s.get("decision_basis") == "workload" or s.get("tier_note"):
            notes.append(
                f"  {task}: "
                + "; ".join(
                    filter(
                        None,
                        [
                            s["decision_reason"] if s.get("decision_basis") == "workload" else None,
                            s.get("tier_note"),
                        ],
                    )
                )
            )
    if notes:
        lines.append("why:")
        lines.extend(notes)
    return lines


def _batch_table(report: dict) -> list[str]:
    """g* and S(g*) per task (and the workload) per batch size; nothing for a single batch size."""
    batches = sorted({int(b) for s in report["tasks"].values() for b in s.get("by_batch") or {}})
    if len(batches) <= 1:
        return []
    lines = ["\nbest gamma and S(g*) per batch size:"]
    lines.append(f"{'task':<18} " + " ".join(f"{'b=' + str(b):>14}" for b in batches))
    for task, s in list(report["tasks"].items()) + (
        [("(workload)", report["workload"])] if report.get("workload") else []
    ):
        cells = []
        for b in batches:
            entry = (s.get("by_batch") or {}).get(str(b))
            cells.append(
                f"{'-':>14}"
                if not entry or entry["predicted_speedup"] is None
                else format(
                    f"g{entry['best_gamma']} {entry['predicted_speedup']:.2f}x"
                    + (" on" if entry["speculate"] else " off"),
                    ">14",
                )
            )
        lines.append(f"{task:<18} " + " ".join(cells))
    return lines


def _validation_lines(report: dict) -> list[str]:
    """The validation summary of the run, then one line per task; nothing when none was validated."""
    summary = (report.get("validation_summary") or {}).get("run")
    if not summary:
        return []
    covered = report["validation_summary"]["tasks"]
    scope = (
        f"over {len(covered)} tasks"
        if len(covered) > 1
        else f"all {next(iter(covered))}, so not a workload figure"
        if len(report["tasks"]) > 1
        else ""
    )
    scope = f" {scope}" if scope else ""
    lines = [
        f"\nvalidation: {summary['validated']} prompts{scope}, {summary['identical']} outputs "
        "identical to plain greedy, "
        f"target passes vs replayed rounds {_pct(summary['passes_error_pct'])} mean abs. error "
        f"({summary['passes_equal_rounds']} equal), {_timed_text(summary)}"
    ]
    if report.get("validation_plan"):
        lines.append(f"  validated {report['validation_plan']['why']}")
    if summary.get("aggregate_measured") is not None:
        lines.append(_noise_text(summary))
    if summary.get("aggregate_missed"):
        lines.append(
            f"  THE PREDICTION MISSED: the time-weighted speedup is {_pct(summary['aggregate_error_pct'])} off, over "
            f"the bound of {_pct(summary['aggregate_bound_pct'])} (5 points beyond one run's noise): measure again "
            "(--reprofile) before following this advice"
        )
    for task, t in report["validation_summary"]["tasks"].items():
        lines.append(
            f"  {task:<16} n={t['validated']} identical {t['identical']}, passes err "
            f"{_pct(t['passes_error_pct'])}, {_timed_text(t, mare=False)}"
        )
    return lines


def _noise_text(summary: dict) -> str:
    """The validation's figures above the machine's noise, in one line."""
    floor = summary.get("noise_floor_pct")
    noise = (
        f"two greedy runs of the same prompt differ by {floor:.1f}% on average ({summary['noise_pairs']} pairs)"
        if floor is not None
        else "noise not measured (fewer than 2 pairs of greedy runs)"
    )
    if summary.get("steal_pct") is not None:
        noise += f", steal {summary['steal_pct']:.1f}%"
    if summary.get("noise_verdict") == "noisy":
        noise += " — TOO NOISY to judge advice: " + "; ".join(summary.get("noise_notes") or [])
    within = summary.get("within_noise")
    correlation = summary.get("correlation")
    return (
        f"  time-weighted: predicted {summary['aggregate_predicted']:.3f}x vs measured "
        f"{summary['aggregate_measured']:.3f}x ({_pct(summary['aggregate_error_pct'])} off); {noise}; "
        f"{'-' if within is None else f'{within:.0%}'} of prompts within that noise + 3 points; correlation "
        f"{'-' if correlation is None else f'{correlation:.2f}'}"
    )


def _timed_text(summary: dict, *, mare: bool = True) -> str:
    """Predicted against measured speedup over the validations timed on a quiet machine, saying how
    many were left out as disturbed (other processes used the machine meanwhile)."""
    left_out = summary.get("disturbed") or 0
    note = f" ({left_out} measured on a busy machine, left out)" if left_out else ""
    if summary.get("measured_speedup") is None:
        return "speedups not compared: every validation was measured on a busy machine"
    error = f" ({_pct(summary['speedup_error_pct'])} MARE)" if mare else ""
    return (
        f"predicted {summary['predicted_speedup']:.2f}x vs measured {summary['measured_speedup']:.2f}x"
        f"{error}{note}"
    )


def recommendation(report: dict) -> dict:
    """The report's verdict in plain words: the headline (speculate on the workload, or why not, from
    its decision's code), the tasks to speculate on (with gamma and speedup, the best first) and the
    tasks to leave off. A run whose advice is withheld has the short :data:`ADVICE_WITHHELD` as its
    headline, the noisy profiles' batch sizes (``withheld_batches``) and what was seen, each note once
    (``withheld_notes``); ``noisy_notes`` are those notes per noisy batch size."""
    tasks = report["tasks"]
    on = sorted(
        ((t, s) for t, s in tasks.items() if s.get("speculate")),
        key=lambda item: -(item[1]["predicted_speedup"] or 0),
    )
    off = sorted(t for t, s in tasks.items() if not s.get("speculate"))
    workload = report.get("workload") or {}
    noisy = {b: p for b, p in (report.get("cost_profiles") or {}).items() if p.get("quality") == "noisy"}
    if report.get("advice_withheld"):
        headline = f"{ADVICE_WITHHELD}."  # short: what was seen is the list in withheld_notes
    elif workload.get("speculate"):
        headline = (
            f"Speculate: across this workload, {report['draft']} drafting at gamma "
            f"{workload['best_gamma']} is predicted to run {workload['predicted_speedup']:.2f}x "
            "as fast as plain decoding."
        )
    elif workload:
        headline = "Do not speculate on this workload as a whole: " + _why_not(
            workload, report["params"]["margin"]
        )
    else:
        headline = "No results yet."
    return {
        "headline": headline,
        "withheld": bool(report.get("advice_withheld")),
        "withheld_batches": list(noisy) if report.get("advice_withheld") else [],
        "withheld_notes": withheld_notes(noisy.values()) if report.get("advice_withheld") else [],
        "noisy_notes": {batch: withheld_notes([profile]) for batch, profile in noisy.items()},
        "on": [
            f"{t} (gamma {s['best_gamma']}, {s['predicted_speedup']:.2f}x"
            + (
                ", the workload's decision: too few prompts)"
                if s.get("decision_basis") == "workload"
                else ")"
            )
            for t, s in on
        ],
        "off": off,
    }


def _why_not(workload: dict, margin: float) -> str:
    """Why the workload's decision is off, in words, from its decision code."""
    speedup = workload.get("predicted_speedup")
    if workload.get("decision_code") == "nothing_measured" or speedup is None:
        return "no speedup could be predicted (no cost profile or no output yet)."
    predicted = f"the best gamma is predicted to give {speedup:.2f}x"
    if workload.get("decision_code") == "interval_reaches_loss":
        level = f"{workload['interval_level']:.0%} " if workload.get("interval_level") else ""
        low = workload["speedup_interval"][0]
        return f"{predicted}, but its {level}interval reaches {low:.2f}x, a possible loss."
    return f"{predicted}, below the {1 + margin:.2f}x needed."


def speedup_with_interval(summary: dict) -> str:
    """``1.13x [1.04, 1.22]``, or just ``1.13x`` without an interval, or ``-``."""
    value, interval = summary.get("predicted_speedup"), summary.get("speedup_interval") or [None, None]
    if value is None:
        return "-"
    if interval[0] is None or interval[1] is None:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}]"


def decision_text(summary: dict) -> str:
    """``speculate`` / ``off``, marked when the workload's decision stands in for a too-small task."""
    text = "speculate" if summary.get("speculate") else "off"
    return text + (" (workload's)" if summary.get("decision_basis") == "workload" else "")


def quality_text(profile: dict) -> str:
    """A cost profile's quality in words, with the fix when it is noisy."""
    quality = profile.get("quality")
    note = pricing_entry(profile.get("engine"), profile.get("source")).profile_note(profile)
    if note is not None:
        return note
    if quality is None:
        return "quality not judged (a profile from before it was)"
    notes = "; ".join(profile.get("quality_notes") or [])
    if quality == "noisy":
        return (
            f"NOISY profile ({notes}): the machine was busy while it was measured and the advice may be wrong; "
            "measure again on a quiet machine (specroute analyze ... --reprofile, or specroute demo --reprofile)"
        )
    return f"quality {quality}" + (f" ({notes})" if notes else "")


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _num(value, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
