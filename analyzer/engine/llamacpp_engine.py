"""The llama.cpp engine (through llama-cpp-python): GGUF models loaded natively, quantized as shipped,
and the two passes a run measures with them: a greedy target generation decoded one token at a time
(the entropy of each step's distribution kept) and a teacher-forced pass over prompt + output that
gives each output position's argmax, for a draft (its match sequence) or for the target itself (how
often batched verification disagrees with one-token decoding: the replay's fidelity).

llama-cpp-python is an optional extra (``pip install -e '.[llamacpp]'``, built from source by pip);
:func:`require_llama_cpp` says how to get it instead of failing with an ImportError. Tokenization stays
the run's one rule (:mod:`analyzer.measuring.prompt_encoding`) with the Hugging Face tokenizer read from the same
GGUF file, so both engines measure the same token ids (llama.cpp's own tokenizer gives the same ids
for them; ``tests/test_llamacpp.py`` checks).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from analyzer.engine.engine_base import EngineUnavailable
from analyzer.models.loading import (
    _builtin_gguf_path,
    builtin_cache_folder,
    gguf_parsed_once,
    write_cache_atomically,
)
from analyzer.models.specs import ModelSpecRef, SpecError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LLAMA_CPP_PIN = "llama-cpp-python==0.3.36"
INSTALL_HINT = (
    "CMAKE_ARGS='-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF' pip install -e '.[llamacpp]' (compiles nothing), then "
    "'specroute llama-server build' (compiles llama.cpp once for llama-server and this binding: 4 to 14 "
    "minutes on 2 cores; see docs/llamacpp.md)"
)
CONTEXT_SLACK_TOKENS = 16  # positions beyond prompt + budget + lookahead, for the verify pass's extra tokens
LIBRARY_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"  # where llama-cpp-python loads llama.cpp's libraries from


def _binding_has_own_library(package_folder: Path) -> bool:
    """Whether llama-cpp-python was installed with llama.cpp compiled into it (pip's default build)."""
    return any((package_folder / "lib").glob("*llama.*"))


def require_llama_cpp(cache_root: Path | None = None) -> Any:
    """The ``llama_cpp`` module, or :class:`EngineUnavailable` saying how to install it. A binding installed
    without llama.cpp's library (``-DLLAMA_BUILD=OFF``, as the README installs it) loads the libraries
    ``specroute llama-server build`` keeps in ``cache_root`` (default: the data folder's cache), unless
    LLAMA_CPP_LIB_PATH already names a folder."""
    import importlib.util
    import sys

    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            raise EngineUnavailable(
                f"the llama.cpp engine needs llama-cpp-python, which is not installed here: {INSTALL_HINT}"
            )
        if not os.environ.get(LIBRARY_PATH_VARIABLE) and not _binding_has_own_library(
            Path(spec.origin).parent
        ):
            from analyzer.engine.llama_server import BINARY, BUILD_COMMAND, build_roots, library_dir
            from analyzer.settings import load_settings

            settings = load_settings()
            cache = cache_root if cache_root is not None else settings.resolved_data_dir() / "cache"
            build_cache = settings.resolved_build_cache()
            libraries = library_dir(cache, build_cache=build_cache)
            if libraries is None:
                places = " nor ".join(str(root / BINARY) for root in build_roots(cache, build_cache))
                raise EngineUnavailable(
                    "llama-cpp-python is installed without llama.cpp's library (CMAKE_ARGS=-DLLAMA_BUILD=OFF, as "
                    f"the README installs it), and neither {places} holds a build of it: run "
                    f"'{BUILD_COMMAND}' once (it compiles llama.cpp for llama-server and this binding, once per "
                    "machine)"
                )
            os.environ[LIBRARY_PATH_VARIABLE] = str(libraries)
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:  # OSError: the shared library missing or not loadable
        raise EngineUnavailable(
            f"the llama.cpp engine could not load llama-cpp-python ({exc}): {INSTALL_HINT}"
        ) from None
    return llama_cpp


def gguf_file(ref: ModelSpecRef) -> Path:
    """The GGUF file a ``gguf:`` or ``builtin:`` spec names (the only forms llama.cpp loads natively)."""
    if ref.kind == "builtin":
        return _builtin_gguf_path()
    if ref.kind == "gguf":
        path = Path(ref.location) / (ref.gguf_file or "")
        if not path.is_file():
            raise SpecError(f"GGUF file {ref.gguf_file!r} not found in folder {ref.location}")
        return path
    raise SpecError(
        f"the llama.cpp engine loads GGUF files only (gguf:<folder>#<file.gguf> or builtin:<name>), "
        f"not {ref.canonical!r}"
    )


def load_tokenizer(ref: ModelSpecRef, cache_dir: Path) -> "PreTrainedTokenizerBase":
    """The Hugging Face tokenizer of a GGUF model: the builtin model's cached copy when there is one, else
    the copy under ``cache_dir / "tokenizers"`` this file's first use saved (:func:`tokenizer_cache_folder`),
    else read from the GGUF file itself (parsed once, :func:`analyzer.models.loading.gguf_parsed_once`) and
    saved there. Never trusts remote code."""
    from transformers import AutoTokenizer

    if (
        ref.kind == "builtin"
        and (builtin_cache_folder(cache_dir, ref.location) / "tokenizer_config.json").is_file()
    ):
        return AutoTokenizer.from_pretrained(
            str(builtin_cache_folder(cache_dir, ref.location)), local_files_only=True
        )
    path = gguf_file(ref)
    copy = tokenizer_cache_folder(cache_dir, path)
    if (copy / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(copy), local_files_only=True)
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    write_cache_atomically(None, tokenizer, copy)
    return tokenizer


def tokenizer_cache_folder(cache_dir: Path, path: Path) -> Path:
    """Where the tokenizer read from GGUF file ``path`` is kept: named by the file's resolved path, size and
    modification time, so a file replaced in place is read again."""
    stat = path.stat()
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return Path(cache_dir) / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:20]


def default_threads() -> int:
    """The CPU threads llama.cpp decodes with: every core this process may run on (llama-cpp-python's
    own default is half of them), or fewer where OMP_NUM_THREADS says so, as torch reads it (a whole
    number from 1; anything else is ignored): two processes of two threads each on two cores stall each
    other at every step's barrier (a greedy generation 1.4 s alone, 9.5 s beside another)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    asked = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(cores, int(asked)) if asked.isdigit() and int(asked) >= 1 else cores


@dataclass
class LlamaGeneration:
    """One prompt's greedy output in llama.cpp: ``output_ids`` (N,) ending with the EOS when
    generation stopped there, ``entropies`` (N,) in nats of each step's next-token distribution,
    ``time_s`` the wall time of prefill plus decoding."""

    output_ids: list[int]
    entropies: np.ndarray
    stopped_at_eos: bool
    time_s: float


def entropy_nats_rows(logits: np.ndarray) -> np.ndarray:
    """Entropy of softmax(logits) per row, shape (N, V) -> (N,), in nats (float64 throughout)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -(np.exp(log_probs) * log_probs).sum(axis=-1)


class LlamaCppModel:
    """One GGUF model in a llama.cpp context of ``n_ctx`` positions, decoding with ``threads`` CPU
    threads. ``logits_all`` keeps every position's logits (what llama-cpp-python's speculative loop
    needs); ``draft_model`` makes its ``generate()`` speculate. The wrapped ``Llama`` is ``llm``."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        threads: int | None = None,
        logits_all: bool = False,
        draft_model: Any = None,
    ):
        llama_cpp = self._llama_cpp = require_llama_cpp()
        self.path, self.threads = Path(path), threads or default_threads()
        started = time.perf_counter()
        self.llm = llama_cpp.Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=min(512, n_ctx),
            n_threads=self.threads,
            n_threads_batch=self.threads,
            logits_all=logits_all,
            draft_model=draft_model,
            verbose=False,
        )
        self.load_seconds = time.perf_counter() - started
        self.n_vocab = int(self.llm.n_vocab())

    @property
    def n_ctx(self) -> int:
        return int(self.llm.n_ctx())

    @property
    def trained_context(self) -> int:
        """The context length the model was trained for (its GGUF metadata)."""
        return int(self.llm._model.n_ctx_train())

    @property
    def description(self) -> str:
        """llama.cpp's one-line description of the model, e.g. ``llama 135M Q4_1``."""
        return self.llm._model.desc()

    @property
    def quantization(self) -> str:
        """The weights' type as shipped (Q4_1, Q4_K_M, Q8_0, F16, ...), from the GGUF's
        ``general.file_type`` named as llama.cpp names it; the description's last word where unknown."""
        names = {
            getattr(self._llama_cpp, name): name.removeprefix("LLAMA_FTYPE_MOSTLY_").removeprefix(
                "LLAMA_FTYPE_"
            )
            for name in dir(self._llama_cpp)
            if name.startswith("LLAMA_FTYPE_")
        }
        try:
            return names[int(self.llm.metadata.get("general.file_type", ""))][:16]
        except (KeyError, ValueError):
            return self.description.split()[-1][:16]

    def eos_ids(self) -> list[int]:
        """The tokens that end generation in llama.cpp (its EOS, and the end-of-turn token if it differs)."""
        ids = {int(self.llm.token_eos())}
        eot = int(self.llm._model.token_eot()) if hasattr(self.llm._model, "token_eot") else -1
        if eot >= 0:
            ids.add(eot)
        return sorted(ids)

    def rewind(self, n_tokens: int) -> None:
        """Forget every cached position from ``n_tokens`` on (the KV cache rolled back)."""
        self.llm.n_tokens = n_tokens
        self.llm._ctx.kv_cache_seq_rm(-1, n_tokens, -1)

    def last_logits(self) -> np.ndarray:
        """The logits of the last position decoded, shape (V,) float32 (a copy)."""
        return np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,)).copy()

    def generate_greedy(
        self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]
    ) -> LlamaGeneration:
        """Greedy generation as llama.cpp serves it: the prompt in one pass (batches of ``n_batch``), then
        one ``llama_decode`` per token, the argmax of each step's logits taken (what its greedy sampler
        does), up to ``max_new_tokens`` or the first EOS."""
        eos = set(int(e) for e in eos_ids)
        output: list[int] = []
        entropies = []
        started = time.perf_counter()
        self.rewind(0)
        self.llm.eval(list(prompt_ids))
        while len(output) < max_new_tokens:
            logits = self.last_logits()
            token = int(logits.argmax())
            output.append(token)
            entropies.append(float(entropy_nats_rows(logits[None, :])[0]))
            if token in eos or len(output) == max_new_tokens:
                break
            self.llm.eval([token])
        elapsed = time.perf_counter() - started
        return LlamaGeneration(
            output, np.asarray(entropies, dtype=np.float64), bool(output) and output[-1] in eos, elapsed
        )

    def teacher_forced_argmax(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> np.ndarray:
        """The argmax of this model's logits predicting each output token given prompt + the output
        before it, from batched passes over prompt + output[:-1] (``n_batch`` tokens per
        ``llama_decode``, logits kept only for the output positions); shape (N,) int64."""
        n = len(output_ids)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        tokens = list(prompt_ids) + list(output_ids[:-1])
        first_kept = len(tokens) - n
        predicted = np.empty(n, dtype=np.int64)
        self.rewind(0)
        batch, step = self.llm._batch, self.llm.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            batch.set_batch(batch=chunk, n_past=start, logits_all=False)
            kept = [i for i in range(len(chunk)) if start + i >= first_kept]
            for i in range(len(chunk)):
                batch.batch.logits[i] = start + i >= first_kept
            self.llm._ctx.decode(batch)
            for i in kept:
                row = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(i), shape=(self.n_vocab,))
                predicted[start + i - first_kept] = int(row.argmax())
        self.rewind(0)
        return predicted

    def close(self) -> None:
        """Free the llama.cpp model and context now (rather than when garbage collected)."""
        self.llm.close()


def draft_matches(draft: LlamaCppModel, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> np.ndarray:
    """m_i = 1[the draft's argmax given prompt + t_<i equals t_i], shape (N,) int8, by teacher forcing."""
    predicted = draft.teacher_forced_argmax(prompt_ids, output_ids)
    return (predicted == np.asarray(list(output_ids), dtype=np.int64)).astype(np.int8)


def replay_mismatches(
    target: LlamaCppModel, prompt_ids: Sequence[int], output_ids: Sequence[int]
) -> np.ndarray:
    """1 where the target's argmax in a batched teacher-forced pass over prompt + output differs from
    the token one-token decoding generated, shape (N,) int8: how far batched verification in llama.cpp's
    quantized kernels departs from its decoding (0 everywhere when the replay is exact)."""
    return (1 - draft_matches(target, prompt_ids, output_ids)).astype(np.int8)


def context_size(prompt_tokens: int, max_new_tokens: int, gamma_max: int) -> int:
    """The llama.cpp context a run needs: the longest prompt, the budget, a full lookahead beyond it
    (llama.cpp drafts past the budget) and some slack, rounded up to 256."""
    needed = prompt_tokens + max_new_tokens + gamma_max + CONTEXT_SLACK_TOKENS
    return int(-(-needed // 256) * 256)
