"""How each serving engine reports a generation's speculation in a feedback body, read into one
:class:`FeedbackCounts`: llama-server's ``timings``, vLLM's ``speculative_decoding`` metrics and SGLang's
``meta_info`` (router/decide/feedback.py's docstring gives each mapping). Each :class:`FeedbackFormat` is the feedback
capability of one serving engine in :data:`router.export.serving.SERVING_ENGINES`; feedback.py reads a body with
:data:`FEEDBACK_FORMATS`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Mapping

from analyzer.engine.engine_base import LLAMA_SERVER
from analyzer.errors import SpecrouteError


class FeedbackError(SpecrouteError, ValueError):
    """A feedback payload that cannot be used; the message names the field. The subclasses are the
    other kinds: an unknown route_id, no active policy set."""

    status, code = 400, "invalid_feedback"


@dataclass(frozen=True)
class FeedbackCounts:
    """A generation's speculation, normalised: target passes (rounds), drafted and accepted tokens."""

    engine: str
    rounds: int
    drafted: int
    accepted: int
    output_tokens: int | None = None
    prompt_tokens: int | None = None  # llama.cpp: prompt_n + cache_n, the context the first step decodes over
    decode_ms: float | None = None  # llama.cpp: predicted_ms, the decoding's time after the first token


MAX_COUNT = 1_000_000_000  # per generation; larger counts are a client bug, and would not fit the columns
MAX_GAMMA = 1_000


def count_field(payload: Mapping[str, Any], key: str, where: str = "") -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise FeedbackError(f"field '{where}{key}' must be an integer from 0 to {MAX_COUNT:,}, got {value!r}")
    return value


def gamma_of(payload: Mapping[str, Any]) -> int | None:
    """The request's ``gamma`` when it is a usable lookahead (1..MAX_GAMMA), else None."""
    gamma = payload.get("gamma")
    return (
        gamma if isinstance(gamma, int) and not isinstance(gamma, bool) and 0 < gamma <= MAX_GAMMA else None
    )


def _first(payload: Mapping[str, Any], names: tuple[str, ...], where: str) -> int | None:
    """The count under the first of ``names`` present in ``payload`` (None when none is)."""
    for name in names:
        if payload.get(name) is not None:
            return count_field(payload, name, where)
    return None


def _section(payload: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = payload[key]
    if not isinstance(section, Mapping):
        raise FeedbackError(f"field '{key}' must be an object")
    return section


def _count_list(payload: Mapping[str, Any], key: str, where: str) -> list[int]:
    values = payload.get(key)
    if (
        not isinstance(values, list)
        or not values
        or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT for v in values)
    ):
        raise FeedbackError(
            f"field '{where}{key}' must be a non-empty list of integers from 0 to {MAX_COUNT:,}"
        )
    return values


def _llama_cpp(timings: Mapping[str, Any]) -> FeedbackCounts:
    # llama-server leaves the draft counts out where nothing was drafted (a plain server, or a request that
    # found nothing to draft): 0
    drafted = _first(timings, ("draft_n",), "timings.") or 0
    accepted = _first(timings, ("draft_n_accepted",), "timings.") or 0
    produced = count_field(timings, "predicted_n", "timings.")
    prompt = _first(timings, ("prompt_n",), "timings.")
    cached = _first(timings, ("cache_n",), "timings.")
    decode_ms = timings.get("predicted_ms")
    if decode_ms is not None and (
        isinstance(decode_ms, bool) or not isinstance(decode_ms, (int, float)) or not 0 <= decode_ms < 1e12
    ):
        raise FeedbackError(
            f"field 'timings.predicted_ms' must be a number of milliseconds, got {decode_ms!r}"
        )
    return FeedbackCounts(
        "llama.cpp",
        max(produced - accepted, 0),
        drafted,
        accepted,
        produced,
        prompt + (cached or 0) if prompt is not None else None,
        float(decode_ms) if decode_ms is not None else None,
    )


def _vllm(stats: Mapping[str, Any]) -> FeedbackCounts:
    where = "speculative_decoding."
    rounds = _first(stats, ("num_drafts", "num_spec_steps"), where)
    drafted = _first(stats, ("num_draft_tokens",), where)
    accepted = _first(stats, ("num_accepted_tokens", "num_accepted_draft_tokens"), where)
    if accepted is None and stats.get("num_accepted_tokens_per_pos") is not None:
        accepted = sum(_count_list(stats, "num_accepted_tokens_per_pos", where))
    if stats.get("acceptance_histogram") is not None:
        histogram = _count_list(stats, "acceptance_histogram", where)
        rounds = sum(histogram) if rounds is None else rounds
        accepted = sum(j * n for j, n in enumerate(histogram)) if accepted is None else accepted
        drafted = (len(histogram) - 1) * sum(histogram) if drafted is None else drafted
    if rounds is None or drafted is None or accepted is None:
        missing = next(
            name
            for name, value in (
                ("num_drafts", rounds),
                ("num_draft_tokens", drafted),
                ("num_accepted_tokens", accepted),
            )
            if value is None
        )
        raise FeedbackError(f"field '{where}{missing}' is missing (see the vLLM mapping in the API docs)")
    return FeedbackCounts("vllm", rounds, drafted, accepted, _first(stats, ("num_output_tokens",), where))


def _sglang(meta: Mapping[str, Any], gamma: int | None) -> FeedbackCounts:
    where = "meta_info."
    rounds = count_field(meta, "spec_verify_ct", where)
    completion = _first(meta, ("completion_tokens",), where)
    accepted = _first(meta, ("spec_num_correct_drafts", "spec_accept_token_num"), where)
    if accepted is None:
        if completion is None:
            raise FeedbackError(
                f"field '{where}completion_tokens' (or '{where}spec_num_correct_drafts') is missing"
            )
        accepted = max(completion - rounds, 0)
    drafted = _first(meta, ("spec_num_proposed_drafts", "spec_draft_token_num"), where)
    rate = meta.get("spec_accept_rate")
    if drafted is None and isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1:
        drafted = MAX_COUNT if accepted > rate * MAX_COUNT else max(round(accepted / rate), accepted)
    if drafted is None and gamma is not None:
        drafted = min(gamma * rounds, MAX_COUNT)
    if drafted is None:
        raise FeedbackError(
            f"field '{where}spec_num_proposed_drafts' is missing; send it, "
            f"'{where}spec_accept_rate', or the 'gamma' the server ran with"
        )
    return FeedbackCounts("sglang", rounds, drafted, accepted, completion)


def engine_label(value: Any) -> str:
    """The free ``engine`` label of a counts payload: printable text of at most 32 characters."""
    if value is None or value == "":
        return "counts"
    if not isinstance(value, str) or len(value) > 32 or not value.isprintable():
        raise FeedbackError("field 'engine' must be printable text of at most 32 characters")
    return value


@dataclass(frozen=True)
class FeedbackFormat:
    """How one serving engine reports in a feedback body: the top-level ``key`` of its section, and
    ``parse(section, payload)`` reading that section (``payload``: the whole body, for fields beside it such as
    ``gamma``) into counts; FeedbackError naming the field it cannot use."""

    key: str
    parse: Callable[[Mapping[str, Any], Mapping[str, Any]], FeedbackCounts]

    def counts(self, payload: Mapping[str, Any]) -> FeedbackCounts:
        """The counts of ``payload``'s section (FeedbackError where the section is not an object)."""
        return self.parse(_section(payload, self.key), payload)


# by the serving engine that reports it (router/export/serving.py gives each entry its own); a body carries one
FEEDBACK_FORMATS: dict[str, FeedbackFormat] = {
    "vllm": FeedbackFormat("speculative_decoding", lambda section, _: _vllm(section)),
    "sglang": FeedbackFormat("meta_info", lambda section, payload: _sglang(section, gamma_of(payload))),
    LLAMA_SERVER: FeedbackFormat("timings", lambda section, _: _llama_cpp(section)),
}
