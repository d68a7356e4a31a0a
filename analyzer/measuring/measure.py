"""The measurement passes: one target generation per prompt (optionally batched with left padding),
one teacher-forced draft pass over prompt + output, target entropies, and for sampling the
per-position overlap beta_i = sum_v min(p_i(v), q_i(v)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from transformers import GenerationConfig

from analyzer.measuring.acceptance import acceptance_probability_overlap


@dataclass
class TargetGeneration:
    """One prompt's target output. ``output_ids`` shape (N,) ends with the EOS when generation
    stopped there; ``entropies`` shape (N,) in nats of the target's next-token distribution at each
    output position; ``logits`` (N, V) raw logits, kept only when asked (sampling mode)."""

    output_ids: list[int]
    entropies: np.ndarray
    stopped_at_eos: bool
    time_s: float
    logits: torch.Tensor | None = None


def generation_config(
    max_new_tokens: int, *, eos_ids: Sequence[int], pad_id: int, temperature: float = 0.0, top_p: float = 1.0
) -> GenerationConfig:
    """An explicit generation config, so nothing (repetition penalty, min length, sampling defaults)
    leaks in from the model's own generation_config."""
    sampling = temperature > 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=sampling,
        temperature=temperature if sampling else 1.0,
        top_p=top_p if sampling else 1.0,
        top_k=0 if sampling else None,
        repetition_penalty=1.0,
        num_beams=1,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        return_dict_in_generate=True,
        output_logits=True,
    )


def entropy_nats(logits: torch.Tensor) -> np.ndarray:
    """Entropy of softmax(logits) per row, shape (N, V) -> (N,), in nats."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return (-(log_probs.exp() * log_probs).sum(dim=-1)).cpu().numpy().astype(np.float64)


@torch.inference_mode()
def generate_target(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    keep_logits: bool = False,
) -> list[TargetGeneration]:
    """Generate for a batch of prompts (left-padded) in one ``generate`` call and split the result
    per prompt: the new tokens up to and including the first EOS, the entropy per position, and the
    batch's wall time divided evenly (per-prompt time of a batch is not separable)."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    input_ids, attention = input_ids.to(model.device), attention.to(model.device)
    config = generation_config(
        max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, temperature=temperature, top_p=top_p
    )
    if temperature > 0:
        torch.manual_seed(seed)
    _synchronize(model.device)
    started = time.perf_counter()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        generation_config=config,
    )
    _synchronize(model.device)
    elapsed = time.perf_counter() - started
    steps = torch.stack(out.logits, dim=1)  # (B, steps, V) raw logits, on the model's device
    eos = set(eos_ids)
    results = []
    for row in range(len(prompts)):
        new = out.sequences[row, width:].cpu().tolist()
        stop = next((i for i, token in enumerate(new) if token in eos), None)
        length = len(new) if stop is None else stop + 1
        row_logits = steps[row, :length]
        results.append(
            TargetGeneration(
                output_ids=new[:length],
                entropies=entropy_nats(row_logits),
                stopped_at_eos=stop is not None,
                time_s=elapsed / len(prompts),
                logits=row_logits.float().cpu() if keep_logits else None,
            )
        )
    return results


@torch.inference_mode()
def teacher_forced_logits(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
    """Logits of ``model`` predicting each output token given prompt + the output before it, from one
    forward pass over prompt + output[:-1]; shape (N, V)."""
    n = len(output_ids)
    if n == 0:
        return torch.zeros((0, model.config.vocab_size))
    ids = torch.tensor([list(prompt_ids) + list(output_ids[:-1])], dtype=torch.long, device=model.device)
    try:
        logits = model(input_ids=ids, logits_to_keep=n).logits[0]
    except TypeError:  # models without logits_to_keep
        logits = model(input_ids=ids).logits[0, -n:]
    return logits[-n:].float().cpu()


def teacher_forced_mismatches(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> np.ndarray:
    """Replay fidelity of one generation: 1 where the target's argmax in one teacher-forced pass over
    prompt + output (batched, as verification computes it) differs from the token that one-token
    decoding generated, shape (N,) int8. All zeros in exact arithmetic; in bfloat16/float16 the two
    ways of computing round differently and near-ties flip."""
    if len(output_ids) == 0:
        return np.zeros(0, dtype=np.int8)
    logits = teacher_forced_logits(model, prompt_ids, output_ids)
    return (1 - draft_match_sequence(logits, output_ids)).astype(np.int8)


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer read afterwards includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def draft_match_sequence(draft_logits: torch.Tensor, output_ids: Sequence[int]) -> np.ndarray:
    """m_i = 1[argmax q_i == t_i], shape (N,) int8, from teacher-forced draft logits (N, V)."""
    if len(output_ids) == 0:
        return np.zeros(0, dtype=np.int8)
    predicted = draft_logits.argmax(dim=-1)
    return (predicted == torch.tensor(list(output_ids), dtype=torch.long)).numpy().astype(np.int8)


def processed_probabilities(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / temperature) restricted to the top-p nucleus and renormalised, shape (N, V);
    the same processing is applied to target and draft before comparing them."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    keep_sorted = (cumulative - sorted_probs) < top_p  # keep tokens until the mass reaches top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    filtered = torch.where(keep, probs, torch.zeros_like(probs))
    return filtered / filtered.sum(dim=-1, keepdim=True)


def sampling_overlaps(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float, top_p: float = 1.0
) -> np.ndarray:
    """beta_i = sum_v min(p_i, q_i) per output position, shape (N,), after identical processing."""
    p = processed_probabilities(target_logits, temperature, top_p).numpy()
    q = processed_probabilities(draft_logits, temperature, top_p).numpy()
    return acceptance_probability_overlap(p, q).astype(np.float64)


def draft_confidences(draft_logits: torch.Tensor) -> np.ndarray:
    """The probability of the draft's argmax at each output position, shape (N,) float64: what
    transformers' confidence stop compares with its threshold (``ConfidenceCriteria``)."""
    if len(draft_logits) == 0:
        return np.zeros(0)
    return torch.softmax(draft_logits.float(), dim=-1).max(dim=-1).values.double().numpy()


def draft_off_path(
    model,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    draft_logits: torch.Tensor,
    eos_ids: Sequence[int],
):
    """The draft's continuation after a rejected draft, for
    :func:`analyzer.measuring.assistant_defaults.assistant_rounds`: from prompt + output[:position] + the
    draft's own (wrong) token at ``position``, greedy drafts until ``room`` are drafted, one was an EOS,
    or one's probability was under ``threshold``; returns how many."""
    proposed = draft_logits.argmax(dim=-1).tolist()
    eos = set(eos_ids)

    @torch.inference_mode()
    def continue_off_path(position: int, room: int, threshold: float | None) -> int:
        if room <= 0 or proposed[position] in eos:
            return 0
        ids = list(prompt_ids) + list(output_ids[:position]) + [proposed[position]]
        out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=model.device), use_cache=True)
        drafted = 0
        while drafted < room:
            probs = torch.softmax(out.logits[0, -1].float(), dim=-1)
            token = int(probs.argmax())
            drafted += 1
            if token in eos or (threshold and float(probs[token]) < threshold):
                break
            step = torch.tensor([[token]], dtype=torch.long, device=model.device)
            out = model(input_ids=step, cache=out.cache, use_cache=True)
        return drafted

    return continue_off_path
