"""The routing API's contract: pydantic models of the bodies it reads, validated once, and of a decision, the
answer the router gives in process and over HTTP alike.

A route request (:class:`RouteRequest`), a batch of them (:class:`BatchRequest`), a feedback body
(:class:`FeedbackBody`, a discriminated union over plain counts and each serving engine's own section,
router/decide/feedback_formats.py), and the decision (:class:`Decision`, with its :class:`EngineTerms`); the
other answers are router/serve/responses.py's. Every answer is serialized by :meth:`Answer.to_json`, the one
place JSON is written. The models carry the types, the limits and the help that
router/serve/openapi.py turns into the OpenAPI document, so what the document says and what the server
accepts cannot drift apart. The untrusted-JSON reader (analyzer/json_input.py) parses a body first; a model
then checks it in strict mode (no coercion: ``"3"`` is not an integer, ``true`` is not a number), and
:func:`problem_of` turns pydantic's errors into one :class:`analyzer.errors.SpecrouteError` naming the
field, with the codes the API has always answered (unknown_field, missing_prompt, empty_prompt,
prompt_too_long, batch_too_large, invalid_request, invalid_feedback).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from analyzer.errors import SpecrouteError
from analyzer.names import ENGINES
from analyzer.prompts.prompt_checks import request_text
from router import strict_json
from router.decide.problems import problem_of, rule_broken, value_refused
from router.decide.reasons import Reason

ENGINE_NAMES = ", ".join(ENGINES)

MAX_BATCH = 1000
MAX_NEW_TOKENS = 1 << 20  # beyond any model's context: a larger number is a client's mistake
MAX_BATCH_SIZE = 1 << 16  # beyond any engine's batch


# ---------------------------------------------------------------- the errors


class ApiError(SpecrouteError):
    """A request body the API cannot use (400 ``invalid_request``); the subclasses are the other
    kinds of bad input. ``details.field`` names the field where there is one."""

    status, code = 400, "invalid_request"


class InvalidJson(ApiError):
    code = "invalid_json"


class UnknownField(ApiError):
    code = "unknown_field"


class MissingPrompt(ApiError):
    code = "missing_prompt"


class EmptyPrompt(ApiError):
    code = "empty_prompt"


class PromptTooLong(ApiError):
    code = "prompt_too_long"


class BatchTooLarge(ApiError):
    code = "batch_too_large"


ROUTE_ERRORS: dict[str, type[SpecrouteError]] = {
    cls.code: cls
    for cls in (ApiError, UnknownField, MissingPrompt, EmptyPrompt, PromptTooLong, BatchTooLarge)
}


# ---------------------------------------------------------------- route requests


class Contract(BaseModel):
    """A body's model: strict types, no field beyond those declared."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


def _not_blank(value: str) -> str:
    if not value.strip():
        raise value_refused("a non-empty string")
    return value


class ChatMessage(BaseModel):
    """One chat message: a non-empty role and a string content; other fields (name, ...) pass through to
    the chat template."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    role: Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]
    content: str


Positive = Annotated[int, Field(ge=1)]


class RouteRequest(Contract):
    """Give exactly one of prompt and messages. batch_size and concurrency are the same thing (give one):
    how many sequences the engine runs together with this one."""

    prompt: str | None = Field(None, description="The prompt (not blank).")
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = Field(
        None, description="Chat messages instead of a prompt; some content not blank."
    )
    max_new_tokens: Annotated[Positive, Field(le=MAX_NEW_TOKENS)] | None = None
    batch_size: Annotated[Positive, Field(le=MAX_BATCH_SIZE)] | None = None
    concurrency: Annotated[Positive, Field(le=MAX_BATCH_SIZE)] | None = None
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        None, description="The sampling temperature the engine will use (0: greedy)."
    )

    @model_validator(mode="after")
    def _one_prompt(self, info: ValidationInfo) -> RouteRequest:
        """Exactly one of prompt and messages, with some text, within the server's limit; batch_size or
        concurrency, not both."""
        if (self.prompt is None) == (self.messages is None):
            code = "missing_prompt" if self.prompt is None else "invalid_request"
            raise rule_broken(code, "give exactly one of '{prefix}prompt' and '{prefix}messages'", "prompt")
        if self.prompt is not None and not self.prompt.strip():
            raise rule_broken("empty_prompt", "field '{prefix}prompt' is empty", "prompt")
        if self.messages is not None and not any(m.content.strip() for m in self.messages):
            raise rule_broken("empty_prompt", "field '{prefix}messages' has no content", "messages")
        limit = (info.context or {}).get("max_prompt_chars")
        length = (
            len(self.prompt) if self.prompt is not None else sum(len(m.content) for m in self.messages or ())
        )
        if limit is not None and length > limit:
            raise rule_broken(
                "prompt_too_long",
                f"the prompt of '{{request}}' has {length} characters; the limit is {limit} "
                "(SPECROUTE_MAX_PROMPT_CHARS)",
                "prompt",
                limit=limit,
            )
        if self.batch_size is not None and self.concurrency is not None:
            raise rule_broken(
                "invalid_request",
                "give '{prefix}batch_size' or '{prefix}concurrency', not both",
                "concurrency",
            )
        return self

    @property
    def batch(self) -> int | None:
        """How many sequences run together with this one: batch_size, or concurrency (the same thing)."""
        return self.batch_size if self.batch_size is not None else self.concurrency

    def classified_text(self) -> str:
        """What the task classifier reads of the request (:func:`request_text`)."""
        if self.messages is None:
            return self.prompt or ""
        return request_text(self.prompt, [_message(m) for m in self.messages])

    @classmethod
    def of(
        cls,
        prompt: str | None = None,
        messages: Any = None,
        *,
        max_new_tokens: int | None = None,
        batch_size: int | None = None,
        temperature: float | None = None,
    ) -> RouteRequest:
        """A request built in process, unchecked (the caller's values are trusted as they are; the API
        validates what it reads with ``model_validate``)."""
        return cls.model_construct(
            prompt=prompt,
            messages=messages,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            concurrency=None,
            temperature=temperature,
        )


def _message(message: Any) -> Mapping[str, Any]:
    """A chat message as a mapping (validated messages are models; in-process ones may be dicts)."""
    return message.model_dump() if isinstance(message, BaseModel) else message


class BatchRequest(Contract):
    """Up to 1,000 route requests, decided in order."""

    requests: Annotated[list[RouteRequest], Field(min_length=1, max_length=MAX_BATCH)]

    @field_validator("requests", mode="before")
    @classmethod
    def _at_most(cls, requests: Any) -> Any:
        """A batch over the limit is refused before any of its requests is read."""
        if isinstance(requests, list) and len(requests) > MAX_BATCH:
            raise rule_broken(
                "batch_too_large",
                f"a batch holds at most {MAX_BATCH} requests, got {len(requests)}",
                "",
                limit=MAX_BATCH,
            )
        return requests


def read_route(body: Any, max_prompt_chars: int) -> RouteRequest:
    """The request of one /v1/route body; an ApiError naming the field for anything wrong."""
    try:
        return RouteRequest.model_validate(body, context={"max_prompt_chars": max_prompt_chars})
    except ValidationError as exc:
        raise problem_of(exc, RouteRequest, ROUTE_ERRORS, ApiError) from None


def read_batch(body: Any, max_prompt_chars: int) -> list[RouteRequest]:
    """The requests of a /v1/route/batch body ``{"requests": [...]}``, in order."""
    try:
        batch = BatchRequest.model_validate(body, context={"max_prompt_chars": max_prompt_chars})
    except ValidationError as exc:
        raise problem_of(exc, BatchRequest, ROUTE_ERRORS, ApiError) from None
    return list(batch.requests)


# ---------------------------------------------------------------- the answers


class Answer(BaseModel):
    """An answer's model: no field beyond those declared; written as JSON by :meth:`to_json` only."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    def to_json(self) -> bytes:
        """The answer as the API sends it (fields by their JSON names), written by pydantic's serializer;
        :class:`router.strict_json.NonFiniteNumber` naming the place where it holds NaN or Infinity, which
        JSON cannot carry (they are written as those words first, then looked for where they appear)."""
        text = self.__pydantic_serializer__.to_json(self, by_alias=True)
        if b"NaN" in text or b"Infinity" in text:  # a non-finite number, or a string holding the word
            strict_json.dumps(self.model_dump(by_alias=True))  # raises, naming the place, on a number
        return text

    def to_data(self) -> dict[str, Any]:
        """The answer as JSON-ready data, the same as :meth:`to_json` writes."""
        return self.model_dump(mode="json", by_alias=True)


def _absent(value: Any) -> bool:
    return value is None


class LlamaServerTerms(Answer):
    """llama-server fixes its drafter per server: the pool to send the request to, the drafter setting it
    runs (off: plain) and that server's command-line flags."""

    pool: str
    setting: str
    flags: list[str]


class LlamaCppSpeculative(Answer):
    draft: Literal["prompt-lookup", "model"]
    n_max: Annotated[int, Field(ge=1)]


class LlamaCppTerms(Answer):
    """llama.cpp fixes speculation per server: the pool to send the request to and what that pool
    speculates with (null: a plain pool)."""

    pool: str
    speculative: LlamaCppSpeculative | None


class EngineTerms(Answer):
    """The decision in each engine that can run it: transformers and llama.cpp for a set published from a
    run (and for a plain decision of any set); llama-server for a set published from a llama-server
    analysis."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants", populate_by_name=True)

    llama_server: LlamaServerTerms | None = Field(None, alias="llama-server", exclude_if=_absent)
    transformers: dict[str, Any] | None = Field(
        None,
        description="generate() settings: {assistant_model: false}, or prompt_lookup_num_tokens and "
        "max_matching_ngram_size, or assistant_model: true with the values to set on the draft's "
        "generation_config.",
        exclude_if=_absent,
    )
    llama_cpp: LlamaCppTerms | None = Field(None, alias="llama.cpp", exclude_if=_absent)
    pool: str = Field(description="Deployment to send the request to.")
    priced_by: str | None = Field(
        description="The engine whose cost priced the active policy set (null: none): "
        f"{ENGINE_NAMES}, or an engine whose own step times were imported (vllm, sglang, ...)."
    )
    measured_by: str | None = Field(
        description="The engine that measured the acceptance behind the active policy set (null: none): "
        f"{ENGINE_NAMES}."
    )


class Decision(Answer):
    """Whether to speculate for one request, with which lookahead, and why."""

    route_id: str = Field(
        description="Name this in feedback. Signed with the server's secret key: send it unchanged."
    )
    speculate: bool
    gamma: Annotated[int, Field(ge=0)] = Field(description="Lookahead; 0 when not speculating.")
    task_type: str
    confidence: Annotated[float, Field(ge=0, le=1)]
    predicted_acceptance: float | None
    expected_speedup: float
    reasons: list[str] = Field(
        description="Why, in words for people (reason_codes holds the same, for programs)."
    )
    reason_codes: list[Reason]
    policy_version: int | None
    engine: EngineTerms

    @property
    def codes(self) -> list[str]:
        """The reasons' codes, in order."""
        return [r.code for r in self.reason_codes]


class BatchResponse(Answer):
    decisions: list[Decision]
