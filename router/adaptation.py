"""Online adaptation of a task's policy from engine feedback.

Each task keeps a Beta posterior of alpha: a fixed prior from the analysis (mean alpha_prior,
``prior_strength`` pseudo-tokens) plus exponentially decayed evidence. A feedback event gives counts
(rounds, drafted, accepted); under i.i.d. acceptance a round accepts a ~ min(Geometric, g) tokens and
ends with a rejection with probability 1 - alpha^g, so the event adds ``accepted`` successes and the
expected number of rejecting rounds as failures, with alpha solved from accepted / rounds =
alpha (1 - alpha^g) / (1 - alpha).

The speedup curve in force is the one the analysis measured and published, S_pub(g) (real match
sequences, the device's cost per round), moved by the posterior: a round's cost does not depend on
alpha, only the tokens it yields do, so

    S(g) = S_pub(g) * E_iid(alpha_post, g) / E_iid(alpha_prior, g),   E_iid(a, g) = (1 - a^(g+1)) / (1 - a),

which is the published curve itself until feedback moves alpha (the i.i.d. formula is used only
where nothing was published). gamma = argmax S(g). Speculation turns off when S(g*) falls below
1 + off_margin and on again only above 1 + on_margin (hysteresis), and while off every
``probe_every``-th request speculates at the current gamma so that evidence keeps arriving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from analyzer.acceptance import expected_tokens_iid
from analyzer.speedup import Cost, best_gamma, iid_speedup


@dataclass(frozen=True)
class AdaptationConfig:
    """Knobs of the online estimate (see the module docstring)."""

    prior_strength: float = 50.0
    decay: float = 0.97
    on_margin: float = 0.05
    off_margin: float = 0.0
    probe_every: int = 20
    gamma_max: int = 16


@dataclass(frozen=True)
class TaskState:
    """The online state of one task: Beta(a, b) of alpha, the decision in force, the published S(g)
    curve it moves, and running totals."""

    beta_a: float
    beta_b: float
    speculate: bool
    gamma: int
    prior_alpha: float
    published_curve: tuple[float, ...] = ()  # S_pub(g) at g = 1..G (NaN where not finite)
    events: int = 0
    requests_while_off: int = 0
    total_rounds: int = 0
    total_drafted: int = 0
    total_accepted: int = 0

    @property
    def alpha(self) -> float:
        return self.beta_a / (self.beta_a + self.beta_b)


def alpha_from_round_counts(rounds: int, accepted: int, gamma: float) -> float:
    """The alpha whose i.i.d. expected accepted drafts per round, alpha (1 - alpha^g) / (1 - alpha),
    equals accepted / rounds (bisection; 0 for no acceptance, 1 when every draft was accepted)."""
    if rounds <= 0 or gamma <= 0:
        return float("nan")
    target = min(accepted / rounds, gamma)
    if target <= 0:
        return 0.0
    if target >= gamma - 1e-12:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens_iid(mid, gamma) - 1.0 < target:  # E[tokens] - 1 = E[accepted]
            low = mid
        else:
            high = mid
    return (low + high) / 2


def initial_state(prior_alpha: float, published_speculate: bool, published_gamma: int,
                  published_curve: tuple[float, ...], config: AdaptationConfig) -> TaskState:
    """The state before any feedback: the analysis' alpha as a prior of ``prior_strength`` tokens,
    its decision, and its measured S(g) curve."""
    alpha = float(np.clip(prior_alpha, 1e-3, 1 - 1e-3))
    return TaskState(beta_a=alpha * config.prior_strength, beta_b=(1 - alpha) * config.prior_strength,
                     speculate=published_speculate, gamma=max(published_gamma, 1), prior_alpha=alpha,
                     published_curve=tuple(published_curve))


def speedup_curve(state: TaskState, cost: Cost, gamma_max: int) -> np.ndarray:
    """S(g) for g = 1..G under the posterior alpha, shape (G,) with G = min(gamma_max, the
    profiled lookaheads, the published curve's length): the published curve scaled by
    E_iid(alpha_post, g) / E_iid(alpha_prior, g) (see the module docstring); NaN where the published
    value is not finite. Without a published curve: the i.i.d. prediction with ``cost``."""
    top = min(gamma_max, len(cost.target_forward_s) - 1)
    published = np.asarray(state.published_curve[:top], dtype=np.float64)
    if not np.isfinite(published).any():
        return np.array([iid_speedup(state.alpha, g, cost) for g in range(1, top + 1)])
    gammas = range(1, len(published) + 1)
    scale = np.array([expected_tokens_iid(state.alpha, g) / expected_tokens_iid(state.prior_alpha, g) for g in gammas])
    return published * scale


def speedup_at(state: TaskState, gamma: int, cost: Cost, gamma_max: int) -> float:
    """S(gamma) under the posterior alpha, the one point of :func:`speedup_curve` (it is on the
    router's decision path: no whole curve per request); NaN outside the curve."""
    top = min(gamma_max, len(cost.target_forward_s) - 1)
    published = state.published_curve[:top]
    if not 1 <= gamma <= top:
        return float("nan")
    if any(math.isfinite(v) for v in published):
        if gamma > len(published):
            return float("nan")
        return float(published[gamma - 1] * expected_tokens_iid(state.alpha, gamma)
                     / expected_tokens_iid(state.prior_alpha, gamma))
    return float(iid_speedup(state.alpha, gamma, cost))


def apply_feedback(state: TaskState, rounds: int, drafted: int, accepted: int, cost: Cost,
                   config: AdaptationConfig) -> TaskState:
    """The state after one feedback event (counts from a speculative generation)."""
    totals = dict(events=state.events + 1, total_rounds=state.total_rounds + rounds,
                  total_drafted=state.total_drafted + drafted, total_accepted=state.total_accepted + accepted)
    if rounds <= 0 or drafted <= 0:
        return replace(state, **totals)
    gamma_used = drafted / rounds
    alpha_hat = alpha_from_round_counts(rounds, accepted, gamma_used)
    rejections = rounds * (1.0 - alpha_hat ** gamma_used)
    prior_a = state.prior_alpha * config.prior_strength
    prior_b = (1 - state.prior_alpha) * config.prior_strength
    beta_a = prior_a + config.decay * (state.beta_a - prior_a) + accepted
    beta_b = prior_b + config.decay * (state.beta_b - prior_b) + rejections
    updated = replace(state, beta_a=beta_a, beta_b=beta_b, **totals)
    return decide(updated, cost, config)


def decide(state: TaskState, cost: Cost, config: AdaptationConfig) -> TaskState:
    """Re-choose gamma = argmax S(g) and switch speculation with hysteresis."""
    g_best, best_speedup = best_gamma(speedup_curve(state, cost, config.gamma_max))
    if g_best == 0:
        return state
    speculate = state.speculate
    if speculate and best_speedup < 1.0 + config.off_margin:
        speculate = False
    elif not speculate and best_speedup > 1.0 + config.on_margin:
        speculate = True
    return replace(state, gamma=g_best, speculate=speculate,
                   requests_while_off=0 if speculate else state.requests_while_off)


def next_request(state: TaskState, config: AdaptationConfig) -> tuple[TaskState, bool, int]:
    """(new state, speculate?, gamma) for the next request of this task: the decision in force, or
    a probe at the current gamma on every ``probe_every``-th request while speculation is off."""
    if state.speculate:
        return state, True, state.gamma
    count = state.requests_while_off + 1
    probe = config.probe_every > 0 and count % config.probe_every == 0
    return replace(state, requests_while_off=count), probe, state.gamma
