"""Tiny, real tokenizers and models for tests, built offline from a fixed vocabulary.

The tokenizer is a `tokenizers` WordLevel model: every word, every single punctuation character and
every single whitespace character is one token, and the decoder fuses tokens back together, so
``decode(encode(text)) == text`` for text made of known words. It carries ChatML special tokens
(``<|im_start|>`` as bos, ``<|im_end|>`` as eos, ``<unk>``, ``<pad>``) and a ChatML chat template,
like SmolLM2. :func:`save_tiny_model_folder` saves a tiny ``LlamaForCausalLM`` (or a noisy copy of
one) next to it, so tests can load both through ``hf:<folder>`` with the real loading code.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [UNK, PAD, BOS, EOS]  # ids 0..3, in this order

# Whitespace and punctuation first so that a smaller vocab_size keeps them; then the ChatML role
# names, then ordinary words.
TINY_WORDS: tuple[str, ...] = (
    " ",
    "\n",
    "\t",
    ".",
    ",",
    "!",
    "?",
    ":",
    ";",
    "'",
    '"',
    "(",
    ")",
    "-",
    "=",
    "+",
    "*",
    "/",
    "#",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "_",
    "|",
    "user",
    "assistant",
    "system",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "the",
    "a",
    "an",
    "and",
    "or",
    "not",
    "is",
    "are",
    "was",
    "be",
    "to",
    "of",
    "in",
    "on",
    "at",
    "for",
    "with",
    "by",
    "from",
    "it",
    "this",
    "that",
    "what",
    "which",
    "who",
    "how",
    "why",
    "when",
    "where",
    "you",
    "I",
    "we",
    "they",
    "he",
    "she",
    "my",
    "your",
    "please",
    "thanks",
    "hello",
    "hi",
    "world",
    "write",
    "read",
    "code",
    "function",
    "def",
    "return",
    "print",
    "if",
    "else",
    "import",
    "class",
    "list",
    "sum",
    "number",
    "numbers",
    "text",
    "story",
    "cat",
    "dog",
    "sun",
    "moon",
    "day",
    "night",
    "good",
    "bad",
    "big",
    "small",
    "one",
    "two",
    "three",
    "four",
    "five",
    "translate",
    "French",
    "English",
    "summarize",
    "explain",
    "answer",
    "question",
    "yes",
    "no",
    "can",
    "do",
    "does",
    "make",
    "tell",
    "me",
    "about",
    "short",
    "long",
    "poem",
    "x",
    "y",
    "z",
    "i",
    "n",
    "s",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab(*, words: Sequence[str] | None = None, vocab_size: int | None = None) -> list[str]:
    """The token strings in id order: the four special tokens, then ``words`` (default
    :data:`TINY_WORDS`). ``vocab_size`` (special tokens included) truncates the list, or extends it
    with made-up words ``w0``, ``w1``, ... so tests can ask for a tokenizer of any size >= 4."""
    vocab = SPECIAL_TOKENS + list(TINY_WORDS if words is None else words)
    if len(set(vocab)) != len(vocab):
        raise ValueError("tiny vocabulary has duplicate tokens")
    if vocab_size is None:
        return vocab
    if vocab_size < len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS)}")
    extra = (f"w{i}" for i in range(vocab_size))
    while len(vocab) < vocab_size:
        word = next(extra)
        if word not in vocab:
            vocab.append(word)
    return vocab[:vocab_size]


def build_tiny_tokenizer(
    *, words: Sequence[str] | None = None, vocab_size: int | None = None
) -> PreTrainedTokenizerFast:
    """A fast tokenizer over :func:`tiny_vocab`, with ChatML special tokens and chat template.
    Unknown words encode to ``<unk>``; no special tokens are added by ``tokenizer(text)``."""
    vocab = {token: i for i, token in enumerate(tiny_vocab(words=words, vocab_size=vocab_size))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # One token per word, per punctuation character and per whitespace character, so decoding
    # with a fusing decoder reproduces the text exactly (the chat template's newlines included).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s|\w+|[^\w\s]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        chat_template=CHAT_TEMPLATE,
    )


def save_tiny_tokenizer(
    folder: Path, *, words: Sequence[str] | None = None, vocab_size: int | None = None
) -> Path:
    """Save :func:`build_tiny_tokenizer` into ``folder`` (created if needed) and return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_tokenizer(words=words, vocab_size=vocab_size).save_pretrained(folder)
    return folder


def tiny_llama_config(vocab_size: int, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """The tiny Llama shape used by tests: hidden 64, 2 layers, 4 heads, 512 positions, untied
    input and output embeddings, special token ids taken from ``tokenizer``."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _seeded_tiny_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    # fork_rng keeps the caller's global torch RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).float().eval()


def noisy_copy(base_model: PreTrainedModel, *, noise_std: float, seed: int = 0) -> PreTrainedModel:
    """A deep copy of ``base_model`` with independent Gaussian noise N(0, noise_std^2) added to
    every parameter, drawn from a generator seeded with ``seed`` (the base model is unchanged)."""
    model = copy.deepcopy(base_model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(noise * noise_std)
    return model.eval()


def save_tiny_model_folder(
    folder: Path,
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    noise_std: float = 0.0,
    base_model: PreTrainedModel | Path | str | None = None,
    words: Sequence[str] | None = None,
) -> Path:
    """Save a tiny causal LM and its tokenizer (safetensors) into ``folder`` and return it.

    Without ``base_model``: a freshly initialised tiny ``LlamaForCausalLM`` (seeded with ``seed``)
    over :func:`build_tiny_tokenizer` (``words`` / ``vocab_size`` choose the vocabulary; the model's
    vocabulary is the tokenizer's size). With ``base_model`` (a model, or a folder saved by this
    function): a noisy copy of it, base weights plus Gaussian noise of ``noise_std`` seeded with
    ``seed``, saved with the base folder's tokenizer (or, for a model object, the tokenizer built
    from ``words`` / ``vocab_size``, which must match the model's vocabulary size). The generation
    config's eos and pad ids are set from the tokenizer, so ``generate`` stops at ``<|im_end|>``.
    """
    folder = Path(folder)
    if base_model is None:
        tokenizer = build_tiny_tokenizer(words=words, vocab_size=vocab_size)
        model = _seeded_tiny_model(tiny_llama_config(len(tokenizer), tokenizer), seed)
    else:
        if isinstance(base_model, (str, Path)):
            tokenizer = AutoTokenizer.from_pretrained(base_model)
            base_model = AutoModelForCausalLM.from_pretrained(base_model)
        else:
            tokenizer = build_tiny_tokenizer(words=words, vocab_size=vocab_size)
        if len(tokenizer) != base_model.config.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the base model's vocabulary is "
                f"{base_model.config.vocab_size}"
            )
        model = noisy_copy(base_model, noise_std=noise_std, seed=seed)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
