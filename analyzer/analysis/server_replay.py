"""llama-server's drafting rules replayed on the plain generation of an analysis in llama-server: one drafter
over every prompt in order, as one server sees them (:func:`replay_all`), and every setting over every prompt,
with the draft model's view for draft-simple (:func:`replay_settings`). What the servers themselves did in the
passes through them is replayed in analyzer/analysis/server_passes.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from analyzer.analysis.server_generation import ServerSetup
from analyzer.analysis.server_outcomes import Progress, PromptOutcome, SettingOutcome
from analyzer.engine.llama_server_draft import DraftModel
from analyzer.measuring.server_drafting import (
    NGRAM_MOD,
    DraftOracle,
    NgramModTable,
    ServerDrafter,
    ServerReplay,
    replay_request,
)


def replay_all(
    drafter: ServerDrafter,
    outcomes: Sequence[PromptOutcome],
    *,
    n_predict: int,
    n_ctx: int,
    oracles: Sequence[DraftOracle] | None = None,
) -> list[ServerReplay]:
    """The drafter replayed on every prompt's plain output in order, as one server that serves them in
    that order sees them (ngram-mod's table carried from request to request); ``oracles``, one per prompt,
    are the draft model's view for draft-simple."""
    table = NgramModTable(drafter.n_match) if drafter.kind == NGRAM_MOD else None
    replays = []
    for index, outcome in enumerate(outcomes):
        completion = outcome.plain.completion
        eog = frozenset(completion.tokens[-1:]) if completion.stopped_at_eos else frozenset()
        replays.append(
            replay_request(
                drafter,
                outcome.prompt_ids,
                completion.tokens,
                n_predict=n_predict,
                n_ctx=n_ctx,
                eog_ids=eog,
                table=table,
                oracle=oracles[index] if oracles is not None and drafter.needs_draft_model else None,
            )
        )
    return replays


def replay_settings(
    setup: ServerSetup,
    outcomes: Sequence[PromptOutcome],
    drafters: Sequence[ServerDrafter],
    n_predict: int,
    say: Progress,
) -> None:
    """Every setting replayed on every prompt, into each prompt's ``settings``; where a draft-simple
    setting is compared, the draft model passes over each prompt first and stays loaded for the branches
    the replays ask for."""
    draft = None
    if setup.draft_model is not None and any(d.needs_draft_model for d in drafters):
        draft = DraftModel(setup.draft_model, n_ctx=setup.n_ctx, threads=setup.threads)
    try:
        oracles: list[DraftOracle] | None = None
        if draft is not None:
            oracles = []
            for number, outcome in enumerate(outcomes, 1):
                oracles.append(draft.oracle(outcome.prompt_ids, outcome.plain.completion.tokens))
                say(f"draft model passed over {number}/{len(outcomes)}")
        for drafter in drafters:
            replays = replay_all(drafter, outcomes, n_predict=n_predict, n_ctx=setup.n_ctx, oracles=oracles)
            for outcome, replay in zip(outcomes, replays, strict=True):
                outcome.settings.append(SettingOutcome(drafter, replay))
    finally:
        if draft is not None:
            draft.close()
