"""The exact walk and the derived metrics: hand-computed cases, edge cases and property tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.measuring.acceptance import (
    NgramIndex,
    acceptance_probability_overlap,
    alpha_from_matches,
    draft_acceptance_rate,
    expected_tokens_iid,
    mean_acceptance_length,
    ngram_first_token_matches,
    position_rates,
    walk_model_draft,
    walk_ngram,
)


def test_model_walk_hand_computed():
    # m = 1 1 0 1 1 1 0 0 1 1, budget 10, g = 2
    # round 1: s=0 k=2 a=2 -> s=3; round 2: s=3 k=2 a=2 -> s=6; round 3: s=6 k=2 a=0 -> s=7;
    # round 4: s=7 k=2 a=0 -> s=8; round 5: s=8 k=min(2, 10-8-1)=1 a=1 -> s=10
    counts = walk_model_draft([1, 1, 0, 1, 1, 1, 0, 0, 1, 1], 2, 10)
    assert (counts.rounds, counts.drafted, counts.accepted) == (5, 9, 5)
    assert counts.accepted_hist.tolist() == [2, 1, 2]
    assert counts.drafted_hist.tolist() == [0, 1, 4]
    assert counts.position_accepted.tolist() == [3, 2]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 16, 33])
def test_identical_draft_accepts_everything(gamma, n):
    counts = walk_model_draft([1] * n, gamma, n)
    assert counts.rounds == math.ceil(n / (gamma + 1))
    assert counts.accepted == counts.drafted == n - counts.rounds
    rate = draft_acceptance_rate(counts.accepted, counts.drafted)
    assert rate == 1.0 if counts.drafted else math.isnan(rate)  # n = 1: one round, nothing drafted
    assert alpha_from_matches([1] * n) == 1.0


def test_identical_draft_with_eos_ending_early_drafts_only_to_the_end():
    counts = walk_model_draft([1] * 5, 8, 64)  # output ended by EOS after 5 tokens, budget 64
    assert (counts.rounds, counts.drafted, counts.accepted) == (1, 5, 5)


def test_ngram_walk_hand_computed():
    prompt, output = [5, 6, 7, 8, 5, 6], [7, 8, 9, 5, 6, 7]
    # s=0: trailing (5,6) first at 0 -> propose [7,8], both accepted -> s=3
    # s=3: (8,9) and (9,) occur only at the end -> no proposal -> s=4
    # s=4: (9,5) only at the end; (5,) first at 0 -> propose [6,7], accepted -> done
    counts = walk_ngram(prompt, output, 2, 6, max_ngram=2)
    assert (counts.rounds, counts.drafted, counts.accepted) == (3, 4, 4)
    assert counts.accepted_hist.tolist() == [1, 0, 2]
    assert counts.drafted_hist.tolist() == [1, 0, 2]
    assert counts.position_accepted.tolist() == [2, 2]


def test_ngram_proposal_rules_leftmost_eos_cut_and_last_token_budget():
    index = NgramIndex([1, 2, 3, 9, 1, 2, 4, 1, 2], max_ngram=2, eos_ids={9})
    assert index.propose(9, 3) == [3]  # leftmost (1,2) at 0 -> [3, 9, 1] cut before EOS 9
    index = NgramIndex([1, 2, 9, 1, 2], max_ngram=2, eos_ids={9})
    assert index.propose(5, 3) == []  # the proposal starts with EOS: no candidates at all
    index = NgramIndex([4, 4, 4, 4], max_ngram=2)
    assert index.propose(2, 5) == [4]  # bounded by the context, not the full sequence
    # with one token of budget left nothing is proposed
    assert walk_ngram([1, 2, 3], [1, 2], 3, 2).drafted_hist.tolist() == [2, 0, 0, 0]
    assert walk_ngram([1, 2, 3], [1, 2], 3, 3).drafted_hist.tolist() == [1, 0, 0, 1]


def test_ngram_first_token_matches():
    assert ngram_first_token_matches([5, 6, 7, 8, 5, 6], [7, 8, 9, 5, 6, 7]).tolist() == [1, 1, 0, 0, 1, 1]


def test_derived_metric_edge_cases():
    assert math.isnan(alpha_from_matches([]))
    assert math.isnan(draft_acceptance_rate(0, 0))
    assert math.isnan(mean_acceptance_length(0, 0))
    assert expected_tokens_iid(1.0, 4) == 5.0
    assert expected_tokens_iid(0.0, 4) == 1.0
    assert expected_tokens_iid(0.6, 0) == 1.0
    assert expected_tokens_iid(0.5, 2) == pytest.approx(1.75)
    unconditional, conditional = position_rates(np.array([3, 2, 0]), 4)
    assert unconditional.tolist() == [0.75, 0.5, 0.0]
    assert conditional.tolist() == pytest.approx([0.75, 2 / 3, 0.0])
    unconditional, conditional = position_rates(np.array([0, 0]), 0)
    assert np.isnan(unconditional).all() and np.isnan(conditional).all()
    empty = walk_model_draft([], 4, 10)
    assert (empty.rounds, empty.drafted, empty.accepted) == (0, 0, 0)
    with pytest.raises(ValueError):
        walk_model_draft([1], 0, 1)


matches_strategy = st.lists(st.integers(0, 1), min_size=0, max_size=80)


@given(matches=matches_strategy, gamma=st.integers(1, 16), slack=st.integers(0, 20))
@settings(max_examples=300, deadline=None)
def test_model_walk_identities(matches, gamma, slack):
    n = len(matches)
    counts = walk_model_draft(matches, gamma, n + slack)
    hist = counts.accepted_hist
    assert hist.sum() == counts.rounds == counts.drafted_hist.sum()
    assert counts.accepted == (hist * np.arange(gamma + 1)).sum() <= counts.drafted
    # position j is accepted in every round that accepted more than j drafts
    assert counts.position_accepted.tolist() == [int(hist[j + 1 :].sum()) for j in range(gamma)]
    assert counts.rounds >= math.ceil(n / (gamma + 1))
    if slack == 0:  # budget-limited output: every emitted token is accounted exactly
        assert counts.accepted + counts.rounds == n
    if n:
        al = mean_acceptance_length(counts.accepted, counts.rounds)
        assert 1.0 <= al <= gamma + 1
        unconditional, conditional = position_rates(counts.position_accepted, counts.rounds)
        assert np.all(np.diff(unconditional) <= 1e-12)
        assert np.all(
            (conditional[np.isfinite(conditional)] >= 0)
            & (conditional[np.isfinite(conditional)] <= 1 + 1e-12)
        )


@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    output=st.lists(st.integers(0, 5), min_size=0, max_size=40),
    gamma=st.integers(1, 10),
    max_ngram=st.integers(1, 4),
)
@settings(max_examples=300, deadline=None)
def test_ngram_walk_matches_a_direct_scan_of_the_context(prompt, output, gamma, max_ngram):
    index = NgramIndex(prompt + output, max_ngram, eos_ids={0})
    for s in range(len(output) + 1):
        context = prompt + output[:s]
        assert index.propose(len(context), gamma) == _scan_proposal(context, gamma, max_ngram, eos=0)
    counts = walk_ngram(prompt, output, gamma, len(output), max_ngram=max_ngram, eos_ids={0})
    assert counts.accepted_hist.sum() == counts.rounds and counts.accepted <= counts.drafted


def _scan_proposal(context, gamma, max_ngram, eos):
    """transformers' PromptLookupCandidateGenerator rule, written as a plain scan."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = context[length - n :]
        for start in range(length - n + 1):
            if context[start : start + n] == tail and start + n < min(start + n + gamma, length):
                proposal = context[start + n : min(start + n + gamma, length)]
                return proposal[: proposal.index(eos)] if eos in proposal else proposal
    return []


@given(
    logits_p=st.lists(st.floats(-5, 5), min_size=2, max_size=12),
    shift=st.lists(st.floats(-3, 3), min_size=12, max_size=12),
)
@settings(max_examples=200, deadline=None)
def test_overlap_equals_one_minus_total_variation(logits_p, shift):
    p_logits = np.array(logits_p)
    q_logits = p_logits + np.array(shift[: len(logits_p)])
    p = np.exp(p_logits) / np.exp(p_logits).sum()
    q = np.exp(q_logits) / np.exp(q_logits).sum()
    total_variation = 0.5 * np.abs(p - q).sum()
    beta = acceptance_probability_overlap(p[None, :], q[None, :])[0]
    assert beta == pytest.approx(1.0 - total_variation, abs=1e-12)
    assert 0.0 <= beta <= 1.0 + 1e-12


def test_long_run_by_entropy_hand_computed():
    from analyzer.measuring.entropy import long_run_by_entropy

    # matches: positions 1..5 match (run of 5 starting at index 1), index 0 and 6 do not
    matches = [0, 1, 1, 1, 1, 1, 0]
    entropies = [0.1, 3.5, 0.1, 0.1, 0.1, 0.1, 0.1]
    table = long_run_by_entropy([matches], [entropies], edges=(0.0, 1.0, float("inf")))
    # i = 1..6, previous entropies 0.1, 3.5, 0.1, 0.1, 0.1, 0.1 -> bucket 0 has 5 positions, bucket 1 has 1
    assert table["positions"] == [5, 1]
    assert table["long_runs"] == [1, 0]  # only i = 1 (previous entropy 0.1) starts a run of 5
    assert table["probability"] == [0.2, 0.0]
    assert table["edges"] == [0.0, 1.0, None]


def test_sampling_overlaps_after_temperature_and_top_p_equal_one_minus_total_variation():
    import torch

    from analyzer.measuring.measure import processed_probabilities, sampling_overlaps

    rng = np.random.default_rng(3)
    target = torch.tensor(rng.normal(size=(5, 11)))
    draft = target + torch.tensor(rng.normal(scale=0.7, size=(5, 11)))
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.3, 0.8)):
        betas = sampling_overlaps(target, draft, temperature, top_p)

        def processed(logits):  # an independent numpy version of the same processing
            z = logits.numpy() / temperature
            p = np.exp(z - z.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out = np.zeros_like(p)
            for row in range(p.shape[0]):
                order = np.argsort(-p[row], kind="stable")
                mass_before = np.cumsum(p[row, order]) - p[row, order]
                keep = order[mass_before < top_p]
                out[row, keep] = p[row, keep] / p[row, keep].sum()
            return out

        p, q = processed(target), processed(draft)
        np.testing.assert_allclose(betas, 1.0 - 0.5 * np.abs(p - q).sum(axis=1), atol=1e-6)
        np.testing.assert_allclose(processed_probabilities(target, temperature, top_p).numpy(), p, atol=1e-6)
    assert np.all((betas > 0) & (betas < 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=60), st.integers(1, 8), st.integers(0, 4))
def test_token_marks_agree_with_the_model_draft_walk(matches, gamma, slack):
    from analyzer.measuring.acceptance import token_marks_model_draft

    budget = len(matches) + slack
    marks = token_marks_model_draft(matches, gamma, budget)
    walk = walk_model_draft(matches, gamma, budget)
    assert len(marks) == len(matches) and marks.count("accepted") == walk.accepted
    emitted_by_target = len(marks) - marks.count("accepted")
    assert walk.rounds - emitted_by_target in (0, 1)  # a last round may end on an accepted draft
    for i, mark in enumerate(marks):
        if mark == "accepted":
            assert matches[i] == 1


def test_token_marks_of_the_ngram_walk_by_hand():
    from analyzer.measuring.acceptance import token_marks_ngram

    # prompt "a b c a b" then output "c a b d": lookup after "a b" proposes "c a b" (g=3)
    prompt, output = [1, 2, 3, 1, 2], [3, 1, 2, 4]
    marks = token_marks_ngram(prompt, output, 3, 16, max_ngram=2)
    assert marks == ["accepted", "accepted", "accepted", "bonus"]
    walk = walk_ngram(prompt, output, 3, 16, max_ngram=2)
    assert (walk.rounds, walk.accepted) == (1, 3)
    assert token_marks_ngram([5, 6], [7, 8], 2, 16) == ["plain", "plain"]
