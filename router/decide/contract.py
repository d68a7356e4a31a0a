"""The routing API's request contract: pydantic models of every body the API reads, validated once.

A route request (:class:`RouteRequest`), a batch of them (:class:`BatchRequest`) and a feedback body
(:class:`FeedbackBody`, a discriminated union over plain counts and each serving engine's own section,
router/decide/feedback_formats.py). The models carry the types, the limits and the help that
router/serve/openapi.py turns into the OpenAPI document, so what the document says and what the server
accepts cannot drift apart. The untrusted-JSON reader (analyzer/json_input.py) parses a body first; a model
then checks it in strict mode (no coercion: ``"3"`` is not an integer, ``true`` is not a number), and
:func:`problem_of` turns pydantic's errors into one :class:`analyzer.errors.SpecrouteError` naming the
field, with the codes the API has always answered (unknown_field, missing_prompt, empty_prompt,
prompt_too_long, batch_too_large, invalid_request, invalid_feedback).
"""

from __future__ import annotations

from typing import Annotated, Any

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
from router.decide import decision
from router.decide.problems import problem_of, rule_broken, value_refused

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

    def request(self) -> decision.RouteRequest:
        """What the router decides for."""
        return decision.RouteRequest(
            prompt=self.prompt,
            messages=[m.model_dump() for m in self.messages] if self.messages is not None else None,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size if self.batch_size is not None else self.concurrency,
            temperature=self.temperature,
        )


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


def read_route(body: Any, max_prompt_chars: int) -> decision.RouteRequest:
    """The request of one /v1/route body; an ApiError naming the field for anything wrong."""
    try:
        return RouteRequest.model_validate(body, context={"max_prompt_chars": max_prompt_chars}).request()
    except ValidationError as exc:
        raise problem_of(exc, RouteRequest, ROUTE_ERRORS, ApiError) from None


def read_batch(body: Any, max_prompt_chars: int) -> list[decision.RouteRequest]:
    """The requests of a /v1/route/batch body ``{"requests": [...]}``, in order."""
    try:
        batch = BatchRequest.model_validate(body, context={"max_prompt_chars": max_prompt_chars})
    except ValidationError as exc:
        raise problem_of(exc, BatchRequest, ROUTE_ERRORS, ApiError) from None
    return [r.request() for r in batch.requests]
