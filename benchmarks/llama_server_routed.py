"""Routed through specroute against every static choice, end to end in llama-server.

A user's path: analyze a labelled sample in llama-server (`analyze_in_llama_server`, no validation), publish
the policy set (a drafter setting per task), train the task classifier on the user's other labelled prompts,
start the set's pools (`start_pools`, as `specroute pools start`), and send held-out prompts to specroute's
own front door (`POST /v1/chat/completions`), which classifies, decides and forwards each to a pool.

Every held-out prompt also runs, interleaved with its routed request, on a separate plain server and on one
server per setting (the static choices): separate so that ngram-mod's table, which persists in a server, sees
each prompt once, and all of them start afresh every round (a prompt an ngram-mod server saw answered
drafts its whole answer the next time). The order of the choices rotates from prompt to prompt, and every prompt runs
``--rounds`` times on each; a prompt's figure is the median of its rounds. Each run is timed by its server's
own ``timings`` (time per step times the plain run's steps, so a run whose output left plain greedy is
compared token for token).

Workload, from ../shared/data/prompts (dev.jsonl and dev-extra.jsonl, prompts under 3,000 characters): per task
6 prompts analysed and 3 held out, in a seeded order, plus a code_edit group (arena-hard prompts that hand
over code to fix, modify or optimize). The classifier learns from every other prompt of those files, with the
code_edit ones labelled so.

    python benchmarks/llama_server_routed.py [--analysed 6] [--held-out 3] [--rounds 2] [--n-predict 64] [--threads 2]

Run it with nothing else on the machine; the figures are for the thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from analyzer.analysis.server_analysis import analyze_in_llama_server
from analyzer.analysis.server_generation import ServerSetup
from analyzer.analysis.server_store import server_prompts, store_server_analysis
from analyzer.db import make_engine, make_session_factory
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_pools import start_pools, stop_pools
from analyzer.engine.llama_server_process import LlamaServerProcess, free_port, server_version
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.specs import parse_spec
from analyzer.orm import PromptSet
from analyzer.prompts.prompt_sets import import_prompt_file
from analyzer.settings import load_settings

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"
CODE_EDIT = re.compile(r"\b(fix|refactor|modify|rewrite|improve|optimi[sz]e|change)\b", re.I)
DRAFTERS = ("ngram-simple", "ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod", "ngram-mod 16 8-32")
RESULTS = Path(__file__).resolve().parent / "results"


def _rows() -> list[dict]:
    """Every prompt of dev.jsonl and dev-extra.jsonl under 3,000 characters; the arena-hard code prompts that
    hand over code to change labelled code_edit."""
    rows = []
    for name in ("dev.jsonl", "dev-extra.jsonl"):
        rows += [json.loads(line) for line in (SHARED / name).read_text().splitlines()]
    rows = [r for r in rows if len(r["prompt"]) <= 3000]
    for row in rows:
        if (
            row["task"] == "code"
            and row["id"].startswith("arena-hard")
            and CODE_EDIT.search(row["prompt"])
            and len(row["prompt"]) > 300
        ):
            row["task"] = "code_edit"
    return rows


def split(
    rows: list[dict], analysed_per_task: int, held_per_task: int, seed: int = 0
) -> tuple[list, list, list]:
    """(analysed, held out, the classifier's training rows): per task ``analysed_per_task`` analysed and
    ``held_per_task`` held out in a seeded order, and every other row for training."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    analysed, held, counts = [], [], {}
    for row in order:
        seen = counts.get(row["task"], 0)
        counts[row["task"]] = seen + 1
        if seen < analysed_per_task:
            analysed.append(row)
        elif seen < analysed_per_task + held_per_task:
            held.append(row)
    used = {r["id"] for r in analysed + held}
    return analysed, held, [r for r in rows if r["id"] not in used]


def plan_key(plan, url: str | None) -> str:
    """The pool's key ("off" or a setting) for its URL."""
    return next((pool.key for pool in plan.pools if pool.url == url), str(url))


def chat(url: str, prompt: str, n_predict: int) -> tuple[dict, dict[str, str]]:
    """A greedy chat completion at ``url`` (a pool, or specroute's front door): the answer and its headers."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n_predict,
        "temperature": 0,
        "top_k": 1,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response), dict(response.headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--analysed", type=int, default=6, help="prompts per task analysed")
    parser.add_argument("--held-out", type=int, default=3, help="prompts per task held out and routed")
    parser.add_argument(
        "--rounds", type=int, default=2, help="times every held-out prompt runs on each choice"
    )
    parser.add_argument("--n-predict", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--threads", type=int, default=2, help="threads of each server")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    settings = load_settings()
    binary = find_llama_server(settings.llama_server, settings.resolved_data_dir() / "cache").path
    model = gguf_file(parse_spec("builtin:smollm2-135m-instruct"))
    analysed, held, training = split(_rows(), args.analysed, args.held_out)
    drafters = [parse_drafter(d) for d in DRAFTERS]
    folder = Path(tempfile.mkdtemp(prefix="specroute-routed-"))
    url = f"sqlite:///{folder / 'specroute.db'}"
    import migrations

    engine = make_engine(url)
    migrations.upgrade(engine)
    print(f"analysing {len(analysed)} prompts in llama-server ({args.threads} threads), {len(held)} held out, "
          f"{len(training)} to train the classifier", flush=True)  # fmt: skip
    lines = "".join(
        json.dumps({"id": r["id"], "prompt": r["prompt"], "task": r["task"]}) + "\n" for r in analysed
    )
    with make_session_factory(engine)() as session, session.begin():
        prompt_set, _ = import_prompt_file(session, "analysed", lines.encode(), "analysed.jsonl")
        set_id, prompts = prompt_set.id, server_prompts(prompt_set)
    started = time.perf_counter()
    analysis = analyze_in_llama_server(
        ServerSetup(binary, model, args.threads, 4096),
        sorted(prompts, key=lambda p: [q.key for q in prompts if q.task == p.task].index(p.key)),
        drafters,
        n_predict=args.n_predict,
        calibration_prompts=6,
        validate=False,
        say=lambda line: None,
    )
    print(f"analysis {time.perf_counter() - started:.0f} s", flush=True)
    from router.classify.training import train_classifier
    from router.classify.training_data import make_training_data
    from router.policies.server_policy import policy_set_plan, publish_server_policies

    first_port = free_port()
    with make_session_factory(engine)() as session, session.begin():
        record = store_server_analysis(
            session,
            session.get(PromptSet, set_id),
            analysis,
            model=str(model),
            server_build=server_version(binary),
        )
        policy_set = publish_server_policies(session, record.id, pools={}, first_port=first_port)
        chosen = {p.task_type: (p.setting if p.speculate else None) for p in policy_set.policies}
        train_classifier(
            session,
            make_training_data([r["prompt"] for r in training], [r["task"] for r in training], "bench"),
            cross_validate=False,
        )
        plan = policy_set_plan(session)
    print("chosen: " + ", ".join(f"{task} {label or 'off'}" for task, label in chosen.items()), flush=True)

    def fresh_servers() -> dict[str, LlamaServerProcess]:
        """A plain server and one per setting, not started (each round starts its own: ngram-mod's table
        persists in a server, and a prompt it saw answered drafts its whole answer the second time)."""
        return {"off": LlamaServerProcess(binary, model, threads=args.threads, n_ctx=4096)} | {
            d.label: LlamaServerProcess(
                binary, model, threads=args.threads, n_ctx=4096, flags=d.server_flags()
            )
            for d in drafters
        }

    pools, static = [], fresh_servers()
    from werkzeug.serving import make_server

    from webui.app import create_app

    app = create_app({"database_url": url, "router_refresh_s": 0, "ui_worker": False})
    front = make_server("127.0.0.1", 0, app, threaded=True)
    import threading

    threading.Thread(target=front.serve_forever, daemon=True).start()
    front_url = f"http://127.0.0.1:{front.server_port}"
    names = ["routed", *static]
    runs_ms: dict[str, list[list[float]]] = {name: [[] for _ in held] for name in names}
    tasks, right, pools_of = [row["task"] for row in held], 0, {}
    try:
        for round_number in range(args.rounds):
            # fresh pools and servers every round, so no table holds a held-out prompt's earlier answer
            static = fresh_servers()
            for server in static.values():
                server.start()
            pools = start_pools(plan, binary)
            for number, row in enumerate(held):
                # every choice once, in an order that rotates from prompt to prompt (no choice always first)
                shift = (number + round_number) % len(names)
                timings = {}
                for name in names[shift:] + names[:shift]:
                    url = front_url if name == "routed" else static[name].client.url
                    answer, headers = chat(url, row["prompt"], args.n_predict)
                    timings[name] = answer["timings"]
                    if name == "routed" and round_number == 0:
                        right += headers.get("X-Specroute-Task") == row["task"]
                        pools_of[number] = (headers.get("X-Specroute-Pool"), headers.get("X-Specroute-Task"))
                plain_steps = max(timings["off"]["predicted_n"] - 1, 1)
                for name, t in timings.items():
                    runs_ms[name][number].append(
                        t["predicted_ms"] / max(t["predicted_n"] - 1, 1) * plain_steps
                    )
            for server in static.values():
                server.stop()
            stop_pools(pools)
            print(f"  round {round_number + 1}/{args.rounds} done", flush=True)
    finally:
        front.shutdown()
        app.extensions["specroute.close"]()
        for server in static.values():
            server.stop()
        stop_pools(pools)
        engine.dispose()
    # per prompt and choice the median of its rounds
    ms = {name: [float(np.median(values)) for values in per_prompt] for name, per_prompt in runs_ms.items()}
    totals = {name: float(np.sum(values)) for name, values in ms.items()}
    print(f"\n{len(held)} held-out prompts, {args.n_predict} new tokens, {args.threads} threads, median of "
          f"{args.rounds} rounds; the classifier put {right} of {len(held)} in their labelled task\n")  # fmt: skip
    print("| choice | measured s | speedup vs off |")
    print("|---|---|---|")
    for name, total in sorted(totals.items(), key=lambda item: item[1]):
        print(f"| {name} | {total / 1000:.2f} | {totals['off'] / total:.3f} |")
    settings = [name for name in names if name not in ("routed", "off")]
    print("\n| task | chosen | routed to (classified as) | routed | " + " | ".join(settings) + " |")
    print("|---|---|---|---|" + "---|" * len(settings))
    per_task = {}
    for task in sorted(set(tasks)):
        index = [i for i, t in enumerate(tasks) if t == task]
        sums = {name: sum(values[i] for i in index) for name, values in ms.items()}
        per_task[task] = {name: value / 1000 for name, value in sums.items()}
        where = ", ".join(f"{plan_key(plan, pools_of[i][0])} ({pools_of[i][1]})" for i in index)
        cells = " | ".join(f"{sums['off'] / sums[name]:.3f}" for name in settings)
        print(
            f"| {task} | {chosen.get(task) or 'off'} | {where} | {sums['off'] / sums['routed']:.3f} | {cells} |"
        )
    out = RESULTS / "llama_server_routed.json"
    out.write_text(json.dumps({"threads": args.threads, "n_predict": args.n_predict, "totals_s": {
        k: v / 1000 for k, v in totals.items()}, "per_task_s": per_task, "chosen": chosen,
        "classified_right": right, "held_out": len(held)}, indent=1))  # fmt: skip
    print(f"\nwrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
