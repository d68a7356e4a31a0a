"""The exact walk replays real greedy speculative decoding token for token: simulated rounds equal
the target forward passes counted during transformers' assisted generation (model draft and prompt
lookup), and the assisted output equals plain greedy output."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from analyzer.measuring.acceptance import alpha_from_matches, walk_model_draft, walk_ngram
from analyzer.measuring.measure import draft_match_sequence, generate_target, teacher_forced_logits
from analyzer.measuring.validate import assisted_generate
from tests.tiny_models import EOS_ID, PAD_ID, make_noisy_copy, make_tiny_model

MAX_NEW = 48


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=0)
    return target, make_noisy_copy(target, noise_std=0.02, seed=1)


def _prompts(count: int, length: int = 24) -> list[list[int]]:
    rng = np.random.default_rng(7)
    # a repeated motif gives prompt lookup something to find
    return [list(rng.integers(3, 40, size=length // 2)) * 2 for _ in range(count)]


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_model_draft_rounds_equal_target_forward_passes(pair, gamma):
    target, draft = pair
    alphas = []
    for prompt in _prompts(3):
        generation = generate_target(target, [prompt], MAX_NEW, eos_ids=[EOS_ID], pad_id=PAD_ID)[0]
        matches = draft_match_sequence(
            teacher_forced_logits(draft, prompt, generation.output_ids), generation.output_ids
        )
        alphas.append(alpha_from_matches(matches))
        counts = walk_model_draft(matches, gamma, MAX_NEW)
        output, passes = assisted_generate(
            target, prompt, MAX_NEW, gamma=gamma, draft_model=draft, eos_token_id=EOS_ID
        )
        assert output == generation.output_ids
        assert passes == counts.rounds
    assert 0.05 < np.mean(alphas) < 0.95, "the noisy copy should agree only partly"


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_prompt_lookup_rounds_equal_target_forward_passes(pair, gamma):
    target, _ = pair
    drafted = 0
    for prompt in _prompts(3):
        generation = generate_target(target, [prompt], MAX_NEW, eos_ids=[EOS_ID], pad_id=PAD_ID)[0]
        counts = walk_ngram(prompt, generation.output_ids, gamma, MAX_NEW, max_ngram=2, eos_ids=[EOS_ID])
        output, passes = assisted_generate(
            target, prompt, MAX_NEW, gamma=gamma, ngram_max=2, eos_token_id=EOS_ID
        )
        assert output == generation.output_ids
        assert passes == counts.rounds
        drafted += counts.drafted
    assert drafted > 0, "the prompts should give prompt lookup something to propose"


def test_identical_draft_gives_alpha_one_and_minimal_rounds(pair):
    target, _ = pair
    prompt = _prompts(1)[0]
    generation = generate_target(target, [prompt], MAX_NEW, eos_ids=[EOS_ID], pad_id=PAD_ID)[0]
    matches = draft_match_sequence(
        teacher_forced_logits(target, prompt, generation.output_ids), generation.output_ids
    )
    assert alpha_from_matches(matches) == 1.0
    n = len(generation.output_ids)
    twin = copy.deepcopy(target)  # identical weights, a separate module so its forwards are not counted
    for gamma in (1, 3, 7):
        counts = walk_model_draft(matches, gamma, MAX_NEW)
        if n == MAX_NEW:
            assert counts.rounds == -(-n // (gamma + 1))
        _, passes = assisted_generate(
            target, prompt, MAX_NEW, gamma=gamma, draft_model=twin, eos_token_id=EOS_ID
        )
        assert passes == counts.rounds


def test_batched_left_padded_generation_equals_one_by_one(pair):
    target, _ = pair
    prompts = [p[: 10 + 3 * i] for i, p in enumerate(_prompts(3))]
    batched = generate_target(target, prompts, 24, eos_ids=[EOS_ID], pad_id=PAD_ID)
    single = [generate_target(target, [p], 24, eos_ids=[EOS_ID], pad_id=PAD_ID)[0] for p in prompts]
    for b, s in zip(batched, single):
        assert b.output_ids == s.output_ids
        np.testing.assert_allclose(b.entropies, s.entropies, rtol=1e-3, atol=1e-4)
    assert all(np.all(g.entropies >= 0) for g in single)
    assert all(len(g.entropies) == len(g.output_ids) for g in single)
