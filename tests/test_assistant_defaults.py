"""transformers' assisted generation as people run it: its defaults (20 assistant
tokens, the "constant" schedule, confidence threshold 0.4 moved by its ROC rule after every round) and
the heuristic schedule, replayed from one target generation, the draft's teacher-forced matches and
confidences, and the draft's own continuation after a rejected token. The replay's rounds equal the
target forward passes of real assisted generation, and its drafted tokens the draft's forward passes,
on tiny real models whose draft agrees with the target in part."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.measuring.assistant_defaults import TRANSFORMERS_DEFAULTS, AssistantSettings, assistant_rounds
from analyzer.measuring.measure import (
    draft_confidences,
    draft_match_sequence,
    draft_off_path,
    generate_target,
    teacher_forced_logits,
)
from analyzer.measuring.validate import assisted_generate_as_set
from tests.tiny_models import EOS_ID, PAD_ID, make_noisy_copy, make_tiny_model

MAX_NEW = 48
SETTINGS = [
    TRANSFORMERS_DEFAULTS,
    AssistantSettings(schedule="heuristic"),
    AssistantSettings(tokens=6, threshold=0.6),
    AssistantSettings(tokens=5, threshold=0.0),
]


@pytest.fixture(scope="module")
def target():
    return make_tiny_model(seed=0)


def _replay(target, draft, prompt, settings, adapt=True):
    output = generate_target(target, [prompt], MAX_NEW, eos_ids=[EOS_ID], pad_id=PAD_ID)[0].output_ids
    logits = teacher_forced_logits(draft, prompt, output)
    matches = draft_match_sequence(logits, output)
    off_path = draft_off_path(draft, prompt, output, logits, [EOS_ID])
    chosen = AssistantSettings(settings.tokens, settings.schedule, settings.threshold, adapt)
    return output, matches, assistant_rounds(matches, draft_confidences(logits), MAX_NEW, off_path, chosen)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.label)
@pytest.mark.parametrize("noise", [0.001, 0.004])
@pytest.mark.slow
@pytest.mark.parallel
def test_the_replayed_rounds_and_drafts_are_what_real_assisted_generation_does(target, settings, noise):
    draft = make_noisy_copy(target, noise_std=noise, seed=1)
    rng = np.random.default_rng(3)
    alphas, off_path_rounds = [], 0
    for _ in range(4):
        prompt = rng.integers(3, 97, size=12).tolist()
        output, matches, rounds = _replay(target, draft, prompt, settings)
        ids, target_passes, draft_passes = assisted_generate_as_set(
            target, draft, prompt, MAX_NEW, settings, eos_token_id=[EOS_ID]
        )
        assert ids == output  # greedy speculative decoding emits the target's own tokens
        assert len(rounds) == target_passes and sum(d for d, _ in rounds) == draft_passes
        assert sum(a + 1 for _, a in rounds) >= len(output)
        alphas.append(float(matches.mean()))
        off_path_rounds += sum(1 for d, a in rounds if d > a + 1)  # drafted on after a rejected token
    assert 0.3 < float(np.mean(alphas)) < 0.95  # the draft agrees in part: both outcomes are exercised
    if settings.threshold < 0.5:
        assert off_path_rounds > 0  # the draft's own continuation after a rejection was replayed


def test_the_roc_rule_moves_the_threshold_and_the_replay_follows_it(target):
    draft = make_noisy_copy(target, noise_std=0.003, seed=1)
    prompt = np.random.default_rng(5).integers(3, 97, size=12).tolist()
    _, _, adapted = _replay(target, draft, prompt, TRANSFORMERS_DEFAULTS)
    _, _, fixed = _replay(target, draft, prompt, TRANSFORMERS_DEFAULTS, adapt=False)
    _, real_passes, real_drafts = assisted_generate_as_set(
        target, draft, prompt, MAX_NEW, eos_token_id=[EOS_ID]
    )
    assert adapted != fixed  # the ROC rule changed the rounds ...
    assert (len(adapted), sum(d for d, _ in adapted)) == (
        real_passes,
        real_drafts,
    )  # ... as transformers does


def test_the_replay_checks_its_inputs():
    with pytest.raises(ValueError, match="differ in length"):
        assistant_rounds([1, 0], [0.9], 4, lambda *_: 0)
    with pytest.raises(ValueError, match="smaller than the output"):
        assistant_rounds([1, 0, 1], [0.9, 0.8, 0.7], 2, lambda *_: 0)
    with pytest.raises(ValueError, match="schedule 'fast'"):
        AssistantSettings(schedule="fast")
    # every draft matches and is confident: one round drafts the lookahead, emitting it plus one token
    assert assistant_rounds([1] * 9, [0.99] * 9, 20, lambda *_: 0, AssistantSettings(tokens=4)) == [
        (4, 4),
        (4, 4),
    ]
