"""Starting an analysis' llama-servers one after another (before session 29) and side by side (now,
``analyzer.engine.llama_server_process.start_all``): seconds until every one of N servers of the embedded model
answers /health with ok, the two ways interleaved, medians over the repeats and their ratio to the baseline.

An analysis in llama-server starts the plain server and one per setting (six for the demo's five settings),
and ``specroute serve`` with pools one per pool; each loads the model and runs its warm-up decode before it
serves. The servers are those an analysis starts (``LlamaServerProcess``: 2 threads, one slot, the context
the demo uses); N of them, the plain one and N - 1 n-gram ones.

    python benchmarks/bench_server_start.py --servers 6 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.engine.llama_server import find_llama_server  # noqa: E402
from analyzer.engine.llama_server_process import LlamaServerProcess, start_all  # noqa: E402
from analyzer.engine.llamacpp_engine import gguf_file  # noqa: E402
from analyzer.models.specs import parse_spec  # noqa: E402
from analyzer.settings import load_settings  # noqa: E402
from benchmarks.bench_solver import cpu_model  # noqa: E402

NGRAM_FLAGS = [
    "--spec-type",
    "ngram-simple",
    "--spec-ngram-simple-size-n",
    "2",
    "--spec-ngram-simple-size-m",
    "4",
]


def _servers(binary: Path, model: Path, count: int, threads: int, n_ctx: int) -> list[LlamaServerProcess]:
    return [
        LlamaServerProcess(binary, model, threads=threads, n_ctx=n_ctx, flags=[] if i == 0 else NGRAM_FLAGS)
        for i in range(count)
    ]


def one_after_another(servers: list[LlamaServerProcess]) -> None:
    for server in servers:
        server.start()


WAYS = {"one after another": one_after_another, "side by side (start_all)": start_all}  # the baseline first


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=6, help="servers started each time (default 6)")
    parser.add_argument("--repeats", type=int, default=5, help="starts of each way, interleaved (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="each server's threads (default 2)")
    parser.add_argument("--n-ctx", type=int, default=4096, help="each server's context (default 4096)")
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(
        os.environ.get("SPECROUTE_LLAMA_SERVER", ""), settings.resolved_data_dir() / "cache"
    ).path
    model = gguf_file(parse_spec("builtin:smollm2-135m-instruct"))
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(args.repeats):
        for name, start in WAYS.items():
            servers = _servers(binary, model, args.servers, args.threads, args.n_ctx)
            began = time.perf_counter()
            try:
                start(servers)
                times[name].append(time.perf_counter() - began)
            finally:
                for server in servers:
                    server.stop()
    base = float(np.median(times[next(iter(WAYS))]))
    print(f"{args.servers} llama-servers of {model.name}, {args.threads} threads each; {cpu_model()}, "
          f"{os.cpu_count()} cores; median of {args.repeats}, interleaved")  # fmt: skip
    print("| way | seconds until all serve (median) | ratio | every run |")
    print("|---|---|---|---|")
    for name, seconds in times.items():
        median = float(np.median(seconds))
        print(f"| {name} | {median:.2f} | {median / base:.2f} | {', '.join(f'{s:.2f}' for s in seconds)} |")


if __name__ == "__main__":
    main()
