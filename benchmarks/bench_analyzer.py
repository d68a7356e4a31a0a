"""Benchmark of the analyzer's measurement on this machine.

For (a) the embedded target (SmolLM2-135M-Instruct) with the n-gram drafter, (b) a real draft/target
pair, Qwen2.5-Coder-0.5B-Instruct drafting for -1.5B-Instruct (GGUF Q4_K_M, assembled once from the
package index by ``benchmarks/real_pair.py``, this benchmark's setup step), and optionally (c) a
noisy copy of SmolLM2 as its draft (``--drafters noisy``: same tokenizer, partial agreement, as
expensive as the target), on the first N bundled sample prompts, per prompt and interleaved:

  plain   one plain greedy generation (transformers generate)
  ours    our measurement for all g = 1..G: one target generation + one teacher-forced draft pass
          (or the n-gram index) + the walk for every g
  naive   the naive sweep: one real assisted generation per g = 1..G

and reports: ours vs naive cost (target >= 8x cheaper) with the per-g rounds checked equal to the
target forward passes of every naive run; ours vs plain (target <= 1.2x); predicted vs measured
speedup for every g (the measured one from the naive runs' wall time vs plain), mean absolute
relative error of our prediction (target <= 10%) and of Leviathan's closed form with c = T_d/T_t(1);
analysis throughput and peak memory. Run it on a quiet machine:

    python benchmarks/bench_analyzer.py --prompts 20 --max-new-tokens 64 --out benchmarks/analyzer_results.json
    python benchmarks/bench_analyzer.py --drafters pair --prompts 6 --max-new-tokens 48 --gamma-max 8
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from importlib import resources as ires
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.measuring.acceptance import NgramIndex, alpha_from_matches, walk_model_draft, walk_ngram  # noqa: E402
from analyzer.measuring.cost import profile_costs  # noqa: E402
from analyzer.measuring.measure import draft_match_sequence, generate_target, teacher_forced_logits  # noqa: E402
from analyzer.measuring.prompt_encoding import encode_prompt, eos_token_ids  # noqa: E402
from analyzer.measuring.validate import assisted_generate, greedy_generate  # noqa: E402
from analyzer.models.loading import load_model
from analyzer.models.specs import parse_spec  # noqa: E402
from analyzer.pricing.speedup import Cost, leviathan_speedup, predicted_speedup  # noqa: E402
from analyzer.prompts.ingest import parse_prompt_file  # noqa: E402


def noisy_copy(model, std: float, seed: int):
    import copy

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * std)
    return draft.eval()


def sample_prompts(count: int) -> list:
    data = ires.files("analyzer.sample_data").joinpath("sample_prompts.jsonl").read_bytes()
    prompts = parse_prompt_file(data, "sample_prompts.jsonl").prompts
    # spread over task types: take prompts round-robin by task in file order
    by_task: dict[str, list] = {}
    for p in prompts:
        by_task.setdefault(p.task, []).append(p)
    chosen = []
    while len(chosen) < count and any(by_task.values()):
        for task in sorted(by_task):
            if by_task[task] and len(chosen) < count:
                chosen.append(by_task[task].pop(0))
    return chosen


def ours(target, draft, prompt_ids, max_new, gamma_max, eos_ids, pad_id, ngram_max):
    """Our measurement of one prompt; returns (seconds, output ids, matches, per-g counts)."""
    started = time.perf_counter()
    generation = generate_target(target, [prompt_ids], max_new, eos_ids=eos_ids, pad_id=pad_id)[0]
    output = generation.output_ids
    if draft is not None:
        matches = draft_match_sequence(teacher_forced_logits(draft, prompt_ids, output), output)
        counts = [walk_model_draft(matches, g, max_new) for g in range(1, gamma_max + 1)]
    else:
        index = NgramIndex(list(prompt_ids) + output, ngram_max, eos_ids)
        from analyzer.measuring.acceptance import ngram_first_token_matches

        matches = ngram_first_token_matches(prompt_ids, output, index=index)
        counts = [walk_ngram(prompt_ids, output, g, max_new, index=index) for g in range(1, gamma_max + 1)]
    return time.perf_counter() - started, output, matches, counts


def run_drafter(name, target, draft, tokenizer, prompts, args, eos_ids, pad_id) -> dict:
    torch.manual_seed(0)
    encoded = [
        encode_prompt(
            tokenizer, text=p.text, messages=p.messages, max_prompt_tokens=2048 - args.max_new_tokens
        ).ids
        for p in prompts
    ]
    context = sorted(encoded, key=len)[len(encoded) // 2]
    profile_started = time.perf_counter()
    if draft is None:
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        generator = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor(eos_ids),
            num_output_tokens=args.gamma_max,
            max_matching_ngram_size=args.ngram_max,
            max_length=len(context) + args.max_new_tokens,
        )
        ids = torch.tensor([context])
        measured = profile_costs(
            target, context, args.gamma_max + 1, draft_step=lambda: generator.get_candidates(ids)
        )
    else:
        measured = profile_costs(target, context, args.gamma_max + 1, draft_model=draft)
    profile_s = time.perf_counter() - profile_started
    tokens = max(measured.context_tokens, 1)
    cost = Cost(
        measured.target_forward_s,
        measured.draft_step_s,
        draft_cost_per_token=draft is not None,
        target_prefill_s_per_token=measured.target_prefill_s / tokens,
        draft_prefill_s_per_token=measured.draft_prefill_s / tokens,
    )
    # warm-up (untimed): the first generate/assisted calls pay one-off allocation costs
    warm = encoded[0][:32]
    greedy_generate(target, warm, 4, eos_token_id=eos_ids)
    ours(target, draft, warm, 4, 2, eos_ids, pad_id, args.ngram_max)
    assisted_generate(
        target,
        warm,
        4,
        gamma=2,
        draft_model=draft,
        ngram_max=args.ngram_max if draft is None else None,
        eos_token_id=eos_ids,
    )
    c = measured.draft_step_s / measured.target_forward_s[0]
    rows = []
    for number, (prompt, prompt_ids) in enumerate(zip(prompts, encoded), start=1):
        plain_started = time.perf_counter()
        plain_ids, plain_passes = greedy_generate(
            target, prompt_ids, args.max_new_tokens, eos_token_id=eos_ids
        )
        plain_s = time.perf_counter() - plain_started
        ours_s, output, matches, counts = ours(
            target, draft, prompt_ids, args.max_new_tokens, args.gamma_max, eos_ids, pad_id, args.ngram_max
        )
        naive = []
        for g in range(1, args.gamma_max + 1):
            started = time.perf_counter()
            spec_ids, passes = assisted_generate(
                target,
                prompt_ids,
                args.max_new_tokens,
                gamma=g,
                draft_model=draft,
                ngram_max=args.ngram_max if draft is None else None,
                eos_token_id=eos_ids,
            )
            naive.append(
                {
                    "g": g,
                    "s": time.perf_counter() - started,
                    "passes": passes,
                    "identical": spec_ids == output,
                    "rounds": counts[g - 1].rounds,
                }
            )
        alpha = alpha_from_matches(matches)
        row = {
            "task": prompt.task,
            "prompt_tokens": len(prompt_ids),
            "output_tokens": len(output),
            "plain_s": plain_s,
            "ours_s": ours_s,
            "naive_s": sum(n["s"] for n in naive),
            "plain_identical": plain_ids == output,
            "alpha": alpha,
            "per_g": [
                {
                    **n,
                    "measured_speedup": plain_s / n["s"],
                    "predicted_speedup": predicted_speedup(
                        len(output), counts[n["g"] - 1].drafted_hist, cost, len(prompt_ids)
                    ),
                    "leviathan_speedup": leviathan_speedup(alpha, n["g"], c),
                }
                for n in naive
            ],
        }
        rows.append(row)
        print(
            f"[{name}] {number}/{len(prompts)} {prompt.task:<18} N={len(output):>3} alpha={alpha:.2f} "
            f"plain {plain_s:.2f}s ours {ours_s:.2f}s naive {row['naive_s']:.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return {
        "drafter": name,
        "cost_profile": {
            "target_forward_s": measured.target_forward_s,
            "draft_step_s": measured.draft_step_s,
            "device": measured.device,
            "threads": measured.threads,
            "context_tokens": measured.context_tokens,
        },
        "profile_s": profile_s,
        "rows": rows,
    }


def summarize(result: dict) -> dict:
    rows = result["rows"]
    per_g = [g for r in rows for g in r["per_g"]]
    predicted = np.array([g["predicted_speedup"] for g in per_g])
    leviathan = np.array([g["leviathan_speedup"] for g in per_g])
    measured = np.array([g["measured_speedup"] for g in per_g])
    ours_total = sum(r["ours_s"] for r in rows)
    return {
        "drafter": result["drafter"],
        "prompts": len(rows),
        "output_tokens": int(sum(r["output_tokens"] for r in rows)),
        "alpha_mean": float(np.mean([r["alpha"] for r in rows])),
        "naive_over_ours": sum(r["naive_s"] for r in rows) / ours_total,
        "naive_over_ours_median_per_prompt": float(np.median([r["naive_s"] / r["ours_s"] for r in rows])),
        "ours_over_plain": ours_total / sum(r["plain_s"] for r in rows),
        "ours_over_plain_median_per_prompt": float(np.median([r["ours_s"] / r["plain_s"] for r in rows])),
        "rounds_equal_passes": f"{sum(g['rounds'] == g['passes'] for g in per_g)}/{len(per_g)}",
        "outputs_identical": f"{sum(g['identical'] for g in per_g)}/{len(per_g)}",
        "mare_ours": float(np.mean(np.abs(predicted - measured) / measured)),
        "mare_leviathan": float(np.mean(np.abs(leviathan - measured) / measured)),
        "prompts_per_min": 60.0 * len(rows) / ours_total,
        "profile_s": result["profile_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma-max", type=int, default=16)
    parser.add_argument("--ngram-max", type=int, default=2)
    parser.add_argument("--noise-std", type=float, default=0.01, help="noise of the model draft (noisy copy)")
    parser.add_argument("--drafters", default="ngram,pair", help="comma-separated: ngram, pair, noisy")
    parser.add_argument(
        "--pair-folder",
        type=Path,
        default=None,
        help="where benchmarks/real_pair.py keeps the Qwen2.5-Coder GGUF files (default: its own)",
    )
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "specroute-bench"))
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--from-json", type=Path, help="print the table of a saved --out file instead of measuring"
    )
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print_table(saved["results"], saved["args"], saved.get("peak_mib"))
        return
    torch.set_grad_enabled(False)
    loaded = load_model(parse_spec("builtin:smollm2-135m-instruct"), cache_dir=Path(args.cache_dir))
    target, tokenizer = loaded.model, loaded.tokenizer
    eos_ids = eos_token_ids(target.generation_config.eos_token_id, tokenizer.eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    prompts = sample_prompts(args.prompts)
    results = []
    for name in args.drafters.split(","):
        if name == "pair":
            results.append(run_real_pair(prompts, args))
        else:
            draft = None if name == "ngram" else noisy_copy(target, args.noise_std, seed=1)
            results.append(run_drafter(name, target, draft, tokenizer, prompts, args, eos_ids, pad_id))
        if args.out:
            args.out.write_text(
                json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1)
            )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.out:
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "results": results, "peak_mib": peak_mib},
                indent=1,
            )
        )
    print_table(results, vars(args), peak_mib)
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


def run_real_pair(prompts: list, args) -> dict:
    """The model-draft row: Qwen2.5-Coder-0.5B-Instruct drafting for -1.5B-Instruct, both loaded
    through the analyzer's own ``gguf:`` loading (dequantized to float32 on the CPU)."""
    from real_pair import DEFAULT_FOLDER, pair_specs

    target_spec, draft_spec = pair_specs(args.pair_folder or DEFAULT_FOLDER)
    target = load_model(parse_spec(target_spec), cache_dir=Path(args.cache_dir))
    draft = load_model(parse_spec(draft_spec), cache_dir=Path(args.cache_dir))
    eos_ids = eos_token_ids(target.model.generation_config.eos_token_id, target.tokenizer.eos_token_id)
    pad = target.tokenizer.pad_token_id
    return run_drafter(
        "Qwen2.5-Coder 0.5B -> 1.5B",
        target.model,
        draft.model,
        target.tokenizer,
        prompts,
        args,
        eos_ids,
        pad if pad is not None else eos_ids[0],
    )


def print_table(results: list[dict], args: dict, peak_mib: float | None) -> None:
    """The comparison table (one row per drafter) and the cost curves."""
    print(
        f"\nmachine: {results[0]['cost_profile']['device']}; torch threads {results[0]['cost_profile']['threads']}; "
        f"{args['prompts']} sample prompts, max {args['max_new_tokens']} new tokens, g = 1..{args['gamma_max']}"
    )
    header = (
        "drafter",
        "alpha",
        "naive/ours",
        "(median)",
        "ours/plain",
        "(median)",
        "rounds==passes",
        "identical",
        "MARE ours",
        "MARE Leviathan",
        "prompts/min",
    )
    print(" | ".join(header))
    for result in results:
        s = summarize(result)
        print(
            " | ".join(
                [
                    s["drafter"],
                    f"{s['alpha_mean']:.2f}",
                    f"{s['naive_over_ours']:.1f}x",
                    f"{s['naive_over_ours_median_per_prompt']:.1f}x",
                    f"{s['ours_over_plain']:.2f}x",
                    f"{s['ours_over_plain_median_per_prompt']:.2f}x",
                    s["rounds_equal_passes"],
                    s["outputs_identical"],
                    f"{100 * s['mare_ours']:.1f}%",
                    f"{100 * s['mare_leviathan']:.1f}%",
                    f"{s['prompts_per_min']:.1f}",
                ]
            )
        )
        t = result["cost_profile"]["target_forward_s"]
        print(
            f"  {s['drafter']}: T_t(k)/T_t(1), k=1..{len(t)}: "
            + " ".join(f"{x / t[0]:.2f}" for x in t)
            + f"; T_t(1) = {1000 * t[0]:.1f} ms; T_d = {1000 * result['cost_profile']['draft_step_s']:.2f} ms;"
            f" profiling took {s['profile_s']:.1f} s"
        )
    if peak_mib:
        print(f"peak resident memory: {peak_mib:.0f} MiB (whole process, all drafters)")


if __name__ == "__main__":
    main()
