"""Do the profile's timed T_t(k) match the target's forwards inside real ``generate()``? (Where they do not,
a gamma's predicted speedup in transformers is off by as much.) For each prompt (the unseen workload's first of each
task), the embedded SmolLM2 runs plain greedy and prompt-lookup assisted generation at gamma 1, 4 and 6 for 64 tokens
(EOS ignored), every target forward timed by the tokens it verified (k), against T_t(k) timed as the profile
times it (:func:`analyzer.measuring.cost.time_target_forwards`, k = 1..8 interleaved, over the prompt plus
half the new tokens). Prints per prompt and gamma the rounds, the ratio of the real forwards' sum to the
timed T_t(k) of the same ks, the time outside the forwards per round, and each k's real / timed median (ms);
then the medians over prompts.

    python benchmarks/generate_forwards.py [--prompts 8]

Run it with nothing else on the machine; the figures are for the CPU model and thread count it prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from analyzer.measuring.cost import time_target_forwards  # noqa: E402
from analyzer.measuring.validate import assisted_generate, greedy_generate  # noqa: E402
from analyzer.models.devices import cpu_model_name  # noqa: E402
from analyzer.models.loading import load_model  # noqa: E402
from analyzer.models.specs import parse_spec  # noqa: E402
from benchmarks.cost_transfer import unseen_prompts  # noqa: E402

NEW_TOKENS = 64
GAMMAS = (0, 1, 4, 6)  # 0: plain greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        loaded = load_model(parse_spec("builtin:smollm2-135m-instruct"), cache_dir=Path(folder))
    model, tokenizer = loaded.model, loaded.tokenizer
    records: list[list[float]] = []
    model.register_forward_pre_hook(
        lambda m, a, kw: records.append(
            [kw.get("input_ids", a[0] if a else None).shape[-1], time.perf_counter()]
        ),
        with_kwargs=True,
    )
    model.register_forward_hook(lambda m, a, kw, o: records[-1].append(time.perf_counter()), with_kwargs=True)
    print(
        f"{cpu_model_name()}, torch {args.threads} threads, {loaded.ref.canonical}, {NEW_TOKENS} new tokens"
    )
    summary: dict[int, dict[str, list[float]]] = {
        g: {"ratio": [], "outside": [], "rounds": []} for g in GAMMAS
    }
    for prompt in unseen_prompts(1)[: args.prompts]:
        text = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text).input_ids
        context = (ids * (1 + NEW_TOKENS // max(len(ids), 1)))[: len(ids) + NEW_TOKENS // 2]
        timed = time_target_forwards(model, context, 8, repeats=5)
        for gamma in GAMMAS:
            records.clear()
            started = time.perf_counter()
            if gamma == 0:
                greedy_generate(model, ids, NEW_TOKENS, eos_token_id=[])
            else:
                assisted_generate(model, ids, NEW_TOKENS, gamma=gamma, ngram_max=2, eos_token_id=[])
            wall = time.perf_counter() - started
            forwards = [(int(k), end - start) for k, start, end in records]
            rounds = forwards[1:]  # the first forward holds the prompt
            ratio = sum(s for _, s in rounds) / sum(timed[min(k, 8) - 1] for k, _ in rounds)
            outside = (wall - sum(s for _, s in forwards)) / max(len(rounds), 1)
            by_k: dict[int, list[float]] = {}
            for k, seconds in rounds:
                by_k.setdefault(k, []).append(seconds)
            summary[gamma]["ratio"].append(ratio)
            summary[gamma]["outside"].append(outside)
            summary[gamma]["rounds"].append(len(rounds))
            print(
                f"{prompt.key} ({len(ids)} tokens) gamma {gamma}: {len(rounds)} rounds, real / timed forwards "
                f"{ratio:.3f}, outside {1000 * outside:.2f} ms/round; by k (real / timed ms, count): "
                + " ".join(
                    f"k{k} {1000 * np.median(v):.1f}/{1000 * timed[k - 1]:.1f} ({len(v)})"
                    for k, v in sorted(by_k.items())
                    if k <= 8
                ),
                flush=True,
            )
    print(
        "\n| gamma | real / timed forwards (median over prompts) | outside the forwards per round | rounds |"
    )
    print("|---|---|---|---|")
    for gamma, figures in summary.items():
        print(
            f"| {gamma or 'plain'} | {np.median(figures['ratio']):.3f} | {1000 * np.median(figures['outside']):.2f} ms "
            f"| {np.mean(figures['rounds']):.1f} |"
        )


if __name__ == "__main__":
    main()
