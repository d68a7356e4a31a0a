"""llama.cpp's own speculative decoding, as llama-cpp-python runs it: ``Llama.generate`` with a draft
(``LlamaPromptLookupDecoding`` for n-gram drafting, or :class:`GreedyLlamaDraft`, a second GGUF model
in its own context), greedy, next to plain greedy generation of the same prompt; and the validation of
a run's predictions with them (plain and speculative alternated, wall times, outputs compared, the
target's ``llama_decode`` passes counted).

The loop (``Llama.generate``): the prompt is decoded alone and the first token sampled from it; then
each round asks the draft for up to g tokens after the context, decodes the last token plus the drafts
in one batch, samples every position and keeps the drafts up to the first disagreement (the KV cache is
rolled back past it). So a run of N tokens costs one prefill pass plus one pass per round, which is
what :data:`analyzer.measuring.acceptance.LLAMA_CPP_RULE` replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any, Sequence

import numpy as np

from analyzer.engine.llamacpp_engine import LlamaCppModel, context_size, require_llama_cpp


class GreedyLlamaDraft:
    """A draft model for llama-cpp-python's speculative loop: a second GGUF model in its own llama.cpp
    context proposing its ``num_pred_tokens`` greedy next tokens. Its KV cache follows the target's
    context (the common prefix is kept, the rest rolled back and decoded), so a round costs one
    catch-up pass plus one decode per further draft token. ``calls`` and ``seconds`` count its work."""

    def __init__(self, draft: LlamaCppModel, num_pred_tokens: int, eos_ids: Sequence[int] = ()):
        self.draft, self.num_pred_tokens, self.eos_ids = draft, num_pred_tokens, set(int(e) for e in eos_ids)
        self.calls, self.seconds = 0, 0.0

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        started = perf_counter()
        llm = self.draft.llm
        context = [int(t) for t in input_ids]
        cached = llm.input_ids[: llm.n_tokens].tolist()
        common = 0
        for a, b in zip(cached, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # decode at least the last token, to have its logits
        self.draft.rewind(common)
        llm.eval(context[common:])
        proposal: list[int] = []
        while len(proposal) < self.num_pred_tokens and llm.n_tokens < self.draft.n_ctx:
            token = int(self.draft.last_logits().argmax())
            proposal.append(token)
            if token in self.eos_ids or len(proposal) == self.num_pred_tokens:
                break
            llm.eval([token])
        self.calls += 1
        self.seconds += perf_counter() - started
        return np.asarray(proposal, dtype=np.intc)


def prompt_lookup(gamma: int, ngram_max: int) -> Any:
    """llama-cpp-python's prompt-lookup draft at lookahead ``gamma`` (n-gram sizes ``ngram_max``..1)."""
    return require_llama_cpp().llama_speculative.LlamaPromptLookupDecoding(
        max_ngram_size=ngram_max, num_pred_tokens=gamma
    )


@dataclass
class EngineGeneration:
    """One generate() of llama.cpp: the new tokens, the target's decode passes (prefill included),
    the wall seconds, and the seconds spent inside the target's passes and inside the draft."""

    ids: list[int]
    passes: int
    time_s: float
    decode_s: float
    draft_s: float


def run_generate(
    model: LlamaCppModel, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]
) -> EngineGeneration:
    """Greedy ``Llama.generate`` of ``model`` (speculating when it was built with a draft model), from
    an empty cache, until an EOS or ``max_new_tokens`` (EOS ids empty: exactly that many), counting and
    timing the target's ``eval`` calls (one ``llama_decode`` per call at these lengths) and the draft."""
    llm, eos = model.llm, set(int(e) for e in eos_ids)
    eval_times: list[float] = []
    original_eval = llm.eval

    def timed_eval(tokens):
        start = perf_counter()
        original_eval(tokens)
        eval_times.append(perf_counter() - start)

    draft = llm.draft_model
    draft_times: list[float] = []
    if draft is not None:

        def timed_draft(input_ids, **kwargs):
            start = perf_counter()
            out = draft(input_ids, **kwargs)
            draft_times.append(perf_counter() - start)
            return out

        llm.draft_model = timed_draft
    llm.eval = timed_eval
    llm.reset()
    output: list[int] = []
    try:
        start = perf_counter()
        for token in llm.generate(
            list(prompt_ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0
        ):
            output.append(int(token))
            if int(token) in eos or len(output) >= max_new_tokens:
                break
        elapsed = perf_counter() - start
    finally:
        del llm.eval  # back to the class's method
        llm.draft_model = draft
    return EngineGeneration(output, len(eval_times), elapsed, float(sum(eval_times)), float(sum(draft_times)))


class SpeculativePair:
    """The two llama.cpp deployments a validation compares, for one target GGUF: plain greedy (as a
    server without speculation runs) and speculative at a lookahead (as one started with a draft runs).
    The speculative context is rebuilt when the lookahead or the needed context length changes."""

    def __init__(
        self,
        plain: LlamaCppModel,
        *,
        ngram_max: int | None,
        draft: LlamaCppModel | None,
        eos_ids: Sequence[int],
    ):
        self.plain, self.ngram_max, self.draft, self.eos_ids = plain, ngram_max, draft, list(eos_ids)
        self._speculative: LlamaCppModel | None = None
        self._key: tuple[int, int] | None = None

    def speculative(self, gamma: int, n_ctx: int) -> LlamaCppModel:
        """The speculating context at lookahead ``gamma`` with at least ``n_ctx`` positions."""
        speculative = self._speculative
        # close() drops the context but not its key: a closed pair builds a new one
        if speculative is None or self._key is None or self._key[0] != gamma or self._key[1] < n_ctx:
            if speculative is not None:
                speculative.close()
            drafter = (
                prompt_lookup(gamma, self.ngram_max or 2)
                if self.draft is None
                else GreedyLlamaDraft(self.draft, gamma, self.eos_ids)
            )
            speculative = self._speculative = LlamaCppModel(
                self.plain.path, n_ctx=n_ctx, threads=self.plain.threads, logits_all=True, draft_model=drafter
            )
            self._key = (gamma, n_ctx)
        return speculative

    def close(self) -> None:
        if self._speculative is not None:
            self._speculative.close()
            self._speculative = None


def validate_prompt_llamacpp(
    pair: SpeculativePair, prompt_ids: list[int], max_new_tokens: int, *, gamma: int, repeats: int = 2
):
    """Plain and speculative greedy generation of one prompt in llama.cpp at lookahead ``gamma``,
    ``repeats`` times each, alternating which goes first; medians of the wall times, the first
    speculative run's ids and target passes, and whether every speculative output equalled the plain
    one (an :class:`analyzer.measuring.validate.ValidationMeasurement`)."""
    from analyzer.measuring.validate import ValidationMeasurement

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    speculative = pair.speculative(gamma, context_size(len(prompt_ids), max_new_tokens, gamma))
    plain_runs: list[EngineGeneration] = []
    speculative_runs: list[EngineGeneration] = []
    for r in range(repeats):
        order = [(pair.plain, plain_runs), (speculative, speculative_runs)]
        for model, runs in order if r % 2 == 0 else reversed(order):
            runs.append(run_generate(model, prompt_ids, max_new_tokens, pair.eos_ids))
    plain_s = float(np.median([run.time_s for run in plain_runs]))
    speculative_s = float(np.median([run.time_s for run in speculative_runs]))
    greedy_ids = plain_runs[0].ids
    return ValidationMeasurement(
        gamma=gamma,
        greedy_ids=greedy_ids,
        speculative_ids=speculative_runs[0].ids,
        greedy_time_s=plain_s,
        speculative_time_s=speculative_s,
        outputs_identical=all(run.ids == greedy_ids for run in speculative_runs),
        target_forward_passes=speculative_runs[0].passes,
        measured_speedup=plain_s / speculative_s,
        greedy_times_s=tuple(run.time_s for run in plain_runs),
        speculative_times_s=tuple(run.time_s for run in speculative_runs),
    )
