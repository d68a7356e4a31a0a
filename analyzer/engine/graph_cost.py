"""The ``cuda-graphs`` cost mode: the target's verify step for each k and the draft step timed as serving
engines run them, and greedy (speculative) decoding over the same steps for validation.

vLLM, SGLang and TensorRT-LLM replay captured CUDA graphs over a static KV cache, so a decode step costs
what the GPU needs to read the weights. transformers' eager forward is bound by kernel launches instead:
on one H200 it took 17-20 ms for SmolLM2-135M and for a Llama-3.1-8B-shaped model alike, which prices
speculation for an engine nobody serves with. Here each (model, batch size, k) shape is one graph,
captured once over a :class:`transformers.StaticCache` whose write position and attention mask are
computed on the device from one start-position tensor, so a replay needs no host work but copying the
input ids in. This is a timing harness, not a serving engine: attention reads the whole static cache
(masked), and greedy choices are read back to the host after every step, as engines read sampled tokens.

On a CPU there are no CUDA graphs: ``capture=False`` runs the very same static-cache steps eagerly,
which is what the tests check there (outputs and pass counts equal to transformers' own greedy and
assisted generation); the product refuses the mode on a CPU (:meth:`analyzer.run_params.RunParams.check`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from time import perf_counter, process_time
from typing import cast

import numpy as np
import torch
from transformers import PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

from analyzer.errors import SpecrouteError
from analyzer.measuring.cost import (
    RepeatCallback,
    _cache_argument,
    _synchronize,
    _trailing_ids,
    check_timing_arguments,
)
from analyzer.measuring.interference import TimingQuality, checked_timings, interleaved_repeats

# static caches are sized in steps of this many positions, so that one harness serves many prompts
CACHE_LENGTH_STEP = 256
# eager runs of a step's function on a side stream before its graph is captured (allocations, kernel choice)
CAPTURE_WARMUP_RUNS = 2


class GraphCostError(SpecrouteError, ValueError):
    """The cuda-graphs mode cannot time this model here; the message says why."""

    status, code = 400, "invalid_cost_mode"


def cache_length(needed: int) -> int:
    """``needed`` positions rounded up to a multiple of CACHE_LENGTH_STEP."""
    return -(-max(needed, 1) // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP


class StaticModel:
    """``model`` over a static KV cache of ``max_len`` positions for ``batch_size`` identical rows.

    :meth:`prefill` writes a context eagerly (engines prefill outside their decode graphs too);
    :meth:`step` runs k new tokens at a given start position from a CUDA graph captured for k on first
    use (``capture``), or eagerly over the same static buffers (``capture=False``, on a CPU). Positions
    beyond the start are masked, so a step never needs the cache cropped: rejected drafts are simply
    overwritten later. With ``forward_times`` set to a list, the seconds of every step and prefill
    (synchronised) are appended to it.
    """

    def __init__(self, model: PreTrainedModel, batch_size: int, max_len: int, *, capture: bool):
        if capture and model.device.type != "cuda":
            raise GraphCostError(f"CUDA graphs need a model on a CUDA GPU, not on {model.device.type}")
        self.model, self.batch_size, self.max_len, self.capture = model, batch_size, max_len, capture
        self.device = model.device
        self.forward_times: list[float] | None = None
        self._eager_mask = model.config._attn_implementation not in ("sdpa", "flash_attention_2")
        # transformers takes the cache as `cache` (5.2x) or `past_key_values` (5.17 and before); a static
        # layer writes where its device counter says, or, where forward() takes one, at `cache_position`
        self._takes_cache_position = "cache_position" in inspect.signature(model.forward).parameters
        self._cache_argument = _cache_argument(model)
        with torch.inference_mode():
            self.cache = StaticCache(config=model.config, max_cache_len=max_len)
            unsupported = {
                type(layer).__name__ for layer in self.cache.layers if type(layer) is not StaticLayer
            }
            if unsupported:
                raise GraphCostError(
                    "the cuda-graphs mode times models whose every layer attends to the whole context; "
                    f"this one has {', '.join(sorted(unsupported))} layers"
                )
            self._positions = torch.arange(max_len, device=self.device)
            self._start = torch.zeros((), dtype=torch.long, device=self.device)
        # per k: the step's input ids and, once captured, its graph and the graph's static logits
        self._steps: dict[int, tuple[torch.Tensor, tuple[torch.cuda.CUDAGraph, torch.Tensor] | None]] = {}

    def _forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (b, k, V) of ``input_ids`` (b, k) written at positions start..start+k-1 of the cache;
        only device work, so that it can be captured."""
        k = input_ids.shape[1]
        # the write position (a device tensor per layer once allocated); __init__ refused other layer types
        for layer in cast("list[StaticLayer]", self.cache.layers):
            if getattr(layer, "is_initialized", False) and hasattr(layer, "cumulative_length"):
                layer.cumulative_length.copy_(self._start)
        query_positions = self._start + self._positions[:k]
        allowed = self._positions[None, :] <= query_positions[:, None]  # (k, max_len)
        mask = allowed[None, None].expand(self.batch_size, 1, k, self.max_len)
        if self._eager_mask:  # eager attention adds its mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.model.dtype, device=self.device).masked_fill(
                ~mask, torch.finfo(self.model.dtype).min
            )
        where = {"cache_position": query_positions} if self._takes_cache_position else {}
        output = self.model(
            input_ids=input_ids,
            position_ids=query_positions[None].expand(self.batch_size, k),
            attention_mask=mask,
            use_cache=True,
            **{self._cache_argument: self.cache},
            **where,
        )
        return output.logits

    def prefill(self, ids: list[int]) -> None:
        """Write ``ids`` at positions 0..len(ids)-1 of every row (nothing for an empty list)."""
        if len(ids) > self.max_len:
            raise ValueError(f"{len(ids)} tokens do not fit a static cache of {self.max_len}")
        if not ids:
            return
        forward_times = self.forward_times
        if forward_times is not None:  # a forward like any other: the machinery around it is measured apart
            _synchronize(self.device)
            started = perf_counter()
        with torch.inference_mode():
            self._start.fill_(0)
            self._forward(torch.tensor([ids] * self.batch_size, dtype=torch.long, device=self.device))
        if forward_times is not None:
            _synchronize(self.device)
            forward_times.append(perf_counter() - started)

    def prepare(self, ids: list[int], start: int) -> int:
        """Copy ``ids`` into the input of the step of k = len(ids) tokens and set the start position
        (capturing the step's graph on first use, after both: the eager warm-up runs before a capture
        write into the cache, so they must write what the step itself will, where it will); returns
        k. :meth:`run` then runs it."""
        k = len(ids)
        if not 1 <= k or start + k > self.max_len:
            raise ValueError(f"a step of {k} tokens at position {start} does not fit {self.max_len}")
        with torch.inference_mode():
            if k not in self._steps:
                self._steps[k] = (
                    torch.zeros((self.batch_size, k), dtype=torch.long, device=self.device),
                    None,
                )
            input_ids = self._steps[k][0]
            input_ids.copy_(torch.tensor([ids] * self.batch_size, dtype=torch.long))
            self._start.fill_(start)
            if self.capture and self._steps[k][1] is None:
                self._steps[k] = (input_ids, self._captured(input_ids))
        return k

    def run(self, k: int) -> torch.Tensor:
        """Run the prepared step of k tokens; its logits (b, k, V), valid until the next step of k."""
        input_ids, captured = self._steps[k]
        forward_times = self.forward_times
        if forward_times is not None:
            _synchronize(self.device)
            started = perf_counter()
        with torch.inference_mode():
            if captured is not None:
                graph, logits = captured
                graph.replay()
            else:
                logits = self._forward(input_ids)
        if forward_times is not None:
            _synchronize(self.device)
            forward_times.append(perf_counter() - started)
        return logits

    def step(self, ids: list[int], start: int) -> torch.Tensor:
        """:meth:`prepare` and :meth:`run`: the logits (b, k, V) of ``ids`` written at ``start``."""
        return self.run(self.prepare(ids, start))

    def _captured(self, input_ids: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The graph of the step over ``input_ids`` and its static output, captured after eager warm-up
        runs on a side stream, as CUDA graph capture requires."""
        k = input_ids.shape[1]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP_RUNS):
                self._forward(input_ids)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()  # a private memory pool each: steps of any k replay in any order
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # a worker's other threads go on
                logits = self._forward(input_ids)
        except RuntimeError as error:  # e.g. a model whose forward reads a tensor back to the host
            raise GraphCostError(
                f"capturing the CUDA graph of a {k}-token step of {type(self.model).__name__} failed "
                f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                "time this model with --cost-mode eager"
            ) from error
        return graph, logits


def time_graph_forwards_checked(
    model: PreTrainedModel,
    context_ids: list[int],
    k_max: int,
    *,
    repeats: int = 5,
    warmup: int = 1,
    batch_size: int = 1,
    on_repeat: RepeatCallback | None = None,
    capture: bool = True,
) -> tuple[list[float], TimingQuality]:
    """T_t(k, b) for k = 1..k_max as replayed graphs, and how trustworthy it is: the context is
    prefilled into a static cache, a graph is captured for each k (the last k context ids at the
    position after the context), and each is replayed, interleaved and judged exactly as
    :func:`analyzer.measuring.cost.time_target_forwards_checked` judges eager forwards. Every replay writes the
    same positions, so all timings see len(context_ids) cached positions."""
    check_timing_arguments(k_max, repeats, warmup)
    static = StaticModel(model, batch_size, cache_length(len(context_ids) + k_max), capture=capture)
    static.prefill(context_ids)
    start = len(context_ids)

    def time_one(k: int) -> tuple[float, float]:
        static.prepare(_trailing_ids(context_ids, k), start)
        cpu_start = process_time()
        _synchronize(static.device)
        started = perf_counter()
        static.run(k)
        _synchronize(static.device)
        return perf_counter() - started, process_time() - cpu_start

    def measure(ks: list[int], rounds_warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return interleaved_repeats(time_one, ks, repeats, rounds_warmup, on_repeat)

    threads = max(1, torch.get_num_threads())
    return checked_timings(measure, k_max, warmup=warmup, threads=threads, on_cpu=model.device.type == "cpu")


class GraphDecoder:
    """Greedy decoding and greedy speculative decoding of one sequence over :class:`StaticModel` steps
    of ``target`` and, for a model draft, ``draft`` (prompt lookup with ``ngram_max`` otherwise), with
    transformers' rules: a model draft proposes min(gamma, tokens left - 1) tokens and stops after
    proposing an EOS; prompt lookup proposes what transformers' PromptLookupCandidateGenerator does. Both
    return (new ids, target forwards); the prompt but its last token is prefilled first and not counted,
    so the counts equal transformers' (a greedy step or a speculative round each). Static caches grow
    (in CACHE_LENGTH_STEP steps, captured again) when a prompt needs more room.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        *,
        ngram_max: int | None,
        eos_ids: list[int],
        capture: bool,
    ):
        if (draft is None) == (ngram_max is None):
            raise ValueError("give a draft model or ngram_max, not both or neither")
        self.target_model, self.draft_model, self.ngram_max = target, draft, ngram_max
        self.eos_ids, self.capture = set(eos_ids), capture
        self.target: StaticModel | None = None
        self.draft: StaticModel | None = None

    def _room(self, needed: int) -> StaticModel:
        """Make the caches hold ``needed`` positions (replacing smaller ones); the target's static model."""
        if self.target is None or self.target.max_len < needed:
            length = cache_length(needed)
            self.target = StaticModel(self.target_model, 1, length, capture=self.capture)
            if self.draft_model is not None:
                self.draft = StaticModel(self.draft_model, 1, length, capture=self.capture)
        return self.target

    @contextlib.contextmanager
    def timed_forwards(self) -> Iterator[list[float]]:
        """Inside the block, the seconds of every forward of both models (steps and prefills) are
        appended to the yielded list: the loops' own time is the rest."""
        times: list[float] = []
        statics = [s for s in (self.target, self.draft) if s is not None]
        for static in statics:
            static.forward_times = times
        try:
            yield times
        finally:
            for static in statics:
                static.forward_times = None

    def prepare_for(self, prompt_ids: list[int], max_new_tokens: int, gamma: int) -> None:
        """Make the caches big enough for this prompt, before anything is timed (growing them captures again)."""
        self._room(len(prompt_ids) + max_new_tokens + gamma + 1)

    def greedy(
        self, prompt_ids: list[int], max_new_tokens: int, *, stop_ids: list[int] | None = None
    ) -> tuple[list[int], int]:
        """Plain greedy decoding of up to ``max_new_tokens`` tokens, stopping after an EOS (kept), or
        after one of ``stop_ids`` when given (an empty list: after none)."""
        stops = self.eos_ids if stop_ids is None else set(stop_ids)
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        target = self._room(len(prompt_ids) + max_new_tokens + 1)
        sequence = list(prompt_ids)
        target.prefill(sequence[:-1])
        passes = 0
        while len(sequence) - len(prompt_ids) < max_new_tokens:
            token = int(target.step(sequence[-1:], len(sequence) - 1)[0, -1].argmax())
            passes += 1
            sequence.append(token)
            if token in stops:
                break
        return sequence[len(prompt_ids) :], passes

    def speculative(
        self, prompt_ids: list[int], max_new_tokens: int, gamma: int, *, stop_ids: list[int] | None = None
    ) -> tuple[list[int], int]:
        """Greedy speculative decoding with lookahead ``gamma``: each round verifies the last token and
        the drafts in one target step of k = drafts + 1, keeps the drafts the target agrees with and
        adds the target's own next token (stopping as :meth:`greedy` does)."""
        stops = self.eos_ids if stop_ids is None else set(stop_ids)
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if gamma < 1:
            raise ValueError(f"gamma must be at least 1, got {gamma}")
        target, draft = self._room(len(prompt_ids) + max_new_tokens + gamma + 1), self.draft
        sequence = list(prompt_ids)
        target.prefill(sequence[:-1])
        if draft is not None:
            draft.prefill(sequence[:-1])
        draft_position = len(sequence) - 1  # the first position the draft's cache lacks
        passes = 0
        while (made := len(sequence) - len(prompt_ids)) < max_new_tokens:
            left = max_new_tokens - made
            if draft is not None:
                drafts, draft_position = self._model_drafts(
                    draft, sequence, draft_position, min(gamma, left - 1), stops
                )
            else:
                drafts = self._lookup_drafts(sequence, len(prompt_ids) + max_new_tokens, gamma, stops)
            start = len(sequence) - 1
            choices = target.step(sequence[-1:] + drafts, start)[0].argmax(-1).tolist()
            passes += 1
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == choices[accepted]:
                accepted += 1
            new = (drafts[:accepted] + [choices[accepted]])[:left]
            ended = next((i for i, token in enumerate(new) if token in stops), None)
            sequence += new if ended is None else new[: ended + 1]
            if draft is not None:  # the draft's cache holds the drafts it was fed, up to the first rejected
                draft_position = min(draft_position, start + 1 + accepted)
            if ended is not None:
                break
        return sequence[len(prompt_ids) :], passes

    @staticmethod
    def _model_drafts(
        draft: StaticModel, sequence: list[int], position: int, count: int, stops: set[int]
    ) -> tuple[list[int], int]:
        """Up to ``count`` tokens of ``draft`` after ``sequence`` (stopping after an EOS), feeding the draft
        what its cache lacks from ``position`` first; returns them and the new first missing position."""
        if count < 1:
            return [], position
        choice = int(draft.step(sequence[position:], position)[0, -1].argmax())
        position = len(sequence)
        drafts = [choice]
        while len(drafts) < count and choice not in stops:
            choice = int(draft.step([choice], position)[0, -1].argmax())
            position += 1
            drafts.append(choice)
        return drafts, position

    def _lookup_drafts(self, sequence: list[int], max_length: int, gamma: int, stops: set[int]) -> list[int]:
        """Prompt lookup's proposal, exactly as transformers makes it (on the host, as engines do)."""
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        if self.ngram_max is None:  # __init__ allows that only with a draft model, which never gets here
            raise ValueError("prompt lookup needs ngram_max")
        generator = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor(sorted(stops)) if stops else None,
            num_output_tokens=gamma,
            max_matching_ngram_size=self.ngram_max,
            max_length=max_length,
        )
        candidates, _ = generator.get_candidates(
            cast(torch.LongTensor, torch.tensor([sequence], dtype=torch.long))
        )
        return candidates[0, len(sequence) :].tolist()
