"""llama-server's drafting rules replayed (analyzer/measuring/server_drafting.py), checked by hand on small
token sequences: the cases the C++ code takes care of (a history too short, a match at position 0, too few
tokens after a match, the slot's room, an end-of-generation token inside a draft, ngram-mod's chained
lookups, its n_min, its hash, its table carried across requests and cleared after a low-acceptance streak).
tests/test_llama_server_engine.py checks the replay against the real server."""

from __future__ import annotations

import pytest

from analyzer.measuring.server_drafting import (
    DRAFT_SIMPLE,
    MOD_TABLE_SIZE,
    NGRAM_MOD,
    NGRAM_SIMPLE,
    NgramModTable,
    ServerDrafter,
    ngram_mod_accept,
    ngram_mod_draft,
    ngram_simple_draft,
    parse_drafter,
    replay_request,
)

SIMPLE_2_3 = ServerDrafter(NGRAM_SIMPLE, size_n=2, size_m=3)


def test_ngram_simple_drafts_what_followed_the_newest_earlier_match():
    history = [9, 1, 2, 3, 4, 5, 1, 2, 7, 8, 6, 1]
    # pattern [1, 2] (last history token + id_last): newest earlier match at 6 -> after it 7, 8, 6
    assert ngram_simple_draft(SIMPLE_2_3, history, 2) == [7, 8, 6]
    # a history of at most n + m + 1 tokens drafts nothing
    assert ngram_simple_draft(SIMPLE_2_3, history[:6], 2) == []
    # a match at position 0 does not count
    assert ngram_simple_draft(SIMPLE_2_3, [1, 2, 3, 4, 5, 6, 7, 1], 2) == []
    # fewer than n tokens after the match: nothing (copy_max < size_n)
    assert ngram_simple_draft(SIMPLE_2_3, [0, 0, 0, 0, 0, 9, 1, 2, 5, 1], 2) == [5, 1]
    assert ngram_simple_draft(SIMPLE_2_3, [0, 0, 0, 0, 0, 0, 9, 1, 2, 1], 2) == []


def test_replay_counts_rounds_room_and_the_end_of_generation_token():
    prompt = [9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4]
    output = [5, 6, 7, 8, 3]
    replay = replay_request(SIMPLE_2_3, prompt, output, n_predict=64, n_ctx=4096, eog_ids=frozenset())
    # step 1: history ends 3, 4 + id_last 5 -> pattern [4, 5] at 4 -> draft [6, 7, 1]; accepts 6, 7 then 8
    # step 2: id_last 8, pattern [7, 8] never seen -> plain step to 3
    assert replay.rounds == ((3, 2),) and replay.plain_steps == 1 and replay.output_tokens == 5
    assert (replay.draft_n, replay.draft_n_accepted) == (3, 2)
    # the slot's room: n_predict - generated - 1 cuts the draft
    short = replay_request(SIMPLE_2_3, prompt, output[:3], n_predict=3, n_ctx=4096, eog_ids=frozenset())
    assert short.rounds == ((1, 1),) and short.output_tokens == 3
    # an end-of-generation token matched inside a draft is not counted as accepted, and ends the request
    eog = replay_request(SIMPLE_2_3, prompt, [5, 6, 7], n_predict=64, n_ctx=4096, eog_ids=frozenset({7}))
    assert eog.rounds == ((3, 1),) and eog.output_tokens == 3
    # the context's room: n_ctx - n_tokens - 2 <= 0 drafts nothing
    full = replay_request(
        SIMPLE_2_3, prompt, output, n_predict=64, n_ctx=len(prompt) + 2, eog_ids=frozenset()
    )
    assert full.rounds == () and full.plain_steps == 4


def test_ngram_mod_hash_chained_lookups_and_n_min():
    table = NgramModTable(2)
    # the C++ hash: res = res * 6364136223846793005 + token over n tokens (64-bit), modulo the table size
    expected = ((3 * 6364136223846793005 + 4) & (2**64 - 1)) % MOD_TABLE_SIZE
    assert table.index([3, 4], 0) == expected
    drafter = ServerDrafter(NGRAM_MOD, n_match=2, n_min=2, n_max=3)
    history = [1, 2, 3, 4, 5, 6, 7] + [0] * 30 + [2]  # long enough for the history to be added in a chunk
    assert ngram_mod_draft(drafter, table, history, 3) == [4, 5, 6]
    assert table.n_draft_last == 3
    # one hit is below n_min = 2: nothing is drafted
    assert ngram_mod_draft(ServerDrafter(NGRAM_MOD, n_match=2, n_min=2, n_max=3), table, [6], 7) == []


def test_ngram_mod_table_is_carried_and_cleared_after_five_poor_rounds():
    drafter = ServerDrafter(NGRAM_MOD, n_match=2, n_min=1, n_max=2)
    table = NgramModTable(2)
    first = replay_request(drafter, [5, 6, 7], [1], n_predict=8, n_ctx=64, eog_ids=frozenset())
    assert first.rounds == ()
    # a fresh server knows nothing of [5, 6]; the carried table does, from the first request's prompt
    replay_request(drafter, [5, 6, 7], [1], n_predict=8, n_ctx=64, eog_ids=frozenset(), table=table)
    fresh = replay_request(drafter, [8, 5], [6, 7, 9], n_predict=8, n_ctx=64, eog_ids=frozenset())
    carried = replay_request(
        drafter, [8, 5], [6, 7, 9], n_predict=8, n_ctx=64, eog_ids=frozenset(), table=table
    )
    assert fresh.rounds == () and carried.rounds == ((1, 1),)
    table.n_draft_last = 4
    for _ in range(4):
        ngram_mod_accept(table, 0)
    assert table.entries and table.n_low == 4
    ngram_mod_accept(table, 0)
    assert not table.entries and table.n_low == 0


def test_drafter_labels_parse_back_and_name_the_server_flags():
    for text in (
        "ngram-simple",
        "ngram-simple 3/8",
        "ngram-mod",
        "ngram-mod 16 4-32",
        "draft-simple",
        "draft-simple 1-8 p0.75",
    ):
        drafter = parse_drafter(text)
        assert parse_drafter(drafter.label) == drafter
    assert parse_drafter("ngram-simple 3/8").server_flags() == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8",
    ]  # fmt: skip
    assert parse_drafter("ngram-mod").label == "ngram-mod 24 48-64"
    assert parse_drafter("draft-simple").label == "draft-simple 0-3 p0"
    assert parse_drafter("draft-simple 1-8 p0.75").server_flags() == [
        "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "--spec-draft-n-min", "1",
        "--spec-draft-p-min", "0.75",
    ]  # fmt: skip
    for wrong, message in (
        ("ngram-cache", "start with one of"),
        ("ngram-simple 3", "write 'ngram-simple N/M'"),
        ("ngram-simple a/b", "whole numbers .*; write 'ngram-simple N/M'"),
        ("draft-simple 0-3 0.75", "write 'draft-simple MIN-MAX pP'"),
        ("draft-simple 0-3 p1.5", "0 <= p_min <= 1"),
        ("ngram-simple 3/8/2", "whole numbers"),
        ("ngram-mod 16 40-8", "n_min <= n_max"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_drafter(wrong)


class TableOracle:
    """A draft model given as tables: its (token, probability) after each prefix length of the
    sequence, and after a prefix followed by its own branch tokens; records what was asked."""

    def __init__(self, tops, branches):
        self.tops, self.branches, self.asked = tops, branches, []

    def top(self, position):
        self.asked.append(position)
        return self.tops[position]

    def branch_top(self, position, tokens):
        self.asked.append((position, tuple(tokens)))
        return self.branches[(position, tuple(tokens))]


def test_draft_simple_stops_under_p_min_keeps_drafting_on_its_own_branch_and_drops_short_drafts():
    prompt, output = [1, 2], [10, 11, 12, 13, 14]
    # after the prefix of length 3 (prompt + 10) the draft proposes 11 (right), then 99 (wrong) ...
    tops = {2: (10, 0.9), 3: (11, 0.95), 4: (99, 0.8), 5: (13, 0.9), 6: (14, 0.3), 7: (0, 0.5)}
    branches = {(4, (99,)): (98, 0.85), (4, (99, 98)): (97, 0.2)}
    sure = ServerDrafter(DRAFT_SIMPLE, draft_n_max=4, p_min=0.75)
    oracle = TableOracle(tops, branches)
    replay = replay_request(
        sure, prompt, output, n_predict=64, n_ctx=4096, eog_ids=frozenset(), oracle=oracle
    )
    # round 1 at prefix 3: 11 (0.95), 99 (0.8, wrong: the branch begins), 98 (0.85 on the branch), then 0.2 < 0.75
    # stops: 3 drafted, 1 accepted (11); the target adds 12. Round 2 at prefix 5: 13 (0.9), 14 (0.3) stops: 1
    # drafted, accepted; the target adds 14 and the output is done.
    assert replay.rounds == ((3, 1), (1, 1)) and replay.plain_steps == 0 and replay.output_tokens == 5
    assert (4, (99,)) in oracle.asked and (4, (99, 98)) in oracle.asked
    # the draft's decodes: one for the last sampled token, one per drafted token unless the loop stopped at
    # n_max: round 1 stopped under p_min after 3 (4 decodes), round 2 after 1 (2 decodes)
    assert replay.draft_decodes == 6
    # p_min 0: always n_max (or the room), and no branch is ever needed
    greedy = TableOracle(tops, {})
    every = ServerDrafter(DRAFT_SIMPLE, draft_n_max=2)
    plain = replay_request(
        every, prompt, output, n_predict=64, n_ctx=4096, eog_ids=frozenset(), oracle=greedy
    )
    assert plain.rounds == ((2, 1), (2, 2)) and not any(isinstance(a, tuple) for a in greedy.asked)
    assert plain.draft_decodes == 4  # each round reached n_max = 2: its last token was never decoded
    # n_min: a draft shorter than it is dropped and the step is plain
    strict = ServerDrafter(DRAFT_SIMPLE, draft_n_min=2, draft_n_max=4, p_min=0.75)
    dropped = replay_request(
        strict,
        prompt,
        output,
        n_predict=64,
        n_ctx=4096,
        eog_ids=frozenset(),
        oracle=TableOracle(tops, branches),
    )
    assert dropped.rounds == ((3, 1),) and dropped.plain_steps == 2
    assert dropped.draft_decodes == 4 + 2 + 1  # a dropped draft's decodes happened all the same
    with pytest.raises(ValueError, match="draft model's oracle"):
        replay_request(sure, prompt, output, n_predict=64, n_ctx=4096, eog_ids=frozenset())
