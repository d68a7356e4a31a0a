"""Tiny real transformers models for tests: a randomly initialised Llama target and a "noisy copy"
draft whose greedy choices agree with the target's only in part."""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2


def make_tiny_model(
    seed: int = 0,
    vocab_size: int = 97,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 512,
    kv_heads: int | None = None,
    attention: str | None = None,
) -> LlamaForCausalLM:
    """A float32 LlamaForCausalLM in eval mode with weights drawn from `seed` (the global torch RNG is
    left as it was), pad id 0, EOS id 1 and BOS id 2, and a generation_config holding only those ids;
    `kv_heads` key/value heads (default: one per query head) and attention implementation `attention`
    (default: transformers')."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=False,
        **({"attn_implementation": attention} if attention else {}),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=BOS_ID)
    return model.to(torch.float32).eval()


def make_noisy_copy(model: torch.nn.Module, noise_std: float, seed: int) -> torch.nn.Module:
    """A deep copy of `model` with seeded Gaussian noise of standard deviation `noise_std` added to every
    parameter: a draft that agrees with the target partly, more so the smaller the noise."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in noisy.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(noise.to(parameter.device) * noise_std)
    return noisy.eval()
