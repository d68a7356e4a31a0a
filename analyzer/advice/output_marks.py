"""What produced each output token of a stored result at one lookahead, for the report's drill-down:
an accepted draft, the target's token after a rejected draft, a bonus token after a fully accepted
round, or a plain step. Read from what the run stored (the prompt and output token ids, each token's
text, the draft matches and the run's EOS ids) and replayed with the walk that produced the stored
counts, so no tokenizer, model or torch is needed and the marks agree with the counts shown beside
them. Results from before token ids were stored are not guessed at: they get a message instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from analyzer.engine.engines import measuring_engine
from analyzer.measuring.acceptance import token_marks_model_draft, token_marks_ngram
from analyzer.models.specs import NGRAM_DEFAULT_MAX, parse_spec
from analyzer.orm import AnalysisRun, PromptResult

BEFORE_TOKEN_IDS = (
    "this result was measured before specroute stored token ids with each result, so its tokens "
    "cannot be coloured; run the analysis again to see them"
)
SAMPLING = (
    "a sampling run (temperature > 0) stores expected counts, not a replay, so no token is marked as drafted"
)


@dataclass(frozen=True)
class OutputMarks:
    """``pieces``: (token text, mark) per output token, mark one of accepted | corrected | bonus |
    plain; empty when the tokens cannot be shown. ``note``: why they are not coloured, or None."""

    pieces: list[tuple[str, str]]
    note: str | None = None


def output_marks(run: AnalysisRun, result: PromptResult, gamma: int) -> OutputMarks:
    """The marks of ``result``'s output tokens at lookahead ``gamma`` in ``run``: replayed from the
    stored draft matches (a model draft) or from the stored prompt and output ids with the run's
    n-gram size and EOS ids (prompt lookup), under its engine's drafting rule, exactly as the run
    counted them. A result without stored
    token ids gets no pieces and :data:`BEFORE_TOKEN_IDS`; a sampling run plain pieces; marks that
    disagree with the stored accepted count (which the walk makes impossible) plain pieces and a note
    saying so, so colours never contradict the counts."""
    texts, output_ids = result.output_token_texts, list(result.output_token_ids or [])
    ngram = parse_spec(run.pair.draft.spec)
    if (
        result.prompt_token_ids is None
        or texts is None
        or (ngram.kind == "ngram" and run.eos_token_ids is None)
    ):
        return OutputMarks([], BEFORE_TOKEN_IDS)
    plain = [(text, "plain") for text in texts]
    params = run.run_params
    if params.sampling:
        return OutputMarks(plain, SAMPLING)
    max_new_tokens = params.max_new_tokens
    rule = measuring_engine(params.engine).rule
    if ngram.kind == "ngram":
        marks = token_marks_ngram(
            result.prompt_token_ids,
            output_ids,
            gamma,
            max_new_tokens,
            max_ngram=int(ngram.options.get("max_ngram", NGRAM_DEFAULT_MAX)),
            eos_ids=cast("list[int]", run.eos_token_ids),  # not None: checked above
            rule=rule,
        )
    elif result.draft_matches is not None:
        marks = token_marks_model_draft(result.draft_matches, gamma, max_new_tokens, rule)
    else:
        return OutputMarks(plain, "this result has no stored draft matches, so no token is marked as drafted")
    stored = {count.gamma: count.accepted for count in result.gamma_counts}.get(gamma)
    if len(marks) != len(texts) or (stored is not None and marks.count("accepted") != stored):
        return OutputMarks(
            plain,
            f"the replayed marks ({marks.count('accepted')} accepted) disagree with the stored "
            f"counts ({stored} accepted); not coloured",
        )
    return OutputMarks(list(zip(texts, marks)))
