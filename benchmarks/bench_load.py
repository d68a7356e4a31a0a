"""Load: ``specroute serve`` under a loopback load generator for 60 s at concurrency 32, mixing
single routes, batch routes and feedback; zero errors expected, latency and throughput per kind, and
the server's resident memory sampled every second (growth between the first and the last 10 s).

The database gets the bundled corpus classifier and a policy set for all 13 task types. Each of the
``--concurrency`` keep-alive connections loops: 70% ``POST /v1/route`` (a corpus prompt), 10%
``POST /v1/route/batch`` (10 prompts), 20% ``POST /v1/feedback`` (half naming the route_id of this
connection's last decision, half by task type). The generator runs in its own process; the server
in another (``--workers`` processes; their RSS is summed). With ``--database both`` (the default) the
whole measurement runs on a temporary SQLite file, then on a throw-away PostgreSQL server
(``benchmarks/pg_server.py``), and one table has a database column. ``--checkout DIR`` serves (and
prepares the database with) the specroute of another checkout, e.g. a git worktree of an older commit.

    python benchmarks/bench_load.py --out benchmarks/results/load.json
    python benchmarks/bench_load.py --workers 2 --checkout /tmp/before16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_router import (
    DATABASES,
    ROOT,
    TASKS,
    corpus_prompts,
    databases,
    free_port,
    prepare_database,  # noqa: E402
    read_response,
    server_env,
    wait_for,
)

ROUTE_ID = re.compile(rb'"route_id":"([^"]+)"')
KINDS = ("route", "batch", "feedback")


def _request(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _connection(port, prompts, seed, stop_at, results):
    rng = random.Random(seed)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    last_route_id = None
    try:
        while time.perf_counter() < stop_at:
            draw = rng.random()
            if draw < 0.7:
                kind, request = (
                    "route",
                    _request("/v1/route", {"prompt": rng.choice(prompts), "max_new_tokens": 128}),
                )
            elif draw < 0.8:
                kind, request = (
                    "batch",
                    _request(
                        "/v1/route/batch", {"requests": [{"prompt": rng.choice(prompts)} for _ in range(10)]}
                    ),
                )
            else:
                counts = {"rounds": rng.randint(1, 30)}
                counts["drafted"] = rng.randint(0, 4 * counts["rounds"])
                counts["accepted"] = rng.randint(0, counts["drafted"])
                if last_route_id is not None and rng.random() < 0.5:
                    kind, request = (
                        "feedback",
                        _request("/v1/feedback", {"route_id": last_route_id, **counts}),
                    )
                else:
                    kind, request = (
                        "feedback",
                        _request("/v1/feedback", {"task_type": rng.choice(TASKS), **counts}),
                    )
            start = time.perf_counter_ns()
            writer.write(request)
            status_line, body = await read_response(reader)
            results.append(
                (kind, time.perf_counter_ns() - start, int(status_line.split()[1]), time.perf_counter())
            )
            if kind == "route":
                found = ROUTE_ID.search(body)
                last_route_id = found.group(1).decode() if found else last_route_id
    finally:
        writer.close()


def load_process(port, prompts, concurrency, seconds, queue):
    async def main():
        results = []
        stop_at = time.perf_counter() + seconds
        await asyncio.gather(
            *[_connection(port, prompts, seed, stop_at, results) for seed in range(concurrency)]
        )
        return results

    queue.put(asyncio.run(main()))


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children (server workers)."""
    total = 0
    for p in [pid] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]:
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def measure(url: str, root: Path, folder: str, prompts: list[str], args) -> dict:
    """One server (``args.workers`` processes) of the checkout at ``root`` on the database at ``url``
    under the mixed load for ``args.seconds``: rows per kind, and its resident memory."""
    prepare_database(url, root)
    port = free_port()
    log = open(Path(folder) / f"server-{port}.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webui.cli",
            "serve",
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--workers",
            str(args.workers),
        ],
        env=server_env(root, url, folder),
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    samples: list[tuple[float, int]] = []
    try:
        wait_for(port)
        warm = multiprocessing.Queue()  # every process loads its router before the clock starts
        warm_process = multiprocessing.Process(
            target=load_process, args=(port, prompts, args.concurrency, 3.0, warm)
        )
        warm_process.start(), warm.get(), warm_process.join()
        queue = multiprocessing.Queue()
        generator = multiprocessing.Process(
            target=load_process, args=(port, prompts, args.concurrency, args.seconds, queue)
        )
        stop = threading.Event()

        def sample():
            while not stop.wait(1.0):
                samples.append((time.perf_counter(), rss_bytes(server.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        started = time.perf_counter()
        generator.start()
        sampler.start()
        results = queue.get()
        generator.join()
        stop.set()
        sampler.join()
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    t0 = min(r[3] for r in results)
    rows = {}
    for kind in KINDS + ("all",):
        chosen = [r for r in results if kind == "all" or r[0] == kind]
        latencies = np.asarray([r[1] for r in chosen], dtype=np.float64) / 1e6
        rows[kind] = {
            "requests": len(chosen),
            "per_s": len(chosen) / args.seconds,
            "p50_ms": float(np.percentile(latencies, 50)) if chosen else float("nan"),
            "p99_ms": float(np.percentile(latencies, 99)) if chosen else float("nan"),
            "errors": sum(1 for r in chosen if r[2] >= 400),
            "statuses": sorted({r[2] for r in chosen}),
        }
    memory = np.asarray([m for t, m in samples], dtype=np.float64)
    window = min(10.0, args.seconds / 2)
    first = memory[[i for i, (t, _) in enumerate(samples) if t - started <= window]]
    last = memory[[i for i, (t, _) in enumerate(samples) if t - started >= args.seconds - window]]
    growth = float(np.mean(last) / np.mean(first) - 1.0) if len(first) and len(last) else float("nan")
    return {
        "rows": rows,
        "rss_mib": [(t - started, m / 2**20) for t, m in samples],
        "rss_growth": growth,
        "rss_first_mib": float(np.mean(first)) / 2**20 if len(first) else float("nan"),
        "rss_last_mib": float(np.mean(last)) / 2**20 if len(last) else float("nan"),
        "rss_max_mib": float(memory.max()) / 2**20 if len(memory) else float("nan"),
        "first_response_s": t0 - started,
        "window_s": window,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="server processes (specroute serve --workers)")
    parser.add_argument("--threads", type=int, default=8, help="server threads per process")
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgresql", "both"),
        default="both",
        help="database(s) to measure on, one after the other (default both; postgresql starts a "
        "throw-away server with initdb/pg_ctl, found on PATH or under /usr/lib/postgresql)",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=ROOT,
        help="serve the specroute of this checkout (default: this one), e.g. a git worktree "
        "of an older commit, to compare versions under the same load generator",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kinds = list(DATABASES) if args.database == "both" else [args.database]
    root = args.checkout.resolve()
    prompts = corpus_prompts(2000)
    folder = tempfile.mkdtemp(prefix="specroute-bench-load-")
    measured = {}
    with databases(kinds, folder, "load") as urls:
        for kind, url in urls.items():
            measured[kind] = measure(url, root, folder, prompts, args)
    print(
        f"specroute serve --workers {args.workers} --threads {args.threads} ({root}); {args.concurrency} connections "
        f"for {args.seconds:g} s per database; {os.cpu_count()} CPUs; load generator in another process"
    )
    print("database | kind | requests | per s | p50 ms | p99 ms | errors")
    for kind, result in measured.items():
        for name, r in result["rows"].items():
            print(
                f"{kind} | {name} | {r['requests']} | {r['per_s']:.0f} | {r['p50_ms']:.1f} | "
                f"{r['p99_ms']:.1f} | {r['errors']}"
            )
    for kind, result in measured.items():
        print(
            f"{kind}: server RSS first {result['window_s']:g} s mean {result['rss_first_mib']:.1f} MiB, last "
            f"{result['window_s']:g} s mean {result['rss_last_mib']:.1f} MiB, "
            f"growth {100 * result['rss_growth']:+.2f}% "
            f"(target < 10%); max {result['rss_max_mib']:.1f} MiB; first response at "
            f"+{result['first_response_s']:.2f} s"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "databases": measured,
                    "workers": args.workers,
                    "threads": args.threads,
                    "concurrency": args.concurrency,
                    "seconds": args.seconds,
                    "checkout": str(root),
                },
                indent=1,
            )
        )
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
