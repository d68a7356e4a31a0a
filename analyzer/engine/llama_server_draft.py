"""The draft model's view of a request, for draft-simple's replay in llama-server
(analyzer/measuring/server_drafting.py, :class:`DraftOracle`): the draft GGUF loaded in llama-cpp-python (the
same llama.cpp as the server), one teacher-forced pass over the request's prompt and greedy output giving
the draft's most likely token and its top-10 probability after every prefix from the prompt on, and, on
demand, the same on the draft's own branch after it left the output (cached, since several settings ask
for the same branches)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analyzer.engine.llamacpp_engine import LlamaCppModel
from analyzer.measuring.server_drafting import DRAFT_TOP_K


def top_k_probability(logits: np.ndarray, k: int = DRAFT_TOP_K) -> tuple[int, float]:
    """The most likely token of ``logits`` (V,) and its probability under a softmax over the ``k`` largest
    logits only, which is what draft-simple's top-k sampler compares with p_min."""
    top = np.argpartition(logits, -k)[-k:]
    values = logits[top].astype(np.float64)
    best = int(top[int(values.argmax())])
    weights = np.exp(values - values.max())
    return best, float(1.0 / weights.sum())


class DraftModel:
    """The draft GGUF in llama-cpp-python, kept loaded for every request of an analysis."""

    def __init__(self, path: Path, *, n_ctx: int, threads: int) -> None:
        self.model = LlamaCppModel(path, n_ctx=n_ctx, threads=threads)
        self._kv: list[int] = []  # the tokens now in the model's KV cache

    def _logits_after(self, tokens: Sequence[int]) -> np.ndarray:
        """The draft's logits after ``tokens``, reusing the cached prefix."""
        common = 0
        for cached, token in zip(self._kv, tokens):
            if cached != token:
                break
            common += 1
        if common == len(tokens):  # llama.cpp needs one token decoded to give its logits
            common -= 1
        self.model.rewind(common)
        self.model.llm.eval(list(tokens[common:]))
        self._kv = list(tokens)
        return self.model.last_logits()

    def oracle(self, prompt: Sequence[int], output: Sequence[int]) -> RequestOracle:
        """The draft's view of one request: the teacher-forced tops from the prompt on, computed now."""
        sequence = list(prompt) + list(output)
        tops = {}
        self._logits_after(list(prompt))
        tops[len(prompt)] = top_k_probability(self.model.last_logits())
        for position in range(len(prompt) + 1, len(sequence) + 1):
            tops[position] = top_k_probability(self._logits_after(sequence[:position]))
        return RequestOracle(self, sequence, tops)

    def close(self) -> None:
        self.model.close()


class RequestOracle:
    """:class:`analyzer.measuring.server_drafting.DraftOracle` for one request."""

    def __init__(self, draft: DraftModel, sequence: list[int], tops: dict[int, tuple[int, float]]) -> None:
        self.draft, self.sequence, self.tops = draft, sequence, tops
        self._branches: dict[tuple[int, tuple[int, ...]], tuple[int, float]] = {}

    def top(self, position: int) -> tuple[int, float]:
        return self.tops[position]

    def branch_top(self, position: int, tokens: Sequence[int]) -> tuple[int, float]:
        key = (position, tuple(tokens))
        if key not in self._branches:
            logits = self.draft._logits_after(self.sequence[:position] + list(tokens))
            self._branches[key] = top_k_probability(logits)
        return self._branches[key]
