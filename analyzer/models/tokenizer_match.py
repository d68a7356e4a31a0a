"""Whether a target and a draft tokenize alike: speculative decoding verifies the draft's token ids
with the target, so both must map the same strings to the same ids and agree on BOS/EOS.

A tokenizer is summarised by a fingerprint (stored with each model spec); when two differ, the
mismatch is explained by the first difference found. The tokenizers are passed in: nothing here
imports torch or transformers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from analyzer.models.specs import TokenizerMismatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    return {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 (hex) over the sorted (token, id) vocabulary items, added tokens included, and the
    bos/eos/pad/unk token ids: equal fingerprints mean the same ids for the same strings."""
    payload = {"vocab": sorted(tokenizer.get_vocab().items()), "special": _special_ids(tokenizer)}
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode("utf-8")).hexdigest()


def _first_differing_token(target_vocab: Mapping[str, int], draft_vocab: Mapping[str, int]):
    target_by_id = {i: token for token, i in target_vocab.items()}
    draft_by_id = {i: token for token, i in draft_vocab.items()}
    for token_id in sorted(target_by_id.keys() | draft_by_id.keys()):
        if target_by_id.get(token_id) != draft_by_id.get(token_id):
            return token_id, target_by_id.get(token_id), draft_by_id.get(token_id)
    return None


def check_same_tokenizer(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase, target_name: str, draft_name: str
) -> None:
    """Raise :class:`TokenizerMismatch` unless target and draft map the same strings to the same ids
    and agree on the bos/eos ids; the message names the first difference found (vocabulary sizes,
    the first token id whose string differs with both strings, or the special ids)."""
    if tokenizer_fingerprint(target_tok) == tokenizer_fingerprint(draft_tok):
        return
    prefix = f"target {target_name!r} and draft {draft_name!r} use different tokenizers"
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if len(target_vocab) != len(draft_vocab):
        raise TokenizerMismatch(
            f"{prefix}: vocabulary sizes {len(target_vocab)} vs {len(draft_vocab)}; "
            "speculative decoding needs a draft with the target's tokenizer"
        )
    differing = _first_differing_token(target_vocab, draft_vocab)
    if differing is not None:
        token_id, target_token, draft_token = differing
        raise TokenizerMismatch(
            f"{prefix}: token id {token_id} is {target_token!r} in {target_name!r} "
            f"but {draft_token!r} in {draft_name!r}"
        )
    for name in ("eos", "bos"):
        target_id, draft_id = _special_ids(target_tok)[name], _special_ids(draft_tok)[name]
        if target_id != draft_id:
            raise TokenizerMismatch(f"{prefix}: {name} token id {target_id} vs {draft_id}")
    # Only pad/unk differ: harmless for greedy verification, which never emits them by rule.
