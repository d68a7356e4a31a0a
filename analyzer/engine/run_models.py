"""The pair a run measures with: target and drafter loaded once on the run's device in its dtype,
with the ids that end and pad the target's output, and the run's one rule for turning a prompt into
the target's token ids (chat template, truncation) and output ids into the texts shown per token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from analyzer.engine.engine_base import ProfilingPlan
from analyzer.measuring.acceptance import TRANSFORMERS_RULE, DraftingRule
from analyzer.measuring.assistant_defaults import DEFAULT_TOKENS
from analyzer.measuring.prompt_encoding import (
    EncodedPrompt,
    encode_prompt,
    eos_token_ids,
    prompt_token_limit,
    token_texts,
)
from analyzer.measuring.prompt_passes import PromptPasses
from analyzer.models.devices import Placement, run_batch_sizes
from analyzer.models.loading import LoadedModel, load_model
from analyzer.models.specs import ModelSpecRef, parse_spec
from analyzer.models.tokenizer_match import check_same_tokenizer
from analyzer.names import CUDA_GRAPHS, TRANSFORMERS
from analyzer.orm import ModelPair, Prompt
from analyzer.run_params import RunParams

# validations on a GPU: plain and speculative alternated over this many timed repeats, after a warm-up
GPU_VALIDATION_REPEATS = 2
# on a CPU too: two greedy runs of each validated prompt are a pair of identical work, from which the report
# measures the machine's noise (one run each was below it: a single run can be off by 10%)
CPU_VALIDATION_REPEATS = 2
# the cuda-graphs mode captures its steps' graphs; tests on the CPU run the same steps uncaptured
CAPTURE_GRAPHS = True

if TYPE_CHECKING:
    from analyzer.engine.graph_cost import GraphDecoder
    from analyzer.engine.overhead import GenerateCallback


@dataclass
class RunModels:
    """``target`` and ``draft`` (None for prompt lookup, whose options ``draft_ref`` holds) as
    loaded; ``eos_ids`` end the target's output (its generation config's, else its tokenizer's);
    ``pad_id`` pads batches (the tokenizer's pad, else the first EOS)."""

    target: LoadedModel
    draft: LoadedModel | None
    draft_ref: ModelSpecRef
    eos_ids: list[int]
    pad_id: int
    engine: str = TRANSFORMERS
    rule: DraftingRule = TRANSFORMERS_RULE
    graphs: GraphDecoder | None = None  # the cuda-graphs mode's loops, made on first use

    def graph_decoder(self) -> GraphDecoder:
        """The cuda-graphs mode's decoding loops over this pair (:class:`analyzer.engine.graph_cost.GraphDecoder`),
        made once: their captured graphs serve every overhead measurement and validation of the run."""
        from analyzer.engine.graph_cost import GraphDecoder

        if self.graphs is None:
            self.graphs = GraphDecoder(
                self.target.model,
                self.draft.model if self.draft else None,
                ngram_max=self.ngram_max,
                eos_ids=self.eos_ids,
                capture=CAPTURE_GRAPHS,
            )
        return self.graphs

    @property
    def ngram_max(self) -> int | None:
        """The prompt-lookup n-gram size (None for a model draft)."""
        return int(self.draft_ref.options.get("max_ngram", 2)) if self.draft_ref.kind == "ngram" else None

    def prompt_limit(self, params: RunParams) -> int:
        """:func:`prompt_token_limit`: ``max_prompt_tokens``, else the model's context less the new tokens."""
        return prompt_token_limit(self.target.model, params.max_new_tokens, params.max_prompt_tokens)

    def encode(self, prompt: Prompt, params: RunParams) -> EncodedPrompt:
        """The prompt's token ids under the run's rule: the chat template unless the run turned it off,
        and at most :meth:`prompt_limit` ids (the last ones). One tokenizer call; a run calls
        this once per prompt and reuses the ids everywhere (they are stored with the result)."""
        return encode_prompt(
            self.target.tokenizer,
            text=prompt.text,
            messages=prompt.messages,
            use_chat_template=params.chat_template,
            max_prompt_tokens=self.prompt_limit(params),
        )

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's text on its own (stored, so showing a result needs no tokenizer)."""
        return token_texts(self.target.tokenizer, token_ids)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def tokenizers(self) -> tuple[object, object | None]:
        """The target's and the draft's tokenizer (None for prompt lookup), as loaded."""
        return self.target.tokenizer, self.draft.tokenizer if self.draft is not None else None

    def device_text(self) -> str:
        from analyzer.measuring.cost import device_description

        return device_description(self.target.model)

    def dtype_text(self) -> str:
        return self.target.placement.dtype

    def library_versions(self) -> dict:
        """The versions of torch, transformers and numpy doing the measuring (stored with runs and profiles)."""
        import numpy as np
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}

    def profiling_plan(self, params: RunParams) -> ProfilingPlan:
        """On the target's device in its dtype, at the run's batch sizes (1, 4, 16 on a GPU by default),
        timing ``generate()`` or, in the cuda-graphs cost mode, the CUDA-graph decoding loops."""
        placement, dtype = self.target.placement, self.dtype_text()
        graphs = params.cost_mode == CUDA_GRAPHS
        return ProfilingPlan(
            self.device_text(),
            dtype,
            f"{placement.device} in {dtype}" + (", steps replayed from CUDA graphs" if graphs else ""),
            "the CUDA-graph decoding loops" if graphs else "generate()",
            run_batch_sizes(params, placement),
            params.cost_mode,
            # transformers' defaults draft up to DEFAULT_TOKENS: price them (greedy, a model draft)
            DEFAULT_TOKENS + 1 if self.draft is not None and params.temperature == 0 else 0,
        )

    def warmup_passes(self) -> int:
        """GPU_WARMUP_ROUNDS untimed passes on a GPU (nothing is timed cold there), one elsewhere."""
        from analyzer.measuring.cost import GPU_WARMUP_ROUNDS

        return GPU_WARMUP_ROUNDS if self.target.placement.is_cuda else 1

    def measure_batch(
        self, encoded: list[EncodedPrompt], params: RunParams, *, seed: int
    ) -> list[PromptPasses]:
        """The passes of a batch of prompts: the target generation (left-padded, one generate call),
        each prompt's teacher-forced draft pass (a model draft) and, in half precision, the replay's
        fidelity; one :class:`PromptPasses` per prompt (with the raw logits when sampling)."""
        from analyzer.measuring.measure import generate_target, teacher_forced_mismatches

        sampling = params.temperature > 0
        generations = generate_target(
            self.target.model,
            [enc.ids for enc in encoded],
            params.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=seed,
            keep_logits=sampling,
        )
        passes = []
        for enc, generation in zip(encoded, generations):
            output = generation.output_ids
            draft_logits, matches, draft_s, rounds = self._draft_pass(enc.ids, output, params, sampling)
            mismatches = None
            if not sampling and self.target.placement.dtype != "float32":
                mismatches = int(teacher_forced_mismatches(self.target.model, enc.ids, output).sum())
            passes.append(
                PromptPasses(
                    output_ids=output,
                    entropies=generation.entropies,
                    target_time_s=generation.time_s,
                    matches=matches,
                    replay_mismatches=mismatches,
                    draft_time_s=draft_s,
                    target_logits=generation.logits,
                    draft_logits=draft_logits,
                    assistant_rounds=rounds,
                )
            )
        return passes

    def _draft_pass(self, prompt_ids: list[int], output: list[int], params: RunParams, sampling: bool):
        """A model draft's teacher-forced pass over one prompt's output: its logits, match sequence and seconds,
        and (greedy) the rounds transformers' assisted generation makes under its defaults, replayed; Nones (and
        0.0 s) without a model draft."""
        import time

        from analyzer.measuring.assistant_defaults import assistant_rounds
        from analyzer.measuring.measure import (
            draft_confidences,
            draft_match_sequence,
            draft_off_path,
            teacher_forced_logits,
        )

        started = time.perf_counter()
        draft_logits = teacher_forced_logits(self.draft.model, prompt_ids, output) if self.draft else None
        matches = draft_match_sequence(draft_logits, output) if draft_logits is not None else None
        draft_s = time.perf_counter() - started
        rounds = None
        if self.draft is not None and draft_logits is not None and matches is not None and not sampling:
            off_path = draft_off_path(self.draft.model, prompt_ids, output, draft_logits, self.eos_ids)
            rounds = assistant_rounds(
                matches, draft_confidences(draft_logits), params.max_new_tokens, off_path
            )
        return draft_logits, matches, draft_s, rounds

    def measure_costs(
        self,
        context: list[int],
        k_max: int,
        batch_size: int,
        on_repeat,
        *,
        on_draft_repeat=None,
        cost_mode: str | None = "eager",
    ):
        """The cost profile at ``batch_size`` over a cache of ``context``
        (:func:`analyzer.measuring.cost.profile_costs`), its steps timed in ``cost_mode``: eager forwards,
        or replayed CUDA graphs (:func:`analyzer.engine.graph_cost.time_graph_forwards_checked`)."""
        from functools import partial

        from analyzer.engine.graph_cost import time_graph_forwards_checked
        from analyzer.measuring.cost import profile_costs

        graphs = cost_mode == CUDA_GRAPHS
        draft_step = (
            self._prompt_lookup_step(context, k_max - 1, on_host=graphs) if self.draft is None else None
        )
        return profile_costs(
            self.target.model,
            context,
            k_max,
            batch_size=batch_size,
            draft_model=self.draft.model if self.draft else None,
            draft_step=draft_step,
            on_repeat=on_repeat,
            forwards_checked=partial(time_graph_forwards_checked, capture=CAPTURE_GRAPHS) if graphs else None,
            on_draft_repeat=on_draft_repeat,
        )

    def measure_overhead(
        self, context: list[int], params: RunParams, on_generate: GenerateCallback | None = None
    ):
        """generate()'s own time per plain step and per round (:mod:`analyzer.engine.overhead`), or in the
        cuda-graphs mode the host time of the loops over the replayed graphs."""
        from analyzer.engine.overhead import (
            OVERHEAD_GAMMA,
            OVERHEAD_NEW_TOKENS,
            OVERHEAD_REPEATS,
            measure_graph_overhead,
            measure_machinery_overhead,
        )
        from analyzer.measuring.cost import time_callable

        graphs = params.cost_mode == CUDA_GRAPHS
        lookup = (
            self._prompt_lookup_step(context, params.gamma_max, on_host=graphs)
            if self.draft is None
            else None
        )
        if graphs:
            return measure_graph_overhead(
                self.graph_decoder(),
                context,
                gamma=min(OVERHEAD_GAMMA, params.gamma_max),
                new_tokens=min(OVERHEAD_NEW_TOKENS, params.max_new_tokens),
                lookup_s=time_callable(lookup) if lookup else 0.0,
                repeats=OVERHEAD_REPEATS,
                on_generate=on_generate,
            )
        return measure_machinery_overhead(
            self.target.model,
            context,
            gamma=min(OVERHEAD_GAMMA, params.gamma_max),
            new_tokens=min(OVERHEAD_NEW_TOKENS, params.max_new_tokens),
            draft_model=self.draft.model if self.draft else None,
            ngram_max=self.ngram_max,
            lookup_s=time_callable(lookup) if lookup else 0.0,
            repeats=OVERHEAD_REPEATS,
            on_generate=on_generate,
        )

    def validate(self, prompt_ids: list[int], params: RunParams, gamma: int):
        """transformers' assisted generation against plain greedy (:func:`analyzer.measuring.validate.validate_prompt`),
        or in the cuda-graphs mode the speculative loop over the replayed graphs against the greedy one
        (:class:`analyzer.engine.graph_cost.GraphDecoder`, warm and alternated in the same way)."""
        from analyzer.measuring.validate import compare_generations, validate_prompt

        on_gpu = self.target.placement.is_cuda  # warm, and alternated over 2 repeats (cold runs lie there)
        if params.cost_mode == CUDA_GRAPHS:
            decoder = self.graph_decoder()
            decoder.prepare_for(prompt_ids, params.max_new_tokens, gamma)  # sized, and captured untimed below
            return compare_generations(
                lambda: decoder.greedy(prompt_ids, params.max_new_tokens),
                lambda: decoder.speculative(prompt_ids, params.max_new_tokens, gamma),
                gamma=gamma,
                repeats=GPU_VALIDATION_REPEATS,
                warmup=True,
            )
        return validate_prompt(
            self.target.model,
            prompt_ids,
            params.max_new_tokens,
            gamma=gamma,
            draft_model=self.draft.model if self.draft else None,
            ngram_max=self.ngram_max,
            eos_token_id=self.eos_ids,
            repeats=GPU_VALIDATION_REPEATS if on_gpu else CPU_VALIDATION_REPEATS,
            warmup=on_gpu,
        )

    def _prompt_lookup_step(self, context: list[int], gamma: int, *, on_host: bool = False):
        """One prompt-lookup proposal as transformers computes it (a scan of the whole context), which
        is what an engine pays per round; the lookup of our analysis is indexed and not representative.
        ``on_host``: over ids on the CPU, as the cuda-graphs mode's loop looks up (generate() looks up
        on the model's device)."""
        import torch
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        device = "cpu" if on_host else self.target.model.device
        generator = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor(self.eos_ids, device=device),
            num_output_tokens=gamma,
            max_matching_ngram_size=self.ngram_max or 2,
            max_length=len(context) + 4096,
        )
        input_ids = cast(torch.LongTensor, torch.tensor([context], dtype=torch.long, device=device))
        return lambda: generator.get_candidates(input_ids)


def load_run_models(pair: ModelPair, cache_dir: Path, allow_network: bool, placement: Placement) -> RunModels:
    """Load target and draft once, on the run's device in the run's dtype; a draft whose tokenizer
    differs from the target's is refused (:class:`analyzer.models.loading.TokenizerMismatch`)."""
    target_ref, draft_ref = parse_spec(pair.target.spec), parse_spec(pair.draft.spec)
    target = load_model(target_ref, cache_dir=cache_dir, allow_network=allow_network, placement=placement)
    draft = None
    if draft_ref.kind != "ngram":
        draft = load_model(draft_ref, cache_dir=cache_dir, allow_network=allow_network, placement=placement)
        check_same_tokenizer(target.tokenizer, draft.tokenizer, pair.target.spec, pair.draft.spec)
    eos_ids = eos_token_ids(target.model.generation_config.eos_token_id, target.tokenizer.eos_token_id)
    pad = target.tokenizer.pad_token_id
    pad_id = int(pad if pad is not None else eos_ids[0])
    return RunModels(target, draft, draft_ref, eos_ids, pad_id)
