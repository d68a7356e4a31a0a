"""Passes through the servers of an analysis in llama-server, which calibration and validation both make: one
pass of a prompt (the plain server, each setting's server, the plain server again, :func:`run_pass`) and the
replay of what each setting's server did with its history (:class:`ServerHistory`, :func:`served_replay`).

A queued analysis keeps its passes as it makes them (:class:`PassLog`), so that a resumed attempt on the same
machine takes the passes the earlier one finished instead of running them again and goes on from the first it
did not: the earlier passes are replayed through their own history (the earlier attempt's servers), the new
ones through the new servers' history, which starts empty as those servers do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from analyzer.analysis.server_generation import timed_complete
from analyzer.analysis.server_outcomes import (
    Generated,
    PromptOutcome,
    ServerPrompt,
    SettingOutcome,
    TimedCompletion,
    Trial,
)
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


@dataclass(frozen=True)
class PassRuns:
    """One pass of one prompt as the servers ran it: the plain server, each setting's server in order, the
    plain server again."""

    plain: TimedCompletion
    measured: list[TimedCompletion]
    plain_after: TimedCompletion


@dataclass(frozen=True)
class Attempt:
    """What an earlier attempt of a queued analysis made, kept instead of made again (``generated``: plain
    generations by prompt key; ``passes``: the calibration and validation passes it finished, by
    :func:`pass_key`), and whom to tell what this attempt makes: ``on_generated`` each new plain generation,
    ``on_pass`` every pass in order with whether it ran anew."""

    generated: Generated = field(default_factory=dict)
    passes: Mapping[str, PassRuns] = field(default_factory=dict)
    on_generated: Callable[[ServerPrompt, list[int], TimedCompletion], None] | None = None
    on_pass: Callable[[str, PassRuns, bool], None] | None = None


def pass_key(stage: str, number: int, outcome: PromptOutcome) -> str:
    """A pass's name in a :class:`PassLog`: ``calibration 1 <prompt key>``, ``validation 2 <prompt key>``."""
    return f"{stage} {number} {outcome.prompt.key}"


class PassLog:
    """The passes an earlier attempt made (``kept``, by :func:`pass_key`), taken instead of running them again
    while they are the ones asked for in order, and ``on_pass``, told every pass in order with whether it ran
    anew (a queued analysis stores the new ones). Once one pass is run anew the rest of ``kept`` is dropped: a
    resume goes on from the first pass the earlier attempt did not finish, never back to a later one."""

    def __init__(
        self,
        history: ServerHistory,
        kept: Mapping[str, PassRuns] | None = None,
        on_pass: Callable[[str, PassRuns, bool], None] | None = None,
    ):
        self.kept, self.on_pass = dict(kept or {}), on_pass
        self.earlier = ServerHistory(history.n_predict, history.n_ctx)  # the earlier attempt's servers
        self.taken = 0
        self.order: list[str] = []  # every pass's key in the order the servers got it

    def run(
        self,
        servers: Sequence[Server],
        outcome: PromptOutcome,
        history: ServerHistory,
        stage: str,
        number: int,
    ) -> bool:
        """One pass of ``outcome`` (:func:`run_pass`); True where it was the earlier attempt's, kept."""
        key = pass_key(stage, number, outcome)
        self.order.append(key)
        runs = self.kept.pop(key, None)
        new = runs is None
        if runs is None:
            self.kept.clear()
            runs = run_pass(servers, outcome, history)
        else:
            _add_pass(outcome, runs, self.earlier)
            self.taken += 1
        if self.on_pass is not None:
            self.on_pass(key, runs, new)
        return not new


def run_pass(servers: Sequence[Server], outcome: PromptOutcome, history: ServerHistory) -> PassRuns:
    """One pass of a prompt: the plain server, each setting's server, the plain server again; each setting
    gets a :class:`Trial` bracketed by the two plain runs (with the replay of its server's history where
    that matters), and the prompt the plain pair."""
    n_predict = history.n_predict
    plain = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    measured = [timed_complete(server, outcome.prompt_ids, n_predict) for server in servers[1:]]
    plain_after = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    runs = PassRuns(plain, measured, plain_after)
    _add_pass(outcome, runs, history)
    return runs


def _add_pass(outcome: PromptOutcome, runs: PassRuns, history: ServerHistory) -> None:
    for index, (setting, run) in enumerate(zip(outcome.settings, runs.measured, strict=True)):
        setting.trials.append(
            Trial(runs.plain, run, runs.plain_after, history.replay(index, setting, outcome, run.completion))
        )
        setting.calibration = outcome.calibration
    outcome.plain_pairs.append((runs.plain, runs.plain_after))
