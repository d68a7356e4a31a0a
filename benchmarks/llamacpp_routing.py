"""``bench_routing.py --engine llama.cpp``: routed vs always-on vs off on llama.cpp serving pools.

llama.cpp servers fix speculation per server, so the three modes are three ways of choosing a pool
(``python -m llama_cpp.server``, :mod:`benchmarks.llamacpp_pools`), all greedy, for each held-out prompt:
  off        the plain pool ``spec-off``;
  always-on  the prompt-lookup pool at the workload's best gamma (4 where the analysis found none);
  routed     the in-process router (``router_from_database`` over the llama.cpp analysis' published
             policies and the trained classifier) decides, and the request goes to the pool its decision
             names (``spec-off`` / ``spec-k<gamma>``, the router's default names; a pool runs for every
             gamma a policy can name, so that probes find one too). The decision's time is counted.
The modes take turns first from prompt to prompt, and every timed request follows an untimed one that
empties the pool's prompt cache (the server reuses the longest common prefix of the last request, so a
prompt sent twice would skip its prefill). llama-cpp-python's server reports neither timings nor
drafted/accepted counts: times are the client's wall time per request, and no feedback is posted.
Reported: tokens/s per task and overall (completion tokens / wall time), routed/off and routed/always-on,
regret against the per-prompt oracle (the faster of off and always-on), and how many outputs differ
between the pools (batched verification in llama.cpp's quantized kernels can flip near-ties).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from analyzer.db import make_engine, make_session_factory
from analyzer.engine.llamacpp_engine import default_threads, gguf_file, load_tokenizer
from analyzer.measuring.prompt_encoding import encode_prompt
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings
from benchmarks.llamacpp_pools import complete, decision_pool, evict_prompt_cache, pool_name, running_pools
from router.decide.decision import RouterConfig, router_from_database

MODES = ("off", "always-on", "routed")
FALLBACK_GAMMA = 4  # always-on's gamma where the analysis chose none
CONTEXT_TOKENS = 2048  # each pool's llama.cpp context
LOOKAHEAD_SLACK = 32  # positions kept free beyond prompt + budget for the drafted tokens


def _router(url: str):
    """The in-process router over the database's active policy set and classifier, pools under the
    router's default names (spec-off, spec-k<gamma>) whatever SPECROUTE_ROUTER_POOLS says."""
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            config = dataclasses.replace(RouterConfig.from_settings(load_settings()), pools={})
            return router_from_database(session, config)
    finally:
        engine.dispose()


def pool_gammas(router, always_gamma: int) -> list[int]:
    """Every gamma a pool must serve: always-on's, and each policy's (a policy that does not speculate
    keeps a gamma that a probe would use, at least 1)."""
    policies = list(router.policies.values()) + ([router.fallback] if router.fallback is not None else [])
    return sorted(
        {always_gamma} | {max(1, p.gamma) for p in policies} | {s.gamma for s in router.states.values()}
    )


def _templated_prompts(held_out: list[dict], tokenizer, max_new_tokens: int) -> list[tuple[str, int]]:
    """(text, token count) of each prompt as the analysis encodes it (chat template, truncated to fit the
    pool's context): the server's completions endpoint takes text, which it tokenizes with special tokens."""
    room = CONTEXT_TOKENS - max_new_tokens - LOOKAHEAD_SLACK
    texts = []
    for prompt in held_out:
        ids = encode_prompt(
            tokenizer, text=prompt["text"], messages=prompt["messages"], max_prompt_tokens=room
        ).ids
        texts.append((tokenizer.decode(ids, skip_special_tokens=False), len(ids)))
    return texts


def run_llamacpp_modes(
    url: str, target_spec: str, held_out: list[dict], workload_gamma: int, args
) -> list[dict]:
    """Send every held-out prompt to the pools serving ``target_spec`` (a GGUF) in the three modes; one
    row per prompt (see the module docstring). ``url``: the database holding the published llama.cpp
    policies and the classifier."""
    threads = args.threads or default_threads()
    always_gamma = workload_gamma or FALLBACK_GAMMA
    router = _router(url)
    ref = parse_spec(target_spec)
    prompts = _templated_prompts(held_out, load_tokenizer(ref, Path(args.cache_dir)), args.max_new_tokens)
    gammas = {"spec-off": None, **{f"spec-k{g}": g for g in pool_gammas(router, always_gamma)}}
    print(
        f"  starting {len(gammas)} llama.cpp pools ({', '.join(gammas)}), {threads} threads each",
        file=sys.stderr,
    )
    rows = []
    with running_pools(gguf_file(ref), gammas, n_threads=threads, n_ctx=CONTEXT_TOKENS) as pools:
        for (
            pool
        ) in pools.values():  # first requests of a fresh server are slower (pages of the mmapped model)
            complete(pool.url, prompts[0][0], 8)
        for number, (prompt, (text, n_ids)) in enumerate(zip(held_out, prompts), start=1):
            order = MODES[number % 3 :] + MODES[: number % 3]
            answers, decision = {}, None
            for mode in order:
                started = time.perf_counter()
                if mode == "routed":
                    decision = router.route(
                        prompt=prompt["text"], messages=prompt["messages"], max_new_tokens=args.max_new_tokens
                    ).to_data()
                    target = pools.get(decision_pool(decision))
                    if target is None:
                        raise RuntimeError(
                            f"the router named pool {decision_pool(decision)!r}, which is not running "
                            f"(running: {', '.join(pools)})"
                        )
                else:
                    target = pools["spec-off" if mode == "off" else f"spec-k{always_gamma}"]
                routing_s = time.perf_counter() - started
                evict_prompt_cache(target.url)
                answer = complete(target.url, text, args.max_new_tokens)
                if pool_name(answer.model) != target.name:
                    raise RuntimeError(
                        f"{mode}: sent to pool {target.name} but {pool_name(answer.model)} answered"
                    )
                answers[mode] = (answer, routing_s, target.name)
            off, always, routed = (answers[m][0] for m in MODES)
            rows.append(
                {
                    "task": prompt["task"],
                    "prompt_tokens": n_ids,
                    "server_prompt_tokens": off.prompt_tokens,
                    "tokens": {m: answers[m][0].completion_tokens for m in MODES},
                    "times": {m: answers[m][0].wall_s + answers[m][1] for m in MODES},
                    "pools": {m: answers[m][2] for m in MODES},
                    "pools_agree": off.text == always.text,
                    "routed_matches_off": routed.text == off.text,
                    "routed_task": decision["task_type"],
                    "speculate": decision["speculate"],
                    "gamma": decision["gamma"],
                }
            )
            if off.text != always.text:  # kept for a look at where batched verification departed
                rows[-1]["texts"] = {"off": off.text, "always-on": always.text}
            row = rows[-1]
            print(
                f"[{number}/{len(held_out)}] {prompt['task']:<18} routed as {decision['task_type']:<18} "
                f"{'g=' + str(decision['gamma']) if decision['speculate'] else 'off':<5} "
                + " ".join(f"{m}={row['times'][m]:.2f}s" for m in MODES)
                + ("" if row["pools_agree"] else "  POOLS' OUTPUTS DIFFER"),
                file=sys.stderr,
            )
    return rows


def summarize_llamacpp(rows: list[dict], workload_gamma: int, args) -> dict:
    """Print the table (tokens/s, ratios, regret per task and overall) and return it."""
    threads = args.threads or default_threads()
    always_gamma = workload_gamma or FALLBACK_GAMMA
    tasks = sorted({r["task"] for r in rows})
    differ = sum(not r["pools_agree"] for r in rows)
    retokenized = sum(r["server_prompt_tokens"] != r["prompt_tokens"] for r in rows)
    print(
        f"\nengine llama.cpp (llama-cpp-python server, {threads} threads per pool); {len(rows)} held-out prompts, "
        f"{args.max_new_tokens} new tokens max; always-on gamma {always_gamma}"
        f"{'' if workload_gamma else ' (the analysis chose none)'}; outputs of off and always-on differ on "
        f"{differ}/{len(rows)}; routed and off differ on "
        f"{sum(not r['routed_matches_off'] for r in rows)}/{len(rows)}; classifier right on "
        f"{sum(r['routed_task'] == r['task'] for r in rows)}/{len(rows)}; server's prompt token count differs from "
        f"the analysis' on {retokenized}/{len(rows)}"
    )
    header = (
        ["task", "n"]
        + [f"{m} tok/s" for m in MODES]
        + ["routed/off", "routed/always", "regret off", "regret always", "regret routed", "spec'd"]
    )
    print(" | ".join(header))
    table = {}
    for task in tasks + ["overall"]:
        group = [r for r in rows if task == "overall" or r["task"] == task]
        seconds = {m: sum(r["times"][m] for r in group) for m in MODES}
        speed = {m: sum(r["tokens"][m] for r in group) / seconds[m] for m in MODES}
        oracle = sum(min(r["times"]["off"], r["times"]["always-on"]) for r in group)
        regret = {m: seconds[m] / oracle - 1 for m in MODES}
        table[task] = {
            "n": len(group),
            "tokens_per_s": speed,
            "regret": regret,
            "routed_over_off": speed["routed"] / speed["off"],
            "routed_over_always": speed["routed"] / speed["always-on"],
            "speculated": sum(r["speculate"] for r in group),
            "pools_differ": sum(not r["pools_agree"] for r in group),
        }
        print(
            " | ".join(
                [task, str(len(group))]
                + [f"{speed[m]:.2f}" for m in MODES]
                + [f"{table[task]['routed_over_off']:.3f}", f"{table[task]['routed_over_always']:.3f}"]
                + [f"{100 * regret[m]:.1f}%" for m in MODES]
                + [str(table[task]["speculated"])]
            )
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "engine": "llama.cpp",
                    "workload_gamma": workload_gamma,
                    "always_gamma": always_gamma,
                    "threads": threads,
                    "rows": rows,
                    "table": table,
                },
                indent=1,
            )
        )
    return table
