"""Feedback from live llama-server pools moving a task between the pools of its policy set.

From a stored llama-server analysis (the demo's, in ``--data-dir``), publish its policy set, start its pools as
``specroute pools start`` does, and send one task's traffic through the router in process: each request is
decided for the task (``Router.decide_task``), sent to the pool the decision names, and the pool's own
``timings`` go back as the decision's feedback (``record_feedback``), which moves the task's estimate per setting
and the router's next decision (``Router.observe``). Two phases:

- **as analyzed**: held-out prompts of the task (../shared/data/prompts/dev-extra.jsonl, none of them in the
  bundled sample);
- **shifted**: the same task's traffic turns into prompts of another kind (dev-extra's ``general`` chat prompts),
  where the published setting may no longer pay.

Every prompt also runs on the plain pool (the baseline) and on the task's published pool (the **static**
choice: no feedback); where the router's decision names another pool, that run is the **routed** one. Each
figure is the server's own ``predicted_ms``; a phase's speedup is its summed plain time over its summed time
under the choice. Every prompt runs once per pool (an ngram-mod pool that met a prompt before would draft its
answer back).

    python benchmarks/server_feedback.py --data-dir DIR [--task extraction] [--prompts 12] [--n-predict 64]

Run it with nothing else on the machine; the figures are for the thread count the analysis used.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from analyzer.analysis.server_store import list_server_analyses
from analyzer.db import make_engine, make_session_factory
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_pools import start_pools, stop_pools
from analyzer.engine.llama_server_process import LlamaServerClient
from analyzer.models.devices import cpu_model_name
from analyzer.settings import load_settings
from router.decide.contract import RouteRequest
from router.decide.decision import router_from_database
from router.decide.feedback import parse_feedback, record_feedback
from router.policies.server_policy import policy_set_plan, publish_server_policies

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"


def held_out(task: str, count: int, seed: int) -> list[str]:
    """``count`` prompts of ``task`` from dev-extra.jsonl under 3,000 characters, in a seeded order."""
    rows = [json.loads(line) for line in (SHARED / "dev-extra.jsonl").open(encoding="utf-8")]
    prompts = [r["prompt"] for r in rows if r["task"] == task and len(r["prompt"]) < 3000]
    random.Random(seed).shuffle(prompts)
    return prompts[:count]


def completion(url: str, prompt: str, n_predict: int) -> dict:
    """A greedy completion of ``prompt`` under the pool's chat template; its ``timings``."""
    client = LlamaServerClient(url)
    ids = client.tokenize(client.chat_prompt([{"role": "user", "content": prompt}]))
    return dict(client.complete(ids, n_predict).timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="the data folder holding the llama-server analysis")
    parser.add_argument(
        "--task", default=None, help="the task whose traffic moves (default: the best speculating)"
    )
    parser.add_argument("--prompts", type=int, default=12, help="prompts per phase")
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--seed", type=int, default=20261129)
    args = parser.parse_args()

    settings = load_settings()
    engine = make_engine(f"sqlite:///{Path(args.data_dir) / 'specroute.db'}")
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        record = list_server_analyses(session)[0]
        policy_set = publish_server_policies(
            session, record.id, pools={}, activate=True, notes="server_feedback"
        )
        speculating = sorted(
            (p for p in policy_set.policies if p.speculate and p.task_type != "*"),
            key=lambda p: -p.expected_speedup,
        )
        task = args.task or speculating[0].task_type
        published = next(p for p in policy_set.policies if p.task_type == task)
        plan = policy_set_plan(session)
        urls = dict(plan.mapping)
    print(f"llama-server analysis #{record.id}, policy set v{policy_set.version}: {task} speculates with "
          f"{published.setting} ({published.expected_speedup:.2f}x predicted); pools {urls}")  # fmt: skip
    print(f"machine: {cpu_model_name()}, threads {record.threads}; {args.n_predict} new tokens")
    binary = find_llama_server(settings.llama_server, Path(args.data_dir) / "cache").path
    servers = start_pools(plan, binary, say=print)
    static_url = urls[published.setting if published.speculate else "off"]
    rows = []
    try:
        router = router_from_database_in(sessions)
        for phase, source in (("as analyzed", task), ("shifted", "general")):
            for prompt in held_out(source, args.prompts, args.seed):
                decision = router.decide_task(task, RouteRequest.of(prompt, max_new_tokens=args.n_predict))
                routed_url = decision.engine.pool
                setting = decision.engine.llama_server.setting if decision.engine.llama_server else "off"
                plain = completion(urls["off"], prompt, args.n_predict)
                static = completion(static_url, prompt, args.n_predict)
                routed = (
                    static if routed_url == static_url else completion(routed_url, prompt, args.n_predict)
                )
                payload = {"route_id": decision.route_id, "setting": setting, "timings": routed}
                with sessions() as session, session.begin():
                    recorded = record_feedback(session, parse_feedback(payload))
                router.observe(task, recorded.state)
                rows.append((phase, setting, plain["predicted_ms"], static["predicted_ms"], routed["predicted_ms"],
                             recorded.state.setting or "off"))  # fmt: skip
                print(f"{phase:<12} {setting:<20} plain {plain['predicted_ms']:7.0f} ms  static "
                      f"{static['predicted_ms']:7.0f} ms  routed {routed['predicted_ms']:7.0f} ms  -> in force: "
                      f"{recorded.state.setting or 'off'}")  # fmt: skip
    finally:
        stop_pools(servers)
        engine.dispose()
    print(
        "\n| phase | requests | static speedup | routed speedup | pools the router used | in force at the end |"
    )
    print("|---|---|---|---|---|---|")
    for phase in ("as analyzed", "shifted"):
        mine = [r for r in rows if r[0] == phase]
        plain, static, routed = (sum(r[i] for r in mine) for i in (2, 3, 4))
        used = sorted({r[1] for r in mine})
        print(f"| {phase} | {len(mine)} | {plain / static:.3f} | {plain / routed:.3f} | {', '.join(used)} | "
              f"{mine[-1][5]} |")  # fmt: skip


def router_from_database_in(sessions):
    with sessions() as session:
        return router_from_database(session)


if __name__ == "__main__":
    main()
