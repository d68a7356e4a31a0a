"""Where a routed request's time goes: ``specroute serve`` (one process, ``--threads``) on a SQLite file prepared as
benchmarks/bench_router.py prepares it, under that script's load generator posting corpus prompts to ``/v1/route``,
sampled by py-spy (a sampling profiler that reads the server's stacks from outside it, so the server runs as it does
in production) for ``--seconds``. Only the thread holding the GIL is sampled (py-spy's ``--gil``): the server's
Python runs one thread at a time, so these samples are where its CPU time goes, and the sampling instants at which
no thread held the GIL (the expected count less the samples taken) are the time it waited on sockets, the database
or a CPU. Each sample is put in the first category any frame of its stack names, in this order: the decision log's
write (its writer thread), metrics, serializing the answer (its model written as JSON), parsing the JSON, validating
the request (its model), the decision (classifying the prompt, the policy's choice and the answer's model built),
access and errors, and the server and framework (waitress, Flask, Werkzeug); the shares are of all samples taken.

    pip install py-spy
    python benchmarks/profile_router.py [--seconds 20] [--threads 8] [--concurrency 16]
    git worktree add /tmp/before 49cefe4 && python benchmarks/profile_router.py --checkout /tmp/before --label 49cefe4

Writes benchmarks/results/router_profile.json (the shares and the 25 heaviest innermost project frames) and the
collapsed stacks beside it (router_profile.stacks.txt, for a flame graph), then rewrites benchmarks/README.md;
with ``--checkout DIR --label NAME`` it profiles the specroute of another checkout (its database prepared by its
own command line) into router_profile_NAME.json, which the README shows beside today's.
Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench_router import (  # this folder's own (on sys.path as the script's folder)
    ROOT,
    corpus_prompts,
    drive,
    free_port,
    prepare_database,
    server_env,
    wait_for,
)

from analyzer.models.devices import cpu_model_name

HERE = Path(__file__).resolve().parent
# (category, what a frame's text contains), in order: a sample is the first category any frame of it names
CATEGORIES = (
    ("decision log", ("decision_log.py", "batch_writer.py")),
    ("metrics", ("router/serve/metrics.py", "prometheus")),
    ("serializing", ("to_json (", "strict_json.py", "jsonify")),
    ("parsing", ("_parse_json", "json_input.py", "json/decoder.py", "json/__init__.py")),
    ("validating", ("read_route (", "read_batch (")),
    ("deciding", ("router/decide/", "router/classify/", "router/serve/service.py")),
    ("access and errors", ("webui/access.py", "api_error", "error_payload")),
    ("server and framework", ("waitress", "flask", "werkzeug", "router/serve/api.py", "webui/app.py")),
)
OTHER = "other"


def category(stack: list[str]) -> str:
    """The category of one sample's ``stack``: the first of :data:`CATEGORIES` any of its frames names (so a
    reason serialized for the decision log is the log's, and a request thread's Flask frames count only where
    nothing of the product's own work is under them)."""
    for name, needles in CATEGORIES:
        if any(needle in frame for frame in stack for needle in needles):
            return name
    return OTHER


def project_frame(stack: list[str]) -> str | None:
    """The innermost frame of the project's own code (analyzer/, router/, webui/) in ``stack``."""
    for frame in reversed(stack):
        if any(f"{package}/" in frame for package in ("analyzer", "router", "webui")):
            return frame
    return None


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: one ``frame;frame;... count`` line per distinct stack."""
    stacks = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        text, _, count = line.rpartition(" ")
        if text and count.isdigit():
            stacks.append((text.split(";"), int(count)))
    return stacks


def shares(stacks: list[tuple[list[str], int]]) -> dict:
    """Each category's share of all samples, and the heaviest innermost project frames."""
    by_category: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    for stack, count in stacks:
        by_category[category(stack)] += count
        own = project_frame(stack)
        if own is not None:
            frames[own] += count
    total = sum(by_category.values())
    return {
        "samples": total,
        "shares": {name: by_category[name] / total for name, _ in (*CATEGORIES, (OTHER, ()))}
        if total
        else {},
        "top_frames": [[frame, count / total] for frame, count in frames.most_common(25)] if total else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=8, help="server threads")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="profile the specroute of this checkout")
    parser.add_argument("--label", default="", help="with --checkout: the name its result is stored under")
    args = parser.parse_args()
    root = args.checkout.resolve()
    if (root != ROOT) != bool(args.label):
        parser.error("give --label with --checkout (and only then)")
    suffix = f"_{args.label}" if args.label else ""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    folder = tempfile.mkdtemp(prefix="specroute-profile-router-")
    url = f"sqlite:///{folder}/router.db"
    prepare_database(url, root)
    prompts = corpus_prompts(2000)
    bodies = [json.dumps({"prompt": p, "max_new_tokens": 128}).encode() for p in prompts]
    port = free_port()
    stacks_file = HERE / "results" / f"router_profile{suffix}.stacks.txt"
    with open(Path(folder) / "server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "webui.cli", "serve", "--port", str(port), "--threads", str(args.threads)],
            env=server_env(root, url, folder),
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(port)
            drive(port, "/v1/route", bodies, args.concurrency, 3.0, 1.0)  # the router loaded and warm
            record = [
                spy, "record", "--pid", str(server.pid), "--duration", str(int(args.seconds)),
                "--rate", str(args.rate), "--format", "raw", "--threads", "--nonblocking", "--gil",
                "--output", str(stacks_file),
            ]  # fmt: skip
            sampled: dict = {}
            profiler = threading.Thread(
                target=lambda: sampled.update(done=subprocess.run(record, capture_output=True, text=True))
            )
            profiler.start()
            load = drive(port, "/v1/route", bodies, args.concurrency, args.seconds, 0.5)
            profiler.join()
        finally:
            server.terminate()
            server.wait(timeout=30)
    if sampled["done"].returncode != 0:
        raise SystemExit(f"py-spy failed: {sampled['done'].stderr[-2000:]}")
    found = shares(read_stacks(stacks_file))
    expected = args.rate * int(args.seconds)
    found["gil_free"] = max(0.0, 1.0 - found["samples"] / expected) if expected else 0.0
    result = {
        "machine": f"{cpu_model_name()}, {os.cpu_count()} CPUs",
        "threads": args.threads,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "load": load,
        **found,
        "checkout": args.label or "today",
        "command": f"python benchmarks/profile_router.py --seconds {args.seconds:g} --threads {args.threads} "
        f"--concurrency {args.concurrency}" + (f" --checkout DIR --label {args.label}" if args.label else ""),
    }
    for name, share in found["shares"].items():
        print(f"{name:<22} {100 * share:5.1f}%")
    print(f"no thread held the GIL at {100 * found['gil_free']:.1f}% of the sampling instants")
    print(f"{load['requests_per_s']:.0f} requests/s under the profiler, p99 {load['p99_ms']:.1f} ms")
    out = HERE / "results" / f"router_profile{suffix}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} and {stacks_file}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    print(f"rewrote {write_readme()}")


if __name__ == "__main__":
    main()
