"""Where a policy set's costs come from, and so how feedback moves its tasks' estimates: one interface
(:class:`TaskEstimator`), one implementation per cost source, chosen once from the set (:func:`estimator_of`).
The decision (router/decide/decision.py), the feedback (router/decide/feedback.py) and the service ask the set's
estimator; none of them tells the kinds of analysis apart.

- :class:`CurveEstimator`: a set whose options are a run's gammas, priced by a measured (or imported) cost
  profile. Feedback's draft counts move the acceptance posterior, and the policy curve reprices every gamma
  under it (:mod:`router.decide.adaptation`).
- :class:`TimingEstimator`: a set whose options are llama-server settings, priced by the step cost fitted from
  the servers' timings. Feedback's timings move each published setting's estimate
  (:mod:`router.decide.server_adaptation`).

A set with neither (a run published without a cost profile) has no estimator: it takes no feedback."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from analyzer.pricing.policy_curve import BASE, PolicyCurve
from analyzer.pricing.speedup import Cost
from router.decide.adaptation import AdaptationConfig, TaskState, apply_feedback, count_event, initial_state
from router.decide.feedback_formats import FeedbackCounts, FeedbackError
from router.decide.server_adaptation import (
    OptionPrior,
    PlainCost,
    apply_server_feedback,
    choose_setting,
    estimate,
    initial_server_state,
    option_priors,
    prior_weight_ms,
    setting_gamma,
)
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot

_Entry = TypeVar("_Entry")


class UnknownSetting(FeedbackError):
    """Feedback names a llama-server setting the policy set publishes no pool for."""

    code = "unknown_setting"


@dataclass(frozen=True)
class Chosen:
    """What a task's estimate decides for one request: speculate, with which gamma and (a llama-server set)
    which setting, the acceptance it expects, and the speedup (None: the published one stands)."""

    speculate: bool
    gamma: int
    setting: str | None
    alpha: float
    expected: float | None


class TaskEstimator(Protocol):
    """How one policy set's tasks start, decide and move with feedback. ``option_pools``: the set's pools keyed
    by the option they serve, where a pool's feedback names its option (None: it names none)."""

    option_pools: Mapping[str, str] | None

    def initial_state(self, policy: PolicySnapshot, config: AdaptationConfig) -> TaskState:
        """A task's state before any feedback: its published decision, its analysis as the prior."""
        ...

    def choose(
        self, task: str, state: TaskState, speculate: bool, gamma: int, config: AdaptationConfig
    ) -> Chosen:
        """The decision for one request of ``task`` under ``state``, where :func:`next_request` said to speculate
        (``speculate``: the decision in force, or a probe while off) with ``gamma``."""
        ...

    def apply(
        self,
        task: str,
        state: TaskState,
        counts: FeedbackCounts,
        setting: str | None,
        config: AdaptationConfig,
        version: int,
    ) -> TaskState:
        """``task``'s state after one feedback event of policy set ``version`` (``setting``: the pool's, as the
        payload names it; None where it does not); a FeedbackError where the event cannot move it."""
        ...


def _of_task(by_task: Mapping[str, _Entry], task: str) -> _Entry | None:
    """``task``'s entry, the fallback's where it has none (its policy is the fallback's)."""
    return by_task[task] if task in by_task else by_task.get(FALLBACK_TASK)


class CurveEstimator:
    """A run's set: each task's policy curve over the gammas, priced by the set's cost; feedback's draft counts
    move the acceptance posterior and the curve reprices every gamma under it."""

    # a run's feedback carries its counts; the gamma it ran with is the decision's
    option_pools: Mapping[str, str] | None = None

    def __init__(self, contract: PolicyContract, policies: Mapping[str, PolicySnapshot], cost: Cost) -> None:
        self.curves: dict[str, PolicyCurve] = {task: p.curve(contract, cost) for task, p in policies.items()}

    def curve_of(self, task: str) -> PolicyCurve | None:
        return _of_task(self.curves, task)

    def initial_state(self, policy: PolicySnapshot, config: AdaptationConfig) -> TaskState:
        return initial_state(policy.alpha_mean, policy.speculate, policy.gamma, config)

    def choose(
        self, task: str, state: TaskState, speculate: bool, gamma: int, config: AdaptationConfig
    ) -> Chosen:
        curve = self.curve_of(task)
        expected = curve.speedup(gamma, BASE, state.alpha, state.prior_alpha) if curve is not None else None
        finite = expected if expected is not None and math.isfinite(expected) else None
        return Chosen(speculate, gamma, None, state.alpha, finite)

    def apply(
        self,
        task: str,
        state: TaskState,
        counts: FeedbackCounts,
        setting: str | None,
        config: AdaptationConfig,
        version: int,
    ) -> TaskState:
        curve = self.curve_of(task)
        assert curve is not None  # every set has its fallback's curve
        return apply_feedback(state, counts.rounds, counts.drafted, counts.accepted, curve, config)


class TimingEstimator:
    """A llama-server set: each task's published settings as its analysis priced them, moved by the timings
    of the pools that served them (:mod:`router.decide.server_adaptation`); the plain step cost prices a pool's
    request as plain decoding would have run it."""

    def __init__(
        self, contract: PolicyContract, policies: Mapping[str, PolicySnapshot], cost: PlainCost
    ) -> None:
        self.priors = {
            task: option_priors(p.option_curve, contract.published_settings) for task, p in policies.items()
        }
        self.cost, self.margin = cost, contract.margin
        self.option_pools: Mapping[str, str] | None = contract.pools  # "off" and each setting's label -> URL

    def priors_of(self, task: str) -> tuple[OptionPrior, ...]:
        return _of_task(self.priors, task) or ()

    def initial_state(self, policy: PolicySnapshot, config: AdaptationConfig) -> TaskState:
        return initial_server_state(policy.alpha_mean, policy.setting if policy.speculate else None, config)

    def choose(
        self, task: str, state: TaskState, speculate: bool, gamma: int, config: AdaptationConfig
    ) -> Chosen:
        """The setting in force; while off, every ``probe_every``-th request (``speculate``) goes to the published
        setting with the highest estimate."""
        priors, weight = self.priors_of(task), prior_weight_ms(self.cost, config)
        setting = state.setting if state.speculate else None
        if speculate and not state.speculate:
            setting = choose_setting(priors, state, self.margin, config, weight).probe
        prior = next((p for p in priors if p.label == setting), None)
        expected = estimate(prior, state, weight)[0] if prior is not None else None
        return Chosen(setting is not None, setting_gamma(setting), setting, state.alpha, expected)

    def apply(
        self,
        task: str,
        state: TaskState,
        counts: FeedbackCounts,
        setting: str | None,
        config: AdaptationConfig,
        version: int,
    ) -> TaskState:
        """One pool request (:func:`apply_server_feedback`): its setting is the one the payload names, else the
        one in force (while off: the one a probe goes to, where the request drafted something; one that drafted
        nothing ran on the off pool). A request on the off pool is counted and moves no setting; one on a setting
        moves that setting's estimate, even where it drafted nothing."""
        priors, weight = self.priors_of(task), prior_weight_ms(self.cost, config)
        named = setting
        if named is None:
            setting = state.setting if state.speculate else choose_setting(priors, state, self.margin, config,
                                                                           weight).probe  # fmt: skip
        elif named == "off" or named not in {p.label for p in priors}:
            if named != "off":
                raise UnknownSetting(
                    f"unknown setting {named!r}: policy set v{version} publishes pools for "
                    f"{', '.join(sorted(p.label for p in priors)) or 'no setting'} (and off) for task {task!r}"
                )
            setting = None
        if setting is None or counts.drafted == 0 and named is None and not state.speculate:
            # a plain request: it says nothing about a setting; it is counted
            return count_event(state, counts.rounds, 0, 0)
        missing = next(
            (name for name, value in (("predicted_ms", counts.decode_ms), ("prompt_n", counts.prompt_tokens),
                                      ("predicted_n", counts.output_tokens)) if value is None),
            None,
        )  # fmt: skip
        if missing is not None:
            raise FeedbackError(
                f"field 'timings.{missing}' is missing: feedback to a llama-server policy set (v{version}) is "
                "the pool's 'timings' as the server reports them"
            )
        assert (
            counts.decode_ms is not None
            and counts.prompt_tokens is not None
            and counts.output_tokens is not None
        )
        return apply_server_feedback(
            state,
            setting=setting,
            drafted=counts.drafted,
            accepted=counts.accepted,
            rounds=counts.rounds,
            plain_ms=self.cost.plain_ms(counts.prompt_tokens, counts.output_tokens),
            served_ms=counts.decode_ms,
            priors=priors,
            margin=self.margin,
            weight_ms=weight,
            config=config,
        )


def estimator_of(
    contract: PolicyContract, policies: Mapping[str, PolicySnapshot], cost: Cost | None
) -> TaskEstimator | None:
    """The estimator of a policy set from where its costs come from: the llama-server settings' plain step cost
    (:class:`TimingEstimator`), else the run's cost profile (:class:`CurveEstimator`); None without either (the
    set takes no feedback)."""
    plain = PlainCost.from_json(contract.plain_cost)
    if plain is not None and contract.by_setting:
        return TimingEstimator(contract, policies, plain)
    if cost is not None:
        return CurveEstimator(contract, policies, cost)
    return None
