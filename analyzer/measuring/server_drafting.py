"""llama-server's own drafting rules, replayed exactly on one greedy generation: how many tokens the server
drafts and accepts in each round for a drafter (``ngram-simple``, ``ngram-mod``, ``draft-simple``) and its
knobs.

The rules are those of llama.cpp's ``common/speculative.cpp``, ``common/ngram-map.cpp`` and
``common/ngram-mod.cpp`` (the llama.cpp that the pinned llama-cpp-python sdist vendors) and of the server's
loop in ``tools/server/server-context.cpp``:

- after the prompt's pass the first output token is sampled with nothing drafted;
- before each later step the drafter sees the tokens in the slot (prompt and output so far, without the
  last sampled token) and that token (``id_last``); its draft is cut to the slot's room,
  ``min(n_ctx - n_tokens - 2, n_predict - generated - 1)``; an empty draft makes the step a plain one;
- the target accepts the draft's longest prefix equal to its greedy output, and stops at an
  end-of-generation token unless that token is the draft's last; the round then adds the accepted tokens
  and the target's own next token.

``ngram-simple`` looks the last ``size_n`` tokens up in the history (the newest earlier occurrence, never
position 0) and drafts the up to ``size_m`` tokens after it; it drafts nothing when fewer than ``size_n``
tokens follow the match or when the history holds at most ``size_n + size_m + 1`` tokens. It keeps no
state. ``ngram-mod`` hashes ``n_match`` tokens into a table of 4 Mi entries (no key check, so a collision
drafts the colliding entry's token) and drafts by chained lookups, ``n_min`` to ``n_max`` tokens or nothing.
Its table **persists across requests** in one server: the prompt's n-grams are added at each request's
start, the history's in chunks of more than 32 tokens, and the table is cleared when over a quarter full or
after five rounds in a row accept under a quarter of the (uncut) draft. The replay keeps that state in a
:class:`NgramModTable` the caller carries from request to request in the server's order: a fresh table is a
freshly started server.

``draft-simple`` drafts with a draft model, greedily, up to ``n_max`` tokens (and the slot's room), and stops
before a token whose probability is under ``p_min``; a draft shorter than ``n_min`` is dropped. The
probability is the draft sampler's: a softmax over the draft's 10 most likely tokens (top-k 10). The replay
asks a :class:`DraftOracle` for the draft's most likely token and that probability after each prefix of the
request's sequence (one teacher-forced pass of the draft), and, **after a drafted token that differs from
the target's output**, after that prefix followed by the draft's own tokens (a pass on the draft's branch):
the server goes on drafting there while the draft stays confident, and those tokens count in ``draft_n``
though none can be accepted. With ``p_min`` 0 no branch is needed (the draft always runs to ``n_max``).
``ngram-map-k``, ``ngram-map-k4v`` and ``ngram-cache`` are not replayed (their statistics of key hits and
their cache files are out of scope), nor the other draft-model types (EAGLE-3, MTP and the like).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from analyzer.measuring.request_work import RequestWork, round_rows_context

NGRAM_SIMPLE, NGRAM_MOD, DRAFT_SIMPLE = "ngram-simple", "ngram-mod", "draft-simple"
DRAFTER_TYPES = (NGRAM_SIMPLE, NGRAM_MOD, DRAFT_SIMPLE)
DRAFT_TOP_K = 10  # draft-simple's sampler keeps the draft's 10 most likely tokens
MOD_TABLE_SIZE = 4 * 1024 * 1024  # entries of ngram-mod's table (common_speculative_impl_ngram_mod)
_HASH_MULTIPLIER = 6364136223846793005
_MASK64 = (1 << 64) - 1
_MOD_CHUNK = 32  # ngram-mod adds the history's n-grams once more than this many are new
_MOD_OCCUPANCY_LIMIT = 0.25
_MOD_LOW_ACCEPT, _MOD_LOW_STREAK = 0.25, 5


@dataclass(frozen=True)
class ServerDrafter:
    """One drafter of llama-server with its knobs: ``ngram-simple`` uses ``size_n`` (lookup) and
    ``size_m`` (draft); ``ngram-mod`` uses ``n_match``, ``n_min`` and ``n_max``; ``draft-simple`` uses
    ``draft_n_max``, ``draft_n_min`` and ``p_min``. Defaults are the server's."""

    kind: str
    size_n: int = 12
    size_m: int = 48
    n_match: int = 24
    n_min: int = 48
    n_max: int = 64
    draft_n_max: int = 3
    draft_n_min: int = 0
    p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_TYPES:
            raise ValueError(f"drafter {self.kind!r} is not replayed; use one of {', '.join(DRAFTER_TYPES)}")
        if self.kind == NGRAM_SIMPLE and not (1 <= self.size_n and 1 <= self.size_m):
            raise ValueError("ngram-simple needs size_n >= 1 and size_m >= 1")
        if self.kind == NGRAM_MOD and not (
            1 <= self.n_match and 0 <= self.n_min <= self.n_max and 1 <= self.n_max
        ):
            raise ValueError("ngram-mod needs n_match >= 1 and 0 <= n_min <= n_max, n_max >= 1")
        if self.kind == DRAFT_SIMPLE and not (
            0 <= self.draft_n_min <= self.draft_n_max and 1 <= self.draft_n_max and 0.0 <= self.p_min <= 1.0
        ):
            raise ValueError("draft-simple needs 0 <= n_min <= n_max, n_max >= 1 and 0 <= p_min <= 1")

    @property
    def label(self) -> str:
        """The setting in a line: ``ngram-simple 12/48``, ``ngram-mod 24 48-64`` or ``draft-simple 0-3 p0.75``
        (n_min-n_max, then p_min)."""
        if self.kind == NGRAM_SIMPLE:
            return f"{NGRAM_SIMPLE} {self.size_n}/{self.size_m}"
        if self.kind == DRAFT_SIMPLE:
            return f"{DRAFT_SIMPLE} {self.draft_n_min}-{self.draft_n_max} p{self.p_min:g}"
        return f"{NGRAM_MOD} {self.n_match} {self.n_min}-{self.n_max}"

    @property
    def max_draft(self) -> int:
        """The most tokens one round drafts: ngram-simple's size_m, ngram-mod's n_max, draft-simple's n_max."""
        if self.kind == NGRAM_SIMPLE:
            return self.size_m
        return self.draft_n_max if self.kind == DRAFT_SIMPLE else self.n_max

    @property
    def needs_draft_model(self) -> bool:
        return self.kind == DRAFT_SIMPLE

    @property
    def family(self) -> str:
        """Which step costs price it: "draft model" (the draft decodes beside the target) or "n-gram"."""
        return "draft model" if self.needs_draft_model else "n-gram"

    def server_flags(self) -> list[str]:
        """The llama-server command-line flags that select this drafter and its knobs (draft-simple also
        needs the draft model, ``-md FILE``)."""
        if self.kind == DRAFT_SIMPLE:
            return [
                "--spec-type", DRAFT_SIMPLE,
                "--spec-draft-n-max", str(self.draft_n_max),
                "--spec-draft-n-min", str(self.draft_n_min),
                "--spec-draft-p-min", f"{self.p_min:g}",
            ]  # fmt: skip
        if self.kind == NGRAM_SIMPLE:
            return [
                "--spec-type", NGRAM_SIMPLE,
                "--spec-ngram-simple-size-n", str(self.size_n),
                "--spec-ngram-simple-size-m", str(self.size_m),
            ]  # fmt: skip
        return [
            "--spec-type", NGRAM_MOD,
            "--spec-ngram-mod-n-match", str(self.n_match),
            "--spec-ngram-mod-n-min", str(self.n_min),
            "--spec-ngram-mod-n-max", str(self.n_max),
        ]  # fmt: skip


_FORMS = {
    NGRAM_SIMPLE: "'ngram-simple N/M'",
    NGRAM_MOD: "'ngram-mod MATCH MIN-MAX'",
    DRAFT_SIMPLE: "'draft-simple MIN-MAX pP' (e.g. 'draft-simple 0-3 p0.75')",
}


def parse_drafter(text: str) -> ServerDrafter:
    """A drafter from its label: ``ngram-simple`` (defaults), ``ngram-simple N/M``, ``ngram-mod``,
    ``ngram-mod MATCH MIN-MAX``, ``draft-simple`` or ``draft-simple MIN-MAX pP``. Raises ValueError naming
    what is wrong."""
    parts = text.split()
    if not parts or parts[0] not in DRAFTER_TYPES:
        raise ValueError(f"drafter {text!r}: start with one of {', '.join(DRAFTER_TYPES)}")
    kind, knobs = parts[0], parts[1:]
    if not knobs:
        return ServerDrafter(kind)
    try:
        if kind == NGRAM_SIMPLE and len(knobs) == 1:
            size_n, size_m = (int(v) for v in knobs[0].split("/"))
            return ServerDrafter(kind, size_n=size_n, size_m=size_m)
        if kind == NGRAM_MOD and len(knobs) == 2:
            n_min, n_max = (int(v) for v in knobs[1].split("-"))
            return ServerDrafter(kind, n_match=int(knobs[0]), n_min=n_min, n_max=n_max)
        if kind == DRAFT_SIMPLE and len(knobs) == 2 and knobs[1].startswith("p"):
            n_min, n_max = (int(v) for v in knobs[0].split("-"))
            return ServerDrafter(kind, draft_n_min=n_min, draft_n_max=n_max, p_min=float(knobs[1][1:]))
    except ValueError as exc:
        reason = str(exc) if "needs" in str(exc) else "the sizes must be whole numbers (p_min a number)"
        raise ValueError(f"drafter {text!r}: {reason}; write {_FORMS[kind]}") from None
    raise ValueError(f"drafter {text!r}: write {_FORMS[kind]}")


@dataclass
class NgramModTable:
    """ngram-mod's hash table as one server holds it across requests (only the filled entries), with the
    per-request bookkeeping of the one slot."""

    n_match: int
    entries: dict[int, int] = field(default_factory=dict)
    i_last: int = 0
    n_draft_last: int = 0
    n_low: int = 0

    def index(self, tokens: Sequence[int], start: int) -> int:
        res = 0
        for token in tokens[start : start + self.n_match]:
            res = (res * _HASH_MULTIPLIER + token) & _MASK64
        return res % MOD_TABLE_SIZE

    def add(self, tokens: Sequence[int], start: int) -> None:
        self.entries[self.index(tokens, start)] = tokens[start + self.n_match]

    def reset(self) -> None:
        self.entries.clear()


def ngram_simple_draft(drafter: ServerDrafter, history: Sequence[int], id_last: int) -> list[int]:
    """``common_ngram_simple_draft``: the draft after the newest earlier occurrence of the last
    ``size_n`` tokens of ``history + [id_last]``."""
    n, m, cur_len = drafter.size_n, drafter.size_m, len(history)
    if cur_len <= n + m + 1:
        return []
    pattern = list(history[cur_len - n + 1 :]) + [id_last]
    match_pos = 0
    first = pattern[0]
    for j in range(cur_len - n - 1, 0, -1):
        if history[j] == first and list(history[j : j + n]) == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return list(history[match_pos + n : match_pos + n + copy_max])


def ngram_mod_begin(table: NgramModTable, prompt: Sequence[int]) -> None:
    """ngram-mod's ``begin``: the prompt's n-grams into the table at a request's start."""
    table.i_last = table.n_draft_last = 0
    n = table.n_match
    if len(prompt) < n:
        return
    for i in range(len(prompt) - n):
        table.add(prompt, i)
    table.i_last = len(prompt) - n
    if len(table.entries) / MOD_TABLE_SIZE > _MOD_OCCUPANCY_LIMIT:
        table.reset()


def ngram_mod_draft(
    drafter: ServerDrafter, table: NgramModTable, history: Sequence[int], id_last: int
) -> list[int]:
    """ngram-mod's ``draft_one``: chained lookups from the last ``n_match`` tokens; ``n_min`` to
    ``n_max`` tokens, or none when a lookup misses before ``n_min``."""
    table.n_draft_last = 0
    n, cur_len = table.n_match, len(history)
    if cur_len < n:
        return []
    if table.i_last + _MOD_CHUNK < cur_len:
        for i in range(table.i_last, cur_len - n):
            table.add(history, i)
        table.i_last = cur_len - n
    window = list(history[cur_len - n + 1 :]) + [id_last]
    for i in range(drafter.n_max):
        token = table.entries.get(table.index(window, i))
        if token is None:
            if i < drafter.n_min:
                return []
            break
        window.append(token)
    draft = window[n:]
    table.n_draft_last = len(draft)
    return draft


def ngram_mod_accept(table: NgramModTable, n_accepted: int) -> None:
    """ngram-mod's ``accept``: five rounds in a row under a quarter accepted clear the table."""
    if table.n_draft_last <= 0:
        return
    if n_accepted / table.n_draft_last < _MOD_LOW_ACCEPT:
        table.n_low += 1
        if table.n_low >= _MOD_LOW_STREAK:
            table.reset()
            table.n_low = 0
            table.i_last = 0
    else:
        table.n_low = 0


class DraftOracle(Protocol):
    """What draft-simple's replay asks of the draft model for one request, whose sequence is its prompt
    followed by its greedy output."""

    def top(self, position: int) -> tuple[int, float]:
        """The draft's most likely token after the sequence's first ``position`` tokens, and its
        probability among the draft's 10 most likely (``len(prompt) <= position <= len(sequence)``)."""
        ...

    def branch_top(self, position: int, tokens: Sequence[int]) -> tuple[int, float]:
        """The same after the sequence's first ``position`` tokens followed by ``tokens``, the draft's own
        tokens after it left the sequence."""
        ...


def draft_simple_draft(
    drafter: ServerDrafter, oracle: DraftOracle, sequence: Sequence[int], start: int, room: int
) -> list[int]:
    """draft-simple's draft after the sequence's first ``start`` tokens (the slot's tokens and the last
    sampled one): greedy, up to ``min(n_max, room)`` tokens, stopping before one under ``p_min`` (the
    caller drops a draft shorter than ``n_min``). Once a drafted token differs from the sequence (or runs
    past its end) the draft continues on its own tokens (:meth:`DraftOracle.branch_top`)."""
    draft: list[int] = []
    branch_at = -1  # where the draft left the sequence
    for i in range(min(drafter.draft_n_max, room)):
        position = start + i
        if branch_at < 0:
            token, p = oracle.top(position)
        else:
            token, p = oracle.branch_top(branch_at, draft[branch_at - start :])
        if p < drafter.p_min:
            break
        if branch_at < 0 and (position >= len(sequence) or token != sequence[position]):
            branch_at = position
        draft.append(token)
    return draft


def draft_decodes(drafter: ServerDrafter, drafted: int, room: int) -> int:
    """The draft model's decodes behind one call of draft-simple that drafted ``drafted`` tokens (before
    the n_min drop): one for the last sampled token, then one per drafted token except a last one that
    reached ``min(n_max, room)`` (the loop stops before decoding it)."""
    return 1 + drafted - (1 if drafted == min(drafter.draft_n_max, room) else 0)


@dataclass(frozen=True)
class ServerReplay:
    """What llama-server does with one request under one drafter: ``rounds`` holds (drafted, accepted)
    per verification round; ``plain_steps`` the steps after the first token with nothing drafted;
    ``draft_n`` and ``draft_n_accepted`` are the server's own ``timings`` fields; ``draft_decodes``
    counts the draft model's decodes in its draft loops (draft-simple). ``prompt_tokens`` is the prompt's
    length; ``plain_context`` sums the tokens each plain step attends over, ``round_context`` the same for
    each round's first row and ``row_context`` for its other rows (:mod:`analyzer.pricing.context_cost`)."""

    output_tokens: int
    plain_steps: int
    rounds: tuple[tuple[int, int], ...]
    draft_decodes: int = 0  # the draft model's decodes (draft-simple), for its cost
    prompt_tokens: int = 0
    plain_context: int = 0
    round_context: int = 0
    row_context: int = 0

    @property
    def draft_n(self) -> int:
        return sum(k for k, _ in self.rounds)

    def work(self) -> RequestWork:
        """The request's counts for the cost model."""
        return RequestWork(
            self.plain_steps,
            self.plain_context,
            len(self.rounds),
            self.draft_n,
            self.draft_n_accepted,
            self.round_context,
            self.draft_decodes,
            self.row_context,
        )

    @property
    def draft_n_accepted(self) -> int:
        return sum(a for _, a in self.rounds)


def _accepted(draft: Sequence[int], output: Sequence[int], g: int, eog_ids: frozenset[int]) -> int:
    """How many of ``draft`` the target accepts at output position ``g``
    (``common_sampler_sample_and_accept_n`` under greedy sampling)."""
    for i, token in enumerate(draft):
        if g + i >= len(output) or token != output[g + i]:
            return i
        if token in eog_ids and i + 1 < len(draft):
            return i
    return len(draft)


def replay_request(
    drafter: ServerDrafter,
    prompt: Sequence[int],
    output: Sequence[int],
    *,
    n_predict: int,
    n_ctx: int,
    eog_ids: frozenset[int],
    table: NgramModTable | None = None,
    oracle: DraftOracle | None = None,
) -> ServerReplay:
    """Replay llama-server's speculative loop for one request whose greedy output is ``output`` (as the
    plain server returned it, ``n_predict`` at most, an end-of-generation token last where it stopped on
    one). ``table`` is ngram-mod's state carried from the server's earlier requests (None: a fresh
    server); it is updated in place. ``oracle`` is the draft model's view of this request (draft-simple
    only)."""
    if drafter.kind == DRAFT_SIMPLE and oracle is None:
        raise ValueError("draft-simple is replayed with the draft model's oracle")
    if drafter.kind == NGRAM_MOD:
        table = table if table is not None else NgramModTable(drafter.n_match)
        ngram_mod_begin(table, prompt)
    rounds: list[tuple[int, int]] = []
    plain_steps, g, decodes = 0, 1, 0
    plain_context = round_context = row_context = 0  # the row decoding output g - 1 sees P + g tokens
    done = not output or output[0] in eog_ids or 1 >= n_predict
    while not done and g < len(output):
        room = min(n_ctx - (len(prompt) + g - 1) - 2, n_predict - g - 1)
        draft, draft_decodes_here = _draft_at(drafter, prompt, output, g, room, table, oracle)
        decodes += draft_decodes_here
        if not draft:
            plain_steps += 1
            plain_context += len(prompt) + g
            new = list(output[g : g + 1])
        else:
            accepted = _accepted(draft, output, g, eog_ids)
            rounds.append((len(draft), accepted))
            round_context += len(prompt) + g
            row_context += round_rows_context(len(prompt) + g, len(draft))
            if table is not None:
                ngram_mod_accept(table, accepted)
            new = list(output[g : g + accepted + 1])
        for token in new:
            g += 1
            if token in eog_ids or g >= n_predict:
                done = True
                break
    return ServerReplay(
        min(g, len(output)), plain_steps, tuple(rounds), decodes, len(prompt), plain_context, round_context,
        row_context,
    )  # fmt: skip


def _draft_at(
    drafter: ServerDrafter,
    prompt: Sequence[int],
    output: Sequence[int],
    g: int,
    room: int,
    table: NgramModTable | None,
    oracle: DraftOracle | None,
) -> tuple[list[int], int]:
    """The draft ``drafter`` makes after the prompt and the first ``g`` output tokens (the last of them the one
    just sampled), at most ``room`` tokens (none where there is no room), and the draft model's decodes it
    cost (draft-simple; 0 for the n-gram settings)."""
    if room <= 0:
        return [], 0
    history = list(prompt) + list(output[: g - 1])
    decodes = 0
    if drafter.kind == NGRAM_SIMPLE:
        draft = ngram_simple_draft(drafter, history, output[g - 1])
    elif oracle is not None:
        sequence = list(prompt) + list(output)
        draft = draft_simple_draft(drafter, oracle, sequence, len(prompt) + g, room)
        decodes = draft_decodes(drafter, len(draft), room)
        draft = draft if len(draft) >= drafter.draft_n_min else []
    else:
        assert table is not None
        draft = ngram_mod_draft(drafter, table, history, output[g - 1])
    return draft[:room], decodes
