"""Online adaptation of a policy set published from a llama-server analysis: feedback from the pools moves
each task's estimate per setting, and the one rule sends the task to another pool the set publishes when
its estimate crosses it.

A llama-server request's feedback is its ``timings``: ``predicted_n`` tokens decoded in ``predicted_ms``
after a prompt of ``prompt_n`` (+ ``cache_n`` reused) tokens, ``draft_n`` drafted and ``draft_n_accepted``
accepted. Its plain time is what plain decoding of the same tokens would have taken, priced by the
analysis' plain step cost (:func:`analyzer.measuring.request_work.plain_work`: a step per token after the
first, each over its context). Per setting that served the task, the estimate keeps decayed sums of the
plain and served milliseconds of its events (each event first multiplies the setting's sums by ``decay``);
with the analysis' speedup S_pub as a prior worth W = ``prior_strength`` plain steps,

    S(o) = (W + plain(o)) / (W / S_pub(o) + served(o)),

the lower end of its interval scaled alike (low_pub * S / S_pub). The decision is the policy curve's rule
(:func:`analyzer.pricing.policy_curve.decision_rule`) over the published settings, as a run's is over its
gammas, with its hysteresis: the setting in force stays while its estimate is at or above 1 + ``off_margin``;
when it falls below, the task goes to the published setting with the highest estimate that clears the whole
rule (S > 1 + margin and low > 1.0), else off; while off, the best setting that clears the whole rule turns
it on.
While off, every ``probe_every``-th request goes to the published setting with the highest estimate, so
that evidence keeps arriving. The acceptance posterior (``beta_a``, ``beta_b``) follows the drafted tokens
the pools report, for display; the decision does not read it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from analyzer.measuring.request_work import plain_work
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.pricing.policy_curve import decision_rule
from router.decide.adaptation import AdaptationConfig, TaskState, count_event
from router.policies.policy import NO_GAMMA


@dataclass(frozen=True)
class OptionPrior:
    """One published setting as a task's analysis priced it: its speedup and its interval's lower end."""

    label: str
    speedup: float
    low: float | None


def option_priors(option_curve: Mapping | None, published: Collection[str]) -> tuple[OptionPrior, ...]:
    """The settings of a policy's stored curve (:meth:`analyzer.pricing.option_curve.OptionCurve.as_dict`)
    that the set publishes a pool for, in the curve's order; empty without a curve."""
    if not option_curve:
        return ()
    return tuple(
        OptionPrior(o["label"], float(o["speedup"]), o.get("low"))
        for o in option_curve.get("options", ())
        if o["label"] in published and o.get("speedup") is not None and o["speedup"] > 0
    )


@dataclass(frozen=True)
class PlainCost:
    """The analysis' plain step cost in milliseconds: a step, and per token of context a row attends over."""

    step_ms: float
    per_context_ms: float

    @classmethod
    def from_json(cls, value: Mapping | None) -> "PlainCost | None":
        if not value:
            return None
        return cls(float(value["step_ms"]), float(value["per_context_ms"]))

    def plain_ms(self, prompt_tokens: int, output_tokens: int) -> float:
        """Plain decoding of ``output_tokens`` after ``prompt_tokens`` (the first output token is free)."""
        work = plain_work(prompt_tokens, output_tokens)
        return self.step_ms * work.plain_steps + self.per_context_ms * work.plain_context


def setting_gamma(label: str | None) -> int:
    """The most tokens a setting drafts per round (a decision's gamma); NO_GAMMA for off."""
    return NO_GAMMA if label is None else parse_drafter(label).max_draft


def evidence(state: TaskState, label: str) -> tuple[float, float, int]:
    """(decayed plain ms, decayed served ms, events) of ``label``'s feedback under ``state``."""
    found = (state.options or {}).get(label)
    return (float(found[0]), float(found[1]), int(found[2])) if found else (0.0, 0.0, 0)


def estimate(prior: OptionPrior, state: TaskState, weight_ms: float) -> tuple[float, float | None]:
    """(S, the lower end of its interval) of one setting for the task: the prior moved by its feedback."""
    plain, served, events = evidence(state, prior.label)
    if not events:
        return prior.speedup, prior.low
    speedup = (weight_ms + plain) / (weight_ms / prior.speedup + served)
    low = prior.low * speedup / prior.speedup if prior.low is not None else None
    return speedup, low


@dataclass(frozen=True)
class SettingChoice:
    """A task's decision under its estimate: the setting in force (None: off), its estimated speedup and
    lower end, why (a code of :data:`analyzer.pricing.policy_curve.DECISION_CODES`), and the setting a probe
    goes to while off (the published one with the highest estimate; None: the set publishes none)."""

    setting: str | None
    speedup: float
    low: float | None
    code: str
    probe: str | None


def choose_setting(
    priors: Sequence[OptionPrior], state: TaskState, margin: float, config: AdaptationConfig, weight_ms: float
) -> SettingChoice:
    """The rule over the published settings under ``state`` (module docstring): the setting in force while it
    holds; else the best published setting that clears the whole rule; else off."""
    if not priors:
        return SettingChoice(None, float("nan"), None, "nothing_measured", None)
    estimates = {p.label: estimate(p, state, weight_ms) for p in priors}
    best = max(estimates, key=lambda label: estimates[label][0])
    if state.speculate and state.setting in estimates:
        held_speedup, held_low = estimates[state.setting]
        kept, kept_code = decision_rule(
            held_speedup, held_low, margin, hold=True, off_margin=config.off_margin
        )
        if kept:
            return SettingChoice(state.setting, held_speedup, held_low, kept_code, best)
    ranked = sorted(estimates, key=lambda label: -estimates[label][0])
    for label in ranked:
        speedup, low = estimates[label]
        if label != state.setting and decision_rule(speedup, low, margin)[0]:
            return SettingChoice(label, speedup, low, "clears", best)
    speedup, low = estimates[best]
    return SettingChoice(None, speedup, low, decision_rule(speedup, low, margin)[1], best)


def initial_server_state(prior_alpha: float, setting: str | None, config: AdaptationConfig) -> TaskState:
    """The state before any feedback: the published setting in force, no evidence, the analysis' acceptance
    as the display posterior's prior."""
    alpha = min(max(prior_alpha, 1e-3), 1 - 1e-3)
    return TaskState(
        beta_a=alpha * config.prior_strength,
        beta_b=(1 - alpha) * config.prior_strength,
        speculate=setting is not None,
        gamma=setting_gamma(setting),
        prior_alpha=alpha,
        setting=setting,
        options={},
    )


def apply_server_feedback(
    state: TaskState,
    *,
    setting: str,
    drafted: int,
    accepted: int,
    rounds: int,
    plain_ms: float,
    served_ms: float,
    priors: Sequence[OptionPrior],
    margin: float,
    weight_ms: float,
    config: AdaptationConfig,
) -> TaskState:
    """The state after one pool request that ran with ``setting``: its plain and served milliseconds added
    to the setting's decayed sums, the acceptance posterior moved by its drafts, and the rule applied anew."""
    plain, served, events = evidence(state, setting)
    options = dict(state.options or {})
    options[setting] = [config.decay * plain + plain_ms, config.decay * served + served_ms, events + 1]
    prior_a = state.prior_alpha * config.prior_strength
    prior_b = (1 - state.prior_alpha) * config.prior_strength
    moved = replace(
        count_event(state, rounds, drafted, accepted),
        beta_a=prior_a + config.decay * (state.beta_a - prior_a) + accepted,
        beta_b=prior_b + config.decay * (state.beta_b - prior_b) + (drafted - accepted),
        options=options,
    )
    choice = choose_setting(priors, moved, margin, config, weight_ms)
    return replace(
        moved,
        setting=choice.setting,
        speculate=choice.setting is not None,
        gamma=setting_gamma(choice.setting),
        requests_while_off=0 if choice.setting is not None else moved.requests_while_off,
    )


def prior_weight_ms(cost: PlainCost, config: AdaptationConfig) -> float:
    """W: the analysis' speedup weighs as ``prior_strength`` plain steps."""
    return config.prior_strength * cost.step_ms
