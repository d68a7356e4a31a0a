"""Reading a GGUF file's metadata with gguf's own ``GGUFReader`` (the baseline, "before" in the table) and
with ``analyzer.models.gguf_fields.QuickGGUFReader`` (what specroute reads with, "now"), and what it does to a first
load: the Hugging Face tokenizer of the GGUF file (``analyzer.engine.llamacpp_engine.load_tokenizer``, the llama.cpp
engine's) and the transformers model dequantized from it (``analyzer.models.loading.load_model``, each into a new
cache folder).
Interleaved, the median of ``--repeats`` runs each, in this process (libraries imported before timing).

    python benchmarks/bench_gguf_read.py --repeats 5
    python benchmarks/bench_gguf_read.py --gguf /path/folder#model.gguf --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402, F401  (imported before timing)

from analyzer.engine.llamacpp_engine import load_tokenizer  # noqa: E402
from analyzer.models import gguf_fields  # noqa: E402
from analyzer.models.devices import cpu_model_name  # noqa: E402
from analyzer.models.loading import load_model  # noqa: E402
from analyzer.models.specs import SMOLLM2_BUILTIN, builtin_gguf_file, parse_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", default=f"builtin:{SMOLLM2_BUILTIN}", help="a builtin: or gguf: model spec")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ref = parse_spec(args.gguf)
    path = builtin_gguf_file() if ref.kind == "builtin" else Path(ref.location) / (ref.gguf_file or "")
    quick = gguf_fields.QuickGGUFReader
    ways = {"gguf's GGUFReader (before)": gguf.GGUFReader, "QuickGGUFReader (now)": quick}

    def with_reader(reader: type, work: Callable[[], object]) -> float:
        gguf_fields.QuickGGUFReader = reader  # type: ignore[misc]  (the one name loading reads)
        try:
            started = time.perf_counter()
            work()
            return time.perf_counter() - started
        finally:
            gguf_fields.QuickGGUFReader = quick  # type: ignore[misc]

    tasks: dict[str, Callable[[type], float]] = {
        "metadata read": lambda reader: with_reader(reader, lambda: reader(path)),
        "tokenizer, first load": lambda reader: with_reader(
            reader, lambda: load_tokenizer(ref, Path(tempfile.mkdtemp()))
        ),
        "model, first load": lambda reader: with_reader(
            reader, lambda: load_model(ref, cache_dir=Path(tempfile.mkdtemp()))
        ),
    }
    times: dict[tuple[str, str], list[float]] = {(t, w): [] for t in tasks for w in ways}
    for _ in range(args.repeats):  # interleaved: every way of every task once per round
        for task, run in tasks.items():
            for way, reader in ways.items():
                times[task, way].append(run(reader))
    print(
        f"{path.name}: {cpu_model_name()}, {torch.get_num_threads()} torch threads, median of {args.repeats}"
    )
    print("| what | read by | median (s) | ratio |")
    print("|---|---|---|---|")
    for task in tasks:
        base = float(np.median(times[task, next(iter(ways))]))
        for way in ways:
            median = float(np.median(times[task, way]))
            print(f"| {task} | {way} | {median:.2f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
