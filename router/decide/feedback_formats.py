"""How each serving engine reports a generation's speculation in a feedback body, read into one
:class:`FeedbackCounts`: llama-server's ``timings``, vLLM's ``speculative_decoding`` metrics and SGLang's
``meta_info`` (router/decide/feedback.py's docstring gives each mapping). Each section is a pydantic model with
strict types; each :class:`FeedbackFormat` is the feedback capability of one serving engine in
:data:`router.export.serving.SERVING_ENGINES`, and router/decide/contract.py makes the formats the variants
of the feedback body's discriminated union."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from analyzer.errors import SpecrouteError
from analyzer.names import LLAMA_SERVER


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

# a count of one generation, as every engine's section and the plain counts carry it
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class Section(BaseModel):
    """An engine's own object in a feedback body: strict types for the fields specroute reads, and every
    other field the engine puts there kept in the stored event but not read."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    def counts(self, gamma: int | None) -> FeedbackCounts:
        """The generation's counts (``gamma``: the body's, where the section needs it); FeedbackError
        naming the field where the section lacks what the counts need."""
        raise NotImplementedError


class LlamaServerTimings(Section):
    """llama-server's ``timings`` of one completion. It leaves the draft counts out where nothing was
    drafted (a plain server, or a request that found nothing to draft): 0. A policy set published from a
    llama-server analysis also needs ``predicted_ms`` and ``prompt_n`` (with ``cache_n``) to price the
    request against plain decoding."""

    draft_n: Count | None = None
    draft_n_accepted: Count | None = None
    predicted_n: Count
    prompt_n: Count | None = None
    cache_n: Count | None = None
    predicted_ms: Annotated[float, Field(ge=0, lt=1e12, allow_inf_nan=False)] | None = Field(
        None, description="the decoding's milliseconds after the first token"
    )

    def counts(self, gamma: int | None) -> FeedbackCounts:
        accepted = self.draft_n_accepted or 0
        return FeedbackCounts(
            "llama.cpp",
            max(self.predicted_n - accepted, 0),  # each target pass emits its accepted drafts and one token
            self.draft_n or 0,
            accepted,
            self.predicted_n,
            self.prompt_n + (self.cache_n or 0) if self.prompt_n is not None else None,
            self.predicted_ms,
        )


class VllmStats(Section):
    """vLLM's per-request ``speculative_decoding`` metrics: rounds, drafted and accepted as named (or
    their aliases), the accepted drafts per position, or an acceptance histogram (h[j] = rounds that
    accepted exactly j drafts)."""

    num_drafts: Count | None = None
    num_spec_steps: Count | None = None  # an alias of num_drafts
    num_draft_tokens: Count | None = None
    num_accepted_tokens: Count | None = None
    num_accepted_draft_tokens: Count | None = None  # an alias of num_accepted_tokens
    num_accepted_tokens_per_pos: Annotated[list[Count], Field(min_length=1)] | None = None
    acceptance_histogram: Annotated[list[Count], Field(min_length=1)] | None = None
    num_output_tokens: Count | None = None

    def counts(self, gamma: int | None) -> FeedbackCounts:
        rounds = _first(self.num_drafts, self.num_spec_steps)
        drafted = self.num_draft_tokens
        accepted = _first(self.num_accepted_tokens, self.num_accepted_draft_tokens)
        if accepted is None and self.num_accepted_tokens_per_pos is not None:
            accepted = sum(self.num_accepted_tokens_per_pos)
        histogram = self.acceptance_histogram
        if histogram is not None:
            rounds = sum(histogram) if rounds is None else rounds
            accepted = sum(j * n for j, n in enumerate(histogram)) if accepted is None else accepted
            drafted = (len(histogram) - 1) * sum(histogram) if drafted is None else drafted
        named = (("num_drafts", rounds), ("num_draft_tokens", drafted), ("num_accepted_tokens", accepted))
        for name, value in named:
            if value is None:
                raise FeedbackError(
                    f"field 'speculative_decoding.{name}' is missing (see the vLLM mapping in the API docs)"
                )
        assert rounds is not None and drafted is not None and accepted is not None
        return FeedbackCounts("vllm", rounds, drafted, accepted, self.num_output_tokens)


class SglangMeta(Section):
    """SGLang's ``meta_info``: rounds = spec_verify_ct; accepted = spec_num_correct_drafts, else
    completion_tokens - spec_verify_ct; drafted = spec_num_proposed_drafts, else accepted / spec_accept_rate,
    else the body's gamma times rounds."""

    spec_verify_ct: Count
    completion_tokens: Count | None = None
    spec_num_correct_drafts: Count | None = None
    spec_accept_token_num: Count | None = None  # an alias of spec_num_correct_drafts
    spec_num_proposed_drafts: Count | None = None
    spec_draft_token_num: Count | None = None  # an alias of spec_num_proposed_drafts
    spec_accept_rate: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None

    def counts(self, gamma: int | None) -> FeedbackCounts:
        rounds = self.spec_verify_ct
        accepted = _first(self.spec_num_correct_drafts, self.spec_accept_token_num)
        if accepted is None:
            if self.completion_tokens is None:
                raise FeedbackError(
                    "field 'meta_info.completion_tokens' (or 'meta_info.spec_num_correct_drafts') is missing"
                )
            accepted = max(self.completion_tokens - rounds, 0)
        drafted = _first(self.spec_num_proposed_drafts, self.spec_draft_token_num)
        rate = self.spec_accept_rate
        if drafted is None and rate:
            drafted = MAX_COUNT if accepted > rate * MAX_COUNT else max(round(accepted / rate), accepted)
        if drafted is None and gamma is not None:
            drafted = min(gamma * rounds, MAX_COUNT)
        if drafted is None:
            raise FeedbackError(
                "field 'meta_info.spec_num_proposed_drafts' is missing; send it, "
                "'meta_info.spec_accept_rate', or the 'gamma' the server ran with"
            )
        return FeedbackCounts("sglang", rounds, drafted, accepted, self.completion_tokens)


def _first(*values: int | None) -> int | None:
    """The first of a field and its aliases that the section gives (None when none is)."""
    return next((value for value in values if value is not None), None)


@dataclass(frozen=True)
class FeedbackFormat:
    """How one serving engine reports in a feedback body: the top-level ``key`` of its section and the
    ``section`` model that reads it into counts (router/decide/contract.py makes each a variant of the
    feedback body's discriminated union)."""

    key: str
    section: type[Section]


# by the serving engine that reports it (router/export/serving.py gives each entry its own); a body carries one
FEEDBACK_FORMATS: dict[str, FeedbackFormat] = {
    "vllm": FeedbackFormat("speculative_decoding", VllmStats),
    "sglang": FeedbackFormat("meta_info", SglangMeta),
    LLAMA_SERVER: FeedbackFormat("timings", LlamaServerTimings),
}
