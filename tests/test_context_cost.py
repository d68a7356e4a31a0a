"""The engine-neutral pieces of the llama-server analysis: a cost model with the context in it (fitted under physical
constraints, checked on prompts it was not fitted on), the machine's noise floor from pairs of identical runs,
calibration prompts that span the workload, and the three routing numbers (static, by task, oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.advice.routing_ceiling import routing_ceiling
from analyzer.measuring.calibration_choice import spanning_choice
from analyzer.measuring.noise import (
    MAX_NOISE_FLOOR,
    aggregate_half_width,
    noise_floor,
    sampled_half_width,
)
from analyzer.measuring.request_work import RequestWork, plain_work, round_rows_context
from analyzer.measuring.server_drafting import parse_drafter, replay_request
from analyzer.pricing.context_cost import (
    FIT_ERROR_MARGIN,
    StepCost,
    fit_error_bound,
    fit_plain,
    fit_problem,
    fit_rounds,
    fit_step_cost,
    fit_without,
    heldout_reach,
    heldout_reaches,
)
from analyzer.pricing.server_cost import ServerCost

TRUE = StepCost(
    step_ms=10.0,
    per_context_ms=0.02,
    round_ms=3.0,
    per_draft_ms=1.5,
    per_accepted_ms=0.4,
    per_row_context_ms=0.004,
)


def _spec_work(
    prompt: int, output: int, rounds: int, drafted_per_round: int, accepted_per_round: int
) -> RequestWork:
    """A request of ``output`` tokens after ``prompt``, ``rounds`` rounds at the start, the rest plain."""
    position, plain_steps, plain_context, round_context, row_context = prompt + 1, 0, 0, 0, 0
    produced = 1
    for _ in range(rounds):
        round_context += position
        row_context += round_rows_context(position, drafted_per_round)
        position += accepted_per_round + 1
        produced += accepted_per_round + 1
    while produced < output:
        plain_steps += 1
        plain_context += position
        position += 1
        produced += 1
    return RequestWork(
        plain_steps,
        plain_context,
        rounds,
        rounds * drafted_per_round,
        rounds * accepted_per_round,
        round_context,
        row_context=row_context,
    )


def _samples(cost: StepCost, rng: np.random.Generator, noise: float = 0.0):
    plain, spec = [], []
    for index, prompt in enumerate([20, 60, 150, 300, 600, 900, 1400, 2000]):
        work = plain_work(prompt, 64)
        plain.append((index, work, cost.plain_ms(work) * (1 + noise * rng.standard_normal())))
        for rounds, drafted, accepted in ((4, 8, 3), (10, 4, 2), (2, 16, 1)):
            work = _spec_work(prompt, 64, rounds, drafted, accepted)
            spec.append((index, work, cost.request_ms(work) * (1 + noise * rng.standard_normal())))
    return plain, spec


def test_plain_work_counts_every_step_over_its_context():
    # P = 10, N = 5: steps g = 1..4 attend over 11, 12, 13, 14 tokens
    assert plain_work(10, 5) == RequestWork(4, 50)
    assert plain_work(10, 1) == RequestWork(0, 0) and plain_work(0, 0) == RequestWork(0, 0)
    # a round of k = 3 drafted tokens whose first row sees 100 tokens: its other rows see 101 + 102 + 103
    assert round_rows_context(100, 3) == 306 and round_rows_context(7, 0) == 0


def test_the_replay_counts_the_context_a_plain_request_would():
    # a drafter that never drafts: its replay's work is exactly plain decoding's
    drafter = parse_drafter("ngram-simple 12/48")
    prompt, output = list(range(1000, 1040)), list(range(2000, 2030))
    replay = replay_request(drafter, prompt, output, n_predict=64, n_ctx=4096, eog_ids=frozenset())
    assert replay.rounds == () and replay.work() == plain_work(len(prompt), len(output))
    # a repeating output drafts; every step is either plain or a round, and the context sums follow
    output = [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7]
    drafter = parse_drafter("ngram-simple 2/4")
    replay = replay_request(drafter, [1, 2, 3], output, n_predict=64, n_ctx=4096, eog_ids=frozenset())
    work = replay.work()
    # every output token after the first comes from a plain step or a round (the last round may run past the end)
    assert work.rounds > 0 and work.plain_steps + work.rounds + work.accepted >= len(output) - 1
    assert (
        work.plain_context + work.round_context + work.row_context > plain_work(3, len(output)).plain_context
    )


def test_an_exact_cost_is_recovered_with_its_context_term():
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    fitted = fit_step_cost(plain, spec)
    assert fitted.context_fitted
    for name in (
        "step_ms",
        "per_context_ms",
        "round_ms",
        "per_draft_ms",
        "per_accepted_ms",
        "per_row_context_ms",
    ):
        assert getattr(fitted.cost, name) == pytest.approx(getattr(TRUE, name), rel=1e-4, abs=1e-6)
    assert fitted.fit_mare < 1e-6 and fitted.heldout_mare is not None and fitted.heldout_mare < 1e-6
    assert fitted.plain_heldout_mare is not None and fitted.plain_heldout_mare < 1e-6


def test_the_leave_one_out_fits_agree_on_exact_times_spread_with_noise_and_are_stored_with_the_cost():
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    exact = [fit_without(key, plain, spec) for key in range(8)]
    assert all(fit.step_ms == pytest.approx(TRUE.step_ms, rel=1e-4) for fit in exact)
    assert all(fit.round_ms == pytest.approx(TRUE.round_ms, rel=1e-3) for fit in exact)
    # the plain stage alone where no speculating request is given
    assert fit_without(3, plain, None).round_ms == 0.0
    plain, spec = _samples(TRUE, np.random.default_rng(1), noise=0.05)
    noisy = [fit_without(key, plain, spec) for key in range(8)]
    steps = np.asarray([fit.step_ms for fit in noisy])
    assert steps.std() > 1e-3 and abs(steps.mean() / TRUE.step_ms - 1) < 0.1
    cost = ServerCost.from_fit(fit_step_cost(plain, spec))
    stored = ServerCost(**{**cost.as_dict(), "refits": tuple(noisy)})
    again = ServerCost.from_stored({**stored.as_dict(), "bound": 0.1})
    assert again == stored and len(again.refits) == 8 and again.refits[2] == noisy[2]


def test_a_prompt_the_others_reach_only_by_extrapolating_may_miss_by_more_noise():
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    reaches = heldout_reaches(plain, spec)
    # prompts of 20 .. 2,000 tokens: the shortest and the longest, left out, are priced by extrapolating from
    # the others, the ones in the middle by interpolating
    assert list(reaches) == list(range(8)) and all(1.0 < r < 2.0 for r in reaches.values())
    assert reaches[0] > reaches[4] and reaches[7] > reaches[4] and reaches[4] < 1.1
    assert heldout_reach(plain, spec) == pytest.approx(float(np.median(list(reaches.values()))))
    # the only prompt whose drafts were ever rejected: without it nothing determines that term, so it is
    # reached only by extrapolating as far as can be, counted at leverage 3, sqrt(1 + 3) = 2
    accepted_all = [
        (key, _spec_work(prompt, 64, rounds, 4, 4 if key < 3 else 1), 0.0)
        for key, prompt in enumerate([50, 300, 900, 400])
        for rounds in (3, 6)
    ]
    priced = [(key, work, TRUE.request_ms(work)) for key, work, _ in accepted_all]
    plain_four = [s for s in plain if s[0] < 4]
    reached = heldout_reaches(plain_four, priced)
    assert reached[3] == pytest.approx(2.0) and all(reached[key] < 2.0 for key in range(3))
    # the bound takes one run's noise that many times; the fit carries the reach of the error it is checked on
    assert fit_error_bound(0.06, 1.5) == pytest.approx(FIT_ERROR_MARGIN + 0.09)
    fitted = fit_step_cost(plain, spec)
    assert fitted.heldout_reach == pytest.approx(heldout_reach(plain, spec))
    assert fitted.plain_heldout_reach == pytest.approx(heldout_reach(plain, []))
    cost = ServerCost.from_fit(fitted)
    assert cost.checked_reach in (fitted.heldout_reach, fitted.plain_heldout_reach)
    assert cost.bound(0.04) == pytest.approx(FIT_ERROR_MARGIN + 0.04 * cost.checked_reach)
    # under three prompts nothing is held out: reach 1, the bound as for requests the fit was made on
    assert heldout_reach(plain[:2], [s for s in spec if s[0] < 2]) == 1.0


def test_without_the_context_term_long_prompts_are_mispriced():
    # the model without context (the step's time the same at every length) misses long prompts
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    flat = [
        (key, RequestWork(w.plain_steps, 0, w.rounds, w.drafted, w.accepted, 0), ms) for key, w, ms in spec
    ]
    flat_plain = [(key, RequestWork(w.plain_steps, 0), ms) for key, w, ms in plain]
    without = fit_step_cost(flat_plain, flat)
    with_context = fit_step_cost(plain, spec)
    assert not without.context_fitted  # no spread of context to fit: the term is 0
    assert without.heldout_mare is not None and without.heldout_mare > 0.1
    assert with_context.heldout_mare is not None and with_context.heldout_mare < 0.001


def test_the_fit_stays_physical_when_the_data_say_otherwise():
    # measured times in which accepting a token "costs" 2.5 steps (noise, or a machine that changed speed)
    bent = StepCost(step_ms=10.0, per_context_ms=0.0, round_ms=0.0, per_draft_ms=1.0, per_accepted_ms=25.0)
    # (an accepted token at 26 ms against a 10 ms step)
    plain, spec = _samples(bent, np.random.default_rng(1))
    cost = fit_rounds(fit_plain(plain)[0], spec)
    # clamped: an accepted token (drafted and accepted) costs at most the step it saves
    assert cost.per_draft_ms + cost.per_accepted_ms == pytest.approx(cost.step_ms)
    assert min(cost.round_ms, cost.per_draft_ms, cost.per_context_ms) >= 0
    assert 0 <= cost.per_row_context_ms <= cost.per_context_ms
    assert cost.round_ms_at(4, 500) >= cost.round_ms_at(1, 500) >= cost.step_ms + cost.per_context_ms * 500


def test_a_term_no_request_has_is_not_fitted_and_costs_nothing():
    """Calibration runs in which every drafted token was accepted time no rejected token: its cost is not
    fitted (0, not the arbitrary point of its bounds scipy's solver left it at, with a RuntimeWarning about
    an invalid value), and the other terms are the fit without that term."""
    import warnings

    all_accepted = StepCost(
        step_ms=10.0, per_context_ms=0.0, round_ms=3.0, per_draft_ms=1.5, per_accepted_ms=0.4
    )
    plain, spec = [], []
    for index, prompt in enumerate([20, 60, 150]):
        work = plain_work(prompt, 64)
        plain.append((index, work, all_accepted.plain_ms(work)))
        for rounds, drafted in ((4, 3), (10, 2), (2, 1)):
            work = _spec_work(prompt, 64, rounds, drafted, drafted)  # every drafted token accepted
            spec.append((index, work, all_accepted.request_ms(work) * (1.03 if rounds == 10 else 1.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's RuntimeWarning fails the test
        cost = fit_rounds(fit_plain(plain)[0], spec)
    assert cost.per_draft_ms == 0.0  # a rejected token's cost: no request had one
    # an accepted token's cost (per_draft_ms + per_accepted_ms) and the round's are fitted from the rest
    assert cost.per_accepted_ms > 0 and cost.round_ms > 0
    assert cost.per_draft_ms + cost.per_accepted_ms <= cost.step_ms


def test_a_fit_of_collinear_terms_warns_of_nothing():
    """Three runs for four terms, two of them collinear (drafted and accepted counts that move together): scipy's
    solver computed 0 * inf in a step it then discarded, and numpy's RuntimeWarning ("invalid value
    encountered in multiply") would reach the user's console; the fit is finite and warns of nothing."""
    import warnings

    from scipy.optimize import nnls

    from analyzer.pricing.context_cost import _bounded_fit

    design = np.array([[0.06, 0.12, 0.97, 0.84], [0.01, 0.02, 0.59, 0.89], [0.5, 1.0, 0.93, 0.95]])
    target = np.array([0.05, 0.84, 0.74])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coef = _bounded_fit(design, target, np.full(4, np.inf), np.ones(3))
    # the non-negative least squares optimum (scipy's NNLS): the same residual, the same third and fourth terms
    # (the third at its bound, 0) and the same sum the two collinear terms make (column 1 is twice column 0)
    best, residual = nnls(design, target)
    assert np.all(np.isfinite(coef))
    assert np.linalg.norm(design @ coef - target) == pytest.approx(residual, rel=1e-9)
    assert coef[2] == pytest.approx(best[2], abs=1e-9) and best[2] == 0.0
    assert coef[3] == pytest.approx(best[3], rel=1e-6) and best[3] > 0.5
    assert coef[0] + 2 * coef[1] == pytest.approx(best[0] + 2 * best[1], rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    step=st.floats(1.0, 50.0),
    per_context=st.floats(0.0, 0.05),
    round_extra=st.floats(0.0, 20.0),
    per_draft=st.floats(0.0, 5.0),
    accepted_share=st.floats(0.0, 1.0),
    noise=st.floats(0.0, 0.1),
    seed=st.integers(0, 1000),
)
def test_every_fitted_cost_is_physically_possible(
    step, per_context, round_extra, per_draft, accepted_share, noise, seed
):
    truth = StepCost(
        step, per_context, round_extra, per_draft, accepted_share * step, per_row_context_ms=per_context / 4
    )
    plain, spec = _samples(truth, np.random.default_rng(seed), noise)
    cost = fit_step_cost(plain, spec).cost
    values = [cost.step_ms, cost.per_context_ms, cost.round_ms, cost.per_draft_ms]
    assert all(v >= 0 for v in values)
    assert (
        -1e-9 <= cost.per_draft_ms + cost.per_accepted_ms <= cost.step_ms + 1e-9
    )  # an accepted token's cost
    assert 0 <= cost.per_row_context_ms <= cost.per_context_ms + 1e-12
    for position in (10, 1000):
        assert cost.round_ms_at(8, position) >= cost.round_ms_at(1, position) >= cost.step_ms


def test_a_fit_over_its_bound_is_refused_with_the_numbers():
    rng = np.random.default_rng(3)
    plain, spec = _samples(TRUE, rng)
    # every other prompt's speculating runs took 2.5 times as long (a machine that changed speed under it)
    spec = [(key, work, ms * (2.5 if key % 2 else 1.0)) for key, work, ms in spec]
    fitted = fit_step_cost(plain, spec)
    bound = fit_error_bound(0.02)
    assert bound == pytest.approx(FIT_ERROR_MARGIN + 0.02) and fit_error_bound(None) == FIT_ERROR_MARGIN
    problem = fit_problem(fitted.checked_error, bound, "n-gram")
    assert fitted.heldout_mare is not None and fitted.heldout_mare > bound
    assert problem == (
        f"the n-gram step costs miss the measured time by {fitted.checked_error:.1%} on prompts it was not fitted "
        f"on (bound {bound:.1%}: 5% beyond one run's noise on this machine)"
    )
    assert fit_problem(fit_step_cost(*_samples(TRUE, rng)).checked_error, bound, "n-gram") is None
    assert fit_problem(0.3, 0.1, "x", heldout=False) == (
        "the x step costs miss the measured time by 30.0% in-sample "
        "(bound 10.0%: 5% beyond one run's noise on this machine)"
    )
    assert fit_problem(0.3, 0.14, "x", reach=1.8) == (
        "the x step costs miss the measured time by 30.0% on prompts it was not fitted on (bound 14.0%: 5% beyond "
        "one run's noise on this machine, that noise taken 1.80 times for how far the fits without each prompt "
        "reach to it)"
    )


def test_too_few_prompts_cannot_be_checked_and_no_round_is_an_error():
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    two = fit_step_cost([s for s in plain if s[0] < 2], [s for s in spec if s[0] < 2])
    assert two.heldout_mare is None and two.plain_heldout_mare is None
    assert two.checked_error == max(two.fit_mare, two.plain_fit_mare)
    with pytest.raises(ValueError, match="no round was timed"):
        fit_rounds(fit_plain(plain)[0], [(0, RequestWork(10, 100), 50.0)])
    with pytest.raises(ValueError, match="no step was timed"):
        fit_plain([(0, RequestWork(0, 0), 5.0)])


def test_the_noise_floor_of_identical_runs():
    rng = np.random.default_rng(7)
    sigma = 0.04
    truth = rng.uniform(5, 20, size=4000)
    first = truth * np.exp(sigma * rng.standard_normal(4000))
    second = truth * np.exp(sigma * rng.standard_normal(4000))
    floor = noise_floor(first, second, steal=0.002, mhz_spread=0.0)
    # |log a/b| ~ |N(0, 2 sigma^2)|: mean 2 sigma / sqrt(pi); one run's error sigma sqrt(2 / pi)
    assert floor.floor == pytest.approx(2 * sigma / math.sqrt(math.pi), rel=0.05)
    assert floor.run_error == pytest.approx(sigma * math.sqrt(2 / math.pi), rel=0.05)
    assert floor.p10 is not None and floor.p90 is not None and floor.p10 < 1 < floor.p90
    assert floor.verdict == "quiet" and floor.notes == [] and floor.pairs == 4000
    assert floor.floor_for(4) == pytest.approx(floor.floor / 2)
    noisy = noise_floor(first * np.exp(0.3 * rng.standard_normal(4000)), second)
    assert noisy.floor is not None and noisy.floor > MAX_NOISE_FLOOR and noisy.verdict == "noisy"
    assert "too noisy to time advice on" in noisy.notes[-1]
    stolen = noise_floor(first, second, steal=0.2)
    assert (
        stolen.verdict == "noisy" and stolen.notes[0] == "the hypervisor took 20.0% of the CPU time (steal)"
    )
    assert noise_floor([1.0], [1.1]).verdict == "unknown"


def test_the_aggregate_interval_narrows_with_the_square_root_of_passes_and_of_even_prompts():
    # one run's error 2% (sigma 2.5%): a pair's log ratio has sd 3.5%, 95%: 1.96 x 3.5% = 6.93% for one prompt
    sigma = 0.02 * math.sqrt(math.pi / 2)
    assert aggregate_half_width(0.02, [1.0], 1) == pytest.approx(1.959964 * math.sqrt(2) * sigma)
    weights = [1.0] * 25
    one = aggregate_half_width(0.02, weights, 1)
    assert one == pytest.approx(aggregate_half_width(0.02, [1.0], 1) / 5)
    assert aggregate_half_width(0.02, weights, 4) == pytest.approx(one / 2)
    assert sampled_half_width(0.02, weights, [4] * 25) == pytest.approx(one / 2)
    # one prompt of three carrying most of the time decides the width; its extra passes narrow it most
    uneven = [8.0, 1.0, 1.0]
    assert sampled_half_width(0.02, uneven, [1, 1, 1]) == pytest.approx(aggregate_half_width(0.02, uneven, 1))
    assert sampled_half_width(0.02, uneven, [4, 1, 1]) < sampled_half_width(0.02, uneven, [1, 4, 4])
    assert sampled_half_width(0.02, [], []) == math.inf


def test_calibration_prompts_span_lengths_and_draft_rates():
    rng = np.random.default_rng(0)
    # 40 short prompts that draft little first, then the long and the drafting ones
    lengths = np.concatenate([rng.uniform(20, 80, 40), [1500, 2500, 300, 900, 60]])
    drafts = np.concatenate([rng.uniform(0, 0.05, 40), [0.1, 0.0, 0.8, 0.5, 0.9]])
    features = np.column_stack([np.log(lengths), drafts])
    chosen = spanning_choice(features, 6)
    assert len(chosen) == 6 and chosen == sorted(chosen)
    assert int(np.argmax(lengths)) in chosen and int(np.argmax(drafts)) in chosen  # both extremes
    assert sum(i >= 40 for i in chosen) >= 3  # not the first six
    assert spanning_choice(features, 100) == list(range(45)) and spanning_choice(features, 0) == []
    assert spanning_choice(np.zeros((5, 2)), 2) == [0, 1]  # all alike: the earliest rows


def test_static_by_task_and_oracle():
    tasks = ["a"] * 4 + ["b"] * 4
    plain = [10.0] * 8
    options = np.array([[8, 12], [8, 12], [9, 12], [12, 5], [12, 5], [12, 5], [12, 5], [10, 10]], dtype=float)
    rows = {c.group: c for c in routing_ceiling(tasks, plain, options, ["x", "y"], min_speedup=1.05)}
    overall = rows["all"]
    assert overall.static == pytest.approx(80 / 66) and overall.static_option == "y"
    assert overall.by_task == pytest.approx(80 / 62) and overall.task_options == {"a": "x", "b": "y"}
    assert overall.oracle == pytest.approx(80 / 55)
    assert rows["a"].static == pytest.approx(40 / 41)  # the workload's option on task a
    assert rows["a"].by_task == pytest.approx(40 / 37) and rows["a"].oracle == pytest.approx(40 / 30)
    for row in rows.values():
        for value, (low, high) in (
            (row.static, row.static_interval),
            (row.by_task, row.by_task_interval),
            (row.oracle, row.oracle_interval),
        ):
            assert low <= value + 1e-12 and value <= high + 1e-12
    # an option that only ties plain is not chosen under the margin; the oracle never goes below plain
    flat = routing_ceiling(["a", "a"], [10.0, 10.0], np.array([[10.0], [11.0]]), ["z"], min_speedup=1.05)
    assert flat[-1].static == 1.0 and flat[-1].static_option is None and flat[-1].oracle == 1.0
    with pytest.raises(ValueError):
        routing_ceiling(["a"], [1.0], np.zeros((1, 0)), [], min_speedup=1.05)


def test_one_run_that_noise_brought_near_plain_does_not_decide_the_round_terms():
    # a request whose one small round the noise hid (measured 0.3 ms above its plain part): weighted by that
    # residual instead of its measured time, it outweighed every other request and set each round term to 0
    plain, spec = _samples(TRUE, np.random.default_rng(0))
    work = _spec_work(900, 64, 1, 1, 0)
    known = TRUE.step_ms * (work.plain_steps + work.rounds) + TRUE.per_context_ms * (
        work.plain_context + work.round_context
    )
    cost = fit_rounds(fit_plain(plain)[0], [*spec, ("hidden", work, known + 0.3)])
    assert cost.round_ms == pytest.approx(TRUE.round_ms, rel=0.1)
    assert cost.per_draft_ms == pytest.approx(TRUE.per_draft_ms, rel=0.1)
    assert cost.per_row_context_ms == pytest.approx(TRUE.per_row_context_ms, rel=0.2)


def test_a_runs_validation_reports_the_machines_noise_and_the_aggregate_beside_it():
    from analyzer.advice.report import validation_summary

    def row(greedy, speculative, predicted):
        return {
            "outputs_identical": True,
            "replay_identical": True,
            "passes_error_pct": 0.0,
            "disturbed": False,
            "greedy_times_s": greedy,
            "speculative_times_s": speculative,
            "greedy_time_s": float(np.median(greedy)),
            "speculative_time_s": float(np.median(speculative)),
            "measured_speedup": float(np.median(greedy) / np.median(speculative)),
            "predicted_speedup": predicted,
        }

    rows = [
        row([1.00, 1.02], [0.50, 0.51], 2.00),  # measured 1.98: within noise
        row([2.00, 1.96], [2.00, 2.00], 1.00),  # measured 0.99
        row([4.00, 4.04], [2.70, 2.66], 1.80),  # measured 1.5: 20% off
    ]
    summary = validation_summary(rows)
    logs = [abs(math.log(1.00 / 1.02)), abs(math.log(2.00 / 1.96)), abs(math.log(4.00 / 4.04))]
    assert summary["noise_pairs"] == 3
    assert summary["noise_floor_pct"] == pytest.approx(100 * np.mean(logs))
    # time-weighted: summed greedy over summed speculative; predicted over each prompt's greedy / prediction
    greedy = [1.01, 1.98, 4.02]
    speculative = [0.505, 2.00, 2.68]
    assert summary["aggregate_measured"] == pytest.approx(sum(greedy) / sum(speculative))
    predicted = sum(greedy) / (1.01 / 2.0 + 1.98 / 1.0 + 4.02 / 1.8)
    assert summary["aggregate_predicted"] == pytest.approx(predicted)
    assert summary["aggregate_error_pct"] == pytest.approx(
        100 * abs(predicted / summary["aggregate_measured"] - 1)
    )
    assert summary["within_noise"] == pytest.approx(2 / 3)  # the third prompt is 20% off
    assert summary["correlation"] == pytest.approx(
        np.corrcoef([2.0, 1.0, 1.8], [1.01 / 0.505, 0.99, 4.02 / 2.68])[0, 1]
    )
    # a run validated before each run was kept: no pairs, no floor, the rest still given
    old = validation_summary([{**r, "greedy_times_s": None} for r in rows])
    assert (
        old["noise_floor_pct"] is None
        and old["within_noise"] is None
        and old["aggregate_measured"] is not None
    )
    assert summary["noise_verdict"] == "quiet" and summary["steal_pct"] is None
    # the hypervisor took 20% of the CPU while validating: the figures cannot judge the advice, and say so
    stolen = validation_summary([{**r, "steal_share": 0.2} for r in rows])
    assert stolen["steal_pct"] == pytest.approx(20.0) and stolen["noise_verdict"] == "noisy"
    assert any("steal" in note for note in stolen["noise_notes"])
    # the bound every fit is held to: 5 points beyond one run's noise (floor / sqrt 2); the third prompt's 20%
    # puts the aggregate 9.9% off, over it; predictions 2% high are not
    assert summary["aggregate_bound_pct"] == pytest.approx(100 * (0.05 + np.mean(logs) / math.sqrt(2)))
    assert (
        summary["aggregate_error_pct"] == pytest.approx(9.9, abs=0.1) and summary["aggregate_missed"] is True
    )
    close = validation_summary([{**r, "predicted_speedup": 1.02 * r["measured_speedup"]} for r in rows])
    assert close["aggregate_missed"] is False and close["aggregate_error_pct"] == pytest.approx(2.0)
