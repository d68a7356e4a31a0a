"""Validate predictions against real speculative decoding: transformers' assisted generation (a draft
model, or prompt lookup for n-gram drafting) next to plain greedy decoding of the same prompt.

Greedy speculative decoding is exact, so the two outputs must agree token for token (up to a rare
float near-tie), and the number of target forward passes equals the number of speculative rounds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel

from analyzer.measuring.assistant_defaults import TRANSFORMERS_DEFAULTS, AssistantSettings
from analyzer.measuring.prompt_encoding import eos_token_ids


@dataclass(frozen=True)
class ValidationMeasurement:
    """Plain greedy and speculative generation of one prompt with lookahead `gamma`: both outputs
    (new tokens only), median wall-clock seconds of each, whether the outputs were identical in every
    run, the target forward passes of the speculative run (= rounds), and greedy_time / speculative_time.
    """

    gamma: int
    greedy_ids: list[int]
    speculative_ids: list[int]
    greedy_time_s: float
    speculative_time_s: float
    outputs_identical: bool
    target_forward_passes: int
    measured_speedup: float
    # every timed run, in the order each kind ran: consecutive greedy runs are pairs of identical work (the
    # machine's noise, :func:`analyzer.measuring.noise.noise_floor`)
    greedy_times_s: tuple[float, ...] = ()
    speculative_times_s: tuple[float, ...] = ()


@dataclass
class ForwardPassCounter:
    """How many times a module's forward ran while the counter was attached."""

    count: int = 0


@contextlib.contextmanager
def count_forward_passes(model: torch.nn.Module) -> Iterator[ForwardPassCounter]:
    """Count the forward calls of `model` (its top-level module, not its layers) inside the block.

    A forward hook increments the yielded counter's `.count` once per call and is removed on exit, even
    when the block raises; in generate() every prefill, decode step or verification is one call.
    """
    counter = ForwardPassCounter()

    def hook(module, args, output):
        counter.count += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


@contextlib.contextmanager
def _generation_config_replaced(model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """Swap `model.generation_config` for `config` inside the block and put the original object back
    afterwards, even on error. generate() fills every unset field of the config it is given from the
    model's own generation_config (and the assistant's generate() from the draft's), so a repetition
    penalty or min_new_tokens there would otherwise leak into what must be plain greedy decoding."""
    original = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = original


def _clean_generation_config(
    model: PreTrainedModel, eos_token_id: int | list[int] | None, **settings
) -> GenerationConfig:
    """A greedy GenerationConfig carrying only the model's special token ids plus `settings`; an
    `eos_token_id` of None means the model's own, an empty list means none."""
    own = model.generation_config
    eos = eos_token_ids(eos_token_id, own.eos_token_id)
    pad = own.pad_token_id if own.pad_token_id is not None else (eos[0] if eos else None)
    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=own.bos_token_id,
        **settings,
    )


def _generate(
    target_model: PreTrainedModel, prompt_ids: list[int], config: GenerationConfig, **kwargs
) -> tuple[list[int], int]:
    """Run target_model.generate() on one prompt under `config` and return (new ids, target forwards)."""
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    # transformers 5 gives generate() to generative models only
    if not isinstance(target_model, GenerationMixin):
        raise TypeError(f"{type(target_model).__name__} cannot generate: it is not a GenerationMixin")
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=target_model.device)
    with _generation_config_replaced(target_model, config), count_forward_passes(target_model) as counter:
        with torch.inference_mode():
            output = target_model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **kwargs
            )
    return output[0, len(prompt_ids) :].tolist(), counter.count


def greedy_generate(
    target_model: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    eos_token_id: int | list[int] | None = None,
) -> tuple[list[int], int]:
    """Plain greedy decoding of up to `max_new_tokens` tokens; returns (new token ids, target forward
    passes). Generation stops after an EOS token (kept in the output); `eos_token_id` defaults to the
    target's generation_config, and an empty list stops on nothing. Without EOS the pass count equals
    the number of new tokens."""
    config = _clean_generation_config(target_model, eos_token_id, max_new_tokens=max_new_tokens)
    return _generate(target_model, prompt_ids, config)


def assisted_generate(
    target_model: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    gamma: int,
    draft_model: PreTrainedModel | None = None,
    ngram_max: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> tuple[list[int], int]:
    """Greedy speculative decoding with lookahead `gamma`; returns (new token ids, target forward passes).

    With `draft_model`, transformers' assisted generation drafts with that model; transformers reads the
    lookahead from the *assistant's* generation_config, so the draft gets a clean one with
    num_assistant_tokens = gamma, schedule "constant" and assistant_confidence_threshold = 0 for the call
    (its own object is put back afterwards, even on error). Without a draft model, prompt lookup drafts
    up to gamma tokens from the last n-gram (sizes `ngram_max`, default transformers' 2, down to 1).
    The draft must be a separate module from the target, or its forwards would be counted too.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be at least 1, got {gamma}")
    if draft_model is not None and ngram_max is not None:
        raise ValueError("give draft_model or ngram_max, not both")
    if draft_model is target_model:
        raise ValueError("the draft must be a separate module from the target (e.g. a deep copy)")
    if draft_model is None:
        config = _clean_generation_config(
            target_model,
            eos_token_id,
            max_new_tokens=max_new_tokens,
            prompt_lookup_num_tokens=gamma,
            max_matching_ngram_size=ngram_max if ngram_max is not None else 2,
        )
        return _generate(target_model, prompt_ids, config)
    config = _clean_generation_config(target_model, eos_token_id, max_new_tokens=max_new_tokens)
    draft_config = _clean_generation_config(  # transformers gives the draft the target's EOS anyway
        draft_model,
        config.eos_token_id,
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
    )
    with _generation_config_replaced(draft_model, draft_config):
        return _generate(target_model, prompt_ids, config, assistant_model=draft_model)


def assisted_generate_as_set(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    settings: AssistantSettings = TRANSFORMERS_DEFAULTS,
    *,
    eos_token_id: int | list[int] | None = None,
) -> tuple[list[int], int, int]:
    """Greedy assisted generation with the draft's generation_config as ``settings`` say (the defaults:
    nothing set, so transformers applies its own); returns (new token ids, target forward passes = rounds,
    draft forward passes = drafted tokens: each of the assistant's forwards drafts one token)."""
    if draft_model is target_model:
        raise ValueError("the draft must be a separate module from the target (e.g. a deep copy)")
    config = _clean_generation_config(target_model, eos_token_id, max_new_tokens=max_new_tokens)
    chosen = {} if settings == TRANSFORMERS_DEFAULTS else {
        "num_assistant_tokens": settings.tokens,
        "num_assistant_tokens_schedule": settings.schedule,
        "assistant_confidence_threshold": settings.threshold,
    }  # fmt: skip
    draft_config = _clean_generation_config(draft_model, config.eos_token_id, **chosen)
    with _generation_config_replaced(draft_model, draft_config), count_forward_passes(draft_model) as drafts:
        ids, passes = _generate(target_model, prompt_ids, config, assistant_model=draft_model)
    return ids, passes, drafts.count


def validate_prompt(
    target_model: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    gamma: int,
    draft_model: PreTrainedModel | None = None,
    ngram_max: int | None = None,
    repeats: int = 1,
    eos_token_id: int | list[int] | None = None,
    warmup: bool = False,
) -> ValidationMeasurement:
    """Time plain greedy and speculative generation of one prompt and compare their outputs.

    Each of `repeats` rounds runs both, alternating which goes first so that a one-time warm-up cost or
    drift does not favour either; times are medians over the rounds and measured_speedup is
    greedy_time / speculative_time. The ids and pass count reported are the first round's;
    outputs_identical is true only if every speculative run reproduced the greedy output. Both runs stop
    at `eos_token_id` (default: the target's generation_config). With ``warmup`` both run once,
    untimed, first (on a GPU a first, cold run measured 0.65x where warm ones measured 1.01x).
    """

    def run_greedy():
        return greedy_generate(target_model, prompt_ids, max_new_tokens, eos_token_id=eos_token_id)

    def run_speculative():
        return assisted_generate(
            target_model,
            prompt_ids,
            max_new_tokens,
            gamma=gamma,
            draft_model=draft_model,
            ngram_max=ngram_max,
            eos_token_id=eos_token_id,
        )

    return compare_generations(run_greedy, run_speculative, gamma=gamma, repeats=repeats, warmup=warmup)


Generation = Callable[[], "tuple[list[int], int]"]


def compare_generations(
    run_greedy: Generation, run_speculative: Generation, *, gamma: int, repeats: int = 1, warmup: bool = False
) -> ValidationMeasurement:
    """Time ``run_greedy`` and ``run_speculative`` (each returns its new ids and target forwards) as
    :func:`validate_prompt` describes: alternated over ``repeats`` rounds, after one untimed run of
    each with ``warmup``; the cuda-graphs mode compares its own two loops the same way."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if warmup:
        run_greedy()
        run_speculative()
    greedy_runs: list[tuple[list[int], int]] = []
    speculative_runs: list[tuple[list[int], int]] = []
    greedy_times: list[float] = []
    speculative_times: list[float] = []
    for r in range(repeats):
        order = [
            (run_greedy, greedy_runs, greedy_times),
            (run_speculative, speculative_runs, speculative_times),
        ]
        for run, results, times in order if r % 2 == 0 else reversed(order):
            start = perf_counter()
            results.append(run())
            times.append(perf_counter() - start)
    greedy_ids = greedy_runs[0][0]
    speculative_ids, passes = speculative_runs[0]
    greedy_time_s, speculative_time_s = float(np.median(greedy_times)), float(np.median(speculative_times))
    return ValidationMeasurement(
        gamma=gamma,
        greedy_ids=greedy_ids,
        speculative_ids=speculative_ids,
        greedy_time_s=greedy_time_s,
        speculative_time_s=speculative_time_s,
        outputs_identical=all(ids == greedy_ids for ids, _ in speculative_runs),
        target_forward_passes=passes,
        measured_speedup=greedy_time_s / speculative_time_s,
        greedy_times_s=tuple(greedy_times),
        speculative_times_s=tuple(speculative_times),
    )
