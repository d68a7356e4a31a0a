"""End-to-end: does routing pay on real generation? Routed vs always-on vs off.

1. Policies: the bundled sample prompts are analyzed with the embedded SmolLM2-135M-Instruct target
   and n-gram drafting (as ``specroute demo`` does) and published; the task classifier is trained on
   the bundled corpus minus the held-out prompts.
2. Workload: held-out corpus prompts (not in the sample set, not in the classifier's training data),
   ``--per-task`` of each task type, shuffled.
3. Every prompt is generated greedily with transformers in four modes, in a rotating order:
   (a) no speculation; (b) always on with transformers' documented prompt-lookup setting
   (prompt_lookup_num_tokens=10, max_matching_ngram_size=2); (c) always on at the one gamma the
   whole-workload analysis chose; (d) routed: ``generate_routed`` asks the running HTTP API
   (``specroute serve`` in another process) and posts feedback after each generation.
   All four outputs must be identical. Reported: tokens/s per task type and overall (total new
   tokens / total time), the ratios of (d) to (a), (b) and (c), and the regret of each mode against
   the per-prompt oracle (the fastest mode for that prompt).

    python benchmarks/bench_routing.py --out benchmarks/results/routing.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import migrations  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.ingest import parse_prompt_file  # noqa: E402
from analyzer.loading import context_limit, encode_prompt, load_model, parse_spec  # noqa: E402
from analyzer.prompt_sets import import_sample, sample_bytes  # noqa: E402
from analyzer.report import build_report  # noqa: E402
from analyzer.runs import RunParams, create_run, execute_run  # noqa: E402
from analyzer.validate import assisted_generate, greedy_generate  # noqa: E402
from router.classifier import cold_start_data, make_training_data, train_classifier  # noqa: E402
from router.client import RouterClient, generate_routed  # noqa: E402
from router.features import prompt_text  # noqa: E402
from router.policy import publish_policies  # noqa: E402

TARGET = "builtin:smollm2-135m-instruct"
MODES = ("a: off", "b: always, transformers defaults", "c: always, workload gamma", "d: routed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def held_out_prompts(per_task: int, seed: int) -> list[dict]:
    """Corpus prompts that are not in the bundled sample, ``per_task`` per task type."""
    from importlib import resources

    sample = {prompt_text(p.text, p.messages) for p in parse_prompt_file(sample_bytes(), "sample.jsonl").prompts}
    corpus = parse_prompt_file(resources.files("router.data").joinpath("corpus.jsonl").read_bytes(), "corpus.jsonl").prompts
    by_task = collections.defaultdict(list)
    for p in corpus:
        text = prompt_text(p.text, p.messages)
        if text not in sample and len(text) <= 4000:
            by_task[p.task].append({"text": p.text, "messages": p.messages, "task": p.task, "key": text})
    rng = random.Random(seed)
    chosen = []
    for task in sorted(by_task):
        rng.shuffle(by_task[task])
        chosen += by_task[task][:per_task]
    rng.shuffle(chosen)
    return chosen


def prepare(url: str, held_out: list[dict], args, cache_dir: Path) -> int:
    engine = make_engine(url)
    migrations.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        import_sample(session)
        run_id = create_run(session, "sample", TARGET, "ngram",
                            RunParams(max_new_tokens=args.max_new_tokens, gamma_max=16, validate=0)).id
    started = time.perf_counter()
    execute_run(sessions, run_id, cache_dir=cache_dir,
                progress=lambda d, t, phase: print(f"\r  analysis: {phase} {d}/{t}   ", end="", file=sys.stderr))
    print(f"\n  analysis of the sample took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    excluded = {p["key"] for p in held_out}
    corpus = cold_start_data()
    kept = [(t, l) for t, l in zip(corpus.texts, corpus.labels) if t not in excluded]
    with sessions() as session, session.begin():
        version = train_classifier(session, make_training_data([t for t, _ in kept], [l for _, l in kept],
                                                               "bundled corpus minus the held-out prompts"))
        print(f"  classifier v{version.version}: macro-F1 {version.scores['macro_f1']:.3f} "
              f"(cross-validated, {len(kept)} prompts)", file=sys.stderr)
        publish_policies(session, run_id)
        report = build_report(session, run_id)
    engine.dispose()
    return int(report["workload"]["best_gamma"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, default=6, help="held-out prompts per task type (13 types)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "specroute-bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    cache_dir = Path(args.cache_dir)
    folder = tempfile.mkdtemp(prefix="specroute-routing-")
    url = f"sqlite:///{folder}/routing.db"
    held_out = held_out_prompts(args.per_task, args.seed)
    print(f"{len(held_out)} held-out prompts over {len({p['task'] for p in held_out})} task types", file=sys.stderr)
    workload_gamma = prepare(url, held_out, args, cache_dir)
    port = free_port()
    env = {**os.environ, "SPECROUTE_DATABASE_URL": url, "SPECROUTE_DATA_DIR": folder, "OMP_NUM_THREADS": "1",
           "SPECROUTE_UI_WORKER": "false"}
    server = subprocess.Popen([sys.executable, "-m", "webui.cli", "serve", "--port", str(port), "--threads", "2"],
                              env=env, cwd=Path(__file__).resolve().parent.parent,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = RouterClient(f"http://127.0.0.1:{port}", timeout_s=10)
    for _ in range(120):
        try:
            client.health()
            break
        except Exception:
            time.sleep(0.5)
    loaded = load_model(parse_spec(TARGET), cache_dir=cache_dir)
    model, tokenizer = loaded.model, loaded.tokenizer
    room = context_limit(model) - args.max_new_tokens
    rows = []
    try:
        for number, prompt in enumerate(held_out, start=1):
            ids = encode_prompt(tokenizer, text=prompt["text"], messages=prompt["messages"], max_prompt_tokens=room).ids
            source = prompt["messages"] if prompt["messages"] else prompt["text"]
            runs = {
                MODES[0]: lambda: (greedy_generate(model, ids, args.max_new_tokens)[0], None),
                MODES[1]: lambda: (assisted_generate(model, ids, args.max_new_tokens, gamma=10, ngram_max=2)[0], None),
                MODES[2]: lambda: (assisted_generate(model, ids, args.max_new_tokens, gamma=workload_gamma, ngram_max=2)[0], None),
                MODES[3]: lambda: (lambda r: (r.output_ids, r.decision))(
                    generate_routed(model, tokenizer, source, router=client, max_new_tokens=args.max_new_tokens)),
            }
            order = list(MODES[number % 4:] + MODES[:number % 4])
            times, outputs, decision = {}, {}, None
            for mode in order:
                start = time.perf_counter()
                output, made = runs[mode]()
                times[mode] = time.perf_counter() - start
                outputs[mode] = output
                decision = made or decision
            identical = all(outputs[m] == outputs[MODES[0]] for m in MODES)
            rows.append({"task": prompt["task"], "tokens": len(outputs[MODES[0]]), "times": times, "identical": identical,
                         "routed_task": decision["task_type"], "speculate": decision["speculate"], "gamma": decision["gamma"]})
            print(f"[{number}/{len(held_out)}] {prompt['task']:<18} routed as {decision['task_type']:<18} "
                  f"{'g=' + str(decision['gamma']) if decision['speculate'] else 'off':<5} "
                  + " ".join(f"{m[0]}={times[m]:.2f}s" for m in MODES) + ("" if identical else "  OUTPUTS DIFFER"),
                  file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)
    summarize(rows, workload_gamma, args)


def summarize(rows: list[dict], workload_gamma: int, args) -> None:
    tasks = sorted({r["task"] for r in rows})
    print(f"\nthreads {torch.get_num_threads()}; {len(rows)} held-out prompts, {args.max_new_tokens} new tokens max; "
          f"mode (c) gamma = {workload_gamma}; outputs identical in all modes: {sum(r['identical'] for r in rows)}/{len(rows)}; "
          f"classifier right on {sum(r['routed_task'] == r['task'] for r in rows)}/{len(rows)}")
    header = ["task", "n"] + [f"{m} tok/s" for m in MODES] + ["d/a", "d/b", "d/c", "regret a", "regret b", "regret c", "regret d", "spec'd"]
    print(" | ".join(header))
    table = {}
    for task in tasks + ["overall"]:
        group = [r for r in rows if task == "overall" or r["task"] == task]
        tokens = sum(r["tokens"] for r in group)
        speed = {m: tokens / sum(r["times"][m] for r in group) for m in MODES}
        oracle = sum(min(r["times"].values()) for r in group)
        regret = {m: sum(r["times"][m] for r in group) / oracle - 1 for m in MODES}
        table[task] = {"n": len(group), "tokens_per_s": speed, "regret": regret,
                       "speculated": sum(r["speculate"] for r in group)}
        print(" | ".join([task, str(len(group))] + [f"{speed[m]:.2f}" for m in MODES]
                         + [f"{speed[MODES[3]] / speed[MODES[i]]:.3f}" for i in range(3)]
                         + [f"{100 * regret[m]:.1f}%" for m in MODES] + [str(table[task]["speculated"])]))
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "workload_gamma": workload_gamma,
                                        "rows": rows, "table": table}, indent=1))


if __name__ == "__main__":
    main()
