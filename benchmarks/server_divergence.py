"""How often a speculating llama-server's greedy output leaves plain greedy's, and with which flash-attention
setting: what is guaranteed where outputs diverge.

For each ``-fa`` value, one plain server and one ``ngram-simple 2/4`` server (both otherwise as the analysis
starts them: one slot, the given threads, context 4096) complete the same prompts of ``cost_transfer.py``'s
workloads greedily; printed per value: how many outputs are equal, and the first token where each differs.
Nothing is timed, so it may run beside other work.

    python benchmarks/server_divergence.py --workload long --prompts 10
"""

from __future__ import annotations

import argparse

from cost_transfer import long_prompts, unseen_prompts

from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_process import LlamaServerProcess
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.devices import cpu_model_name
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two outputs differ (the shorter one's end if one is a prefix), or None."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("unseen", "long"), default="long")
    parser.add_argument("--prompts", type=int, default=10, help="the workload's first N prompts")
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", default="ngram-simple 2/4")
    parser.add_argument("--fa", action="append", help="-fa values to compare (default: on, off)")
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(settings.llama_server, settings.resolved_data_dir() / "cache").path
    model = gguf_file(parse_spec("builtin:smollm2-135m-instruct"))
    prompts = (long_prompts() if args.workload == "long" else unseen_prompts(8))[: args.prompts]
    drafter = parse_drafter(args.drafter)
    print(
        f"{args.workload}: first {len(prompts)} prompts, {args.n_predict} new tokens, {args.drafter}, "
        f"{args.threads} threads, on {cpu_model_name()}; llama-server {binary}"
    )
    print("| -fa | outputs equal to plain greedy | first differing token per prompt |\n|---|---|---|")
    for fa in args.fa or ["on", "off"]:
        outputs: dict[str, list[list[int]]] = {}
        for name, flags in (("plain", []), ("speculating", drafter.server_flags())):
            with LlamaServerProcess(
                binary, model, threads=args.threads, n_ctx=4096, flags=[*flags, "-fa", fa]
            ) as server:
                client = server.client
                outputs[name] = [
                    client.complete(client.tokenize(client.chat_prompt(p.messages)), args.n_predict).tokens
                    for p in prompts
                ]
        firsts = [
            first_difference(a, b) for a, b in zip(outputs["plain"], outputs["speculating"], strict=True)
        ]
        equal = sum(1 for f in firsts if f is None)
        cells = ", ".join("=" if f is None else str(f) for f in firsts)
        print(f"| {fa} | {equal} / {len(prompts)} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
