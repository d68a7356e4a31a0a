"""Why a routing decision is what it is, as data: a :class:`Reason` is a code from :data:`REASON_CODES`
and its parameters (numbers, names), e.g. ``{"code": "below_break_even", "speedup": 0.97, "low": 0.91}``.
Decisions carry reasons and the text people read (the API's ``reasons``, the playground, the command
line), rendered by :func:`reason_text`, the one place the words live. Code branches
on codes, tests assert codes. The same model is the API's schema of a reason (``reason_codes``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator


def reason(code: str, **params: Any) -> Reason:
    """A :class:`Reason` with ``params`` (keyword arguments)."""
    return Reason(code=code, **params)


def _predicted(p: Mapping[str, Any]) -> str:
    """``1.13x [1.04, 1.22]`` (the interval when the analysis gave one)."""
    low, high = p.get("low"), p.get("high")
    return f"{p['speedup']:.2f}x" + (
        f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    )


def _workload(p: Mapping[str, Any]) -> str:
    why = {
        "no_classifier": "no task classifier trained",
        "low_confidence": f"confidence {p.get('confidence', 0):.2f} < {p.get('min_confidence', 0):.2f}",
        "no_task_policy": f"no policy for task {p.get('task')}",
        "catch_all": f"task {p.get('task')} is the classifier's catch-all (its predictions were right "
        f"{100 * p.get('precision', 0):.0f}% of the time on unseen sources)",
    }[p["cause"]]
    return f"{why}: workload-wide policy (analysis predicts {p['speedup']:.2f}x)"


def _batch(p: Mapping[str, Any]) -> str:
    where = (
        f"measured at batch size {p['lower']}"
        if p["lower"] == p["upper"]
        else f"interpolated between profiled batch sizes {p['lower']} and {p['upper']}"
    )
    adjusted = f", adjusted to the online alpha {p['alpha']:.2f}" if p.get("alpha") is not None else ""
    interval = f" (interval from {p['low']:.2f}x)" if p.get("low") is not None else ""
    why = {  # rendered from the rule's code (analyzer.pricing.policy_curve.decision_rule), never re-derived
        "clears": "on",
        "kept_on": f"on (kept: it stays on above {1 + p.get('off_margin', 0.0):.2f}x)",
        "below_margin": f"off (needs > {1 + p['margin']:.2f}x)",
        "interval_reaches_loss": "off (the interval reaches a loss)",
        "point_estimate": "on (decided on S(g*) alone)" if p["speculate"] else "off (decided on S(g*) alone)",
        "nothing_measured": "off (nothing measured)",
        "too_few_prompts": "as the workload decides",
    }[p.get("decision", "clears" if p["speculate"] else "below_margin")]
    return (
        f"batch size {p['batch_size']}: S(g) {where}{adjusted}: best gamma {p['gamma']} at {p['speedup']:.2f}x"
        f"{interval}, speculation {why}"
    )


# code -> what it renders to (the parameters each code carries are the ones its text reads)
REASON_CODES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    # which policy decided
    "task_policy": lambda p: (
        f"task {p['task']} (confidence {p['confidence']:.2f}): {p['tier']}, "
        f"analysis predicts {_predicted(p)} at gamma {p['gamma']}"
    ),
    "task_too_few_prompts": lambda p: (
        f"task {p['task']} (confidence {p['confidence']:.2f}): only {p['n_prompts']} prompts in the analysis, "
        f"too few to decide: the workload's decision applies ({_predicted(p)} at gamma {p['gamma']})"
    ),
    "workload_policy": _workload,
    "rarely_reached": lambda p: (
        f"classifier v{p['classifier_version']} rarely predicts {p['task']} ({p['detail']}): "
        f"most {p['task']} traffic is routed by another task's policy"
    ),
    "no_policy": lambda p: "no published policy: speculation off",
    # the online estimate
    "online_estimate": lambda p: (
        f"online estimate after {p['events']} feedback events: alpha {p['alpha']:.2f}, "
        f"gamma {p['gamma']}, speculation {'on' if p['speculate'] else 'off'}"
    ),
    "probe": lambda p: (
        f"probe: every {p['probe_every']}th request of an 'off' task speculates "
        "so that feedback can turn it back on"
    ),
    # the request's own rules
    "no_predicted_gain": lambda p: "no predicted gain: speculation off",
    "batch_size_curve": _batch,
    "short_output": lambda p: f"expected output {p['max_new_tokens']} tokens < {p['min_output_tokens']}: off",
    "batch_not_profiled": lambda p: (
        f"batch size {p['batch_size']} > {p['max_batch_size']} and no cost profile "
        "covers it: the batch already uses the idle compute; off"
    ),
    "sampling": lambda p: (
        f"temperature {p['temperature']}: acceptance was measured greedy; sampling accepts less"
    ),
}

# the codes that say which policy decided: exactly one of them is in every decision's reasons
POLICY_CODES = ("task_policy", "task_too_few_prompts", "workload_policy", "no_policy")


class Reason(BaseModel):
    """One reason of a decision: a code and its parameters (router/decide/reasons.py lists them)."""

    model_config = ConfigDict(extra="allow", frozen=True, ser_json_inf_nan="constants")  # as answers: Answer

    code: str = Field(json_schema_extra={"enum": list(REASON_CODES)})

    @field_validator("code")
    @classmethod
    def _known(cls, code: str) -> str:
        if code not in REASON_CODES:
            raise ValueError(f"unknown reason code {code!r}")
        return code

    @property
    def params(self) -> Mapping[str, Any]:
        """The parameters, without the code."""
        return self.model_extra or {}

    def as_dict(self) -> dict[str, Any]:
        """``{"code": ..., **params}``, JSON-ready."""
        return {"code": self.code, **self.params}

    @property
    def text(self) -> str:
        return reason_text(self)


def reason_text(item: Reason) -> str:
    """The sentence a person reads for ``item``."""
    return REASON_CODES[item.code](item.params)
