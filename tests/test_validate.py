"""Real speculative decoding (transformers' assisted generation and prompt lookup) on tiny real models.

Greedy speculative decoding is exact: every speculative output must equal plain greedy decoding, and
the number of target forward passes must equal the number of rounds that the walk of DESIGN.md
predicts. The reference walks below restate transformers 5's rules independently of analyzer/:
- model draft: a round at output position s drafts min(gamma, max_new_tokens - s - 1) tokens (the draft
  stops early after proposing EOS, which cannot change how many are accepted), accepts the leading
  drafts the target agrees with, and emits those plus one target token;
- prompt lookup: the leftmost earlier occurrence of the trailing n-gram (n = ngram_max down to 1) with at
  least one token after it proposes up to gamma following tokens (not capped by max_new_tokens), cut
  before the first EOS; no draft when only one token is left to generate.
A round emits at most max_new_tokens - s tokens and stops after EOS.
A float near-tie could in principle flip one argmax between the draft's and the target's forward shapes;
none occurs with these models and prompts, so the tests demand exact equality.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from analyzer.measuring import validate
from analyzer.measuring.validate import (
    ValidationMeasurement,
    assisted_generate,
    count_forward_passes,
    greedy_generate,
    validate_prompt,
)
from tests.tiny_models import EOS_ID, make_noisy_copy, make_tiny_model

# Prompts whose greedy continuation (seed-0 tiny model) has no EOS within 40 tokens and repeats itself,
# so prompt lookup finds matches; EOS_PROMPT's first greedy token is EOS.
PROMPTS = [
    [33, 78, 72, 19, 50, 80, 63, 83, 77, 11, 80, 4],
    [22, 32, 84, 22, 69, 52, 4, 88, 11, 23, 78, 8],
    [41, 6, 37, 63, 79, 95, 52, 94, 57, 53, 96, 76],
]
EOS_PROMPT = [63, 36, 73, 32, 27, 94, 63, 72, 73, 63, 53, 84]


@pytest.fixture(scope="module")
def target():
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def twin(target):
    """A draft identical to the target but a separate module, so its forwards are not counted."""
    return copy.deepcopy(target)


@pytest.fixture(scope="module")
def noisy(target):
    return make_noisy_copy(target, noise_std=0.005, seed=1)


def reference_greedy(model, prompt, max_new_tokens, eos=EOS_ID):
    """Greedy decoding by full recomputation at every step (no cache, no generate())."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token == eos:
                break
    return ids[len(prompt) :]


def draft_matches(draft, prompt, output):
    """m_i = 1 when the draft's argmax after prompt + output[:i] is output[i] (one teacher-forced pass)."""
    with torch.inference_mode():
        logits = draft(input_ids=torch.tensor([prompt + output])).logits[0]
    predicted = logits[len(prompt) - 1 : len(prompt) + len(output) - 1].argmax(-1).tolist()
    return [int(p == t) for p, t in zip(predicted, output)]


def rounds_for_model_draft(matches, gamma, max_new_tokens):
    """Rounds of greedy speculative decoding with a model draft, walking the match vector."""
    position, rounds = 0, 0
    while position < len(matches):
        drafted = min(gamma, max_new_tokens - position - 1)
        accepted = 0
        while accepted < drafted and position + accepted < len(matches) and matches[position + accepted]:
            accepted += 1
        position += accepted + 1
        rounds += 1
    return rounds


def prompt_lookup_draft(context, gamma, ngram_max, eos=EOS_ID):
    """transformers' prompt-lookup proposal for the next round after `context`."""
    length = len(context)
    for n in range(min(ngram_max, length - 1), 0, -1):
        for start in range(length - n + 1):
            if context[start : start + n] == context[-n:] and start + n < length:
                proposal = context[start + n : min(start + n + gamma, length)]
                return proposal[: proposal.index(eos)] if eos in proposal else proposal
    return []


def rounds_for_prompt_lookup(prompt, output, gamma, ngram_max, max_new_tokens, eos=EOS_ID):
    """Rounds of greedy speculative decoding with transformers' prompt lookup, walking the output."""
    position, rounds = 0, 0
    while position < len(output):
        proposal = []
        if max_new_tokens - position > 1:
            proposal = prompt_lookup_draft(prompt + output[:position], gamma, ngram_max, eos)
        accepted = 0
        while (
            accepted < len(proposal)
            and position + accepted < len(output)
            and proposal[accepted] == output[position + accepted]
        ):
            accepted += 1
        position += accepted + 1
        rounds += 1
    return rounds


def test_count_forward_passes_counts_top_level_calls_and_detaches(target):
    ids = torch.tensor([PROMPTS[0]])
    with count_forward_passes(target) as counter:
        for _ in range(3):
            target(input_ids=ids)
    assert counter.count == 3
    target(input_ids=ids)
    assert counter.count == 3
    assert not target._forward_hooks


def test_count_forward_passes_detaches_on_error(target):
    with pytest.raises(RuntimeError):
        with count_forward_passes(target):
            raise RuntimeError("boom")
    assert not target._forward_hooks


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generate_matches_full_recomputation_with_one_pass_per_token(target, prompt):
    output, passes = greedy_generate(target, prompt, 24)
    assert EOS_ID not in output  # precondition of the prompt choice
    assert output == reference_greedy(target, prompt, 24)
    assert passes == len(output) == 24


def test_greedy_generate_stops_after_eos(target):
    full, _ = greedy_generate(target, PROMPTS[0], 30)
    eos = full[7]
    stop = full.index(eos)
    output, passes = greedy_generate(target, PROMPTS[0], 30, eos_token_id=eos)
    assert output == full[: stop + 1]
    assert passes == stop + 1


def test_an_empty_eos_list_stops_on_nothing(target):
    assert greedy_generate(target, EOS_PROMPT, 10) == ([EOS_ID], 1)
    output, passes = greedy_generate(target, EOS_PROMPT, 10, eos_token_id=[])
    assert output[0] == EOS_ID and len(output) == passes == 10
    assert assisted_generate(target, EOS_PROMPT, 10, gamma=3, ngram_max=2, eos_token_id=[])[0] == output


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("max_new_tokens", [10, 13, 17])
def test_identical_draft_takes_ceil_n_over_gamma_plus_one_passes(target, twin, gamma, max_new_tokens):
    for prompt in PROMPTS:
        greedy, _ = greedy_generate(target, prompt, max_new_tokens)
        output, passes = assisted_generate(target, prompt, max_new_tokens, gamma=gamma, draft_model=twin)
        assert output == greedy
        assert passes == math.ceil(len(output) / (gamma + 1))


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_identical_draft_with_eos_inside_a_round(target, twin, gamma):
    full, _ = greedy_generate(target, PROMPTS[1], 30)
    eos = full[9]  # the first occurrence ends generation there
    greedy, _ = greedy_generate(target, PROMPTS[1], 30, eos_token_id=eos)
    output, passes = assisted_generate(
        target, PROMPTS[1], 30, gamma=gamma, draft_model=twin, eos_token_id=eos
    )
    assert output == greedy == full[: full.index(eos) + 1]
    assert passes == math.ceil(len(output) / (gamma + 1))


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_noisy_draft_is_exact_and_takes_the_walked_number_of_rounds(target, noisy, gamma):
    for prompt in PROMPTS:
        greedy, _ = greedy_generate(target, prompt, 30)
        matches = draft_matches(noisy, prompt, greedy)
        assert 0 < sum(matches) < len(matches)  # the draft agrees only in part
        output, passes = assisted_generate(target, prompt, 30, gamma=gamma, draft_model=noisy)
        assert output == greedy
        assert passes == rounds_for_model_draft(matches, gamma, 30)


@pytest.mark.parametrize("eos_position", [3, 7, 22])
def test_noisy_draft_with_eos_takes_the_walked_number_of_rounds(target, noisy, eos_position):
    full, _ = greedy_generate(target, PROMPTS[2], 30)
    eos = full[eos_position]
    assert full.index(eos) == eos_position  # its first occurrence, so generation ends there
    greedy, _ = greedy_generate(target, PROMPTS[2], 30, eos_token_id=eos)
    assert len(greedy) == eos_position + 1
    matches = draft_matches(noisy, PROMPTS[2], greedy)
    for gamma in (2, 5):
        output, passes = assisted_generate(
            target, PROMPTS[2], 30, gamma=gamma, draft_model=noisy, eos_token_id=eos
        )
        assert output == greedy
        assert passes == rounds_for_model_draft(matches, gamma, 30)


@pytest.mark.parametrize("ngram_max", [1, 2, 3])
@pytest.mark.parametrize("gamma", [1, 3, 10])
def test_prompt_lookup_is_exact_and_takes_the_walked_number_of_rounds(target, gamma, ngram_max):
    for prompt in PROMPTS:
        for max_new_tokens in (20, 37):
            greedy, _ = greedy_generate(target, prompt, max_new_tokens)
            output, passes = assisted_generate(
                target, prompt, max_new_tokens, gamma=gamma, ngram_max=ngram_max
            )
            assert output == greedy
            assert passes == rounds_for_prompt_lookup(prompt, greedy, gamma, ngram_max, max_new_tokens)
            assert passes < len(greedy)  # lookup found something to accept


def test_prompt_lookup_cuts_proposals_before_eos(target):
    # 95 occurs in PROMPTS[2] and, as EOS, first in its output at position 24: on the way two lookups
    # propose it, once as the first token (no draft that round) and once later (draft cut before it).
    eos = 95
    greedy, _ = greedy_generate(target, PROMPTS[2], 40, eos_token_id=eos)
    assert len(greedy) == 25 and greedy[-1] == eos
    proposals = [prompt_lookup_draft(PROMPTS[2] + greedy[:s], 10, 2, eos=-1) for s in range(len(greedy))]
    assert sum(eos in p for p in proposals) == 2
    for gamma in (2, 4, 10):
        output, passes = assisted_generate(target, PROMPTS[2], 40, gamma=gamma, ngram_max=2, eos_token_id=eos)
        assert output == greedy
        assert passes == rounds_for_prompt_lookup(PROMPTS[2], greedy, gamma, 2, 40, eos=eos)


def test_draft_generation_config_is_restored(target, noisy):
    original = noisy.generation_config
    before = original.to_dict()
    target_config = target.generation_config
    assisted_generate(target, PROMPTS[0], 8, gamma=3, draft_model=noisy)
    assert noisy.generation_config is original and original.to_dict() == before
    assert target.generation_config is target_config


def test_draft_generation_config_is_restored_on_error(target, noisy):
    original = noisy.generation_config
    before = original.to_dict()
    with pytest.raises(IndexError):  # a token id outside the vocabulary fails in the embedding
        assisted_generate(target, [5, 6, 10_000], 8, gamma=3, draft_model=noisy)
    assert noisy.generation_config is original and original.to_dict() == before
    assert not target._forward_hooks


def test_settings_in_the_models_generation_configs_do_not_leak(target, twin):
    # A repetition penalty, a minimum length, an n-gram ban or a long adaptive draft in the models' own
    # configs must not change plain greedy decoding, nor the draft length of gamma.
    prompt, n = PROMPTS[1], 17
    expected = reference_greedy(target, prompt, n)
    leaky_target, leaky_draft = copy.deepcopy(target), copy.deepcopy(twin)
    for model in (leaky_target, leaky_draft):
        model.generation_config.repetition_penalty = 3.0
        model.generation_config.no_repeat_ngram_size = 2
        model.generation_config.min_new_tokens = 40
        model.generation_config.suppress_tokens = [expected[0]]
    leaky_draft.generation_config.num_assistant_tokens = 20
    leaky_draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    leaky_draft.generation_config.assistant_confidence_threshold = 0.9
    assert greedy_generate(leaky_target, prompt, n) == (expected, n)
    output, passes = assisted_generate(leaky_target, prompt, n, gamma=2, draft_model=leaky_draft)
    assert output == expected and passes == math.ceil(n / 3)
    assert assisted_generate(leaky_target, prompt, n, gamma=2, ngram_max=2)[0] == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gamma": 0, "ngram_max": 2},
        {"gamma": 2, "ngram_max": 2, "draft_model": "twin"},
        {"gamma": 2, "draft_model": "target"},
    ],
)
def test_assisted_generate_rejects_bad_arguments(target, twin, kwargs):
    kwargs = dict(kwargs)
    if "draft_model" in kwargs:
        kwargs["draft_model"] = {"twin": twin, "target": target}[kwargs["draft_model"]]
    with pytest.raises(ValueError):
        assisted_generate(target, PROMPTS[0], 8, **kwargs)


def test_validate_prompt_measures_a_real_pair(target, noisy):
    measured = validate_prompt(target, PROMPTS[0], 20, gamma=3, draft_model=noisy, repeats=2)
    greedy, _ = greedy_generate(target, PROMPTS[0], 20)
    speculative, passes = assisted_generate(target, PROMPTS[0], 20, gamma=3, draft_model=noisy)
    assert measured.gamma == 3
    assert measured.greedy_ids == greedy == measured.speculative_ids == speculative
    assert measured.outputs_identical
    assert measured.target_forward_passes == passes < 20
    assert measured.greedy_time_s > 0 and measured.speculative_time_s > 0
    assert measured.measured_speedup == measured.greedy_time_s / measured.speculative_time_s


def test_validate_prompt_with_prompt_lookup(target):
    measured = validate_prompt(target, PROMPTS[1], 25, gamma=4, ngram_max=2)
    greedy, _ = greedy_generate(target, PROMPTS[1], 25)
    assert measured.outputs_identical and measured.speculative_ids == greedy
    assert measured.target_forward_passes == rounds_for_prompt_lookup(PROMPTS[1], greedy, 4, 2, 25)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_validate_prompt_alternates_order_takes_medians_and_flags_differences(monkeypatch):
    clock, calls = FakeClock(), []
    greedy_seconds = iter([4.0, 6.0, 5.0])
    speculative = iter([(2.0, [7, 8, 9]), (9.0, [7, 8, 9]), (2.5, [7, 8, 0])])

    def fake_greedy(model, prompt, n, *, eos_token_id=None):
        calls.append("greedy")
        clock.now += next(greedy_seconds)
        return [7, 8, 9], 3

    def fake_assisted(model, prompt, n, *, gamma, draft_model=None, ngram_max=None, eos_token_id=None):
        calls.append("speculative")
        seconds, ids = next(speculative)
        clock.now += seconds
        return ids, 2

    monkeypatch.setattr(validate, "perf_counter", clock)
    monkeypatch.setattr(validate, "greedy_generate", fake_greedy)
    monkeypatch.setattr(validate, "assisted_generate", fake_assisted)
    measured = validate_prompt(None, [1, 2], 3, gamma=2, ngram_max=2, repeats=3)
    assert calls == ["greedy", "speculative", "speculative", "greedy", "greedy", "speculative"]
    assert measured == ValidationMeasurement(
        gamma=2,
        greedy_ids=[7, 8, 9],
        speculative_ids=[7, 8, 9],
        greedy_time_s=5.0,
        speculative_time_s=2.5,
        outputs_identical=False,
        target_forward_passes=2,
        measured_speedup=2.0,
        greedy_times_s=(4.0, 6.0, 5.0),  # every run kept, in the order each kind ran
        speculative_times_s=(2.0, 9.0, 2.5),
    )


def test_a_warm_validation_runs_both_once_untimed_before_its_timed_repeats(target, monkeypatch):
    prompt = PROMPTS[0]
    """On a GPU validation warms up first (a cold first run measured 0.65x where warm ones gave 1.01x)
    and alternates plain and speculative over 2 repeats; the warm-up is never timed."""
    calls = []
    for name in ("greedy_generate", "assisted_generate"):
        real = getattr(validate, name)
        monkeypatch.setattr(
            validate, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        )
    measured = validate.validate_prompt(target, prompt, 6, gamma=2, ngram_max=2, repeats=2, warmup=True)
    assert calls == ["greedy_generate", "assisted_generate"] + ["greedy_generate", "assisted_generate"] + [
        "assisted_generate",
        "greedy_generate",
    ]
    assert measured.outputs_identical and measured.greedy_time_s > 0
    calls.clear()
    validate.validate_prompt(target, prompt, 6, gamma=2, ngram_max=2)
    assert calls == ["greedy_generate", "assisted_generate"]  # on a CPU: one timed pair, no warm-up
