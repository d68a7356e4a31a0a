"""Router speed: in-process decision latency, and HTTP throughput on the production server.

1. In process: ``Router.route`` with the classifier trained on two thirds of the bundled corpus and
   a policy set for all 13 task types, timed on the other third (held out, cut to at most 2,000
   characters): first one pass on a fresh router (as a server that just started: its word cache
   holds only the classifier vocabulary's words), then passes interleaved with the same decisions made through the scikit-learn
   pipeline's own ``predict_proba`` (the baseline our FastScorer replaces), then the fast path
   alone; p50/p99 over every call, and p99 for prompts of 1,500-2,000 characters.
2. Over HTTP: ``specroute serve`` (subprocess, ``--threads``, with each of ``--workers`` process
   counts: waitress for 1, gunicorn's gthread workers above 1) on a temporary SQLite database, driven by an asyncio load generator in another process with ``--concurrency``
   keep-alive connections posting /v1/route; the same generator against a bare WSGI app on the same
   server settings gives the server's own ceiling in the same run. Decisions are logged as in
   production.

    python benchmarks/bench_router.py --out benchmarks/results/router.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import migrations  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.ingest import parse_prompt_file  # noqa: E402
from analyzer.simulated_run import create_simulated_run  # noqa: E402
from analyzer.speedup import Cost  # noqa: E402
from router.classifier import TaskClassifier, build_pipeline, cold_start_data, train_classifier  # noqa: E402
from router.decision import Router  # noqa: E402
from router.features import prompt_text  # noqa: E402
from router.policy import PolicySnapshot, publish_policies  # noqa: E402

TASKS = ("code", "structured_output", "summarization", "translation", "rag", "qa", "math", "reasoning",
         "creative_writing", "roleplay", "extraction", "customer_support", "general")


def corpus_prompts(max_chars: int) -> list[str]:
    from importlib import resources

    data = resources.files("router.data").joinpath("corpus.jsonl").read_bytes()
    texts = [prompt_text(p.text, p.messages) for p in parse_prompt_file(data, "corpus.jsonl").prompts]
    return [t[:max_chars] for t in texts]


def percentiles_ms(values_ns: list[int]) -> tuple[float, float]:
    if not values_ns:  # e.g. a warm-up whose every request began before its measuring started
        return float("nan"), float("nan")
    a = np.asarray(values_ns, dtype=np.float64) / 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


FEATURES = {"name": "tfidf"}  # --features: the classifier's feature set (router.classifier.FEATURE_SETS)


def in_process(train: tuple[list[str], list[str]], prompts: list[str], repeats: int) -> dict:
    pipeline = build_pipeline(features=FEATURES["name"]).fit(*train)
    classifier = TaskClassifier(0, 0, sorted(set(train[1])), pipeline)
    policies = {t: PolicySnapshot(t, i % 2 == 0, 4, 0.6, 0.01, 10, 1.3, "RECOMMENDED", (1.3,) * 8)
                for i, t in enumerate(TASKS + ("*",))}
    cost = Cost([0.07] * 17, 0.0001, draft_cost_per_token=False)  # with online states, as served
    fast = Router(classifier, policies, policy_version=1, cost=cost)
    slow_classifier = TaskClassifier(0, 0, classifier.labels, pipeline)
    slow_classifier.predict = lambda texts: [  # the baseline: scikit-learn's own predict_proba per call
        (str(pipeline.classes_[i]), float(p[i])) for p in pipeline.predict_proba(list(texts)) for i in [p.argmax()]]
    slow = Router(slow_classifier, policies, policy_version=1, cost=cost)
    times = {"first sight": [], "fast": [], "pipeline": [], "fast alone": []}
    long_times = {name: [] for name in times}
    for text in prompts:  # first sight: held-out prompts on a fresh router (as a server that just started)
        start = time.perf_counter_ns()
        fast.route(text, max_new_tokens=128)
        elapsed = time.perf_counter_ns() - start
        times["first sight"].append(elapsed)
        if len(text) >= 1500:
            long_times["first sight"].append(elapsed)
    agree = 0
    for _ in range(repeats):
        for text in prompts:
            for name, router in (("fast", fast), ("pipeline", slow)):
                start = time.perf_counter_ns()
                decision = router.route(text, max_new_tokens=128)
                elapsed = time.perf_counter_ns() - start
                times[name].append(elapsed)
                if len(text) >= 1500:
                    long_times[name].append(elapsed)
                if name == "fast":
                    task = decision.task_type
                elif decision.task_type == task:
                    agree += 1
    for _ in range(repeats):  # the fast path by itself, as a server runs it (nothing interleaved)
        for text in prompts:
            start = time.perf_counter_ns()
            fast.route(text, max_new_tokens=128)
            elapsed = time.perf_counter_ns() - start
            times["fast alone"].append(elapsed)
            if len(text) >= 1500:
                long_times["fast alone"].append(elapsed)
    return {name: {"p50_ms": percentiles_ms(times[name])[0], "p99_ms": percentiles_ms(times[name])[1],
                   "p99_ms_1500_2000_chars": percentiles_ms(long_times[name])[1], "calls": len(times[name])}
            for name in times} | {"same_task": agree / len(times["fast"]),
                                  "long_prompts": len(long_times["first sight"]),
                                  "cached_words": classifier.fast.cached_words()}


# ---------------------------------------------------------------- HTTP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"server on port {port} did not start")


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response from a keep-alive connection: its status line and body."""
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status_line, await reader.readexactly(length)


async def _connection(port: int, requests: list[bytes], stop_at: float, warm_until: float, latencies: list, errors: list):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            start = time.perf_counter_ns()
            writer.write(requests[i % len(requests)])
            i += 1
            status_line, _ = await read_response(reader)
            if now >= warm_until:
                latencies.append(time.perf_counter_ns() - start)
                if b" 200 " not in status_line:
                    errors.append(status_line)
    finally:
        writer.close()


def load_process(port: int, path: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float, queue) -> None:
    requests = [(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(b)}\r\n\r\n").encode() + b for b in bodies]

    async def main():
        latencies, errors = [], []
        start = time.perf_counter()
        await asyncio.gather(*[_connection(port, requests[c::concurrency] or requests, start + warmup_s + seconds,
                                           start + warmup_s, latencies, errors) for c in range(concurrency)])
        return latencies, errors

    latencies, errors = asyncio.run(main())
    queue.put((latencies, len(errors), errors[:3]))


def drive(port: int, path: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float) -> dict:
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=load_process, args=(port, path, bodies, concurrency, seconds, warmup_s, queue))
    process.start()
    latencies, error_count, examples = queue.get()
    process.join()
    p50, p99 = percentiles_ms(latencies)
    return {"requests_per_s": len(latencies) / seconds, "p50_ms": p50, "p99_ms": p99, "errors": error_count,
            "error_examples": [e.decode(errors="replace") for e in examples], "requests": len(latencies)}


BARE_APP = """
import sys, waitress
def app(environ, start_response):
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    body = b'{"ok": true}'
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
waitress.serve(app, host="127.0.0.1", port=int(sys.argv[1]), threads=int(sys.argv[2]), _quiet=True)
"""


def server_name(workers: int) -> str:
    return f"specroute /v1/route, {workers} process{'es' if workers > 1 else ''}"


def prepare_database(url: str) -> None:
    engine = make_engine(url)
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        train_classifier(session, cold_start_data(), cross_validate=False, features=FEATURES["name"])
        run = create_simulated_run(session, {t: 0.2 + 0.05 * i for i, t in enumerate(TASKS)}, per_task=3)
        publish_policies(session, run.id)
    engine.dispose()


def http(prompts: list[str], args) -> dict:
    folder = tempfile.mkdtemp(prefix="specroute-bench-router-")
    url = f"sqlite:///{folder}/router.db"
    prepare_database(url)
    bodies = [json.dumps({"prompt": p, "max_new_tokens": 128}).encode() for p in prompts]
    env = {**os.environ, "SPECROUTE_DATABASE_URL": url, "SPECROUTE_DATA_DIR": folder, "SPECROUTE_UI_WORKER": "false",
           "OMP_NUM_THREADS": "1"}
    results = {}
    servers = [("bare WSGI app", [sys.executable, "-c", BARE_APP])] + [
        (server_name(workers), [sys.executable, "-m", "webui.cli", "serve", "--workers", str(workers)])
        for workers in args.workers]
    started, logs = {}, []
    try:
        for name, command in servers:  # all up at once, so that their runs can be interleaved
            port = free_port()
            argv = command + ([str(port), str(args.threads)] if name.startswith("bare") else
                              ["--port", str(port), "--threads", str(args.threads)])
            logs.append(open(Path(folder) / f"server-{port}.log", "wb"))
            started[name] = (port, subprocess.Popen(argv, env=env, cwd=Path(__file__).resolve().parent.parent,
                                                    stdout=logs[-1], stderr=subprocess.STDOUT))
        for name, (port, _) in started.items():
            wait_for(port)
            drive(port, "/v1/route", bodies, args.concurrency, 2.0, 1.0)  # every process has loaded its router
        runs = {name: [] for name in started}
        for _ in range(args.runs):
            for name, (port, _) in started.items():
                runs[name].append(drive(port, "/v1/route", bodies, args.concurrency, args.seconds, args.warmup))
    finally:
        for _, server in started.values():
            server.terminate()
            server.wait(timeout=30)
        for log in logs:
            log.close()
    for name, measured in runs.items():
        results[name] = {"runs": measured, "requests_per_s": float(np.median([r["requests_per_s"] for r in measured])),
                         "p50_ms": float(np.median([r["p50_ms"] for r in measured])),
                         "p99_ms": float(np.median([r["p99_ms"] for r in measured])),
                         "errors": int(sum(r["errors"] for r in measured))}
    engine = make_engine(url)
    with engine.connect() as connection:
        results["decisions_logged"] = connection.exec_driver_sql("SELECT count(*) FROM route_decisions").scalar()
    engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-chars", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the corpus in process")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=8, help="server threads (per process)")
    parser.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
                        help="comma-separated server process counts to measure (specroute serve --workers)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3, help="load runs per server (medians reported)")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--features", default="tfidf", help="classifier feature set: tfidf, minilm or tfidf+minilm")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    FEATURES["name"] = args.features
    prompts = corpus_prompts(args.max_chars)
    data = cold_start_data()  # the same prompts in the same order, with labels
    train = ([t for i, t in enumerate(data.texts) if i % 3], [l for i, l in enumerate(data.labels) if i % 3])
    traffic = [t[:args.max_chars] for i, t in enumerate(data.texts) if i % 3 == 0]
    print(f"{len(prompts)} corpus prompts cut to <= {args.max_chars} chars; {os.cpu_count()} CPUs", file=sys.stderr)
    local = in_process(train, traffic, args.repeats)
    print(f"\nin-process decision latency (1 thread), {args.features} classifier trained on {len(train[0])} corpus prompts, "
          f"timed on the other {len(traffic)} (cut to <= {args.max_chars} chars):")
    print("path | p50 ms | p99 ms | p99 ms, 1500-2000 chars | calls")
    labels = {"first sight": "Router.route, first pass (fresh router; word cache holds only the vocabulary's words)",
              "fast": "Router.route (FastScorer), interleaved", "pipeline": "baseline: pipeline.predict_proba, interleaved",
              "fast alone": "Router.route (FastScorer), alone"}
    for name in ("first sight", "fast", "pipeline", "fast alone"):
        r = local[name]
        print(f"{labels[name]} | "
              f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p99_ms_1500_2000_chars']:.3f} | {r['calls']}")
    print(f"same task from both paths: {100 * local['same_task']:.2f}%; "
          f"{local['long_prompts']} prompts of 1500-2000 chars; {local['cached_words']} words cached; "
          f"p50 speedup {local['pipeline']['p50_ms'] / local['fast']['p50_ms']:.1f}x")
    result = {"in_process": local}
    if not args.skip_http:
        served = http(prompts, args)
        result["http"] = served
        print(f"\nHTTP, {args.threads} threads per process (waitress for 1 process and the bare app, gunicorn "
              f"gthread above 1), asyncio load generator in another process, "
              f"concurrency {args.concurrency}, {args.seconds:.0f} s per run after {args.warmup:.0f} s warm-up, "
              f"median of {args.runs} runs (servers interleaved):")
        print("server | req/s | p50 ms | p99 ms | errors")
        for name in ["bare WSGI app"] + [server_name(w) for w in args.workers]:
            r = served[name]
            print(f"{name} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']}")
        for workers in args.workers:
            share = served[server_name(workers)]['requests_per_s'] / served['bare WSGI app']['requests_per_s']
            print(f"{server_name(workers)} / bare WSGI app (1 process): {share:.2f}")
        print(f"decisions logged: {served['decisions_logged']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
