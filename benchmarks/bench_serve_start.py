"""Server start: `python -m webui.cli serve` (its in-process worker on, idle) started from two
checkouts, interleaved, N times each: seconds until /healthz answers 200, the server's resident memory
after it served six pages, and whether torch was mapped into it.

    git worktree add /tmp/old db66515   # the commit before `specroute serve` stopped importing torch
    python benchmarks/bench_serve_start.py --before /tmp/old --runs 5
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

PY = sys.executable


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once(root):
    folder = tempfile.mkdtemp()
    env = {**os.environ, "SPECROUTE_DATA_DIR": folder, "PYTHONPATH": root, "SPECROUTE_UI_WORKER": "true"}
    subprocess.run(
        [PY, "-m", "webui.cli", "db", "upgrade"], cwd=root, env=env, check=True, capture_output=True
    )
    p = port()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [PY, "-m", "webui.cli", "serve", "--port", str(p)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{p}/healthz", timeout=1).read()
            break
        except Exception:
            time.sleep(0.02)
    ready = time.perf_counter() - started
    for path in ("/", "/prompts", "/runs", "/classifier", "/policies", "/v1/policies"):
        urllib.request.urlopen(f"http://127.0.0.1:{p}{path}", timeout=10).read()
    rss = (
        next(int(line.split()[1]) for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS"))
        / 1024
    )
    torch = "torch" in open(f"/proc/{proc.pid}/maps").read()
    proc.terminate()
    proc.wait(timeout=30)
    return ready, rss, torch


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--before", required=True, help="checkout of the older commit")
parser.add_argument("--runs", type=int, default=5)
args = parser.parse_args()
CHECKOUTS = {
    f"before ({args.before})": args.before,
    "after (this checkout)": str(Path(__file__).resolve().parent.parent),
}
results = {k: [] for k in CHECKOUTS}
for _ in range(args.runs):
    for name, root in CHECKOUTS.items():
        results[name].append(once(root))
for name, rows in results.items():
    print(
        f"{name}: ready in {float(np.median([r[0] for r in rows])):.2f} s (median of {len(rows)}), "
        f"RSS {float(np.median([r[1] for r in rows])):.0f} MiB, torch mapped: {rows[0][2]}"
    )
