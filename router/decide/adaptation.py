"""Online adaptation of a task's policy from engine feedback.

Each task keeps a Beta posterior of alpha: a fixed prior from the analysis (mean alpha_prior,
``prior_strength`` pseudo-tokens) plus exponentially decayed evidence. A feedback event gives counts
(rounds, drafted, accepted); under i.i.d. acceptance a round accepts a ~ min(Geometric, g) tokens and
ends with a rejection with probability 1 - alpha^g, so the event adds ``accepted`` successes and the
expected number of rejecting rounds as failures, with alpha solved from accepted / rounds =
alpha (1 - alpha^g) / (1 - alpha).

The speedup curve in force is the one the analysis measured and published, S_pub(g) (real match
sequences, the device's cost per round), moved by the posterior as the policy's
:class:`analyzer.pricing.policy_curve.PolicyCurve` rescales it:

    S(g) = S_pub(g) * E_iid(alpha_post, g) / E_iid(alpha_prior, g),   E_iid(a, g) = (1 - a^(g+1)) / (1 - a),

which is the published curve itself until feedback moves alpha (the i.i.d. formula is used only
where nothing was published). gamma = argmax S(g) over the gammas the run analysed. Speculation follows
the policy curve's one rule with hysteresis (:meth:`analyzer.pricing.policy_curve.PolicyCurve.decide`): it turns
off when S(g*) falls below 1 + off_margin, and on again only where the analysis would turn it on (S(g*)
above 1 + the set's margin and the interval's lower end, scaled to the posterior, above 1.0); while off
every ``probe_every``-th request speculates at the current gamma so that evidence keeps arriving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.pricing.policy_curve import BASE, PolicyCurve
from router.policies.policy import PRIOR_ALPHA_RANGE

SMALLEST_GAMMA = 1  # what a probe drafts for a policy published without a g* (NO_GAMMA)


@dataclass(frozen=True)
class AdaptationConfig:
    """Knobs of the online estimate (see the module docstring). Where speculation turns back on, and
    over which gammas, is the policy curve's (its set's margin and gamma_max), not a knob here."""

    prior_strength: float = 50.0
    decay: float = 0.97
    off_margin: float = 0.0
    probe_every: int = 20


@dataclass(frozen=True)
class TaskState:
    """The online state of one task: Beta(a, b) of alpha, the decision in force and running totals
    (the published S(g) it moves is the policy's :class:`PolicyCurve`; under a llama-server set the
    setting in force and each setting's feedback times, :mod:`router.decide.server_adaptation`)."""

    beta_a: float
    beta_b: float
    speculate: bool
    gamma: int
    prior_alpha: float
    events: int = 0
    requests_while_off: int = 0
    total_rounds: int = 0
    total_drafted: int = 0
    total_accepted: int = 0
    # under a llama-server set (router/decide/server_adaptation.py): the setting in force (None: off) and per
    # setting [decayed plain ms, decayed served ms, events]; None under a run's set
    setting: str | None = None
    options: dict[str, list[float]] | None = None

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


def initial_state(
    prior_alpha: float, published_speculate: bool, published_gamma: int, config: AdaptationConfig
) -> TaskState:
    """The state before any feedback: the analysis' alpha as a prior of ``prior_strength`` tokens,
    and its decision."""
    alpha = float(np.clip(prior_alpha, *PRIOR_ALPHA_RANGE))
    return TaskState(
        beta_a=alpha * config.prior_strength,
        beta_b=(1 - alpha) * config.prior_strength,
        speculate=published_speculate,
        gamma=max(published_gamma, SMALLEST_GAMMA),
        prior_alpha=alpha,
    )


def count_event(state: TaskState, rounds: int, drafted: int, accepted: int) -> TaskState:
    """``state`` with one more event and its counts in the running totals."""
    return replace(
        state,
        events=state.events + 1,
        total_rounds=state.total_rounds + rounds,
        total_drafted=state.total_drafted + drafted,
        total_accepted=state.total_accepted + accepted,
    )


def apply_feedback(
    state: TaskState, rounds: int, drafted: int, accepted: int, curve: PolicyCurve, config: AdaptationConfig
) -> TaskState:
    """The state after one feedback event (counts from a speculative generation)."""
    counted = count_event(state, rounds, drafted, accepted)
    if rounds <= 0 or drafted <= 0:
        return counted
    gamma_used = drafted / rounds
    alpha_hat = alpha_from_round_counts(rounds, accepted, gamma_used)
    rejections = rounds * (1.0 - alpha_hat**gamma_used)
    prior_a = state.prior_alpha * config.prior_strength
    prior_b = (1 - state.prior_alpha) * config.prior_strength
    beta_a = prior_a + config.decay * (state.beta_a - prior_a) + accepted
    beta_b = prior_b + config.decay * (state.beta_b - prior_b) + rejections
    return decide(replace(counted, beta_a=beta_a, beta_b=beta_b), curve, config)


def decide(state: TaskState, curve: PolicyCurve, config: AdaptationConfig) -> TaskState:
    """Re-choose gamma = argmax S(g) of the policy's base curve under the posterior alpha, and switch
    speculation by the policy curve's one rule with hysteresis (:meth:`PolicyCurve.decide` with
    ``hold``): on only when S(g*) clears 1 + the set's margin and the interval's lower end, scaled to
    the posterior, clears 1.0; off once S(g*) falls below 1 + ``off_margin``."""
    point = curve.decide(
        BASE, state.alpha, state.prior_alpha, hold=state.speculate, off_margin=config.off_margin
    )
    if point is None or point.gamma is None:
        return state
    speculate = point.speculate
    return replace(
        state,
        gamma=point.gamma,
        speculate=speculate,
        requests_while_off=0 if speculate else state.requests_while_off,
    )


def next_request(state: TaskState, config: AdaptationConfig) -> tuple[TaskState, bool, int]:
    """(new state, speculate?, gamma) for the next request of this task: the decision in force, or
    a probe at the current gamma on every ``probe_every``-th request while speculation is off."""
    if state.speculate:
        return state, True, state.gamma
    count = state.requests_while_off + 1
    probe = config.probe_every > 0 and count % config.probe_every == 0
    return replace(state, requests_while_off=count), probe, state.gamma
