"""Router speed: in-process decision latency, and HTTP throughput on the production server.

1. In process: ``Router.route`` with the classifier trained on two thirds of the bundled corpus and
   a policy set for all 13 task types, timed on the other third (held out, cut to at most 2,000
   characters): first one pass on a fresh router (as a server that just started: its word cache
   holds only the classifier vocabulary's words), then passes interleaved with the same decisions made
   through the scikit-learn
   pipeline's own ``predict_proba`` (the baseline our FastScorer replaces), then the fast path
   alone; p50/p99 over every call, and p99 for prompts of 1,500-2,000 characters.
2. Over HTTP: ``specroute serve`` (subprocess, ``--threads``, with each of ``--workers`` process
   counts: waitress for 1, gunicorn's arbiter over waitress in each process above 1) on each ``--database``: a temporary
   SQLite file and a database on a throw-away PostgreSQL server (``benchmarks/pg_server.py``: initdb
   into a temporary folder, fsync on), driven by an asyncio load generator in another process with
   ``--concurrency`` keep-alive connections posting each of ``--endpoints`` (``/v1/route``: corpus
   prompts; ``/v1/feedback``: counts for the 13 tasks, half by task_type, half by a route_id); the
   same generator against a bare WSGI app on the same server settings gives the server's own
   ceiling in the same run. Decisions are logged and feedback stored as in production. Every
   server is up for the whole run and the runs are interleaved; one table, with a database column.
   ``--checkout DIR`` serves the specroute of another checkout, its databases prepared through that
   checkout's own command line (the bundled classifier, and a policy set from an analysis of one sample
   prompt per task), e.g. ``git worktree add /tmp/before 49cefe4``, so that two versions meet the same
   load generator.

    python benchmarks/bench_router.py --out benchmarks/results/router.json
    python benchmarks/bench_router.py --skip-in-process --database both --checkout /tmp/before
    python benchmarks/bench_router.py --skip-in-process --database sqlite --endpoints route \
        --against /tmp/before --against-label 49cefe4 --out benchmarks/results/router_vs_49cefe4.json

``--against DIR`` serves a second checkout beside ``--checkout``'s, every server up at once and the runs
interleaved: the side-by-side table (requests per second, p50, p99, each as a share of the bare app in the same
run, and today's over the other's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg_server import create_database, throwaway_postgres  # noqa: E402

from analyzer.db import make_engine  # noqa: E402
from analyzer.models.devices import cpu_model_name  # noqa: E402
from analyzer.pricing.speedup import Cost  # noqa: E402
from analyzer.prompts.ingest import parse_prompt_file  # noqa: E402
from analyzer.prompts.prompt_checks import prompt_text  # noqa: E402
from analyzer.prompts.prompt_sets import DEFAULT_TASK_TYPES  # noqa: E402
from router.classify.pipeline import build_pipeline  # noqa: E402
from router.classify.task_classifier import TaskClassifier  # noqa: E402
from router.classify.training_data import cold_start_data  # noqa: E402
from router.decide.decision import Router  # noqa: E402
from router.decide.route_ids import new_route_id, route_key  # noqa: E402
from router.policies.policy import PolicySnapshot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATABASES = ("sqlite", "postgresql")
ENDPOINTS = {"route": "/v1/route", "feedback": "/v1/feedback"}

TASKS = DEFAULT_TASK_TYPES  # the task types of DESIGN.md


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


FEATURES = {
    "name": "tfidf"
}  # --features: the classifier's feature set (router.classify.pipeline.FEATURE_SETS)


def in_process(train: tuple[list[str], list[str]], prompts: list[str], repeats: int) -> dict:
    pipeline = build_pipeline(features=FEATURES["name"]).fit(*train)
    classifier = TaskClassifier(0, 0, sorted(set(train[1])), pipeline)
    policies = {
        t: PolicySnapshot(t, i % 2 == 0, 4, 0.6, 0.01, 10, 1.3, "RECOMMENDED", (1.3,) * 8)
        for i, t in enumerate(TASKS + ("*",))
    }
    cost = Cost([0.07] * 17, 0.0001, draft_cost_per_token=False)  # with online states, as served
    fast = Router(classifier, policies, policy_version=1, cost=cost)
    slow_classifier = TaskClassifier(0, 0, classifier.labels, pipeline)
    slow_classifier.predict = lambda texts: [  # the baseline: scikit-learn's own predict_proba per call
        (str(pipeline.classes_[i]), float(p[i]))
        for p in pipeline.predict_proba(list(texts))
        for i in [p.argmax()]
    ]
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
    return {
        name: {
            "p50_ms": percentiles_ms(times[name])[0],
            "p99_ms": percentiles_ms(times[name])[1],
            "p99_ms_1500_2000_chars": percentiles_ms(long_times[name])[1],
            "calls": len(times[name]),
        }
        for name in times
    } | {
        "same_task": agree / len(times["fast"]),
        "long_prompts": len(long_times["first sight"]),
        "cached_words": classifier.fast.cached_words(),
    }


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


async def _connection(
    port: int,
    requests: list[bytes],
    stop_at: float,
    warm_until: float,
    latencies: list,
    errors: list,
    answered: list,
):
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
            answered[0] += b" 200 " in status_line  # warm-up included: each one is a decision to log
            if now >= warm_until:
                latencies.append(time.perf_counter_ns() - start)
                if b" 200 " not in status_line:
                    errors.append(status_line)
    finally:
        writer.close()


def load_process(
    port: int, path: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float, queue
) -> None:
    requests = [
        (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\n\r\n"
        ).encode()
        + b
        for b in bodies
    ]

    async def main():
        latencies, errors, answered = [], [], [0]
        start = time.perf_counter()
        await asyncio.gather(
            *[
                _connection(
                    port,
                    requests[c::concurrency] or requests,
                    start + warmup_s + seconds,
                    start + warmup_s,
                    latencies,
                    errors,
                    answered,
                )
                for c in range(concurrency)
            ]
        )
        return latencies, errors, answered[0]

    latencies, errors, answered = asyncio.run(main())
    queue.put((latencies, len(errors), errors[:3], answered))


def drive(
    port: int, path: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float
) -> dict:
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(
        target=load_process, args=(port, path, bodies, concurrency, seconds, warmup_s, queue)
    )
    process.start()
    latencies, error_count, examples, answered = queue.get()
    process.join()
    p50, p99 = percentiles_ms(latencies)
    return {
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": error_count,
        "error_examples": [e.decode(errors="replace") for e in examples],
        "requests": len(latencies),
        "answered_200": answered,  # every answer with status 200, warm-up included
    }


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
    return f"specroute, {workers} process{'es' if workers > 1 else ''}"


# how every tree's database is prepared, by its own command line (``python -m webui.cli``), so that a checkout
# whose modules sit elsewhere prepares its own schema: the bundled classifier, and a policy set (version 1,
# active) from an analysis of one bundled sample prompt per task, 16 new tokens, gamma up to 4, in transformers
PREPARE_STEPS = (
    ("db", "upgrade"),
    ("prompts", "import", "{prompts}", "--name", "bench"),
    ("train", "--data", "corpus", "--features", "{features}"),
    (
        "analyze",
        "--prompts",
        "bench",
        "--engine",
        "transformers",
        "--max-new-tokens",
        "16",
        "--gamma-max",
        "4",
        "--validate",
        "0",
    ),
    ("policies", "publish", "--run", "1"),
    ("policies", "activate", "1"),
)


def one_prompt_per_task(folder: str) -> Path:
    """A prompt file of the bundled sample's first prompt of each task type (13), in ``folder``."""
    chosen: dict[str, str] = {}
    with open(ROOT / "analyzer" / "sample_data" / "sample_prompts.jsonl") as sample:
        for line in sample:
            row = json.loads(line)
            chosen.setdefault(row["task"], line)
    path = Path(folder) / "one-per-task.jsonl"
    path.write_text("".join(chosen[task] for task in TASKS))
    return path


def server_env(root: Path, url: str, folder: str) -> dict:
    """The environment of a server (or preparation) process of the specroute checkout at ``root``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "SPECROUTE_DATABASE_URL": url,
        "SPECROUTE_DATA_DIR": folder,
        "SPECROUTE_UI_WORKER": "false",
        "OMP_NUM_THREADS": "1",
        "SPECROUTE_SECRET_KEY": SECRET_KEY,  # the route ids of feedback_bodies verify on every server
    }


def prepare_database(url: str, root: Path = ROOT) -> None:
    """Migrate the database at ``url`` to head and give it the bundled corpus classifier and an active policy
    set (version 1) over all 13 tasks, through the command line of the checkout at ``root`` (its own
    processes: an older checkout prepares its own schema with its own modules; :data:`PREPARE_STEPS`)."""
    folder = tempfile.mkdtemp(prefix="specroute-bench-prepare-")
    values = {"prompts": str(one_prompt_per_task(folder)), "features": FEATURES["name"]}
    for step in PREPARE_STEPS:
        subprocess.run(
            [sys.executable, "-m", "webui.cli", *(part.format(**values) for part in step)],
            cwd=root,
            env=server_env(root, url, folder),
            check=True,
            stdout=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def databases(kinds: list[str], folder: str, name: str):
    """{kind: URL} of a fresh database of each kind: a SQLite file in ``folder``, or database ``name``
    on a throw-away PostgreSQL server (stopped on exit)."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for kind in kinds:
            if kind == "sqlite":
                urls[kind] = f"sqlite:///{folder}/{name}.db"
            else:
                urls[kind] = create_database(stack.enter_context(throwaway_postgres()), name)
        yield urls


# every server's SPECROUTE_SECRET_KEY in one run, so that the route ids of feedback_bodies verify
SECRET_KEY = secrets.token_hex(32)


def feedback_bodies(count: int, seed: int = 0) -> list[bytes]:
    """Feedback as an engine sends it: counts for the 13 tasks, half by task_type, half by a route_id of
    policy set version 1 (the only one: feedback does not look a decision up), signed with the servers' key
    as a decision's is."""
    rng = np.random.default_rng(seed)
    bodies = []
    for i in range(count):
        task = TASKS[i % len(TASKS)]
        rounds = int(rng.integers(1, 31))
        drafted = int(rng.integers(0, 4 * rounds + 1))
        counts = {"rounds": rounds, "drafted": drafted, "accepted": int(rng.integers(0, drafted + 1))}
        named = {"route_id": new_route_id(1, task, route_key(SECRET_KEY))} if i % 2 else {"task_type": task}
        bodies.append(json.dumps({**named, **counts}).encode())
    return bodies


def count_rows(url: str, table: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
    finally:
        engine.dispose()


def trees(args) -> list[tuple[str, Path]]:
    """(label, checkout root) of every tree served: ``--checkout`` ("today", or its ``--label``), and
    ``--against``'s tree beside it ("before", or its ``--against-label``) where given."""
    found = [(args.label, args.checkout.resolve())]
    if args.against is not None:
        found.append((args.against_label, args.against.resolve()))
    return found


def http(prompts: list[str], args) -> dict:
    """Every (tree, database, workers) server and the bare app up together, each tree's databases prepared by
    its own command line; each of ``args.runs`` rounds drives each (server, endpoint) in turn; medians per
    row. With one tree the rows are keyed "database | server | endpoint", with two "tree | database | ..."."""
    folder = tempfile.mkdtemp(prefix="specroute-bench-router-")
    bodies = {
        "route": [json.dumps({"prompt": p, "max_new_tokens": 128}).encode() for p in prompts],
        "feedback": feedback_bodies(2000),
    }
    served_trees = trees(args)
    started, logs, rows, stored = {}, [], {}, {}
    with contextlib.ExitStack() as stack:
        tree_urls = {
            label: stack.enter_context(databases(args.database, folder, f"router{index}"))
            for index, (label, _) in enumerate(served_trees)
        }
        roots = dict(served_trees)
        for label, urls in tree_urls.items():
            for url in urls.values():
                prepare_database(url, roots[label])
        first_urls = tree_urls[served_trees[0][0]]
        servers = [
            (
                ("-", "-", "bare WSGI app"),
                [sys.executable, "-c", BARE_APP],
                first_urls.get("sqlite", "sqlite://"),
            )
        ] + [
            (
                (label, kind, server_name(workers)),
                [sys.executable, "-m", "webui.cli", "serve", "--workers", str(workers)],
                url,
            )
            for label, urls in tree_urls.items()
            for kind, url in urls.items()
            for workers in args.workers
        ]
        try:
            for key, command, url in servers:  # all up at once, so that their runs can be interleaved
                port = free_port()
                root = roots.get(key[0], served_trees[0][1])
                argv = command + (
                    [str(port), str(args.threads)]
                    if key[2].startswith("bare")
                    else ["--port", str(port), "--threads", str(args.threads)]
                )
                logs.append(open(Path(folder) / f"server-{port}.log", "wb"))
                started[key] = (
                    port,
                    subprocess.Popen(
                        argv,
                        env=server_env(root, url, folder),
                        cwd=root,
                        stdout=logs[-1],
                        stderr=subprocess.STDOUT,
                    ),
                )
            plan = [
                (key, "route" if key[1] == "-" else endpoint)
                for key in started
                for endpoint in (["-"] if key[1] == "-" else args.endpoints)
            ]
            routed: dict[tuple[str, str], int] = {}  # (tree, database): route answers given, each one logged
            for key, (port, _) in started.items():
                wait_for(port)
                if key[1] != "-":
                    ready = drive(port, "/v1/route", bodies["route"], args.concurrency, 2.0, 1.0)
                    routed[key[:2]] = routed.get(key[:2], 0) + ready["answered_200"]  # its router is loaded
            runs = {step: [] for step in plan}
            for _ in range(args.runs):
                for key, endpoint in plan:
                    port = started[key][0]
                    measured = drive(
                        port,
                        ENDPOINTS[endpoint],
                        bodies[endpoint],
                        args.concurrency,
                        args.seconds,
                        args.warmup,
                    )
                    runs[(key, endpoint)].append(measured)
                    if endpoint == "route" and key[1] != "-":
                        routed[key[:2]] = routed.get(key[:2], 0) + measured["answered_200"]
        finally:
            for _, server in started.values():
                server.terminate()
                server.wait(timeout=30)
            for log in logs:
                log.close()
        for ((tree, kind, server), endpoint), measured in runs.items():
            row_key = f"{kind} | {server} | {'-' if kind == '-' else ENDPOINTS[endpoint]}"
            if len(served_trees) > 1:
                row_key = f"{tree} | {row_key}"
            rows[row_key] = {
                **({"tree": tree} if len(served_trees) > 1 else {}),
                "database": kind,
                "server": server,
                "endpoint": "-" if kind == "-" else ENDPOINTS[endpoint],
                "runs": measured,
                "requests_per_s": float(np.median([r["requests_per_s"] for r in measured])),
                "p50_ms": float(np.median([r["p50_ms"] for r in measured])),
                "p99_ms": float(np.median([r["p99_ms"] for r in measured])),
                "errors": int(sum(r["errors"] for r in measured)),
                "error_examples": [e for r in measured for e in r["error_examples"]][:3],
            }
        for label, urls in tree_urls.items():
            for kind, url in urls.items():
                logged = count_rows(url, "route_decisions")
                stored[kind if len(served_trees) == 1 else f"{label} {kind}"] = {
                    "decisions_logged": logged,
                    "decisions_answered": routed.get((label, kind), 0),
                    "every_decision_logged": logged == routed.get((label, kind), 0),
                    "feedback_events": count_rows(url, "feedback_events"),
                }
    result = {"rows": rows, "stored": stored, "checkout": str(served_trees[0][1])}
    if len(served_trees) > 1:
        result["trees"] = {label: str(root) for label, root in served_trees}
        result["threads"], result["concurrency"], result["seconds"] = (
            args.threads,
            args.concurrency,
            args.seconds,
        )
        result["machine"] = f"{cpu_model_name()}, {os.cpu_count()} CPUs"
        result["endpoints"], result["workers"], result["runs"] = args.endpoints, args.workers, args.runs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-chars", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the corpus in process")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=8, help="server threads (per process)")
    parser.add_argument(
        "--workers",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 2],
        help="comma-separated server process counts to measure (specroute serve --workers)",
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3, help="load runs per server (medians reported)")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-in-process", action="store_true", help="measure over HTTP only")
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgresql", "both"),
        default="both",
        help="database(s) the HTTP servers run on (default both; postgresql starts a throw-away "
        "server with initdb/pg_ctl, found on PATH or under /usr/lib/postgresql)",
    )
    parser.add_argument(
        "--endpoints",
        type=lambda v: v.split(","),
        default=["route", "feedback"],
        help="comma-separated endpoints to drive over HTTP: route (POST /v1/route), "
        "feedback (POST /v1/feedback)",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=ROOT,
        help="serve the specroute of this checkout (default: this one), e.g. a git worktree "
        "of an older commit, to compare versions under the same load generator",
    )
    parser.add_argument(
        "--label", default="today", help="the --checkout tree's name in the rows (with --against)"
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="serve this checkout's specroute too, beside --checkout's, every server up at once and the runs "
        "interleaved (e.g. a git worktree of an older commit); the rows name each tree",
    )
    parser.add_argument("--against-label", default="before", help="the --against tree's name in the rows")
    parser.add_argument(
        "--features", default="tfidf", help="classifier feature set: tfidf, minilm or tfidf+minilm"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.database = list(DATABASES) if args.database == "both" else [args.database]
    if set(args.endpoints) - set(ENDPOINTS):
        parser.error(f"--endpoints: choose from {', '.join(ENDPOINTS)}")
    FEATURES["name"] = args.features
    prompts = corpus_prompts(args.max_chars)
    data = cold_start_data()  # the same prompts in the same order, with labels
    train = (
        [t for i, t in enumerate(data.texts) if i % 3],
        [label for i, label in enumerate(data.labels) if i % 3],
    )
    traffic = [t[: args.max_chars] for i, t in enumerate(data.texts) if i % 3 == 0]
    print(
        f"{len(prompts)} corpus prompts cut to <= {args.max_chars} chars; {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    result = {}
    if not args.skip_in_process:
        local = in_process(train, traffic, args.repeats)
        print(
            f"\nin-process decision latency (1 thread), {args.features} classifier trained on "
            f"{len(train[0])} corpus prompts, "
            f"timed on the other {len(traffic)} (cut to <= {args.max_chars} chars):"
        )
        print("path | p50 ms | p99 ms | p99 ms, 1500-2000 chars | calls")
        labels = {
            "first sight": "Router.route, first pass (fresh router; word cache holds only the vocabulary's words)",
            "fast": "Router.route (FastScorer), interleaved",
            "pipeline": "baseline: pipeline.predict_proba, interleaved",
            "fast alone": "Router.route (FastScorer), alone",
        }
        for name in ("first sight", "fast", "pipeline", "fast alone"):
            r = local[name]
            print(
                f"{labels[name]} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p99_ms_1500_2000_chars']:.3f} | {r['calls']}"
            )
        print(
            f"same task from both paths: {100 * local['same_task']:.2f}%; "
            f"{local['long_prompts']} prompts of 1500-2000 chars; {local['cached_words']} words cached; "
            f"p50 speedup {local['pipeline']['p50_ms'] / local['fast']['p50_ms']:.1f}x"
        )
        result["in_process"] = local
    if not args.skip_http:
        served = http(prompts, args)
        result["http"] = served
        print(
            f"\nHTTP ({served['checkout']}), {args.threads} threads per process (waitress in each process, under "
            f"gunicorn's arbiter above 1; the bare app on waitress), asyncio load generator in another process, "
            f"concurrency {args.concurrency}, {args.seconds:g} s per run after {args.warmup:g} s warm-up, "
            f"median of {args.runs} runs (servers interleaved):"
        )
        print("database | server | endpoint | req/s | p50 ms | p99 ms | errors")
        for r in served["rows"].values():
            tree = f"{r['tree']} | " if "tree" in r else ""
            print(
                f"{tree}{r['database']} | {r['server']} | {r['endpoint']} | {r['requests_per_s']:.0f} | "
                f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']}"
            )
        for kind, stored in served["stored"].items():
            print(
                f"{kind}: {stored['decisions_logged']} decisions logged of {stored['decisions_answered']} "
                f"answered ({'every one' if stored['every_decision_logged'] else 'NOT every one'}), "
                f"{stored['feedback_events']} feedback events stored"
            )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
