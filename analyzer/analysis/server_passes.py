"""Passes through the servers of an analysis in llama-server, which calibration and validation both make: one
pass of a prompt (the plain server, each setting's server, the plain server again, :func:`run_pass`), the replay
of what each setting's server did with its history (:class:`ServerHistory`, :func:`served_replay`), and
validation's passes over the held-out prompts (:func:`validate_held_out`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from analyzer.analysis.server_generation import timed_complete
from analyzer.analysis.server_outcomes import Progress, PromptOutcome, SettingOutcome, Trial
from analyzer.engine.llama_server_process import Completion, Server
from analyzer.measuring.server_drafting import (
    DRAFT_SIMPLE,
    NGRAM_MOD,
    NgramModTable,
    ServerDrafter,
    ServerReplay,
    replay_request,
)


@dataclass
class ServerHistory:
    """What each setting's server did, replayed: its drafting rule on the server's own output wherever that
    left plain greedy, and, for the drafters whose state carries from request to request (ngram-mod's table),
    a table per setting fed every request in the order the server gets it (a repeated prompt finds its own
    earlier output in the table)."""

    n_predict: int
    n_ctx: int
    tables: dict[int, NgramModTable] = field(default_factory=dict)

    def replay(
        self, index: int, setting: SettingOutcome, outcome: PromptOutcome, served: Completion
    ) -> ServerReplay | None:
        """The replay of this request on setting ``index``'s server, given the output it ``served`` and its
        history (None: the setting's own replay is what the server did, or a draft model's run left plain
        greedy and cannot be replayed: the draft model's view was taken of plain output only)."""
        drafter = setting.drafter
        table = (
            self.tables.setdefault(index, NgramModTable(drafter.n_match))
            if drafter.kind == NGRAM_MOD
            else None
        )
        if table is None and served.tokens == outcome.plain.completion.tokens:
            return None
        return served_replay(drafter, outcome.prompt_ids, served, self.n_predict, self.n_ctx, table)


def served_replay(
    drafter: ServerDrafter,
    prompt_ids: Sequence[int],
    served: Completion,
    n_predict: int,
    n_ctx: int,
    table: NgramModTable | None = None,
) -> ServerReplay | None:
    """``drafter``'s rule replayed on the output a server ``served`` (None for a draft model: its view of any
    output but plain greedy's was not taken). A model-free server's draft counts equal this replay even
    where its output left plain greedy (llama-server's batched verification can flip an argmax over long
    contexts: 45 such runs of 45 on 1,588-2,513-token prompts, a 2-core Xeon), so its time is priced from the
    work it did, not the work plain greedy output would have made it do."""
    if drafter.kind == DRAFT_SIMPLE:
        return None
    tokens = served.tokens
    return replay_request(
        drafter,
        prompt_ids,
        tokens,
        n_predict=n_predict,
        n_ctx=n_ctx,
        eog_ids=frozenset(tokens[-1:]) if served.stopped_at_eos else frozenset(),
        table=table,
    )


def run_pass(servers: Sequence[Server], outcome: PromptOutcome, history: ServerHistory) -> None:
    """One pass of a prompt: the plain server, each setting's server, the plain server again; each setting
    gets a :class:`Trial` bracketed by the two plain runs (with the replay of its server's history where
    that matters), and the prompt the plain pair."""
    n_predict = history.n_predict
    plain = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    measured = [timed_complete(server, outcome.prompt_ids, n_predict) for server in servers[1:]]
    plain_after = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    for index, (setting, run) in enumerate(zip(outcome.settings, measured, strict=True)):
        setting.trials.append(
            Trial(plain, run, plain_after, history.replay(index, setting, outcome, run.completion))
        )
        setting.calibration = outcome.calibration
    outcome.plain_pairs.append((plain, plain_after))


def validate_held_out(
    servers: Sequence[Server],
    outcomes: Sequence[PromptOutcome],
    history: ServerHistory,
    repeats: int,
    say: Progress,
) -> None:
    """``repeats`` passes over the held-out prompts, interleaved (every prompt once per pass)."""
    for repeat in range(1, repeats + 1):
        for number, outcome in enumerate(outcomes, 1):
            run_pass(servers, outcome, history)
            of = f", pass {repeat}/{repeats}" if repeats > 1 else ""
            say(f"validated {number}/{len(outcomes)} ({outcome.prompt.key}){of}")
