"""The cost modes side by side, for benchmarks/gpu_check.py: one prompt validated cold and warm in
each mode (eager ``generate()`` and the cuda-graphs harness), and one analysis's eager and
cuda-graphs profiles, decisions and validations printed next to each other, with markdown tables.

"Cold" is the first timed run of its kind after the models are loaded, without an untimed run first
(the cuda-graphs one includes capturing its graphs); "warm" is what the analyzer does on a GPU: one
untimed run of each, then plain and speculative alternated over 2 repeats. In one process only the
first phase is truly cold: the eager cold run goes first, so the graphs' cold run finds kernels chosen.
"""

from __future__ import annotations

import time
from pathlib import Path

from analyzer.analysis.run_records import RunParams
from analyzer.engine.graph_cost import GraphDecoder
from analyzer.measuring.prompt_encoding import encode_prompt, eos_token_ids, prompt_token_limit
from analyzer.measuring.validate import compare_generations, validate_prompt
from analyzer.models.devices import resolve
from analyzer.models.loading import load_model
from analyzer.models.specs import parse_spec

COLD_WARM_GAMMA = 4


def cold_and_warm_validation(
    target_spec: str, draft_spec: str, params: RunParams, prompt_text: str, cache_dir: Path, *, capture: bool
) -> list[dict]:
    """One prompt, plain against speculative at gamma COLD_WARM_GAMMA: eager cold, eager warm, then
    cuda-graphs cold and warm (``capture=False`` on a CPU: the same steps uncaptured); the models are
    loaded here, first thing, and dropped when it returns."""
    placement = resolve(params.device, params.dtype)
    started = time.perf_counter()
    target = load_model(parse_spec(target_spec), cache_dir=cache_dir, placement=placement)
    draft_ref = parse_spec(draft_spec)
    draft = (
        None if draft_ref.kind == "ngram" else load_model(draft_ref, cache_dir=cache_dir, placement=placement)
    )
    ngram_max = int(draft_ref.options.get("max_ngram", 2)) if draft is None else None
    print(f"  loaded in {time.perf_counter() - started:.1f} s", flush=True)
    eos = eos_token_ids(target.model.generation_config.eos_token_id, target.tokenizer.eos_token_id)
    ids = encode_prompt(
        target.tokenizer,
        text=prompt_text,
        use_chat_template=params.chat_template,
        max_prompt_tokens=prompt_token_limit(target.model, params.max_new_tokens, params.max_prompt_tokens),
    ).ids
    gamma, new_tokens = COLD_WARM_GAMMA, params.max_new_tokens
    rows = []

    def eager(warm: bool):
        return validate_prompt(
            target.model,
            ids,
            new_tokens,
            gamma=gamma,
            draft_model=draft.model if draft else None,
            ngram_max=ngram_max,
            eos_token_id=eos,
            repeats=2 if warm else 1,
            warmup=warm,
        )

    decoder = GraphDecoder(
        target.model, draft.model if draft else None, ngram_max=ngram_max, eos_ids=eos, capture=capture
    )

    def graphs(warm: bool):
        return compare_generations(
            lambda: decoder.greedy(ids, new_tokens),
            lambda: decoder.speculative(ids, new_tokens, gamma),
            gamma=gamma,
            repeats=2 if warm else 1,
            warmup=warm,
        )

    for mode, measure in (
        ("eager", eager),
        ("cuda-graphs" if capture else "cuda-graphs (uncaptured)", graphs),
    ):
        for phase in ("cold", "warm"):
            clock = time.perf_counter()
            measured = measure(phase == "warm")
            row = {
                "mode": mode,
                "phase": phase,
                "gamma": gamma,
                "prompt_tokens": len(ids),
                "new_tokens": len(measured.greedy_ids),
                "greedy_s": measured.greedy_time_s,
                "speculative_s": measured.speculative_time_s,
                "speedup": measured.measured_speedup,
                "identical": measured.outputs_identical,
                "passes": measured.target_forward_passes,
                "wall_s": time.perf_counter() - clock,
            }
            rows.append(row)
            print(
                f"  {mode:<24} {phase}: plain {row['greedy_s'] * 1000:8.1f} ms ({row['new_tokens']} tokens), "
                f"speculative {row['speculative_s'] * 1000:8.1f} ms ({row['passes']} target passes): "
                f"{row['speedup']:.2f}x, outputs {'identical' if row['identical'] else 'DIFFER'}",
                flush=True,
            )
    return rows  # the models go with this frame; the caller frees the memory


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.3f}"


def _ratios(profile: dict, ks=(2, 5, 9)) -> str:
    t = profile["target_k_s"]
    return "/".join(f"{t[k - 1] / t[0]:.2f}" if k <= len(t) else "-" for k in ks)


def _validation(report: dict) -> str:
    summary = (report.get("validation_summary") or {}).get("run")
    if not summary:
        return "-"
    return (
        f"{_x(summary['predicted_speedup'])} vs {_x(summary['measured_speedup'])} "
        f"({summary['identical']}/{summary['validated']} identical)"
    )


def print_side_by_side(pair: str, eager: dict, graphs: dict) -> None:
    """Per batch size, the two modes' profiles and the decision each prices, then their validations."""
    print(f"\n=== {pair}: eager | cuda-graphs, side by side")
    print(
        f"  {'batch':>5} {'T_t(1) ms':>19} {'T_t(2,5,9)/T_t(1)':>31} {'draft step ms':>21} "
        f"{'overhead ms/round':>21}  workload g*, S(g*)"
    )
    profiles = [eager["report"].get("cost_profiles") or {}, graphs["report"].get("cost_profiles") or {}]
    by_batch = [(r["report"].get("workload") or {}).get("by_batch") or {} for r in (eager, graphs)]
    for batch in sorted(set(profiles[0]) | set(profiles[1]), key=int):
        cells = []
        for values in (
            [_ms(p[batch]["target_k_s"][0]) if batch in p else "-" for p in profiles],
            [_ratios(p[batch]) if batch in p else "-" for p in profiles],
            [_ms(p[batch].get("draft_s")) if batch in p else "-" for p in profiles],
            [_ms(p[batch].get("round_overhead_s")) if batch in p else "-" for p in profiles],
        ):
            cells.append(" | ".join(values))
        decisions = " | ".join(
            f"g{b[batch]['best_gamma']} {_x(b[batch]['predicted_speedup'])} "
            f"{'on' if b[batch]['speculate'] else 'off'}"
            if batch in b
            else "-"
            for b in by_batch
        )
        print(f"  {batch:>5} {cells[0]:>19} {cells[1]:>31} {cells[2]:>21} {cells[3]:>21}  {decisions}")
    print(f"  validation, predicted vs measured: eager {_validation(eager['report'])}")
    print(f"                                     cuda-graphs {_validation(graphs['report'])}")


SIDE_BY_SIDE_HEADER = (
    "| model pair | dtype | batch | T_t(1) ms eager / graphs | T_t(2,5,9)/T_t(1) eager | graphs "
    "| draft step ms eager / graphs | overhead ms/round eager / graphs | g*, S(g*) eager | graphs "
    "| validated eager: predicted vs measured | graphs |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def side_by_side_rows(pair: str, eager: dict, graphs: dict) -> list[str]:
    """Markdown rows of :data:`SIDE_BY_SIDE_HEADER`, one per batch size (validation on the first)."""
    reports = [eager["report"], graphs["report"]]
    profiles = [r.get("cost_profiles") or {} for r in reports]
    by_batch = [(r.get("workload") or {}).get("by_batch") or {} for r in reports]
    dtype = reports[0].get("dtype") or eager["params"].get("dtype")
    rows = []
    for number, batch in enumerate(sorted(set(profiles[0]) | set(profiles[1]), key=int)):
        have = [batch in p for p in profiles]
        t1 = " / ".join(_ms(p[batch]["target_k_s"][0]) if h else "-" for p, h in zip(profiles, have))
        ratios = [_ratios(p[batch]) if h else "-" for p, h in zip(profiles, have)]
        draft = " / ".join(_ms(p[batch].get("draft_s")) if h else "-" for p, h in zip(profiles, have))
        overhead = " / ".join(
            _ms(p[batch].get("round_overhead_s")) if h else "-" for p, h in zip(profiles, have)
        )
        decisions = [
            f"g{b[batch]['best_gamma']} {_x(b[batch]['predicted_speedup'])} {'on' if b[batch]['speculate'] else 'off'}"
            if batch in b
            else "-"
            for b in by_batch
        ]
        validation = [_validation(r) for r in reports] if number == 0 else ["", ""]
        rows.append(
            f"| {pair} | {dtype} | {batch} | {t1} | {ratios[0]} | {ratios[1]} | {draft} | {overhead} "
            f"| {decisions[0]} | {decisions[1]} | {validation[0]} | {validation[1]} |"
        )
    return rows


COLD_WARM_HEADER = (
    "| model pair | mode | cold: plain ms, speculative ms, speedup | warm: plain ms, speculative ms, speedup "
    "| outputs identical |\n|---|---|---|---|---|"
)


def cold_warm_rows(pair: str, rows: list[dict]) -> list[str]:
    """Markdown rows of :data:`COLD_WARM_HEADER`, one per mode."""
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        cold, warm = (
            next(r for r in rows if r["mode"] == mode and r["phase"] == p) for p in ("cold", "warm")
        )
        cells = [
            f"{r['greedy_s'] * 1000:.1f}, {r['speculative_s'] * 1000:.1f}, {r['speedup']:.2f}x"
            for r in (cold, warm)
        ]
        identical = "yes" if cold["identical"] and warm["identical"] else "NO"
        lines.append(f"| {pair} | {mode} (g = {cold['gamma']}) | {cells[0]} | {cells[1]} | {identical} |")
    return lines
