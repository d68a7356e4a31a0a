"""Cost measurement on tiny real models: shapes and bookkeeping are checked against a fake clock that
advances by a known amount per forward, so the tests assert exact numbers, never wall-clock times."""

from __future__ import annotations

import math

import pytest
import torch

from analyzer.measuring import cost, interference
from analyzer.measuring.cost import (
    CostMeasurement,
    _cache_argument,
    device_description,
    prefill_cache,
    profile_costs,
    time_callable,
    time_draft_model_step,
    time_forward_over_cache,
    time_target_forwards,
    time_target_forwards_checked,
)
from analyzer.measuring.interference import TimingQuality
from analyzer.measuring.validate import greedy_generate
from tests.tiny_models import make_noisy_copy, make_tiny_model

CONTEXT = [33, 78, 72, 19, 50, 80, 63, 83, 77, 11, 80, 4, 45, 48, 17, 95, 19, 50]


@pytest.fixture(scope="module")
def target():
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def draft(target):
    return make_noisy_copy(target, noise_std=0.01, seed=1)


class FakeClock:
    """A perf_counter stand-in that only moves when a test advances it. Its ``cpu`` clock (patched in
    for process_time) moves with it at torch's thread count, as on a quiet machine, except for time
    spent in ``stall`` (another process holding the CPU); ``machine_busy`` jiffies are what
    /proc/stat would say (None: not Linux)."""

    def __init__(self):
        self.now = 1000.0
        self.stalled = 0.0
        self.machine_busy = None

    def __call__(self) -> float:
        return self.now

    def cpu(self) -> float:
        return (self.now - self.stalled) * torch.get_num_threads()

    def stall(self, seconds: float) -> None:
        self.now += seconds
        self.stalled += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(cost, "perf_counter", fake)
    monkeypatch.setattr(cost, "process_time", fake.cpu)
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: fake.machine_busy)
    return fake


def advance_per_forward(model, clock, seconds_per_call):
    """Make every forward of `model` advance the fake clock; `seconds_per_call(call_index, k)` says by
    how much. Returns the hook handle and the list of k (new tokens) seen per call."""
    seen: list[int] = []

    def hook(module, args, kwargs):
        k = kwargs["input_ids"].shape[1]
        clock.now += seconds_per_call(len(seen), k)
        seen.append(k)

    return model.register_forward_pre_hook(hook, with_kwargs=True), seen


def test_time_target_forwards_gives_one_positive_finite_median_per_k(target):
    medians = time_target_forwards(target, CONTEXT, 6, repeats=2)
    assert len(medians) == 6
    assert all(math.isfinite(t) and t > 0 for t in medians)


def test_time_target_forwards_interleaves_k_and_skips_warmup(target, clock):
    k_max, warmup, repeats = 3, 1, 3
    # per timed call: k seconds plus an offset that depends on the repeat; warm-up calls are huge
    offsets = [1000.0] * k_max + [0.0] * k_max + [100.0] * k_max + [0.5] * k_max

    def seconds(call, k):  # call 0 is the prefill; calls after the first pass are the re-measurement
        return 0.0 if call == 0 else k + (offsets[call - 1] if call - 1 < len(offsets) else 0.5)

    handle, seen = advance_per_forward(target, clock, seconds)
    try:
        medians, quality = time_target_forwards_checked(
            target, CONTEXT, k_max, repeats=repeats, warmup=warmup
        )
    finally:
        handle.remove()
    # the 100 s repeat spreads every k beyond 10% (MAD 0.5 s around k + 0.5 s): all three measured again
    assert seen == [len(CONTEXT)] + [1, 2, 3] * (warmup + repeats) + [1, 2, 3] * repeats
    assert medians == [1.5, 2.5, 3.5]
    assert quality.remeasured == [1, 2, 3] and quality.verdict == "remeasured" and quality.spread == [0.0] * 3


def test_forwards_over_the_cache_leave_it_as_found(target):
    # Prefill all but the last context token, time several forwards on the cache, then decode greedily
    # from it: the continuation must equal plain greedy decoding of the whole context.
    cache = prefill_cache(target, CONTEXT[:-1])
    for k in (1, 3, 5, 2):
        assert time_forward_over_cache(target, cache, CONTEXT[-k:]) > 0
        assert cache.get_seq_length() == len(CONTEXT) - 1
    expected, _ = greedy_generate(target, CONTEXT, 8, eos_token_id=[])
    token, continuation = CONTEXT[-1], []
    with torch.inference_mode():
        for _ in range(8):
            logits = target(
                input_ids=torch.tensor([[token]]), use_cache=True, **{_cache_argument(target): cache}
            ).logits
            token = int(logits[0, -1].argmax())
            continuation.append(token)
    assert continuation == expected


def test_time_target_forwards_leaves_the_model_unchanged(target):
    before, _ = greedy_generate(target, CONTEXT, 10, eos_token_id=[])
    time_target_forwards(target, CONTEXT, 4, repeats=1)
    after, _ = greedy_generate(target, CONTEXT, 10, eos_token_id=[])
    assert after == before


def test_context_shorter_than_k_max_cycles_its_ids(target, clock):
    handle, seen = advance_per_forward(target, clock, lambda call, k: float(k))
    try:
        medians = time_target_forwards(target, [5, 6, 7], 5, repeats=1, warmup=0)
    finally:
        handle.remove()
    assert seen == [3, 1, 2, 3, 4, 5]
    assert medians == [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    "context, k_max, repeats, warmup",
    [(CONTEXT, 0, 1, 1), ([], 2, 1, 1), (CONTEXT, 2, 0, 1), (CONTEXT, 2, 1, -1)],
)
def test_time_target_forwards_rejects_bad_arguments(target, context, k_max, repeats, warmup):
    with pytest.raises(ValueError):
        time_target_forwards(target, context, k_max, repeats=repeats, warmup=warmup)


def test_time_draft_model_step_times_single_token_forwards(draft, clock):
    handle, seen = advance_per_forward(draft, clock, lambda call, k: 0.25 * k if call else 50.0)
    try:
        step = time_draft_model_step(draft, CONTEXT, repeats=3)
    finally:
        handle.remove()
    assert seen == [len(CONTEXT)] + [1] * 4  # prefill, one warm-up step, three timed steps
    assert step == 0.25


def test_time_callable_returns_the_median_of_the_timed_calls(clock):
    durations = iter([100.0, 5.0, 1.0, 3.0, 2.0, 4.0])  # the first call is the untimed warm-up
    calls = []

    def fn():
        calls.append(1)
        clock.now += next(durations)

    assert time_callable(fn, repeats=5, warmup=1) == 3.0
    assert len(calls) == 6


def test_time_callable_rejects_no_repeats():
    with pytest.raises(ValueError):
        time_callable(lambda: None, repeats=0)


def test_device_description_names_cpu_torch_and_threads(target):
    text = device_description(target)
    assert text.startswith("cpu: ")
    assert f"torch {torch.__version__}" in text
    assert text.endswith(f"{torch.get_num_threads()} threads")


def test_profile_costs_with_a_draft_model(target, draft, clock):
    target_hook, _ = advance_per_forward(target, clock, lambda call, k: float(k))
    draft_hook, _ = advance_per_forward(draft, clock, lambda call, k: 0.125 * k)
    try:
        measured = profile_costs(target, CONTEXT, 4, draft_model=draft, repeats=3)
    finally:
        target_hook.remove()
        draft_hook.remove()
    assert measured == CostMeasurement(
        target_forward_s=[1.0, 2.0, 3.0, 4.0],
        draft_step_s=0.125,
        device=device_description(target),
        threads=torch.get_num_threads(),
        context_tokens=len(CONTEXT),
        repeats=3,
        target_prefill_s=float(len(CONTEXT)),  # the fake clock advances 1 s per token the target reads
        draft_prefill_s=0.125 * len(CONTEXT),
        quality=TimingQuality(
            spread=[0.0] * 4, remeasured=[], cpu_share=1.0, others_cpu=None, verdict="clean", notes=[]
        ),
    )


def test_profile_costs_with_a_lookup_callable(target, clock):
    def lookup():
        clock.now += 0.002

    measured = profile_costs(target, CONTEXT, 2, draft_step=lookup, repeats=1)
    assert measured.draft_step_s == pytest.approx(0.002)
    assert len(measured.target_forward_s) == 2


def test_profile_costs_without_a_draft_costs_nothing_to_draft(target):
    measured = profile_costs(target, CONTEXT, 3, repeats=1)
    assert measured.draft_step_s == 0.0
    assert len(measured.target_forward_s) == 3
    assert all(t > 0 for t in measured.target_forward_s)


def test_profile_costs_rejects_two_drafts(target, draft):
    with pytest.raises(ValueError):
        profile_costs(target, CONTEXT, 2, draft_model=draft, draft_step=lambda: None)


# ------------------------------------------------------------------ interference (issue: robust cost profiles)


def _profile_with(target, clock, stall, k_max=6, repeats=5):
    """Profile `target` with forwards costing 1 + 0.05 k s of CPU-backed time each (a flat, GPU-like
    curve), plus whatever
    ``stall(call, k, seen)`` adds: ('stall', s) for time another process held the CPU (no CPU for us),
    ('slow', s) for a slow forward that still had the CPU. Returns (T_t, quality)."""
    calls = {"n": 0}

    def hook(module, args, kwargs):
        k = kwargs["input_ids"].shape[1]
        calls["n"] += 1
        if calls["n"] == 1:
            return  # the prefill
        clock.now += forward_s(k)
        kind, seconds = stall(calls["n"] - 2, k)
        if kind == "stall":
            clock.stall(seconds)
        elif kind == "slow":
            clock.now += seconds

    handle = target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        return time_target_forwards_checked(target, CONTEXT, k_max, repeats=repeats, warmup=0)
    finally:
        handle.remove()


def forward_s(k: int) -> float:
    return 1.0 + 0.05 * k


CLEAN_CURVE = [forward_s(k) for k in range(1, 7)]


def _advice(curve):
    """Best gamma and S(g*) a task with these (walked) match sequences gets from the curve."""
    from analyzer.measuring.acceptance import walk_model_draft
    from analyzer.pricing.speedup import Cost, best_gamma, pooled_speedup

    matches = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1] * 4
    cost = Cost(curve, 0.05)
    return best_gamma(
        [
            pooled_speedup([len(matches)], [walk_model_draft(matches, g, len(matches)).drafted_hist], cost)
            for g in range(1, len(curve))
        ]
    )


def test_a_stall_in_one_repeat_is_dropped_and_the_advice_is_the_clean_profiles(target, clock):
    clean, clean_quality = _profile_with(target, clock, lambda call, k: (None, 0))
    assert (
        clean == pytest.approx(CLEAN_CURVE) and clean_quality.verdict == "clean" and clean_quality.notes == []
    )
    # another process holds the CPU for 30 s during the third repeat (calls 12..17: every k of it)
    stalled, quality = _profile_with(
        target, clock, lambda call, k: ("stall", 5.0) if 12 <= call < 18 else (None, 0)
    )
    assert stalled == pytest.approx(clean) and quality.verdict == "remeasured"
    assert _advice(clean)[0] >= 4  # a flat curve: speculate far ahead
    assert quality.notes == [
        "1 repeat dropped: another process held the CPU (our process got less than 85% of its "
        "best repeats' CPU time, or others used more than 15% of the machine)"
    ]
    assert _advice(stalled) == pytest.approx(_advice(clean))


def test_slow_points_in_most_repeats_are_measured_again_and_come_out_clean(target, clock):
    # k = 5 and 6 are slow by 3, 2 and 1 s in the first three repeats (calls 0..17), with the CPU ours:
    # their medians are off by 1 s and their repeats spread over 10%
    def stall(call, k):
        return ("slow", 3.0 - call // 6) if call < 18 and k >= 5 else (None, 0)

    stalled, quality = _profile_with(target, clock, stall)
    assert quality.remeasured == [5, 6] and quality.verdict == "remeasured"
    assert (
        stalled == pytest.approx(CLEAN_CURVE) and quality.spread == [0.0] * 6
    )  # the re-measured round was clean
    assert quality.notes == [
        "k = 5, 6 re-measured: their repeats spread more than 10% or were starved of CPU"
    ]
    assert _advice(stalled) == pytest.approx(_advice(CLEAN_CURVE))
    unchecked = [
        t + (1.0 if k >= 5 else 0.0) for k, t in enumerate(CLEAN_CURVE, start=1)
    ]  # the medians before
    assert _advice(unchecked)[0] < _advice(CLEAN_CURVE)[0]  # which would have moved the best gamma


def test_interference_that_persists_makes_the_profile_noisy(target, clock):
    # k = 4 is slow by a different amount in every repeat, re-measurements included
    stalled, quality = _profile_with(
        target, clock, lambda call, k: ("slow", (call % 7) * 0.8) if k == 4 else (None, 0)
    )
    assert quality.verdict == "noisy" and quality.remeasured == [4]
    assert quality.notes[-1].startswith("k = 4 still spread up to") and quality.spread[3] > 0.10
    assert stalled[:3] == pytest.approx(CLEAN_CURVE[:3])


def test_a_busy_machine_makes_the_profile_noisy(target, clock, monkeypatch):
    import os

    ticks, cores = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    clock.machine_busy = 0

    def stall(call, k):  # other processes keep every core busy while we measure (a tick more than the
        # forward's fake seconds, so that our own real CPU time between readings cannot round it below 100%)
        clock.machine_busy += int(forward_s(k) * ticks * cores) + 1
        return None, 0

    _, quality = _profile_with(target, clock, stall)
    assert quality.verdict == "noisy" and quality.others_cpu == pytest.approx(1.0, abs=0.02)
    assert quality.notes[-1] == "other processes used 100% of the machine's CPU while profiling"
    # the machine was quiet a moment after the starved round (the jiffies move only with the forwards), so
    # every point was measured again, and taken again by the load
    assert quality.remeasured == [1, 2, 3, 4, 5, 6] and not any(
        "not measured again" in n for n in quality.notes
    )


def test_a_round_starved_by_a_load_still_there_a_moment_later_is_not_measured_again(
    target, clock, monkeypatch
):
    import itertools

    busy = itertools.count(0, 10**6)  # /proc/stat as on a machine whose other processes take every core
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))
    calls = []
    _, quality = _profile_with(target, clock, lambda call, k: calls.append(k) or (None, 0))
    assert len(calls) == 6 * 5  # the first round's 5 repeats of k = 1..6 and nothing more
    assert quality.verdict == "noisy" and quality.remeasured == []
    assert quality.notes == [
        "5 repeats dropped: another process held the CPU (our process got less than 85% of its best repeats' "
        "CPU time, or others used more than 15% of the machine)",
        "k = 1, 2, 3, 4, 5, 6 not measured again: other processes still used 100% of the machine's CPU after "
        "the starved repeats",
        "other processes used 100% of the machine's CPU while profiling",
    ]


class StepJiffies:
    """/proc/stat's busy jiffies moving by ``steps[i]`` at the i-th reading (the last step repeats)."""

    def __init__(self, steps):
        self.steps, self.value, self.reads = list(steps), 0, 0

    def __call__(self):
        self.value += self.steps[min(self.reads, len(self.steps) - 1)]
        self.reads += 1
        return self.value


def _overhead(attempt: int):
    from analyzer.engine.overhead import MachineryOverhead

    return MachineryOverhead(decode_s=0.001 * attempt, round_s=0.002 * attempt, new_tokens=8, repeats=3)


def test_a_busy_overhead_attempt_is_measured_again_once_the_machine_is_quiet(monkeypatch):
    from analyzer.engine.overhead import retried_while_busy

    # readings: before attempt 1, after it (busy), the probe's two (quiet), before and after attempt 2 (quiet)
    jiffies = StepJiffies([0, 10**6, 0])
    monkeypatch.setattr(interference, "_busy_jiffies", jiffies)
    attempts = []
    measured = retried_while_busy(lambda attempt: attempts.append(attempt) or _overhead(attempt))
    assert attempts == [1, 2] and measured == _overhead(2) and measured.busy is None and jiffies.reads == 6


def test_a_load_that_goes_on_stops_the_overhead_after_its_first_attempt(monkeypatch):
    import itertools

    from analyzer.engine.overhead import retried_while_busy

    busy = itertools.count(0, 10**6)
    monkeypatch.setattr(interference, "_busy_jiffies", lambda: next(busy))
    attempts = []
    measured = retried_while_busy(lambda attempt: attempts.append(attempt) or _overhead(attempt))
    assert attempts == [1] and measured.decode_s == _overhead(1).decode_s
    assert measured.busy == (
        "machinery overhead: other processes used 100% of the machine's CPU in 1 attempt; still 100% right "
        "after, so not measured again"
    )
    # busy in every attempt but quiet each time right after one: all three attempts, as before
    jiffies = StepJiffies([0, 10**6, 0, 0] * 2 + [0, 10**6])
    monkeypatch.setattr(interference, "_busy_jiffies", jiffies)
    attempts.clear()
    measured = retried_while_busy(lambda attempt: attempts.append(attempt) or _overhead(attempt))
    assert attempts == [1, 2, 3] and measured.decode_s == _overhead(3).decode_s
    assert (
        measured.busy
        == "machinery overhead: other processes used 100% of the machine's CPU in each of 3 attempts"
    )


# ------------------------------------------------------------------ implausible ratios


def test_a_ratio_below_one_that_persists_makes_the_profile_noisy(target, clock):
    # every T(1) takes 2 s longer than it should, in every round: T(k)/T(1) is about 0.4 for k >= 2,
    # which no verify pass can give (it reads the same weights for more tokens)
    curve, quality = _profile_with(target, clock, lambda call, k: ("slow", 2.0) if k == 1 else (None, 0))
    assert curve[0] == pytest.approx(forward_s(1) + 2.0) and quality.verdict == "noisy"
    assert quality.remeasured == [1, 2, 3, 4, 5, 6]
    assert (
        quality.notes[0].startswith("T_t(k)/T_t(1) = 0.36 at k = 2, ")
        and "physically implausible" in quality.notes[0]
    )
    assert quality.notes[-1].startswith("T_t(k)/T_t(1) = 0.36 at k = 2") and quality.notes[-1].endswith(
        "still implausible after re-measuring"
    )


def test_an_implausible_ratio_in_the_first_round_only_is_measured_again(target, clock):
    # a steady disturbance slows k = 4 by 9 s in every repeat of the first round (calls 0..29): its
    # repeats do not spread, but T(4)/T(1) = 9.7 > 1.5 x 4; the re-measured round is clean
    curve, quality = _profile_with(
        target, clock, lambda call, k: ("slow", 9.0) if call < 30 and k == 4 else (None, 0)
    )
    assert curve == pytest.approx(CLEAN_CURVE) and quality.verdict == "remeasured"
    assert quality.remeasured == [1, 4]
    assert quality.notes == [
        "T_t(k)/T_t(1) = 9.71 at k = 4: physically implausible (a pass over k tokens takes 0.9 to 1.5 k "
        "times a pass over one); re-measured"
    ]


def test_implausible_ratios_bounds():
    from analyzer.measuring.interference import implausible_ratios

    # within timer jitter (MIN_SPREAD_S, 10 ms under the tests) a tiny model's ratios prove nothing
    assert implausible_ratios([0.006, 0.002, 0.0099]) == {}
    assert implausible_ratios([0.006, 0.002], tolerance_s=0.0) == {2: pytest.approx(1 / 3)}

    assert implausible_ratios([1.0, 0.95, 1.2, 5.9]) == {}  # 5.9 <= 1.5 x 4
    assert implausible_ratios([1.0, 0.85, 1.2, 6.1]) == {2: pytest.approx(0.85), 4: pytest.approx(6.1)}
    assert implausible_ratios([2.0]) == {} and implausible_ratios([0.0, 1.0]) == {}


# ------------------------------------------------------------------ waiting for a quiet machine


class FakeMachine:
    """/proc/stat readings on a fake clock: ``shares`` are other processes' CPU share in each window
    (the last one repeats); ``sleep`` advances the clock and the busy jiffies by that share."""

    def __init__(self, shares):
        import os

        self.shares, self.now, self.busy, self.window = list(shares), 0.0, 0, 0
        self.ticks, self.cores = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1

    def reading(self):
        return self.busy, 0.0

    def sleep(self, seconds):
        share = self.shares[min(self.window, len(self.shares) - 1)]
        self.busy += int(round(share * seconds * self.ticks * self.cores))
        self.now += seconds
        self.window += 1

    def clock(self):
        return self.now


def _wait(machine, max_wait_s, lines):
    from analyzer.measuring.interference import wait_for_quiet

    return wait_for_quiet(
        max_wait_s,
        lambda done, total, line: lines.append((done, total, line)),
        reading=machine.reading,
        sleep=machine.sleep,
        clock=machine.clock,
    )


def test_a_busy_machine_is_waited_for_until_it_is_quiet():
    machine, lines = FakeMachine([0.51] * 12 + [0.05]), []
    waited = _wait(machine, 300, lines)
    assert (
        waited.quiet
        and waited.waited_s == pytest.approx(26.0)
        and waited.others_cpu == pytest.approx(0.05, abs=0.01)
    )
    line = "machine busy: others use 51%; waiting up to 5 min for a quiet window before profiling"
    assert lines == [
        (2, 300, line),
        (12, 300, line),
        (22, 300, line),
        (0, 0, "machine quiet after 26 s (others use 5%); profiling"),
    ]


def test_a_machine_that_stays_busy_is_waited_for_up_to_the_bound_then_profiled_with_a_note():
    machine, lines = FakeMachine([0.8]), []
    waited = _wait(machine, 60, lines)
    assert not waited.quiet and waited.waited_s == pytest.approx(60.0)
    assert waited.note == (
        "machine busy: other processes used 80% of its CPU after waiting 1 min for a quiet window; profiling went ahead"
    )
    assert [done for done, _, _ in lines] == [2, 12, 22, 32, 42, 52] and {total for _, total, _ in lines} == {
        60
    }


def test_a_quiet_machine_an_unreadable_one_or_no_bound_are_not_waited_for():
    from analyzer.measuring.interference import wait_for_quiet

    quiet, lines = FakeMachine([0.02]), []
    assert _wait(quiet, 300, lines).waited_s == pytest.approx(2.0) and lines == []  # one window judged
    busy = FakeMachine([0.9])
    assert _wait(busy, 0, lines) == interference.QuietWait(True, 0.0, None) and busy.now == 0.0
    slept = []
    unknown = wait_for_quiet(300, reading=lambda: (None, 0.0), sleep=slept.append)
    assert unknown.quiet and unknown.others_cpu is None and slept == []


# ------------------------------------------------------------------ neighbouring batch sizes


class ScriptedModels:
    """Stands in for a run's loaded models in :func:`analyzer.pricing.run_costs.profile_run_costs`: each cost
    measurement returns the next scripted T_t(1) for its batch size (a flat curve over k), as a cold
    GPU gave; nothing else is timed."""

    engine = "transformers"
    draft = None
    pad_id = 0

    def __init__(self, device: str, script: dict[int, list[float]]):
        from analyzer.models.devices import Placement

        self.device, self.script, self.calls = device, {b: list(v) for b, v in script.items()}, []
        self.target = type("Target", (), {"placement": Placement("cpu", "float32", device)})()

    def device_text(self):
        return self.device

    def dtype_text(self):
        return "bfloat16"

    def library_versions(self):
        return {}

    def profiling_plan(self, params):
        """As the transformers pair plans it (analyzer.engine.run_models.RunModels.profiling_plan)."""
        from analyzer.engine.engine_base import ProfilingPlan
        from analyzer.models.devices import run_batch_sizes

        placement = self.target.placement
        return ProfilingPlan(
            self.device,
            "bfloat16",
            self.device,
            "generate()",
            run_batch_sizes(params, placement),
            params.cost_mode,
        )

    def warmup_passes(self):
        return 1

    def measure_overhead(self, context, params, on_generate=None):
        from analyzer.engine.overhead import MachineryOverhead

        return MachineryOverhead(decode_s=0.0, round_s=0.0, new_tokens=8, repeats=1)

    # each token of context beyond the median prompt's adds this to every forward (a longer context measured
    # after the median prompt's does not take a scripted value)
    PER_CONTEXT_S = 0.0001

    def measure_costs(self, context, k_max, batch_size, on_repeat, *, on_draft_repeat, cost_mode):
        assert cost_mode == "eager"  # the run's mode reaches the engine (the default params' here)
        self.bases = getattr(self, "bases", {})
        base = self.bases.get(batch_size)
        if base is None or len(context) <= base[0]:
            t1 = self.script[batch_size].pop(0)
            self.calls.append(batch_size)
            self.bases[batch_size] = (len(context), t1)
        else:
            self.contexts = [*getattr(self, "contexts", []), len(context)]
            t1 = base[1] + self.PER_CONTEXT_S * (len(context) - base[0])
        return CostMeasurement(
            target_forward_s=[t1 * (1 + 0.01 * k) for k in range(k_max)],
            draft_step_s=0.001 + 0.00001 * len(context),
            device=self.device,
            threads=1,
            context_tokens=len(context),
            repeats=5,
            batch_size=batch_size,
            quality=TimingQuality(verdict="clean"),
        )


def _profiled(engine, db_url, models, prompts: bytes = b"one prompt\n", prompt_ids=None, max_new_tokens=8):
    from sqlalchemy import select

    from analyzer.analysis.run_records import RunParams, create_run
    from analyzer.db import make_session_factory
    from analyzer.orm import AnalysisRun, CostProfile
    from analyzer.pricing.run_costs import profile_run_costs
    from analyzer.prompts.prompt_sets import import_prompt_file

    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        import_prompt_file(session, "p", prompts, "p.txt")
        params = RunParams(
            gamma_max=3,
            profile_batch_sizes=(1, 4),
            device="cpu",
            dtype="float32",
            max_new_tokens=max_new_tokens,
        )
        run_id = create_run(session, "p", "hf:/models/t", "ngram", params).id
    lines = []
    ids = prompt_ids or [[1, 2, 3]]
    profile_run_costs(sessions, run_id, models, params, ids, lambda d, t, line: lines.append(line))
    with sessions() as session:
        profiles = {p.batch_size: p for p in session.scalars(select(CostProfile))}
        run = session.get(AnalysisRun, run_id)
        linked = {link.batch_size: link.cost_profile_id for link in run.batch_profiles}
        return (
            {b: (p.target_forward_s[0], p.quality, p.quality_notes) for b, p in profiles.items()},
            linked,
            lines,
        )


def test_a_cold_batch_1_step_slower_than_batch_4_is_measured_again(engine, db_url):
    models = ScriptedModels("cuda: NVIDIA H200, torch 2.11.0", {1: [0.248, 0.160], 4: [0.169]})
    profiles, linked, lines = _profiled(engine, db_url, models)
    assert models.calls == [1, 4, 1]  # batch 1 again, warm now
    assert profiles[1][:2] == (0.160, "clean") and profiles[4][:2] == (0.169, "clean")
    assert set(linked) == {1, 4}
    assert any(
        "at batch size 1 again: its T_t(1) is implausible next to batch size 4's" in line for line in lines
    )


def test_an_implausible_batch_step_that_persists_makes_both_profiles_noisy(engine, db_url):
    # on a GPU small batches read the same weights: batch 4 at 1.6 x batch 1 is as implausible
    models = ScriptedModels("cuda: NVIDIA H200, torch 2.11.0", {1: [0.100, 0.100], 4: [0.160]})
    profiles, _, _ = _profiled(engine, db_url, models)
    note = (
        "T_t(1) = 100.0 ms at batch size 1 against 160.0 ms at batch size 4, after measuring again: physically "
        "implausible (more than 25% apart the wrong way)"
    )
    assert profiles[1][1] == profiles[4][1] == "noisy"
    assert profiles[1][2][-1] == profiles[4][2][-1] == note


def test_on_a_cpu_a_larger_batch_may_cost_more_but_never_less():
    from analyzer.pricing.run_costs import implausible_batch_steps

    def measured(t1: float):
        return CostMeasurement(
            target_forward_s=[t1, t1], draft_step_s=0.0, device="cpu", threads=2, context_tokens=8, repeats=5
        )

    cpu = {1: measured(0.100), 4: measured(0.310), 16: measured(0.200)}
    assert implausible_batch_steps(cpu, on_gpu=False) == [(4, 16)]  # batch 4 slower than batch 16
    assert implausible_batch_steps(cpu, on_gpu=True) == [(1, 4), (4, 16)]
    assert implausible_batch_steps({1: measured(0.100), 4: measured(0.120)}, on_gpu=True) == []


def test_profiling_progress_plans_each_models_passes_and_shows_re_measurements_apart():
    """On a GPU each timed model makes GPU_WARMUP_ROUNDS + TIMED_REPEATS passes: the target's 5 passes
    re-measured go to a bar of their own, and the draft's passes after them count as planned ones."""
    from analyzer.measuring.cost import GPU_WARMUP_ROUNDS
    from analyzer.measuring.interference import EXTRA_ROUNDS
    from analyzer.models.devices import Placement
    from analyzer.pricing.run_costs import TIMED_REPEATS, _measure_cost_profile

    per_model = GPU_WARMUP_ROUNDS + TIMED_REPEATS

    class TwoModels:
        engine, draft = "transformers", object()
        target = type("Target", (), {"placement": Placement("cuda:0", "bfloat16", "H100")})()

        def warmup_passes(self):  # on a GPU, as the transformers pair warms up there
            return GPU_WARMUP_ROUNDS

        def measure_costs(self, context, k_max, batch_size, on_repeat, *, on_draft_repeat, cost_mode):
            for _ in range(per_model + TIMED_REPEATS):  # one round of re-measurement
                on_repeat()
            for _ in range(per_model):
                on_draft_repeat()
            return "measured"

    seen = []
    assert (
        _measure_cost_profile(TwoModels(), [1, 2], 3, 1, "phase", lambda *a: seen.append(a), "eager")
        == "measured"
    )
    extra = EXTRA_ROUNDS * TIMED_REPEATS * 2
    again = "phase: re-measuring what interference disturbed"
    assert seen == (
        [(0, 2 * per_model, "phase")]
        + [(n, 2 * per_model, "phase") for n in range(1, per_model + 1)]
        + [(n, extra, again) for n in range(1, TIMED_REPEATS + 1)]
        + [(n, 2 * per_model, "phase") for n in range(per_model + 1, 2 * per_model + 1)]
        + [(extra, extra, again)]
    )


def test_a_workload_whose_contexts_spread_is_profiled_again_over_its_longest_request(engine, db_url):
    """Median prompt 10 tokens, longest 200, 64 new tokens: each batch size is measured again over the
    longest request's mean context (200 + 32 - 4 = 228 tokens), and the profile keeps each T_t(k)'s slope per
    token of context, with which a prompt can be priced at its own lengths."""
    from sqlalchemy import select

    from analyzer.advice.summary import cost_for_run, cost_from_profile, costs_for_run
    from analyzer.db import make_session_factory
    from analyzer.orm import AnalysisRun, CostProfile

    models = ScriptedModels("cpu: Intel Xeon, torch 2.13.0, 2 threads", {1: [0.010], 4: [0.020]})
    ids = [list(range(10)), list(range(10)), list(range(200))]
    _, _, lines = _profiled(engine, db_url, models, b"a\nb\nc\n", prompt_ids=ids, max_new_tokens=64)
    assert models.calls == [1, 4] and models.contexts == [228, 228]
    assert any("over 228 tokens of context" in line for line in lines)
    with make_session_factory(engine)() as session:
        profiles = {p.batch_size: p for p in session.scalars(select(CostProfile))}
        assert {b: (p.context_tokens, p.long_context_tokens) for b, p in profiles.items()} == {
            1: (10, 228),
            4: (10, 228),
        }
        one = profiles[1]
        # every forward's slope (T_t(k) = t1 (1 + 0.01 (k - 1)), t1 growing 0.1 ms per token of context)
        assert one.context_slope_s == pytest.approx([0.0001 * (1 + 0.01 * k) for k in range(4)])
        assert one.draft_context_slope_s == pytest.approx(0.00001)
        # the run is priced with them, at every batch size (benchmarks/RESULTS.md: a mixed workload's
        # aggregate error 0.5-3.1% with them, 4.6-5.6% at one context)
        run = session.scalar(select(AnalysisRun))
        cost = cost_for_run(run)
        assert cost is not None and cost == cost_from_profile(one, "ngram")
        assert {b: c.target_context_slope_s for b, c in costs_for_run(run).items()} == {
            b: pytest.approx(p.context_slope_s) for b, p in profiles.items()
        }
        # at one context (the benchmark's baseline) every request costs the median prompt's step
        flat = cost_from_profile(one, "ngram", with_context=False)
        assert flat.for_request(1000, 64).decode_s == pytest.approx(0.010)
    # a request priced at its own mean context: a 1,000-token prompt's step costs 0.1 s more than at 10 tokens
    at_long = cost.for_request(1000, 64)
    assert at_long.decode_s == pytest.approx(0.010 + 0.0001 * (1032 - 10))
    assert cost.for_request(10, 0).decode_s == pytest.approx(0.010)
    # never below half the measured step, however short the prompt
    assert cost.at_context(-10_000).decode_s == pytest.approx(0.005)


def test_a_workload_of_one_length_is_profiled_at_one_context(engine, db_url):
    # 3-token prompts, 8 new tokens: the longest request's mean context is under 1.25 x the median prompt
    from sqlalchemy import select

    from analyzer.db import make_session_factory
    from analyzer.orm import CostProfile

    models = ScriptedModels("cpu: Intel Xeon, torch 2.13.0, 2 threads", {1: [0.010], 4: [0.020]})
    _profiled(engine, db_url, models)
    assert models.calls == [1, 4] and not hasattr(models, "contexts")
    with make_session_factory(engine)() as session:
        profiles = list(session.scalars(select(CostProfile)))
        assert [(p.long_context_tokens, p.context_slope_s) for p in profiles] == [(None, None)] * 2


def test_the_timed_forwards_are_scaled_to_the_ones_generation_runs():
    """generate()'s plain step took 0.95 of the timed T_t(1) and its 5-token forward 0.99 of T_t(5) (at the
    profile's context: no slopes): k = 1 and 5 take those ratios, k = 2..4 the ratios between, k = 6 and 7
    the largest seen k's."""
    from dataclasses import replace

    from analyzer.measuring.cost import CostMeasurement, calibrated_to_generate

    timed = [0.040, 0.042, 0.045, 0.050, 0.060, 0.065, 0.070]
    base = CostMeasurement(timed, 0.0001, "cpu", 2, context_tokens=100, repeats=5)
    calibrated = calibrated_to_generate(base, {1: 0.038, 5: 0.0594}, 100)
    ratios = [0.95, 0.96, 0.97, 0.98, 0.99, 0.99, 0.99]
    assert calibrated.target_forward_s == pytest.approx([t * r for t, r in zip(timed, ratios)])
    assert calibrated.generate_ratio == {1: 0.95, 5: 0.99}
    # one k seen: that k alone; a ratio no forward could have (a busy moment) calibrates nothing
    alone = calibrated_to_generate(base, {1: 0.038, 3: 0.2}, 100)
    assert alone.target_forward_s == pytest.approx([0.038, *timed[1:]]) and alone.generate_ratio == {1: 0.95}
    assert calibrated_to_generate(base, {}, 100) is base
    # seen over a longer cache: compared with the timed T_t(k) moved there along the slopes first
    sloped = replace(base, context_slope_s=[0.00001] * 7, long_context_tokens=1000)
    at_200 = calibrated_to_generate(sloped, {1: (0.040 + 0.00001 * 100) * 0.95}, 200)
    assert at_200.generate_ratio == {1: 0.95} and at_200.target_forward_s[0] == pytest.approx(0.040 * 0.95)
    # never decreasing in k: a 2-token forward is not priced below a 1-token one
    flat = CostMeasurement([0.040, 0.040, 0.041], 0.0, "cpu", 2, context_tokens=100, repeats=5)
    raised = calibrated_to_generate(flat, {1: 0.040, 2: 0.036}, 100)
    assert raised.target_forward_s == pytest.approx([0.040, 0.040, 0.040])
