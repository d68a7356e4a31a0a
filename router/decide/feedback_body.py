"""The feedback body of the routing API as one pydantic model: a discriminated union over plain counts and
each serving engine's own section (router/decide/feedback_formats.py), with the fields every body may carry.
Validated once, in strict mode; :func:`read_feedback` answers a bad body with a FeedbackError naming the
field (router/decide/problems.py). router/serve/openapi.py documents the union from these models."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    ValidationError,
    create_model,
    model_validator,
)

from analyzer.errors import SpecrouteError
from router.decide.feedback_formats import (
    FEEDBACK_FORMATS,
    MAX_GAMMA,
    Count,
    FeedbackCounts,
    FeedbackError,
    Section,
)
from router.decide.problems import problem_of, rule_broken, value_refused


class UnknownFeedbackField(FeedbackError):
    """A feedback body carries a field its shape does not have (a typo would otherwise be silently
    ignored)."""

    code = "unknown_field"


FEEDBACK_ERRORS: dict[str, type[SpecrouteError]] = {
    FeedbackError.code: FeedbackError,
    UnknownFeedbackField.code: UnknownFeedbackField,
}


def _printable(value: str) -> str:
    if not value.isprintable():
        raise value_refused("printable text of at most 32 characters")
    return value


class FeedbackFields(BaseModel):
    """What every feedback body may carry beside its counts or its engine's section."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    route_id: str | None = Field(
        None, description="The route_id of the decision (as given: it is signed with the server's key)."
    )
    task_type: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None, description="The task, where the body names no route_id (under the active policy set)."
    )
    gamma: Annotated[int, Field(ge=1, le=MAX_GAMMA)] | None = Field(
        None, description="The lookahead the engine ran with."
    )
    engine: Annotated[str, Field(max_length=32), AfterValidator(_printable)] | None = Field(
        None, description="A free label of the engine that reported plain counts (default: counts)."
    )
    setting: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None,
        description="A set published from a llama-server analysis: the setting of the pool that served (the "
        "key of the decision's pool in the set's pools; default: the task's setting in force). 400 "
        "unknown_setting for one the set does not publish.",
    )

    def counts(self) -> FeedbackCounts:
        """The generation's counts, as the body gives them."""
        raise NotImplementedError


class CountsFeedback(FeedbackFields):
    """Plain counts, as router/client.py sends them for transformers: rounds (target passes), drafted and
    accepted tokens."""

    rounds: Count
    drafted: Count
    accepted: Count
    output_tokens: Count | None = None

    def counts(self) -> FeedbackCounts:
        return FeedbackCounts(
            self.engine or "counts", self.rounds, self.drafted, self.accepted, self.output_tokens
        )


class SectionFeedback(FeedbackFields):
    """A body that carries one serving engine's own section (its model reads the counts)."""

    section_key: ClassVar[str]

    def counts(self) -> FeedbackCounts:
        section: Section = getattr(self, self.section_key)
        return section.counts(self.gamma)


def _section_body(engine: str, key: str, section: type[Section]) -> type[SectionFeedback]:
    """The feedback body of ``engine``: the common fields and its section under ``key``."""
    name = "".join(part.capitalize() for part in engine.replace(".", "-").split("-")) + "Feedback"
    model = create_model(
        name,
        __base__=SectionFeedback,
        __doc__=f"{engine}'s own report under '{key}': {section.__doc__}",
        **{key: (section, ...)},  # type: ignore[call-overload]
    )
    model.section_key = key
    return model


COUNTS = "counts"
# the feedback body's variants by tag: plain counts, and each serving engine that reports in a section of its own
FEEDBACK_BODIES: dict[str, type[FeedbackFields]] = {
    COUNTS: CountsFeedback,
    **{engine: _section_body(engine, f.key, f.section) for engine, f in FEEDBACK_FORMATS.items()},
}
SECTION_TAGS = {f.key: engine for engine, f in FEEDBACK_FORMATS.items()}
# every top-level field some feedback body may carry
FEEDBACK_FIELDS = tuple(
    dict.fromkeys(name for body in FEEDBACK_BODIES.values() for name in body.model_fields)
)


def _feedback_tag(body: Any) -> str:
    """The variant of a feedback body: the engine whose section it carries, else plain counts."""
    if isinstance(body, dict):
        return next((SECTION_TAGS[key] for key in SECTION_TAGS if key in body), COUNTS)
    return COUNTS


class FeedbackBody(RootModel[Any]):
    """route_id (from a decision) or task_type, plus one of: plain counts {rounds, drafted, accepted}, or
    one serving engine's own section: llama-server's timings, vLLM's speculative_decoding, SGLang's
    meta_info. Any other field is refused (400 unknown_field)."""

    root: Annotated[
        Union[tuple(Annotated[body, Tag(tag)] for tag, body in FEEDBACK_BODIES.items())],  # type: ignore[valid-type]
        Discriminator(_feedback_tag),
    ]

    @model_validator(mode="before")
    @classmethod
    def _one_shape(cls, body: Any) -> Any:
        """One engine's section or plain counts: two sections, or nothing to count, are refused."""
        if not isinstance(body, dict):
            return body
        sections = [key for key in SECTION_TAGS if key in body]
        if len(sections) > 1:
            raise rule_broken(
                "invalid_feedback",
                f"give one engine's section, not {len(sections)}: "
                + ", ".join(f"'{key}'" for key in sections),
                "",
            )
        known = set(FEEDBACK_FIELDS)
        if not sections and not {"rounds", "drafted", "accepted"} & set(body) and set(body) <= known:
            raise rule_broken(
                "invalid_feedback",
                "give counts {rounds, drafted, accepted}, llama.cpp 'timings', vLLM 'speculative_decoding' or "
                "SGLang 'meta_info'",
                "",
            )
        return body


def read_feedback(payload: Any) -> FeedbackFields:
    """The checked variant of a feedback body; a FeedbackError naming the field for anything wrong."""
    try:
        return FeedbackBody.model_validate(payload).root
    except ValidationError as exc:
        model = FEEDBACK_BODIES[_feedback_tag(payload)]
        raise problem_of(exc, model, FEEDBACK_ERRORS, FeedbackError, FEEDBACK_BODIES) from None
