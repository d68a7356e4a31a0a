"""Exact greedy acceptance for every lookahead from one target generation.

Greedy speculative decoding is deterministic, so a round can be replayed from the target's output
t_1..t_N and what the drafter would propose:

- a **model draft** is summarised by its match sequence m_i = 1[argmax q(. | x, t_<i) == t_i]
  (one teacher-forced draft pass); a round starting after s emitted tokens drafts
  k = min(g, limit - s - 1) tokens (transformers never drafts into the last token of the budget),
  accepts the a leading matches, and emits a + 1 tokens;
- **prompt lookup (n-gram)** proposes, at each round start, the tokens that followed the first
  (leftmost) earlier occurrence of the context's trailing n-gram (n = max_ngram down to 1), up to g
  of them, cut before any EOS, exactly as transformers' PromptLookupCandidateGenerator does.

Engines differ in three details of the loop, gathered in a :class:`DraftingRule`: transformers
drafts in the very first round (its prefill verifies the first drafts), never drafts into the last
token of the budget, and cuts a prompt-lookup proposal before an EOS; llama.cpp (llama-cpp-python's
``Llama.generate`` with a draft model or ``LlamaPromptLookupDecoding``) decodes the prompt alone
first (the first output token comes from that pass, nothing drafted), drafts a full lookahead
whatever budget is left, and proposes EOS tokens like any other.

Per g the walk yields raw counts (rounds, drafted, accepted, the histogram of accepted lengths, the
histogram of drafted lengths, per-position accepted counts); every rate is derived from them here.
Drafts past the end of the target's output are not counted (after an EOS nothing is drafted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np


@dataclass(frozen=True)
class DraftingRule:
    """How an engine's speculative loop drafts (see the module docstring): ``prefill_round`` the
    first output token comes from the prompt's own pass with nothing drafted; ``cap_at_budget``
    drafts are limited to budget - s - 1 tokens; ``cut_at_eos`` prompt-lookup proposals stop
    before an EOS."""

    name: str
    prefill_round: bool
    cap_at_budget: bool
    cut_at_eos: bool


TRANSFORMERS_RULE = DraftingRule("transformers", prefill_round=False, cap_at_budget=True, cut_at_eos=True)
LLAMA_CPP_RULE = DraftingRule("llama.cpp", prefill_round=True, cap_at_budget=False, cut_at_eos=False)


@dataclass(frozen=True)
class WalkCounts:
    """Raw counts of one speculative walk at lookahead ``gamma``.

    ``accepted_hist[a]``: rounds that accepted exactly a drafts, shape (gamma + 1,);
    ``drafted_hist[k]``: rounds that drafted exactly k tokens, shape (gamma + 1,);
    ``position_accepted[j]``: rounds whose (j+1)-th draft was accepted, shape (gamma,)."""

    gamma: int
    output_tokens: int
    rounds: int
    drafted: int
    accepted: int
    accepted_hist: np.ndarray
    drafted_hist: np.ndarray
    position_accepted: np.ndarray


def match_runs(matches: Sequence[int] | np.ndarray) -> np.ndarray:
    """run[i] = number of consecutive ones in ``matches`` starting at i, shape (N + 1,) with run[N] = 0."""
    m = np.asarray(matches, dtype=np.int64)
    runs = np.zeros(m.shape[0] + 1, dtype=np.int64)
    for i in range(m.shape[0] - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if m[i] else 0
    return runs


def _counter(gamma: int):
    return (
        np.zeros(gamma + 1, dtype=np.int64),
        np.zeros(gamma + 1, dtype=np.int64),
        np.zeros(gamma, dtype=np.int64),
    )


def walk_model_draft(
    matches: Sequence[int] | np.ndarray,
    gamma: int,
    max_new_tokens: int,
    rule: DraftingRule = TRANSFORMERS_RULE,
) -> WalkCounts:
    """Replay greedy speculative decoding with a model draft at lookahead ``gamma``.

    ``matches``: shape (N,), m_i in {0, 1}; ``max_new_tokens`` >= N is the generation budget
    (transformers drafts k = min(gamma, budget - s - 1) tokens after s emitted tokens). If every
    remaining draft matches up to the end (the draft also predicted the final EOS), drafting stops at
    the end of the output. N = 0 gives zero rounds."""
    if gamma < 1:
        raise ValueError("gamma must be >= 1")
    n = len(matches)
    if max_new_tokens < n:
        raise ValueError("max_new_tokens is smaller than the output")
    return _tally(gamma, n, model_draft_rounds(matches, gamma, max_new_tokens, rule))


def model_draft_rounds(
    matches: Sequence[int] | np.ndarray,
    gamma: int,
    max_new_tokens: int,
    rule: DraftingRule = TRANSFORMERS_RULE,
) -> Iterator[tuple[int, int]]:
    """(drafted, accepted) of each round of the model-draft walk (see :func:`walk_model_draft`)."""
    n = len(matches)
    runs = match_runs(matches)
    s = 0
    while s < n:
        k, a = model_draft_round(runs, s, gamma, max_new_tokens, rule)
        yield k, a
        s += a + 1


def model_draft_round(
    runs: np.ndarray, s: int, gamma: int, max_new_tokens: int, rule: DraftingRule = TRANSFORMERS_RULE
) -> tuple[int, int]:
    """(drafted, accepted) of one model-draft round that starts after ``s`` emitted tokens with
    lookahead ``gamma``; ``runs`` = :func:`match_runs` of the match sequence (shape (N + 1,))."""
    n = len(runs) - 1
    if s == 0 and rule.prefill_round:
        return 0, 0
    k = max(0, min(gamma, max_new_tokens - s - 1)) if rule.cap_at_budget else gamma
    if s + runs[s] >= n:
        k = min(k, n - s)
    return k, int(min(runs[s], k))


def _tally(gamma: int, n: int, rounds: Iterable[tuple[int, int]]) -> WalkCounts:
    accepted_hist, drafted_hist, position_accepted = _counter(gamma)
    for k, a in rounds:
        accepted_hist[a] += 1
        drafted_hist[k] += 1
        position_accepted[:a] += 1
    return _counts(gamma, n, accepted_hist, drafted_hist, position_accepted)


def _counts(gamma, n, accepted_hist, drafted_hist, position_accepted) -> WalkCounts:
    lengths = np.arange(gamma + 1)
    return WalkCounts(
        gamma=gamma,
        output_tokens=n,
        rounds=int(accepted_hist.sum()),
        drafted=int((drafted_hist * lengths).sum()),
        accepted=int((accepted_hist * lengths).sum()),
        accepted_hist=accepted_hist,
        drafted_hist=drafted_hist,
        position_accepted=position_accepted,
    )


class NgramIndex:
    """First occurrence of every n-gram (n = 1..max_ngram) in prompt + output, so that a prompt-lookup
    proposal at any round start costs O(max_ngram) instead of a scan of the context."""

    def __init__(
        self,
        tokens: Sequence[int],
        max_ngram: int,
        eos_ids: Iterable[int] = (),
        rule: DraftingRule = TRANSFORMERS_RULE,
    ):
        if max_ngram < 1:
            raise ValueError("max_ngram must be >= 1")
        self.tokens = list(tokens)
        self.max_ngram = max_ngram
        self.eos_ids = frozenset(eos_ids) if rule.cut_at_eos else frozenset()
        self.rule = rule
        self.first: list[dict[tuple[int, ...], int]] = []
        for n in range(1, max_ngram + 1):
            first: dict[tuple[int, ...], int] = {}
            for i in range(len(self.tokens) - n + 1):
                first.setdefault(tuple(self.tokens[i : i + n]), i)
            self.first.append(first)

    def propose(self, context_len: int, gamma: int) -> list[int]:
        """The prompt-lookup proposal for the context ``tokens[:context_len]``: n-gram sizes from
        min(max_ngram, context_len - 1) down to 1; for the first size whose trailing n-gram occurs
        earlier, the up to ``gamma`` tokens after that leftmost occurrence, cut before the first EOS
        (an empty cut means no proposal, as in transformers) where the index's rule cuts at EOS
        (llama-cpp-python's LlamaPromptLookupDecoding does not)."""
        for n in range(min(self.max_ngram, context_len - 1), 0, -1):
            start = self.first[n - 1].get(tuple(self.tokens[context_len - n : context_len]))
            if start is None or start + n >= context_len:
                continue  # only the trailing n-gram itself: nothing follows it yet
            proposal = self.tokens[start + n : min(start + n + gamma, context_len)]
            for j, token in enumerate(proposal):
                if token in self.eos_ids:
                    return proposal[:j]
            return proposal
        return []


def walk_ngram(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    gamma: int,
    max_new_tokens: int,
    *,
    max_ngram: int = 2,
    eos_ids: Iterable[int] = (),
    index: NgramIndex | None = None,
    rule: DraftingRule = TRANSFORMERS_RULE,
) -> WalkCounts:
    """Replay greedy prompt-lookup decoding at lookahead ``gamma``: at each round start the proposal
    comes from the context prompt + output[:s]; its leading tokens equal to the output are accepted;
    the round emits accepted + 1 tokens. With one token of budget left nothing is proposed (under
    transformers' rule; ``rule`` is the engine's, and a given ``index`` carries its own)."""
    if gamma < 1:
        raise ValueError("gamma must be >= 1")
    p, n = len(prompt_ids), len(output_ids)
    if max_new_tokens < n:
        raise ValueError("max_new_tokens is smaller than the output")
    index = index or NgramIndex(list(prompt_ids) + list(output_ids), max_ngram, eos_ids, rule)
    return _tally(gamma, n, ngram_rounds(p, output_ids, gamma, max_new_tokens, index))


def ngram_rounds(
    prompt_len: int, output_ids: Sequence[int], gamma: int, max_new_tokens: int, index: NgramIndex
) -> Iterator[tuple[int, int]]:
    """(drafted, accepted) of each round of the prompt-lookup walk (see :func:`walk_ngram`);
    ``index`` covers prompt + output."""
    s = 0
    while s < len(output_ids):
        k, a = ngram_round(prompt_len, output_ids, s, gamma, max_new_tokens, index)
        yield k, a
        s += a + 1


def ngram_round(
    prompt_len: int, output_ids: Sequence[int], s: int, gamma: int, max_new_tokens: int, index: NgramIndex
) -> tuple[int, int]:
    """(drafted, accepted) of one prompt-lookup round that starts after ``s`` emitted tokens with
    lookahead ``gamma`` (``index`` covers prompt + output)."""
    rule = index.rule
    if s == 0 and rule.prefill_round:
        return 0, 0
    last_token = rule.cap_at_budget and max_new_tokens - s == 1
    proposal = [] if last_token else index.propose(prompt_len + s, gamma)
    a = 0
    while a < len(proposal) and s + a < len(output_ids) and proposal[a] == output_ids[s + a]:
        a += 1
    return len(proposal), a


def _marks_from_rounds(n: int, rounds) -> list[str]:
    marks: list[str] = []
    for k, a in rounds:
        marks += ["accepted"] * a
        if len(marks) < n:
            marks.append("plain" if k == 0 else "bonus" if a == k else "corrected")
    return marks[:n]


def token_marks_model_draft(
    matches: Sequence[int] | np.ndarray,
    gamma: int,
    max_new_tokens: int,
    rule: DraftingRule = TRANSFORMERS_RULE,
) -> list[str]:
    """What produced each output token in the walk of :func:`walk_model_draft` at ``gamma``:
    "accepted" (a draft the target kept), "corrected" (the target's token after a rejected draft),
    "bonus" (the target's token after a fully accepted round) or "plain" (a round with no drafts)."""
    return _marks_from_rounds(len(matches), model_draft_rounds(matches, gamma, max_new_tokens, rule))


def token_marks_ngram(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    gamma: int,
    max_new_tokens: int,
    *,
    max_ngram: int = 2,
    eos_ids: Iterable[int] = (),
    rule: DraftingRule = TRANSFORMERS_RULE,
) -> list[str]:
    """Per output token, as :func:`token_marks_model_draft`, for the prompt-lookup walk of :func:`walk_ngram`."""
    index = NgramIndex(list(prompt_ids) + list(output_ids), max_ngram, eos_ids, rule)
    return _marks_from_rounds(
        len(output_ids), ngram_rounds(len(prompt_ids), output_ids, gamma, max_new_tokens, index)
    )


def ngram_first_token_matches(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    max_ngram: int = 2,
    eos_ids: Iterable[int] = (),
    index: NgramIndex | None = None,
) -> np.ndarray:
    """m_i = 1 if prompt lookup on the context prompt + output[:i] would propose output[i] first,
    shape (N,). The n-gram analogue of a model draft's match sequence (its mean is alpha)."""
    p = len(prompt_ids)
    index = index or NgramIndex(list(prompt_ids) + list(output_ids), max_ngram, eos_ids)
    matches = np.zeros(len(output_ids), dtype=np.int8)
    for i, token in enumerate(output_ids):
        proposal = index.propose(p + i, 1)
        matches[i] = 1 if proposal and proposal[0] == token else 0
    return matches


# ---------------------------------------------------------------- derived metrics


def alpha_from_matches(matches: Sequence[int] | np.ndarray) -> float:
    """alpha = mean(m_i): the per-token acceptance probability of greedy decoding (Leviathan's
    E[beta] with point-mass distributions). NaN for an empty sequence."""
    m = np.asarray(matches, dtype=np.float64)
    return float(m.mean()) if m.size else float("nan")


def draft_acceptance_rate(accepted: int, drafted: int) -> float:
    """r = accepted / drafted (vLLM, SGLang, TRT-LLM); NaN when nothing was drafted."""
    return accepted / drafted if drafted else float("nan")


def mean_acceptance_length(accepted: int, rounds: int) -> float:
    """AL = 1 + accepted / rounds: tokens emitted per target pass, bonus token included; NaN for 0 rounds."""
    return 1.0 + accepted / rounds if rounds else float("nan")


def position_rates(position_accepted: np.ndarray, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position acceptance, shapes (gamma,): unconditional u_k = position_accepted[k-1] / rounds
    and conditional u_k / u_{k-1} (u_0 = 1); NaN where the denominator is 0."""
    counts = np.asarray(position_accepted, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        unconditional = counts / rounds if rounds else np.full(counts.shape, np.nan)
        previous = np.concatenate([[1.0], unconditional[:-1]])
        conditional = np.where(previous > 0, unconditional / np.where(previous > 0, previous, 1), np.nan)
    return unconditional, conditional


def expected_tokens_iid(alpha: float, gamma: float) -> float:
    """Expected tokens per round under i.i.d. acceptance: (1 - alpha^(g+1)) / (1 - alpha); g + 1 at
    alpha = 1 and 1 at alpha = 0 (g = 0 gives 1: plain decoding; a fractional g, the mean drafted per
    round of a feedback event, is read the same way)."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    if alpha >= 1.0:
        return float(gamma + 1)
    return float((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha))


def acceptance_probability_overlap(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """beta_i = sum_v min(p_i(v), q_i(v)) per position for distributions of shape (N, V) (already
    processed by the same temperature / top-p); shape (N,). Equals 1 - total variation distance."""
    return np.minimum(np.asarray(p), np.asarray(q)).sum(axis=-1)
