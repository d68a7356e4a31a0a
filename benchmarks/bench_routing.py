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

With ``--drafter pair`` the same comparison runs with a real model draft: Qwen2.5-Coder-0.5B-Instruct
drafting for -1.5B-Instruct (GGUF Q4_K_M, assembled by ``benchmarks/real_pair.py``, this benchmark's
setup step; never by tests or CI). The analysis then covers ``--analysis-per-task`` sample prompts of
each task type (a 1.5B target on two CPU cores generates ~3.5 tokens/s), mode (b) is transformers'
own assisted-generation defaults (the draft's generation config untouched: 20 assistant tokens,
confidence-threshold early stop) and (c)/(d) draft with the 0.5B model at the analysed gamma.

With ``--engine llama.cpp`` the policies come from a llama.cpp analysis of the sample (the GGUF run
quantized as shipped) and the workload is served by ``python -m llama_cpp.server`` pools, plain and
prompt-lookup, since llama.cpp fixes speculation per server: off, always-on and routed choose pools
(benchmarks/llamacpp_routing.py; its docstring says how they are timed).

    python benchmarks/bench_routing.py --out benchmarks/results/routing.json
    python benchmarks/bench_routing.py --engine llama.cpp --out benchmarks/results/routing_llamacpp.json
    python benchmarks/bench_routing.py --drafter pair --per-task 2 --max-new-tokens 48 --max-chars 2000 \
        --out benchmarks/results/routing_pair.json
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import migrations  # noqa: E402
from analyzer.advice.report import build_report  # noqa: E402
from analyzer.analysis.run_records import RunParams, create_run  # noqa: E402
from analyzer.analysis.runs import execute_run  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.measuring.prompt_encoding import context_limit, encode_prompt  # noqa: E402
from analyzer.measuring.validate import (  # noqa: E402
    _clean_generation_config,
    _generate,
    assisted_generate,
    greedy_generate,
)
from analyzer.models.loading import load_model
from analyzer.models.specs import parse_spec  # noqa: E402
from analyzer.prompts.ingest import parse_prompt_file  # noqa: E402
from analyzer.prompts.prompt_checks import prompt_text  # noqa: E402
from analyzer.prompts.prompt_sets import import_prompt_file, import_sample, sample_bytes  # noqa: E402
from benchmarks.llamacpp_routing import run_llamacpp_modes, summarize_llamacpp  # noqa: E402
from router.classify.training import train_classifier  # noqa: E402
from router.classify.training_data import cold_start_data, make_training_data  # noqa: E402
from router.client import RouterClient, generate_routed  # noqa: E402
from router.policies.policy import publish_policies  # noqa: E402

TARGET = "builtin:smollm2-135m-instruct"
MODES = ("a: off", "b: always, transformers defaults", "c: always, workload gamma", "d: routed")


def pair_setup(folder: Path | None) -> tuple[str, str]:
    """(target spec, draft spec) of the real pair, assembling its files first if needed."""
    from real_pair import DEFAULT_FOLDER, pair_specs

    return pair_specs(folder or DEFAULT_FOLDER)


def transformers_default_assisted(model, draft, ids: list[int], max_new_tokens: int) -> list[int]:
    """Assisted generation as a user who only passes ``assistant_model=`` gets it: the draft's own
    generation config, so transformers' defaults for the lookahead and its early stop apply."""
    config = _clean_generation_config(model, None, max_new_tokens=max_new_tokens)
    return _generate(model, ids, config, assistant_model=draft)[0]


def sample_subset(per_task: int) -> bytes:
    """The first ``per_task`` bundled sample prompts of every task type, as JSONL."""
    lines = [line for line in sample_bytes().decode().splitlines() if line.strip()]
    taken: dict[str, int] = collections.Counter()
    kept = []
    for line in lines:
        task = json.loads(line).get("task")
        if taken[task] < per_task:
            taken[task] += 1
            kept.append(line)
    return ("\n".join(kept) + "\n").encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def held_out_prompts(per_task: int, seed: int, max_chars: int = 4000) -> list[dict]:
    """Corpus prompts that are not in the bundled sample, ``per_task`` per task type."""
    from importlib import resources

    sample = {
        prompt_text(p.text, p.messages) for p in parse_prompt_file(sample_bytes(), "sample.jsonl").prompts
    }
    corpus = parse_prompt_file(
        resources.files("router.data").joinpath("corpus.jsonl").read_bytes(), "corpus.jsonl"
    ).prompts
    by_task = collections.defaultdict(list)
    for p in corpus:
        text = prompt_text(p.text, p.messages)
        if text not in sample and len(text) <= max_chars:
            by_task[p.task].append({"text": p.text, "messages": p.messages, "task": p.task, "key": text})
    rng = random.Random(seed)
    chosen = []
    for task in sorted(by_task):
        rng.shuffle(by_task[task])
        chosen += by_task[task][:per_task]
    rng.shuffle(chosen)
    return chosen


def prepare(url: str, held_out: list[dict], args, cache_dir: Path, target: str, draft: str) -> int:
    engine = make_engine(url)
    migrations.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        if args.analysis_per_task:
            import_prompt_file(session, "sample", sample_subset(args.analysis_per_task), "sample.jsonl")
        else:
            import_sample(session)
        run_id = create_run(
            session,
            "sample",
            target,
            draft,
            RunParams(
                engine=args.engine, max_new_tokens=args.max_new_tokens, gamma_max=args.gamma_max, validate=0
            ),
        ).id
    started = time.perf_counter()
    execute_run(
        sessions,
        run_id,
        cache_dir=cache_dir,
        progress=lambda d, t, phase: print(f"\r  analysis: {phase} {d}/{t}   ", end="", file=sys.stderr),
    )
    print(f"\n  analysis of the sample took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    excluded = {p["key"] for p in held_out}
    corpus = cold_start_data()
    kept = [
        (t, label, g) for t, label, g in zip(corpus.texts, corpus.labels, corpus.groups) if t not in excluded
    ]
    with sessions() as session, session.begin():
        version = train_classifier(
            session,
            make_training_data(
                [t for t, _, _ in kept],
                [label for _, label, _ in kept],
                "bundled corpus minus the held-out prompts",
                [g for _, _, g in kept],
            ),
        )
        print(
            f"  classifier v{version.version}: macro-F1 {version.scores['macro_f1']:.3f} stratified, "
            f"{version.scores['grouped']['macro_f1']:.3f} leave-one-source-out, routing threshold "
            f"{version.scores['calibration']['threshold']:.2f} ({len(kept)} prompts)",
            file=sys.stderr,
        )
        publish_policies(session, run_id)
        report = build_report(session, run_id)
    engine.dispose()
    return int(report["workload"]["best_gamma"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, default=6, help="held-out prompts per task type (13 types)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--engine",
        choices=("transformers", "llama.cpp"),
        default="transformers",
        help="what analyzes the sample and serves the workload (llama.cpp: pools of llama_cpp.server)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of each llama.cpp pool (default: every core, as the llama.cpp analysis uses)",
    )
    parser.add_argument(
        "--drafter",
        choices=("ngram", "pair"),
        default="ngram",
        help="ngram: SmolLM2-135M with prompt lookup; pair: Qwen2.5-Coder 0.5B drafting for 1.5B",
    )
    parser.add_argument(
        "--pair-folder",
        type=Path,
        default=None,
        help="where benchmarks/real_pair.py keeps the Qwen2.5-Coder GGUF files (default: its own)",
    )
    parser.add_argument(
        "--analysis-per-task",
        type=int,
        default=None,
        help="analyze only this many sample prompts per task type (default: all; 2 with --drafter pair)",
    )
    parser.add_argument("--gamma-max", type=int, default=None, help="default 16 (ngram), 8 (pair)")
    parser.add_argument("--max-chars", type=int, default=4000, help="longest held-out prompt, in characters")
    parser.add_argument(
        "--tasks", default=None, help="comma-separated task types of the workload (default: all)"
    )
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "specroute-bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.engine == "llama.cpp" and args.drafter != "ngram":
        parser.error(
            "--engine llama.cpp serves prompt lookup only (llama-cpp-python's server drafts with "
            "prompt-lookup-decoding, not a draft model): use --drafter ngram"
        )
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    cache_dir = Path(args.cache_dir)
    if args.drafter == "pair":
        target_spec, draft_spec = pair_setup(args.pair_folder)
        args.analysis_per_task = 2 if args.analysis_per_task is None else args.analysis_per_task
    else:
        target_spec, draft_spec = TARGET, "ngram"
    args.gamma_max = args.gamma_max or (8 if args.drafter == "pair" else 16)
    folder = tempfile.mkdtemp(prefix="specroute-routing-")
    url = f"sqlite:///{folder}/routing.db"
    held_out = held_out_prompts(args.per_task, args.seed, args.max_chars)
    if args.tasks:
        held_out = [p for p in held_out if p["task"] in args.tasks.split(",")]
    print(
        f"{len(held_out)} held-out prompts over {len({p['task'] for p in held_out})} task types",
        file=sys.stderr,
    )
    workload_gamma = prepare(url, held_out, args, cache_dir, target_spec, draft_spec)
    if args.engine == "llama.cpp":
        rows = run_llamacpp_modes(url, target_spec, held_out, workload_gamma, args)
        summarize_llamacpp(rows, workload_gamma, args)
        from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

        write_readme()
        return
    port = free_port()
    env = {
        **os.environ,
        "SPECROUTE_DATABASE_URL": url,
        "SPECROUTE_DATA_DIR": folder,
        "OMP_NUM_THREADS": "1",
        "SPECROUTE_UI_WORKER": "false",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "webui.cli", "serve", "--port", str(port), "--threads", "2"],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = RouterClient(f"http://127.0.0.1:{port}", timeout_s=10)
    for _ in range(120):
        try:
            client.health()
            break
        except Exception:
            time.sleep(0.5)
    loaded = load_model(parse_spec(target_spec), cache_dir=cache_dir)
    model, tokenizer = loaded.model, loaded.tokenizer
    draft = None if draft_spec == "ngram" else load_model(parse_spec(draft_spec), cache_dir=cache_dir).model
    room = context_limit(model) - args.max_new_tokens
    rows = []
    try:
        for number, prompt in enumerate(held_out, start=1):
            ids = encode_prompt(
                tokenizer, text=prompt["text"], messages=prompt["messages"], max_prompt_tokens=room
            ).ids
            source = prompt["messages"] if prompt["messages"] else prompt["text"]
            drafting = {"draft_model": draft} if draft is not None else {"ngram_max": 2}
            runs = {
                MODES[0]: lambda: (greedy_generate(model, ids, args.max_new_tokens)[0], None),
                MODES[1]: lambda: (
                    transformers_default_assisted(model, draft, ids, args.max_new_tokens)
                    if draft is not None
                    else assisted_generate(model, ids, args.max_new_tokens, gamma=10, ngram_max=2)[0],
                    None,
                ),
                MODES[2]: lambda: (
                    assisted_generate(model, ids, args.max_new_tokens, gamma=workload_gamma, **drafting)[0],
                    None,
                ),
                MODES[3]: lambda: (lambda r: (r.output_ids, r.decision.to_data()))(
                    generate_routed(
                        model,
                        tokenizer,
                        source,
                        router=client,
                        draft=draft,
                        max_new_tokens=args.max_new_tokens,
                    )
                ),
            }
            order = list(MODES[number % 4 :] + MODES[: number % 4])
            times, outputs, decision = {}, {}, None
            for mode in order:
                start = time.perf_counter()
                output, made = runs[mode]()
                times[mode] = time.perf_counter() - start
                outputs[mode] = output
                decision = made or decision
            identical = all(outputs[m] == outputs[MODES[0]] for m in MODES)
            rows.append(
                {
                    "task": prompt["task"],
                    "tokens": len(outputs[MODES[0]]),
                    "times": times,
                    "identical": identical,
                    "routed_task": decision["task_type"],
                    "speculate": decision["speculate"],
                    "gamma": decision["gamma"],
                }
            )
            print(
                f"[{number}/{len(held_out)}] {prompt['task']:<18} routed as {decision['task_type']:<18} "
                f"{'g=' + str(decision['gamma']) if decision['speculate'] else 'off':<5} "
                + " ".join(f"{m[0]}={times[m]:.2f}s" for m in MODES)
                + ("" if identical else "  OUTPUTS DIFFER"),
                file=sys.stderr,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    summarize(rows, workload_gamma, args)
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


def summarize(rows: list[dict], workload_gamma: int, args) -> None:
    tasks = sorted({r["task"] for r in rows})
    print(
        f"\ndrafter {args.drafter}; threads {torch.get_num_threads()}; {len(rows)} held-out prompts, "
        f"{args.max_new_tokens} new tokens max; "
        f"mode (c) gamma = {workload_gamma}; "
        f"outputs identical in all modes: {sum(r['identical'] for r in rows)}/{len(rows)}; "
        f"classifier right on {sum(r['routed_task'] == r['task'] for r in rows)}/{len(rows)}"
    )
    header = (
        ["task", "n"]
        + [f"{m} tok/s" for m in MODES]
        + ["d/a", "d/b", "d/c", "regret a", "regret b", "regret c", "regret d", "spec'd"]
    )
    print(" | ".join(header))
    table = {}
    for task in tasks + ["overall"]:
        group = [r for r in rows if task == "overall" or r["task"] == task]
        tokens = sum(r["tokens"] for r in group)
        speed = {m: tokens / sum(r["times"][m] for r in group) for m in MODES}
        oracle = sum(min(r["times"].values()) for r in group)
        regret = {m: sum(r["times"][m] for r in group) / oracle - 1 for m in MODES}
        table[task] = {
            "n": len(group),
            "tokens_per_s": speed,
            "regret": regret,
            "speculated": sum(r["speculate"] for r in group),
        }
        print(
            " | ".join(
                [task, str(len(group))]
                + [f"{speed[m]:.2f}" for m in MODES]
                + [f"{speed[MODES[3]] / speed[MODES[i]]:.3f}" for i in range(3)]
                + [f"{100 * regret[m]:.1f}%" for m in MODES]
                + [str(table[task]["speculated"])]
            )
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "workload_gamma": workload_gamma,
                    "rows": rows,
                    "table": table,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
