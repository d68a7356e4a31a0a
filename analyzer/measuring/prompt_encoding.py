"""The token ids at the two ends of a generation: the ids a prompt becomes for the target (its chat
template, and truncation to what the model's context leaves after the output budget), and the ids
that end the target's output (EOS).

Everything that measures, profiles or validates a prompt, and the drill-down that shows it, must
agree on both, so both are written once, here. A run tokenizes each prompt once with
:func:`encode_prompt` under :func:`prompt_token_limit` and stores the ids with the prompt's result.
torch and transformers are never imported here: a tokenizer or model is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analyzer.models.specs import SpecError
from analyzer.prompts.prompt_checks import message_problem

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_CONTEXT_TOKENS = 2048
MIN_PROMPT_TOKENS = 16  # a model whose context the output budget fills still sees this much prompt


@dataclass(frozen=True)
class EncodedPrompt:
    """Prompt token ids as the target will see them; ``truncated`` says whether the head of the
    prompt was dropped to fit, and ``original_tokens`` is the length before that."""

    ids: list[int]
    truncated: bool
    original_tokens: int


def context_limit(model: PreTrainedModel) -> int:
    """The longest sequence (prompt + generated tokens) the model was built for, from
    ``config.max_position_embeddings``; 2048 when the config does not say."""
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else DEFAULT_CONTEXT_TOKENS


def prompt_token_limit(
    model: PreTrainedModel, max_new_tokens: int, max_prompt_tokens: int | None = None
) -> int:
    """The most prompt tokens a run keeps: ``max_prompt_tokens`` when the run sets it, else the
    model's context less the output budget (at least 16), so prompt + output fit the context."""
    if max_prompt_tokens:
        return max_prompt_tokens
    return max(MIN_PROMPT_TOKENS, context_limit(model) - max_new_tokens)


def eos_token_ids(*candidates: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """The EOS ids as a list of ints from the first candidate that is set (not None): each one an id,
    a list or tuple of ids, or None, as ``generation_config.eos_token_id`` and
    ``tokenizer.eos_token_id`` hold them. ``eos_token_ids(model.generation_config.eos_token_id,
    tokenizer.eos_token_id)`` is a run's rule: the model's generation config first, else the
    tokenizer's. An empty list (no candidate set, or an explicit empty list) means no EOS."""
    for candidate in candidates:
        if candidate is None:
            continue
        values = candidate if isinstance(candidate, (list, tuple)) else [candidate]
        return [int(value) for value in values if value is not None]
    return []


def _flat_ids(encoded: Any) -> list[int]:
    """Token ids from whatever apply_chat_template/tokenizer returned: a list, a nested list of one
    row, a tensor, or (transformers 5) a BatchEncoding / dict holding ``input_ids``."""
    if isinstance(encoded, Mapping) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    encoded = list(encoded)
    if encoded and isinstance(encoded[0], (list, tuple)):
        if len(encoded) != 1:
            raise ValueError(f"expected one encoded sequence, got {len(encoded)}")
        encoded = list(encoded[0])
    return [int(token_id) for token_id in encoded]


def _checked_messages(messages: Any) -> list[dict]:
    problem = message_problem(messages)
    if problem is not None:
        raise SpecError(f"messages{problem.where}: {problem.message}")
    return messages


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    *,
    text: str | None = None,
    messages: list[dict] | None = None,
    use_chat_template: bool = True,
    max_prompt_tokens: int,
) -> EncodedPrompt:
    """Token ids for one prompt, given as ``text`` or as chat ``messages`` (exactly one), with one
    call of the tokenizer. Messages always go through the tokenizer's chat template with the
    assistant generation prompt appended (SpecError if it has none); plain text is wrapped as one
    user message when ``use_chat_template`` and the tokenizer has a template, and tokenized as is
    otherwise. Prompts longer than ``max_prompt_tokens`` keep their last ``max_prompt_tokens`` ids,
    so the generation prompt at the end survives, and are marked ``truncated``."""
    if (text is None) == (messages is None):
        raise SpecError("give exactly one of text or messages")
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if messages is not None and not has_template:
        raise SpecError("chat messages need a tokenizer with a chat template, and this one has none")
    if messages is None and use_chat_template and has_template:
        messages = [{"role": "user", "content": text}]
    if messages is not None:
        encoded = tokenizer.apply_chat_template(
            _checked_messages(messages), add_generation_prompt=True, tokenize=True
        )
    else:
        encoded = tokenizer(text)
    ids = _flat_ids(encoded)
    if not ids:
        raise SpecError("the prompt encodes to no tokens")
    kept = ids[-max_prompt_tokens:]
    return EncodedPrompt(ids=kept, truncated=len(kept) < len(ids), original_tokens=len(ids))


def token_texts(tokenizer: PreTrainedTokenizerBase, token_ids: Iterable[int]) -> list[str]:
    """Each token decoded on its own, special tokens kept (what the drill-down shows per token; a
    character split across byte-level tokens shows as replacement characters)."""
    return [
        str(text) for text in tokenizer.batch_decode([[int(t)] for t in token_ids], skip_special_tokens=False)
    ]
