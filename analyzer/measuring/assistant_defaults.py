"""transformers' assisted generation as people run it: with its defaults, replayed exactly.

A draft model's assistant in transformers 5 starts every generate() call with ``num_assistant_tokens``
20, the "constant" schedule and ``assistant_confidence_threshold`` 0.4, and (scikit-learn installed, as
it is with specroute) moves the threshold after every round to the ROC point that weighs a missed
acceptance three times a wasted draft (``AssistedCandidateGenerator.update_candidate_strategy``). A round
drafts until the lookahead or the budget is used up, the draft emits EOS, or the token it just drafted
had a probability under the threshold (``ConfidenceCriteria``: that token is still drafted).

Everything but one number per round follows from the target's greedy output, the draft's teacher-forced
match sequence and its confidence at each output position (the probability of its argmax): which tokens
are accepted, where the next round starts, and the probabilities and matches the ROC rule sees (the
drafts up to the first rejected one, all drafted from the target's own context). What the draft proposes
*after* a rejected token is drafted from its own wrong context, which no teacher-forced pass sees: the
caller's ``continue_off_path`` drafts it with the draft model (:mod:`analyzer.engine.run_models`). Its
tokens are all rejected, so they change the round's cost and nothing else.

``heuristic`` schedules (+2 after a round that accepted every draft, -1 otherwise, at least 1) are
replayed the same way, for a user who sets one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# transformers' generation defaults for an assistant (GenerationConfig._get_default_generation_params)
DEFAULT_TOKENS, DEFAULT_SCHEDULE, DEFAULT_THRESHOLD = 20, "constant", 0.4
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
# ContinueOffPath(position, room, threshold) -> how many more tokens the draft proposes after its
# rejected draft at output ``position``: at most ``room``, the last one the first under ``threshold``
# (0 or None: no confidence stop) or an EOS
ContinueOffPath = Callable[[int, int, float | None], int]


@dataclass(frozen=True)
class AssistantSettings:
    """An assistant's generation settings: the lookahead it starts with, its schedule, its confidence
    threshold (0: none) and whether the threshold moves by the ROC rule (scikit-learn installed)."""

    tokens: int = DEFAULT_TOKENS
    schedule: str = DEFAULT_SCHEDULE
    threshold: float = DEFAULT_THRESHOLD
    adapt_threshold: bool = True

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        if self.tokens < 1:
            raise ValueError("tokens must be >= 1")

    @property
    def label(self) -> str:
        """``num_assistant_tokens 20, constant, threshold 0.4 (adapted)``."""
        adapted = " (adapted)" if self.adapt_threshold and self.threshold else ""
        return f"num_assistant_tokens {self.tokens}, {self.schedule}, threshold {self.threshold:g}{adapted}"


TRANSFORMERS_DEFAULTS = AssistantSettings()


def assistant_rounds(
    matches: Sequence[int] | np.ndarray,
    confidences: Sequence[float] | np.ndarray,
    max_new_tokens: int,
    continue_off_path: ContinueOffPath,
    settings: AssistantSettings = TRANSFORMERS_DEFAULTS,
) -> list[tuple[int, int]]:
    """(drafted, accepted) of every round of a greedy assisted generation under ``settings``.

    ``matches[i]`` = 1 where the draft's argmax at output position i (target context) is the target's
    token, ``confidences[i]`` that argmax's probability; the output (N tokens) ends at an EOS or at the
    ``max_new_tokens`` budget."""
    n = len(matches)
    if len(confidences) != n:
        raise ValueError("matches and confidences differ in length")
    if max_new_tokens < n:
        raise ValueError("max_new_tokens is smaller than the output")
    tokens, threshold = settings.tokens, float(settings.threshold)
    seen_probs: list[float] = []
    seen_matches: list[int] = []
    rounds: list[tuple[int, int]] = []
    s = 0
    while s < n:
        room = max(0, min(int(tokens), max_new_tokens - s - 1))
        drafted, accepted, probs = 0, 0, []
        while drafted < room and s + drafted < n:
            i = s + drafted
            p = float(confidences[i])
            drafted += 1
            probs.append(p)
            stop = bool(threshold) and p < threshold
            if not matches[i]:
                if not stop and drafted < room:
                    drafted += continue_off_path(i, room - drafted, threshold or None)
                break
            accepted += 1
            if stop:
                break
        rounds.append((drafted, accepted))
        if settings.schedule != "constant":
            tokens = tokens + 2 if accepted == drafted else max(1, tokens - 1)
        if settings.adapt_threshold and threshold:
            seen_probs.extend(probs[: accepted + (1 if drafted > accepted else 0)])
            seen_matches.extend([1] * accepted + ([0] if drafted > accepted else []))
            if len(seen_probs) > 5 and 0 in seen_matches and 1 in seen_matches:
                threshold = roc_threshold(seen_matches, seen_probs)
        s += accepted + 1
    return rounds


def roc_threshold(matches: Sequence[int], probs: Sequence[float]) -> float:
    """transformers' next confidence threshold: the ROC curve's threshold minimising fpr + 3 fnr."""
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(matches, probs)
    return float(thresholds[int(np.argmin(fpr + 3 * (1 - tpr)))])
