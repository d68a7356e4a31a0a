"""Load: ``specroute serve`` under a loopback load generator for 60 s at concurrency 32, mixing
single routes, batch routes and feedback; zero errors expected, latency and throughput per kind, and
the server's resident memory sampled every second (growth between the first and the last 10 s).

The database gets the bundled corpus classifier and a policy set for all 13 task types. Each of the
``--concurrency`` keep-alive connections loops: 70% ``POST /v1/route`` (a corpus prompt), 10%
``POST /v1/route/batch`` (10 prompts), 20% ``POST /v1/feedback`` (half naming the route_id of this
connection's last decision, half by task type). The generator runs in its own process; the server
in another (``--workers`` processes; their RSS is summed).

    python benchmarks/bench_load.py --out benchmarks/results/load.json
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

from bench_router import TASKS, corpus_prompts, free_port, prepare_database, read_response, wait_for  # noqa: E402

ROUTE_ID = re.compile(rb'"route_id":"([0-9a-f-]{36})"')
KINDS = ("route", "batch", "feedback")


def _request(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _connection(port, prompts, seed, stop_at, results):
    rng = random.Random(seed)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    last_route_id = None
    try:
        while time.perf_counter() < stop_at:
            draw = rng.random()
            if draw < 0.7:
                kind, request = "route", _request("/v1/route", {"prompt": rng.choice(prompts), "max_new_tokens": 128})
            elif draw < 0.8:
                kind, request = "batch", _request("/v1/route/batch", {"requests": [{"prompt": rng.choice(prompts)}
                                                                                   for _ in range(10)]})
            else:
                counts = {"rounds": rng.randint(1, 30)}
                counts["drafted"] = rng.randint(0, 4 * counts["rounds"])
                counts["accepted"] = rng.randint(0, counts["drafted"])
                if last_route_id is not None and rng.random() < 0.5:
                    kind, request = "feedback", _request("/v1/feedback", {"route_id": last_route_id, **counts})
                else:
                    kind, request = "feedback", _request("/v1/feedback", {"task_type": rng.choice(TASKS), **counts})
            start = time.perf_counter_ns()
            writer.write(request)
            status_line, body = await read_response(reader)
            results.append((kind, time.perf_counter_ns() - start, int(status_line.split()[1]), time.perf_counter()))
            if kind == "route":
                found = ROUTE_ID.search(body)
                last_route_id = found.group(1).decode() if found else last_route_id
    finally:
        writer.close()


def load_process(port, prompts, concurrency, seconds, queue):
    async def main():
        results = []
        stop_at = time.perf_counter() + seconds
        await asyncio.gather(*[_connection(port, prompts, seed, stop_at, results) for seed in range(concurrency)])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="server processes (specroute serve --workers)")
    parser.add_argument("--threads", type=int, default=8, help="server threads per process")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    prompts = corpus_prompts(2000)
    folder = tempfile.mkdtemp(prefix="specroute-bench-load-")
    url = f"sqlite:///{folder}/load.db"
    prepare_database(url)
    env = {**os.environ, "SPECROUTE_DATABASE_URL": url, "SPECROUTE_DATA_DIR": folder, "SPECROUTE_UI_WORKER": "false",
           "OMP_NUM_THREADS": "1"}
    port = free_port()
    log = open(Path(folder) / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "webui.cli", "serve", "--port", str(port), "--threads", str(args.threads),
                               "--workers", str(args.workers)], env=env, cwd=Path(__file__).resolve().parent.parent,
                              stdout=log, stderr=subprocess.STDOUT)
    samples: list[tuple[float, int]] = []
    try:
        wait_for(port)
        warm = multiprocessing.Queue()  # every process loads its router before the clock starts
        warm_process = multiprocessing.Process(target=load_process, args=(port, prompts, args.concurrency, 3.0, warm))
        warm_process.start(), warm.get(), warm_process.join()
        queue = multiprocessing.Queue()
        generator = multiprocessing.Process(target=load_process, args=(port, prompts, args.concurrency, args.seconds, queue))
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
        rows[kind] = {"requests": len(chosen), "per_s": len(chosen) / args.seconds,
                      "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
                      "errors": sum(1 for r in chosen if r[2] >= 400),
                      "statuses": sorted({r[2] for r in chosen})}
    memory = np.asarray([m for t, m in samples], dtype=np.float64)
    first = memory[[i for i, (t, _) in enumerate(samples) if t - started <= 10.0]]
    last = memory[[i for i, (t, _) in enumerate(samples) if t - started >= args.seconds - 10.0]]
    growth = float(np.mean(last) / np.mean(first) - 1.0)
    print(f"specroute serve --workers {args.workers} --threads {args.threads}; {args.concurrency} connections for "
          f"{args.seconds:.0f} s; {os.cpu_count()} CPUs; load generator in another process")
    print("kind | requests | per s | p50 ms | p99 ms | errors")
    for kind, r in rows.items():
        print(f"{kind} | {r['requests']} | {r['per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']}")
    print(f"server RSS: first 10 s mean {np.mean(first) / 2**20:.1f} MiB, last 10 s mean {np.mean(last) / 2**20:.1f} MiB, "
          f"growth {100 * growth:+.2f}% (target < 10%); max {memory.max() / 2**20:.1f} MiB")
    print(f"first response at +{t0 - started:.2f} s")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "rss_mib": [(t - started, m / 2**20) for t, m in samples],
                                        "rss_growth": growth, "workers": args.workers, "threads": args.threads,
                                        "concurrency": args.concurrency, "seconds": args.seconds}, indent=1))


if __name__ == "__main__":
    main()
