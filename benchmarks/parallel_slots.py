"""Would parallel slots make the analysis' generation cheaper without changing what it replays? One plain
llama-server with one slot generating the prompts one after the other, against one with ``--slots`` slots (the
context per slot the same) given as many requests at once, interleaved, medians of ``--repeats``: the wall time
of the whole generation, and how many prompts' greedy outputs differ from the one-slot server's (a batched
step need not pick the same argmax as a single one, and the replay must see the output the analysis priced).

    python benchmarks/parallel_slots.py [--per-task 3] [--n-predict 64] [--slots 4] [--repeats 3]

Writes benchmarks/results/parallel_slots.json and rewrites benchmarks/README.md. Run it with nothing else on the
machine; every figure is for the CPU model and thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from analysis_vs_sweep import sample_prompts  # this folder's own (on sys.path as the script's folder)

from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_process import LlamaServerProcess
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.models.devices import cpu_model_name
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings

HERE = Path(__file__).resolve().parent
N_CTX = 4096  # per slot


def generate(
    binary: Path, model: Path, threads: int, slots: int, prompts, n_predict: int
) -> tuple[float, list]:
    """Seconds to generate every prompt on a server of ``slots`` slots (as many requests at once), with each
    prompt's output tokens; the server's start is not timed."""
    flags = ["-np", str(slots), "-c", str(N_CTX * slots)] if slots > 1 else []
    with LlamaServerProcess(binary, model, threads=threads, n_ctx=N_CTX, flags=flags) as server:
        ids = [server.client.tokenize(server.client.chat_prompt(p.messages)) for p in prompts]
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=slots) as pool:
            completions = list(pool.map(lambda i: server.client.complete(i, n_predict), ids))
        seconds = time.perf_counter() - started
    return seconds, [list(c.tokens) for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(
        settings.llama_server,
        settings.resolved_data_dir() / "cache",
        build_cache=settings.resolved_build_cache(),
    ).path
    model = gguf_file(parse_spec("builtin:smollm2-135m-instruct"))
    prompts = sample_prompts(args.per_task)
    machine = f"{cpu_model_name()}, {os.cpu_count()} CPUs"
    print(
        f"{len(prompts)} prompts, {args.n_predict} new tokens, {args.threads} threads, {machine}", flush=True
    )
    seconds: dict[str, list[float]] = {"1 slot": [], f"{args.slots} slots": []}
    differing = []
    for repeat in range(args.repeats):
        arms = [1, args.slots] if repeat % 2 == 0 else [args.slots, 1]
        outputs = {}
        for slots in arms:
            took, outputs[slots] = generate(binary, model, args.threads, slots, prompts, args.n_predict)
            seconds["1 slot" if slots == 1 else f"{args.slots} slots"].append(took)
            print(f"repeat {repeat + 1}/{args.repeats}: {slots} slot(s) {took:.1f} s", flush=True)
        differing.append(sum(a != b for a, b in zip(outputs[1], outputs[args.slots])))
        print(f"  outputs that differ from one slot's: {differing[-1]} of {len(prompts)}", flush=True)
    medians = {arm: float(np.median(values)) for arm, values in seconds.items()}
    result = {
        "machine": machine,
        "threads": args.threads,
        "prompts": len(prompts),
        "n_predict": args.n_predict,
        "slots": args.slots,
        "seconds": seconds,
        "medians": medians,
        "differing_outputs": differing,
        "command": f"python benchmarks/parallel_slots.py --per-task {args.per_task} --n-predict {args.n_predict} "
        f"--slots {args.slots} --repeats {args.repeats}",
    }
    out = HERE / "results" / "parallel_slots.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    print(f"rewrote {write_readme()}")


if __name__ == "__main__":
    main()
