"""A stored llama-server analysis in words: its step costs, the machine's noise and the routing numbers, one
line or table each, as the CLI prints them and the analysis page shows them (read from the stored record's
JSON, so an analysis stored before a field existed still reads)."""

from __future__ import annotations

from typing import Any

from analyzer.pricing.option_curve import spread_words


def cost_text(cost: dict[str, Any]) -> str:
    """One drafter family's fitted step costs in a line (an analysis stored before the context term came
    has no context term and no held-out error)."""
    per_context_us = 1000 * cost.get("per_context_ms", 0.0)
    step = f"plain step {cost['plain_step_ms']:.2f} ms + {per_context_us:.2f} us per token of context"
    if cost.get("step_extra_ms"):
        step += f" (+ {cost['step_extra_ms']:.2f} ms on these servers)"
    heldout = cost.get("heldout_mare")
    plain_heldout = cost.get("plain_heldout_mare")
    return (
        step
        + f"; a round: a step + {cost['round_ms']:.2f} ms + {cost['per_draft_ms']:.2f} ms per drafted token "
        f"(+ {1000 * cost.get('per_row_context_ms', 0.0):.2f} us per token of its context) + "
        f"{cost['per_accepted_ms']:.2f} ms per accepted token"
        + (
            f" + {cost['per_draft_decode_ms']:.2f} ms per draft decode"
            if cost.get("per_draft_decode_ms")
            else ""
        )
        + f" ({cost['samples']} calibration runs, fit error {cost['fit_mare']:.1%}"
        + (f", {heldout:.1%} on prompts left out" if heldout is not None else "")
        + (
            f"; plain runs {cost['plain_samples']}, {plain_heldout:.1%} left out"
            if plain_heldout is not None
            else ""
        )
        + (f"; bound {cost['bound']:.1%}" if cost.get("bound") is not None else "")
        + ")"
    )


def num(value: Any, form: str = "{:.2f}") -> str:
    return "-" if value is None else form.format(value)


def noise_text(noise: dict[str, Any] | None) -> str:
    """The machine's run-to-run noise in a line."""
    if not noise or noise.get("floor") is None:
        return "machine noise: not measured (fewer than two pairs of plain runs)"
    text = (
        f"machine noise: two runs of the same work differ by {noise['floor']:.1%} on average "
        f"({noise['pairs']} plain-vs-plain pairs; 10th-90th percentile {noise['p10']:.3f}-{noise['p90']:.3f}; "
        f"one run's error {noise['run_error']:.1%})"
    )
    if noise.get("steal") is not None:
        text += f"; steal {noise['steal']:.1%}"
    if noise.get("frequency_spread") is not None:
        text += f"; clock spread {noise['frequency_spread']:.1%}"
    return text + f"; {noise['verdict']}"


def routing_text(routing: list[dict[str, Any]] | None) -> list[str]:
    """The three routing numbers per task and overall, as table lines."""
    if not routing:
        return []

    def cell(value: float, interval: list[float]) -> str:
        return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"

    lines = [
        "",
        "routing from the replays (time-weighted predicted speedup, 95% interval): group | prompts | the workload's "
        "setting | by task (each task's decision) | per-prompt oracle",
    ]
    for row in routing:
        lines.append(
            f"{row['group']} | {row['prompts']} | {cell(row['static'], row['static_interval'])} "
            f"({row['static_option'] or 'off'}) | {cell(row['by_task'], row['by_task_interval'])} | "
            f"{cell(row['oracle'], row['oracle_interval'])}"
        )
    return lines


def divergence_text(validation: list[dict[str, Any]] | None) -> str:
    """What the validation guarantees, given how often speculation changed the served output: where every
    validated speculating server served plain greedy's output, the advice (priced from that output's replay)
    is the cost model's price of the exact work; where some did not (llama-server's batched verification can
    flip an argmax at a near-tie, more often over long contexts), the draft counts follow the output served,
    so the advice is held to its aggregate, and its per-prompt error is reported beside the cost model's."""
    rows = [f for f in validation or [] if f.get("runs") and f.get("output_equal") is not None]
    if not rows:
        return "Not validated: what speculation does to this workload's output is not known."
    runs = sum(int(f["runs"]) for f in rows)
    changed = sum(int(f["runs"]) * (1.0 - float(f["output_equal"])) for f in rows) / runs
    served = [f["mare"] for f in rows if f.get("mare") is not None]
    advice = [f["advice_mare"] for f in rows if f.get("advice_mare") is not None]
    aggregate = [f["aggregate_error"] for f in rows if f.get("aggregate_error") is not None]

    def spread(values: list[float]) -> str:
        low, high = min(values), max(values)
        return f"{low:.1%}" if round(low, 3) == round(high, 3) else f"{low:.1%}-{high:.1%}"

    if changed == 0:
        text = (
            f"Every validated speculating server served plain greedy's output ({runs} prompt-settings): the "
            "advice is the price of the exact replay of the work those servers did"
        )
        return text + (f" (error per prompt {spread(served)})." if served else ".")
    text = (
        f"Speculation changed the served output in {changed:.0%} of {runs} validated prompt-settings "
        "(batched verification flips an argmax at a near-tie, more often over long contexts). There the draft "
        "counts follow the output served, not plain greedy's: the advice, priced from plain greedy's replay, "
        "is held to its aggregate per setting"
    )
    if aggregate:
        text += f" (error {spread(aggregate)} here)"
    text += ", not to each prompt"
    if advice and served:
        text += (
            f" (error per prompt {spread(advice)} for the advice, {spread(served)} for the cost model on the "
            "work served)"
        )
    return text + "."


def decision_text(task: dict[str, Any]) -> str:
    """Why a task speculates with its setting or not, by the one rule (its stored curve: the setting's speedup,
    the interval's lower end, the rule's code, and the workload's decision for a task of too few prompts); an
    analysis stored before the curve was reads "-"."""
    curve = task.get("curve")
    if not curve:
        return "-"
    options = {o["label"]: o for o in curve["options"]}
    shown = task["chosen"] or max(options, key=lambda label: options[label]["speedup"] or 0.0)
    option = options[shown]
    interval = f"{num(option['speedup'])} [{num(option.get('low'))}, {num(option.get('high'))}]"
    spread = spread_words(dict(zip(options, curve["fit_errors"])).get(shown))
    basis = " (too few prompts: the workload's decision)" if curve.get("basis") == "workload" else ""
    verdict = "on" if task["chosen"] else "off"
    return f"{verdict}: {shown} {interval}{spread}, {curve['code'].replace('_', ' ')}{basis}"
