"""The pair a llama.cpp run measures with (the counterpart of :class:`analyzer.engine.run_models.RunModels`):
target and draft GGUF files loaded natively in llama.cpp, quantized as shipped, the Hugging Face
tokenizer read from the target's GGUF (the run's one tokenization rule, so both engines measure the
same ids), and what the run's phases ask of an engine: the passes of one prompt, the cost profile,
the machinery overhead, validation."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analyzer.engine.engine_base import ProfilingPlan
from analyzer.engine.llamacpp_engine import (
    LlamaCppModel,
    draft_matches,
    gguf_file,
    load_tokenizer,
    replay_mismatches,
    require_llama_cpp,
)
from analyzer.errors import SpecrouteError
from analyzer.measuring.acceptance import LLAMA_CPP_RULE, DraftingRule
from analyzer.measuring.prompt_encoding import EncodedPrompt, encode_prompt, token_texts
from analyzer.measuring.prompt_passes import PromptPasses
from analyzer.models.specs import ModelSpecRef, parse_spec
from analyzer.models.tokenizer_match import check_same_tokenizer
from analyzer.names import LLAMA_CPP
from analyzer.orm import ModelPair, Prompt
from analyzer.run_params import RunParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from analyzer.engine.llamacpp_speculative import SpeculativePair
    from analyzer.engine.overhead import GenerateCallback

MAX_CONTEXT_TOKENS = (
    4096  # the context a llama.cpp run holds unless it sets n_ctx (its KV cache is sized for it)
)


class LlamaCppRunError(SpecrouteError, ValueError):
    """A llama.cpp run cannot be measured as asked (the message says why)."""

    status, code = 400, "invalid_run"


@dataclass
class LlamaCppRunModels:
    """``target`` and ``draft`` (None for prompt lookup) in llama.cpp contexts of ``n_ctx`` positions;
    ``tokenizer`` the target's, from its GGUF file; ``eos_ids`` the tokens llama.cpp ends generation at."""

    target: LlamaCppModel
    draft: LlamaCppModel | None
    draft_ref: ModelSpecRef
    tokenizer: PreTrainedTokenizerBase
    draft_tokenizer: PreTrainedTokenizerBase | None
    eos_ids: list[int]
    pad_id: int
    engine: str = LLAMA_CPP
    rule: DraftingRule = LLAMA_CPP_RULE
    _pair: SpeculativePair | None = field(default=None, repr=False)

    @property
    def ngram_max(self) -> int | None:
        return int(self.draft_ref.options.get("max_ngram", 2)) if self.draft_ref.kind == "ngram" else None

    def prompt_limit(self, params: RunParams) -> int:
        """``max_prompt_tokens``, else the context less the new tokens, a draft's lookahead and 16 spare."""
        return params.max_prompt_tokens or max(
            16, self.target.n_ctx - params.max_new_tokens - params.gamma_max - 16
        )

    def encode(self, prompt: Prompt, params: RunParams) -> EncodedPrompt:
        """The prompt's ids under the run's rule (chat template, at most :meth:`prompt_limit` ids)."""
        return encode_prompt(
            self.tokenizer,
            text=prompt.text,
            messages=prompt.messages,
            use_chat_template=params.chat_template,
            max_prompt_tokens=self.prompt_limit(params),
        )

    def token_texts(self, token_ids: list[int]) -> list[str]:
        return token_texts(self.tokenizer, token_ids)

    def device_text(self) -> str:
        from analyzer.engine.llamacpp_cost import device_text

        return device_text(self.target)

    def dtype_text(self) -> str:
        """The target's weights as shipped (Q4_1, Q8_0, F16, ...)."""
        return self.target.quantization

    def profiling_plan(self, params: RunParams) -> ProfilingPlan:
        """On the CPU in the GGUF file's own quantization, batch 1, timing llama.cpp's own loop."""
        device, dtype = self.device_text(), self.dtype_text()
        return ProfilingPlan(
            device, dtype, f"{device}, weights {dtype}", "llama.cpp's Llama.generate()", (1,), None
        )

    def warmup_passes(self) -> int:
        """One untimed pass before each timed model's first timed one."""
        return 1

    def library_versions(self) -> dict:
        import transformers

        llama_cpp = require_llama_cpp()

        return {
            "llama_cpp_python": llama_cpp.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
        }

    def tokenizers(self) -> tuple[object, object | None]:
        return self.tokenizer, self.draft_tokenizer

    def measure_batch(
        self, encoded: list[EncodedPrompt], params: RunParams, *, seed: int
    ) -> list[PromptPasses]:
        """:meth:`measure` of each prompt (llama.cpp runs one sequence per context; greedy, so no seed)."""
        return [self.measure(enc, params) for enc in encoded]

    def measure(self, enc: EncodedPrompt, params: RunParams) -> PromptPasses:
        """One prompt's passes: the greedy generation, the draft's match sequence (a model draft) and
        the fidelity of the replay (batched teacher-forced target pass against one-token decoding)."""
        generation = self.target.generate_greedy(enc.ids, params.max_new_tokens, self.eos_ids)
        output = generation.output_ids
        started = time.perf_counter()
        matches = draft_matches(self.draft, enc.ids, output) if self.draft is not None else None
        draft_s = time.perf_counter() - started
        return PromptPasses(
            output_ids=output,
            entropies=generation.entropies,
            target_time_s=generation.time_s,
            matches=matches,
            draft_time_s=draft_s,
            replay_mismatches=int(replay_mismatches(self.target, enc.ids, output).sum()),
        )

    def measure_costs(
        self,
        context: list[int],
        k_max: int,
        batch_size: int,
        on_repeat,
        *,
        on_draft_repeat=None,
        cost_mode: str | None = None,
    ):
        """llama.cpp's own step times (it has no cost modes: ``cost_mode`` is None)."""
        from analyzer.engine.llamacpp_cost import profile_llamacpp_costs

        if batch_size != 1:
            raise LlamaCppRunError(
                "the llama.cpp engine profiles batch size 1 only (llama-cpp-python runs one "
                "sequence per context)"
            )
        return profile_llamacpp_costs(
            self.target,
            context,
            k_max,
            draft=self.draft,
            ngram_max=self.ngram_max,
            on_repeat=on_repeat,
            on_draft_repeat=on_draft_repeat,
        )

    def measure_overhead(
        self, context: list[int], params: RunParams, on_generate: GenerateCallback | None = None
    ):
        from analyzer.engine.llamacpp_cost import measure_llamacpp_overhead
        from analyzer.engine.overhead import OVERHEAD_GAMMA, OVERHEAD_NEW_TOKENS, OVERHEAD_REPEATS

        return measure_llamacpp_overhead(
            self.target,
            context,
            gamma=min(OVERHEAD_GAMMA, params.gamma_max),
            new_tokens=min(OVERHEAD_NEW_TOKENS, params.max_new_tokens),
            draft=self.draft,
            ngram_max=self.ngram_max,
            repeats=OVERHEAD_REPEATS,
            on_generate=on_generate,
        )

    def validate(self, prompt_ids: list[int], params: RunParams, gamma: int):
        """Plain against speculative greedy generation in llama.cpp (2 repeats, alternated)."""
        from analyzer.engine.llamacpp_speculative import SpeculativePair, validate_prompt_llamacpp

        if self._pair is None:
            self._pair = SpeculativePair(
                self.target, ngram_max=self.ngram_max, draft=self.draft, eos_ids=self.eos_ids
            )
        return validate_prompt_llamacpp(self._pair, prompt_ids, params.max_new_tokens, gamma=gamma)


def load_llamacpp_models(pair: ModelPair, cache_dir: Path, params: RunParams) -> LlamaCppRunModels:
    """Load the run's GGUF target (and GGUF draft) in llama.cpp, with the target's tokenizer; a draft
    whose tokenizer differs is refused as in the transformers engine."""
    require_llama_cpp()
    target_ref, draft_ref = parse_spec(pair.target.spec), parse_spec(pair.draft.spec)
    tokenizer = load_tokenizer(target_ref, cache_dir)
    asked = params.n_ctx or MAX_CONTEXT_TOKENS
    target = LlamaCppModel(gguf_file(target_ref), n_ctx=asked)
    if params.n_ctx is not None and target.trained_context < asked:
        trained = target.trained_context
        target.close()
        raise LlamaCppRunError(
            f"n_ctx {asked} exceeds the {trained} tokens {pair.target.spec} was trained for; give at most {trained}"
        )
    if target.trained_context < MAX_CONTEXT_TOKENS:
        target.close()
        target = LlamaCppModel(gguf_file(target_ref), n_ctx=target.trained_context)
    n_ctx = target.n_ctx
    if params.max_new_tokens + params.gamma_max + 32 > n_ctx:
        target.close()
        raise LlamaCppRunError(
            f"max_new_tokens {params.max_new_tokens} and gamma_max {params.gamma_max} leave no room "
            f"for a prompt in the llama.cpp context of {n_ctx} tokens"
        )
    draft = draft_tokenizer = None
    if draft_ref.kind != "ngram":
        draft_tokenizer = load_tokenizer(draft_ref, cache_dir)
        check_same_tokenizer(tokenizer, draft_tokenizer, pair.target.spec, pair.draft.spec)
        draft = LlamaCppModel(gguf_file(draft_ref), n_ctx=n_ctx, threads=target.threads)
    eos_ids = target.eos_ids()
    pad = tokenizer.pad_token_id
    return LlamaCppRunModels(
        target,
        draft,
        draft_ref,
        tokenizer,
        draft_tokenizer,
        eos_ids,
        int(pad if pad is not None else eos_ids[0]),
    )
