"""Replay benchmark of online gamma adaptation on real match sequences.

From a real analysis run (the embedded SmolLM2 target on the bundled sample prompts; by default
this script runs it, with the n-gram drafter), every prompt's output becomes a replayable request:
for a round that starts after s emitted tokens with lookahead g, the drafter's proposal and the
target's output say exactly how many drafts are accepted (model draft: the match sequence; n-gram:
prompt lookup on the real context). A replay of fixed g reproduces the run's stored per-g counts
exactly (checked before anything is compared).

Two-fold cross-fitting: the prompts are split in halves; the policies of "ours" come from one half
(as ``specroute policies publish`` would build them) and the other half is the traffic, then the
roles swap. The traffic is a shuffled stream with every prompt repeated ``--epochs`` times.
Compared, on tokens per target pass and predicted speedup (the run's measured cost curve:
plain time / speculative time, prompt processing included):

- fixed g = 5, always on;
- transformers' heuristic schedule: +2 after a fully accepted round, −1 otherwise (minimum 1),
  carried across requests as transformers does with one assistant; capped at the profiled G;
- the simple rule (start 5, bounds 2–10; after each request +1 when the mean of the last 10
  acceptance rates > 0.8, −1 when < 0.5, off when < 0.3);
- ours, as served: the product's Router (router/decide/decision.py) over the published policies of the
  source half (router.policies.policy.task_policies of the analysis summary, as ``specroute policies publish``
  builds them) and a task classifier trained on the bundled corpus without the workload's prompts
  (``specroute train --data corpus``, calibrated threshold); each request is routed by its text, and
  its counts move the estimate of the policy that decided (router/decide/adaptation.py: per-task decayed Beta
  posterior of alpha, the published S(g) curve moved by it, hysteresis, probes), as /v1/feedback does;
- ours with the true task labels instead of the classifier (isolates the estimate from the classifier);
- the per-prompt oracle: the best fixed choice (off or g = 1..G) for each prompt in hindsight.

A round is replayed by the analyzer's own walk (analyzer.measuring.acceptance.model_draft_round /
ngram_round), with the prompt and output token ids stored with each result.

    python benchmarks/bench_adaptation.py --out benchmarks/results/adaptation.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import migrations  # noqa: E402
from analyzer.advice.summary import (  # noqa: E402
    AnalysisSummary,
    cost_for_run,
    costs_for_run,
    load_results,
    summarize_groups,
)
from analyzer.analysis.run_records import RunParams, create_run  # noqa: E402
from analyzer.analysis.runs import execute_run  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.measuring.acceptance import NgramIndex, match_runs, model_draft_round, ngram_round  # noqa: E402
from analyzer.models.specs import parse_spec  # noqa: E402
from analyzer.orm import AnalysisRun, PromptResult  # noqa: E402
from analyzer.pricing.speedup import Cost  # noqa: E402
from analyzer.prompts.prompt_checks import prompt_text  # noqa: E402
from analyzer.prompts.prompt_sets import import_sample  # noqa: E402
from router.classify.training import train_classifier  # noqa: E402
from router.classify.training_data import cold_start_data, make_training_data  # noqa: E402
from router.classify.version_store import load_active  # noqa: E402
from router.decide.adaptation import AdaptationConfig, apply_feedback, next_request  # noqa: E402
from router.decide.decision import Router, RouterConfig  # noqa: E402
from router.decide.route_ids import parse_route_id  # noqa: E402
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot, task_policies  # noqa: E402


@dataclass
class Request:
    """One replayable request: its task, text, prompt and output length, and the drafter's outcome."""

    prompt_id: int
    task: str
    text: str
    prompt_tokens: int
    n: int
    max_new_tokens: int
    runs: np.ndarray | None  # model draft: consecutive matches from each position
    index: NgramIndex | None  # n-gram draft: prompt lookup over prompt + output
    output_ids: list[int]

    def round(self, s: int, g: int) -> tuple[int, int]:
        """(drafted, accepted) of a round starting after s emitted tokens with lookahead g."""
        if self.runs is not None:
            return model_draft_round(self.runs, s, g, self.max_new_tokens)
        return ngram_round(self.prompt_tokens, self.output_ids, s, g, self.max_new_tokens, self.index)


@dataclass
class Totals:
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    plain_s: float = 0.0
    spec_s: float = 0.0

    def add(self, other: "Totals") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def replay(request: Request, cost: Cost, gamma_for_round, on_round=None) -> Totals:
    """Run one request; ``gamma_for_round()`` gives g for the next round (0 = a plain decode step)."""
    target_prefill, draft_prefill = cost.prefill_s(request.prompt_tokens)
    out = Totals(tokens=request.n, plain_s=target_prefill + request.n * cost.decode_s, spec_s=target_prefill)
    used_draft = False
    s = 0
    while s < request.n:
        g = gamma_for_round()
        if g <= 0:
            out.passes += 1
            out.spec_s += cost.decode_s
            s += 1
            continue
        used_draft = True
        drafted, accepted = request.round(s, g)
        out.passes += 1
        out.drafted += drafted
        out.accepted += accepted
        out.spec_s += cost.round_s(drafted)
        if on_round is not None:
            on_round(drafted, accepted)
        s += accepted + 1
    if used_draft:
        out.spec_s += draft_prefill
    return out


class Fixed:
    name = "fixed g=5"

    def __init__(self, gamma: int = 5):
        self.gamma = gamma

    def serve(self, request, cost):
        return replay(request, cost, lambda: self.gamma)


class TransformersHeuristic:
    name = "transformers heuristic"

    def __init__(self, gamma_cap: int):
        self.gamma, self.cap = 5.0, gamma_cap

    def serve(self, request, cost):
        def update(drafted, accepted):
            if drafted and accepted == int(self.gamma):
                self.gamma = min(self.gamma + 2.0, self.cap)
            else:
                self.gamma = max(1.0, self.gamma - 1.0)

        return replay(request, cost, lambda: int(self.gamma), update)


class SimpleRule:
    name = "simple rule"

    def __init__(self):
        self.gamma, self.on, self.rates = 5, True, collections.deque(maxlen=10)

    def serve(self, request, cost):
        result = replay(request, cost, lambda: self.gamma if self.on else 0)
        if result.drafted:
            self.rates.append(result.accepted / result.drafted)
            mean = float(np.mean(self.rates))
            if mean < 0.3:
                self.on = False
            elif mean < 0.5:
                self.gamma = max(2, self.gamma - 1)
            elif mean > 0.8:
                self.gamma = min(10, self.gamma + 1)
        return result


class Ours:
    """The product's router and online estimate (see the module docstring)."""

    def __init__(self, router: Router, cost: Cost, true_labels: bool):
        self.router, self.cost, self.true_labels = router, cost, true_labels
        self.name = "ours, true task labels" if true_labels else "ours (classifier, as served)"

    def serve(self, request, cost):
        router = self.router
        if self.true_labels:
            key = request.task if request.task in router.policies else FALLBACK_TASK
            state, speculate, gamma = next_request(router.states[key], router.adaptation)
            router.states[key] = state
        else:
            decision = router.route(request.text, max_new_tokens=request.max_new_tokens)
            key, speculate, gamma = parse_route_id(decision.route_id)[1], decision.speculate, decision.gamma
        result = replay(request, cost, lambda: gamma if speculate else 0)
        if speculate and result.passes:  # what /v1/feedback does with the engine's counts
            router.observe(
                key,
                apply_feedback(
                    router.states[key],
                    result.passes,
                    result.drafted,
                    result.accepted,
                    router.curve_of(key),
                    router.adaptation,
                ),
            )
        return result


def oracle(request: Request, cost: Cost, gamma_max: int) -> Totals:
    options = [replay(request, cost, lambda: 0)] + [
        replay(request, cost, lambda g=g: g) for g in range(1, gamma_max + 1)
    ]
    return min(options, key=lambda t: t.spec_s)


def policies_from(run: AnalysisRun, results: list[PromptResult], cost: Cost) -> dict[str, PolicySnapshot]:
    """The policies ``specroute policies publish`` would build from these results of ``run``."""
    params = run.params
    options = {"gamma_max": int(params["gamma_max"]), "margin": float(params.get("margin", 0.05))}
    tasks, workload = summarize_groups(results, cost, costs=costs_for_run(run), **options)
    summary = AnalysisSummary(
        run_id=run.id,
        sampling=False,
        cost=cost,
        costs=costs_for_run(run),
        prompts=[],
        tasks=tasks,
        workload=workload,
        **options,
    )
    return {p.task_type: PolicySnapshot.of(p) for p in task_policies(summary)}


def train_router_classifier(session, results: list[PromptResult]):
    """A classifier trained as ``specroute train --data corpus`` does, on the bundled corpus less the
    workload's own prompts (they must be unseen), with cross-validated calibration and threshold."""
    workload = {prompt_text(r.prompt.text, r.prompt.messages) for r in results}
    corpus = cold_start_data()
    kept = [i for i, text in enumerate(corpus.texts) if text not in workload]
    data = make_training_data(
        [corpus.texts[i] for i in kept],
        [corpus.labels[i] for i in kept],
        "bundled corpus less the workload",
        [corpus.groups[i] for i in kept],
    )
    train_classifier(session, data)
    session.commit()
    classifier = load_active(session)
    print(
        f"classifier: {len(kept)} corpus prompts ({len(corpus.texts) - len(kept)} workload prompts left out), "
        f"threshold {classifier.threshold}",
        file=sys.stderr,
    )
    return classifier


def load_requests(session, run: AnalysisRun) -> tuple[list[Request], list[PromptResult]]:
    """The run's results as replayable requests (prompt and output token ids as stored with them)."""
    params = run.params
    draft = parse_spec(run.pair.draft.spec)
    results = load_results(session, run.id)
    requests = []
    for r in results:
        if r.prompt_token_ids is None:
            raise SystemExit(f"run {run.id} is from before prompt token ids were stored; analyze again")
        text = prompt_text(r.prompt.text, r.prompt.messages)
        if draft.kind == "ngram":
            index = NgramIndex(
                list(r.prompt_token_ids) + list(r.output_token_ids),
                int(draft.options.get("max_ngram", 2)),
                run.eos_token_ids or [],
            )
            request = Request(
                r.prompt_id,
                r.task_type or "unlabelled",
                text,
                len(r.prompt_token_ids),
                r.output_tokens,
                params["max_new_tokens"],
                None,
                index,
                list(r.output_token_ids),
            )
        else:
            request = Request(
                r.prompt_id,
                r.task_type or "unlabelled",
                text,
                r.prompt_tokens,
                r.output_tokens,
                params["max_new_tokens"],
                match_runs(r.draft_matches),
                None,
                [],
            )
        requests.append(request)
    return requests, results


def check_replay(requests: list[Request], results: list[PromptResult], cost: Cost) -> int:
    """Fixed-g replays must reproduce the stored walk counts; returns how many (prompt, g) matched."""
    checked = 0
    for request, result in zip(requests, results):
        for counts in result.gamma_counts:
            got = replay(request, cost, lambda g=counts.gamma: g)
            if (got.passes, got.drafted, got.accepted) != (counts.rounds, counts.drafted, counts.accepted):
                raise SystemExit(
                    f"replay differs from the stored walk for prompt {result.prompt_id} at g={counts.gamma}: "
                    f"{(got.passes, got.drafted, got.accepted)} vs {(counts.rounds, counts.drafted, counts.accepted)}"
                )
            checked += 1
    return checked


def run_analysis(url: str, args, cache_dir: Path) -> int:
    engine = make_engine(url)
    migrations.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        import_sample(session)
        params = RunParams(max_new_tokens=args.max_new_tokens, gamma_max=args.gamma_max)
        run_id = create_run(session, "sample", "builtin:smollm2-135m-instruct", args.draft, params).id
    started = time.perf_counter()
    execute_run(
        sessions,
        run_id,
        cache_dir=cache_dir,
        progress=lambda done, total, phase: print(
            f"\r  analysis: {phase} {done}/{total}", end="", file=sys.stderr
        ),
    )
    print(f"\n  analysis took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database", help="SQLAlchemy URL of a database holding --run (default: a new temporary one)"
    )
    parser.add_argument(
        "--run", type=int, help="a finished analysis run to replay (default: analyze the sample prompts)"
    )
    parser.add_argument("--draft", default="ngram", help="draft spec for the analysis this script runs")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma-max", type=int, default=16)
    parser.add_argument(
        "--epochs", type=int, default=4, help="times each traffic prompt appears in the stream"
    )
    parser.add_argument("--seeds", type=int, default=5, help="independent shuffles (and splits)")
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "specroute-bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    cache_dir = Path(args.cache_dir)
    url = args.database
    if args.run is None:
        url = url or f"sqlite:///{tempfile.mkdtemp(prefix='specroute-adapt-')}/bench.db"
        args.run = run_analysis(url, args, cache_dir)
    sessions = make_session_factory(make_engine(url))
    with sessions() as session:
        run = session.get(AnalysisRun, args.run)
        cost = cost_for_run(run)
        gamma_max = int(run.params["gamma_max"])
        requests, results = load_requests(session, run)
        checked = check_replay(requests, results, cost)
        print(
            f"run {run.id}: {len(requests)} prompts, draft {run.pair.draft.spec}, g = 1..{gamma_max}; "
            f"fixed-g replays equal the stored walks for {checked}/{checked} (prompt, g)",
            file=sys.stderr,
        )
        classifier = train_router_classifier(session, results)
        predicted = classifier.predict([r.text for r in requests])
        right = sum(task == r.task for (task, _), r in zip(predicted, requests))
        print(f"classifier: {right}/{len(requests)} workload prompts get their true task", file=sys.stderr)
        names = [
            Fixed.name,
            TransformersHeuristic.name,
            SimpleRule.name,
            "ours (classifier, as served)",
            "ours, true task labels",
            "per-prompt oracle",
        ]
        per_seed = {name: [] for name in names}
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            order = rng.permutation(len(requests))
            halves = [order[: len(order) // 2], order[len(order) // 2 :]]
            totals = {name: Totals() for name in names}
            for fold in range(2):
                source, traffic = halves[fold], halves[1 - fold]
                policies = policies_from(run, [results[i] for i in source], cost)

                def router(with_classifier: bool) -> Router:
                    params = run.run_params
                    return Router(
                        classifier if with_classifier else None,
                        policies,
                        policy_version=1,
                        cost=cost,
                        config=RouterConfig(),
                        adaptation=AdaptationConfig(),
                        contract=PolicyContract(
                            gamma_max=gamma_max, margin=params.margin, priced_by=run.priced_by
                        ),
                    )

                servers = [
                    Fixed(),
                    TransformersHeuristic(gamma_max),
                    SimpleRule(),
                    Ours(router(True), cost, False),
                    Ours(router(False), cost, True),
                ]
                stream = np.concatenate([rng.permutation(traffic) for _ in range(args.epochs)])
                for i in stream:
                    for server in servers:
                        totals[server.name].add(server.serve(requests[i], cost))
                    totals["per-prompt oracle"].add(oracle(requests[i], cost, gamma_max))
            for name in names:
                t = totals[name]
                per_seed[name].append(
                    {
                        "tokens_per_pass": t.tokens / t.passes,
                        "speedup": t.plain_s / t.spec_s,
                        "acceptance": t.accepted / t.drafted if t.drafted else 0.0,
                    }
                )
    table = {
        name: {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
        | {
            "speedup_min": float(min(r["speedup"] for r in rows)),
            "speedup_max": float(max(r["speedup"] for r in rows)),
        }
        for name, rows in per_seed.items()
    }
    print(
        f"\nthreads {torch.get_num_threads()}; {args.seeds} seeds x 2 folds, each traffic prompt {args.epochs}x; "
        f"medians over seeds"
    )
    print("policy | tokens/target pass | predicted speedup | (min..max over seeds) | draft acceptance")
    for name in names:
        row = table[name]
        print(
            f"{name} | {row['tokens_per_pass']:.3f} | {row['speedup']:.3f}x | "
            f"{row['speedup_min']:.3f}..{row['speedup_max']:.3f} | {row['acceptance']:.3f}"
        )
    ours = table["ours (classifier, as served)"]["speedup"]
    beaten = [n for n in names[:3] if table[n]["speedup"] < ours]
    print(f"ours beats {len(beaten)}/3 baselines on predicted speedup: {', '.join(beaten) or 'none'}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "url": url,
                    "run": args.run,
                    "table": table,
                    "per_seed": per_seed,
                },
                indent=1,
            )
        )
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
