"""An analysis run's parameters: one typed object, read from what a user typed by
:func:`analyzer.analysis.run_inputs.read_inputs` (the command line, the web form and the demo all call it, so a
bad value gets the same words everywhere), stored as JSON with the run (``AnalysisRun.params``) and read back
with :meth:`RunParams.from_json` (all the worker reads: it parses no user input).

One set of limits (:data:`LIMITS`) and one set of defaults (:mod:`analyzer.names`): an input left blank takes
the field's default below, except ``validate`` (:data:`~analyzer.names.DEFAULT_VALIDATE` prompts for a greedy
run, 0 for a sampling one) and the engine, cost mode, device and dtype, which take the settings
(``SPECROUTE_ENGINE`` and so on). This module imports only the shared bottom (:mod:`analyzer.errors`,
:mod:`analyzer.names`, :mod:`analyzer.checks`): where a run resolves its device is
:func:`analyzer.models.devices.run_placement`, how its engine is chosen :mod:`analyzer.analysis.run_inputs`.

What the router needs of them travels with each published policy set (gamma_max, margin, engine):
see :class:`router.policies.policy.PolicyContract`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

from analyzer.checks import (
    CostModeError,
    DeviceError,
    EngineError,
    check_cost_mode_name,
    check_device_name,
    check_dtype_name,
    check_engine_name,
    shown,
)
from analyzer.errors import SpecrouteError
from analyzer.names import (
    DEFAULT_COST_MODE,
    DEFAULT_ENGINE,
    DEFAULT_GAMMA_MAX,
    DEFAULT_MARGIN,
    ENTROPY_EDGES_NATS,
    MAX_PROFILE_BATCH_SIZE,
)


class RunError(SpecrouteError, ValueError):
    """A run cannot be created or executed as asked; the message says why."""

    status, code = 400, "invalid_run"


class RunNotFound(RunError, LookupError):
    """No analysis run has the id asked for."""

    status, code = 404, "run_not_found"


@dataclass(frozen=True)
class InputProblem:
    """One thing wrong with one input: ``field`` is the input's name (a :class:`RunParams` field, or
    ``batch_sizes``); ``text`` says what is wrong. Where ``names_field`` the message is the field's name
    followed by ``text`` (``max_new_tokens must be a whole number from 1 to 4096, got '0'``), so each
    surface can name the field as its user typed it (``--max-new-tokens``); otherwise ``text`` is the
    whole message (``unknown device 'tpu'; use one of: ...``)."""

    field: str
    text: str
    names_field: bool = True

    def message(self, name: str | None = None) -> str:
        """The problem in words, the field named ``name`` (default: the field's own name)."""
        return f"{name or self.field} {self.text}" if self.names_field else self.text


class RunInputError(RunError):
    """Every problem with a run's inputs at once (the web form lists them all); its message has one line
    per problem. ``spell`` names a field as the surface's user typed it (None: the field's own name)."""

    status, code = 400, "invalid_run_inputs"

    def __init__(self, problems: list[InputProblem], spell: Callable[[str], str] | None = None):
        self.problems = tuple(problems)
        self.spell = spell
        super().__init__("\n".join(self.messages(spell)))

    def messages(self, spell: Callable[[str], str] | None = None) -> list[str]:
        """One message per problem, each field named by ``spell`` (default: its own name)."""
        return [p.message(spell(p.field) if spell else None) for p in self.problems]

    def spelled(self, spell: Callable[[str], str]) -> RunInputError:
        """The same problems, the fields named by ``spell`` (the CLI's ``--max-new-tokens``)."""
        return RunInputError(list(self.problems), spell)


@dataclass(frozen=True)
class Limit:
    """The accepted range of one numeric parameter: ``low <= value <= high`` (``high`` None: no upper
    bound; ``low_open``: ``low < value``)."""

    low: float
    high: float | None = None
    low_open: bool = False

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value <= self.high)

    def text(self) -> str:
        """``between 1 and 64``, ``>= 0``, ``in (0, 1]``."""
        if self.low_open:
            return f"in ({_number(self.low)}, {_number(self.high)}]"
        if self.high is None:
            return f">= {_number(self.low)}"
        return f"between {_number(self.low)} and {_number(self.high)}"


def _number(value: float | None) -> str:
    """``10,000,000``, ``0.5``: whole numbers with thousands separators, others as they are."""
    if value is None:
        return "none"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _bound_text(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def range_words(limit: Limit) -> str:
    """A limit as the input problems say it: ``from 1 to 4096``, ``of at least 1``, ``above 0 and at
    most 1``."""
    low = _bound_text(limit.low)
    if limit.high is None:
        return f"above {low}" if limit.low_open else f"of at least {low}"
    high = _bound_text(limit.high)
    return f"above {low} and at most {high}" if limit.low_open else f"from {low} to {high}"


# The one set of limits: read_inputs (so the CLI, the web form and the demo), the web form's
# min and max attributes and RunParams.check all read these.
LIMITS: dict[str, Limit] = {
    "max_new_tokens": Limit(1, 4096),
    "gamma_max": Limit(1, 64),
    "temperature": Limit(0.0, 5.0),
    "top_p": Limit(0.0, 1.0, low_open=True),
    "validate": Limit(0, 10_000),
    "limit": Limit(1, 10_000_000),
    "batch_size": Limit(1, 64),
    "margin": Limit(0.0, 1.0),
    "chunk_size": Limit(1, 100_000),
}
# the context of an engine that has one (llama.cpp; llama-server's --ctx takes the same range): not a form input
N_CTX_LIMIT = Limit(256, 131_072)


LEAVE_OUT, REFUSE = "leave-out", "refuse"
LONG_PROMPT_RULES = (LEAVE_OUT, REFUSE)  # what an analysis does with prompts its context cannot hold
LONG_PROMPTS_HELP = (
    "What to do with prompts whose tokens and new tokens do not fit the context, counted before anything is "
    "generated: leave-out analyzes the others and names them in the report (the default: one outlier in a "
    "sample costs none of the work done on the rest); refuse stops before generating, listing every such prompt."
)


def long_prompts_text(raw: object) -> str:
    """``must be one of leave-out, refuse, got 'drop'``."""
    return f"must be one of {', '.join(LONG_PROMPT_RULES)}, got {shown(raw)}"


@dataclass(frozen=True)
class RunParams:
    """Parameters of an analysis run (stored as JSON on the run). The field defaults are the defaults of a
    new run (what a blank input takes; ``validate`` and the engine, cost mode, device and dtype excepted:
    see the module's docstring) and what a run stored before a parameter existed means."""

    max_new_tokens: int = 64
    gamma_max: int = DEFAULT_GAMMA_MAX
    temperature: float = 0.0
    top_p: float = 1.0
    validate: int = 0  # a RunParams built in code validates nothing unless asked; inputs: DEFAULT_VALIDATE
    # validate all ``validate`` prompts; False: at most that many, stopping once every measured aggregate is
    # within its target or validation has cost its budget (analyzer/analysis/run_validation.py)
    validate_all: bool = False
    limit: int | None = None
    chat_template: bool = True
    batch_size: int = 1
    margin: float = DEFAULT_MARGIN
    seed: int = 0
    reprofile: bool = False
    max_prompt_tokens: int | None = None
    # the context an engine with one holds (llama.cpp; None: 4096, or the model's trained context if shorter)
    n_ctx: int | None = None
    # what to do with prompts whose tokens and new tokens the context cannot hold (LONG_PROMPT_RULES)
    long_prompts: str = LEAVE_OUT
    # transformers | llama.cpp (analyzer/engine/engines.py): what measures and prices the run
    engine: str = DEFAULT_ENGINE
    # eager | cuda-graphs (analyzer/engine/engines.py): how the transformers engine times its steps
    cost_mode: str = DEFAULT_COST_MODE
    device: str = "auto"  # auto | cpu | cuda | cuda:N, resolved by the worker that executes the run
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    profile_batch_sizes: tuple[int, ...] | None = None  # None: 1,4,16 on a GPU, 1 on the CPU
    chunk_size: int = 32  # prompts per chunk that one worker claims (analyzer/analysis/chunks.py)
    # stored with the run so its entropy table keeps its buckets if the defaults change (None = inf)
    entropy_edges: tuple[float | None, ...] = tuple(
        e if e != float("inf") else None for e in ENTROPY_EDGES_NATS
    )

    @property
    def sampling(self) -> bool:
        """Whether the run measures sampling expectations (temperature > 0) rather than greedy replays."""
        return self.temperature > 0

    def problems(self) -> list[InputProblem]:
        """Every parameter out of range, unknown, or at odds with another (validating or batching a
        sampling run), in the words :func:`~analyzer.analysis.run_inputs.read_inputs` uses. What the run's
        engine cannot measure is its engine's to say: :func:`analyzer.engine.engines.check_run`."""
        found = [
            InputProblem(name, number_text(name, getattr(self, name)))
            for name, limit in LIMITS.items()
            if getattr(self, name) is not None and not limit.admits(getattr(self, name))
        ]
        found += greedy_only(self.temperature, self.batch_size, self.validate)
        if self.n_ctx is not None and not N_CTX_LIMIT.admits(self.n_ctx):
            found.append(InputProblem("n_ctx", number_text("n_ctx", self.n_ctx)))
        if self.long_prompts not in LONG_PROMPT_RULES:
            found.append(InputProblem("long_prompts", long_prompts_text(self.long_prompts)))
        for name, check in (
            ("device", check_device_name),
            ("dtype", check_dtype_name),
            ("engine", check_engine_name),
            ("cost_mode", check_cost_mode_name),
        ):
            try:
                check(getattr(self, name))
            except (DeviceError, EngineError, CostModeError) as error:
                found.append(InputProblem(name, str(error), names_field=False))
        sizes = self.profile_batch_sizes
        if sizes is not None and (not sizes or any(not 1 <= int(b) <= MAX_PROFILE_BATCH_SIZE for b in sizes)):
            found.append(
                InputProblem(
                    "batch_sizes",
                    f"profile batch sizes must be integers from 1 to {MAX_PROFILE_BATCH_SIZE}",
                    names_field=False,
                )
            )
        return found

    def check(self) -> RunParams:
        """Raise :class:`RunInputError` naming every parameter out of range, unknown or at odds with
        another (:meth:`problems`). What the run's engine cannot measure is its engine's to refuse:
        :func:`analyzer.engine.engines.check_run` checks both."""
        found = self.problems()
        if found:
            raise RunInputError(found)
        return self

    def to_json(self) -> dict[str, Any]:
        """The JSON stored on the run."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunParams:
        """The parameters stored on a run (keys it does not know are ignored; missing ones take the
        defaults, as for runs stored before a parameter existed). A value of the wrong type (a row edited
        by hand) is refused with the words :func:`~analyzer.analysis.run_inputs.read_inputs` uses; ranges and
        names are not checked again, so a run stored under older limits still reads back (they were checked
        when it was created)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (data or {}).items() if k in known}
        problems = []
        for name, value in list(values.items()):
            try:
                values[name] = _stored_value(name, value)
            except Refused as refused:
                problems.append(refused.problem)
        if problems:
            raise RunInputError(problems)
        return cls(**values)


# ---------------------------------------------------------------- reading inputs

_HINTS = typing.get_type_hints(RunParams)
# the inputs every surface may give, in the order problems are listed (the web form's)
NUMBER_INPUTS = (
    "max_new_tokens",
    "gamma_max",
    "temperature",
    "top_p",
    "validate",
    "limit",
    "batch_size",
    "margin",
    "chunk_size",
)
FLAG_INPUTS = ("chat_template", "reprofile", "validate_all")
NAME_INPUTS = ("engine", "cost_mode", "device", "dtype", "batch_sizes")
BLANK_MEANS = {"limit": "all", "n_ctx": "the engine's"}  # an optional input: what leaving it blank means
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class Refused(Exception):
    """One input that cannot be read (collected into a :class:`RunInputError`)."""

    def __init__(self, problem: InputProblem):
        super().__init__(problem.message())
        self.problem = problem


def whole_number(name: str) -> bool:
    """Whether the parameter ``name`` is a whole number (declared ``int`` on :class:`RunParams`)."""
    declared = _HINTS[name]
    return declared is int or int in typing.get_args(declared)


def clipped(text: str, length: int = 40) -> str:
    """``text``, or its first characters and an ellipsis when it is longer than ``length`` (no name a run
    takes is that long: a message quotes what the user gave without repeating a page of it)."""
    return text if len(text) <= length else text[: length - 1] + "…"


def number_text(name: str, raw: object) -> str:
    """``must be a whole number from 1 to 4096, got '0'``: what a numeric input must be."""
    kind = "a whole number" if whole_number(name) else "a number"
    blank = f"blank ({BLANK_MEANS[name]}) or " if name in BLANK_MEANS else ""
    limit = N_CTX_LIMIT if name == "n_ctx" else LIMITS.get(name)
    bounds = f" {range_words(limit)}" if limit else ""
    return f"must be {blank}{kind}{bounds}, got {shown(raw)}"


def read_number(name: str, raw: object) -> int | float:
    """``raw`` (text or a number) as the field's type: a whole number, or a finite number."""
    refused = Refused(InputProblem(name, number_text(name, raw)))
    whole = whole_number(name)
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise refused
    value: int | float
    if isinstance(raw, str):
        try:
            value = int(raw.strip()) if whole else float(raw.strip())
        except ValueError:
            raise refused from None
    else:
        value = raw
    if isinstance(value, float):
        if not math.isfinite(value) or (whole and not value.is_integer()):
            raise refused
        return int(value) if whole else value
    return value if whole else float(value)


def read_flag(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in TRUE_WORDS or text in FALSE_WORDS:
        return text in TRUE_WORDS
    raise Refused(InputProblem(name, f"must be true or false, got {shown(raw)}"))


def _stored_value(name: str, value: Any) -> Any:
    """A stored parameter of the right type (``from_json``): numbers and flags read as inputs are,
    ranges left alone; None where the field may be None."""
    if value is None and type(None) in typing.get_args(_HINTS[name]):
        return None
    if name in LIMITS or _HINTS[name] in (int, float) or whole_number(name):
        return read_number(name, value)
    if name in FLAG_INPUTS:
        return read_flag(name, value)
    if name in ("profile_batch_sizes", "entropy_edges"):
        whole = name == "profile_batch_sizes"
        try:
            if not isinstance(value, (list, tuple)):
                raise TypeError(name)
            return tuple(
                None if v is None and not whole else read_number("batch_size" if whole else "margin", v)
                for v in value
            )
        except (Refused, TypeError):
            kind = "whole numbers" if whole else "numbers"
            raise Refused(InputProblem(name, f"must be a list of {kind}, got {shown(value)}")) from None
    if not isinstance(value, str):
        raise Refused(InputProblem(name, f"must be a name, got {shown(value)}"))
    return value


def greedy_only(temperature: float, batch_size: int, validate: int) -> list[InputProblem]:
    """What a sampling run (temperature above 0) cannot have: a batch, or validated prompts."""
    if not temperature > 0:
        return []
    found = []
    if batch_size > 1:
        found.append(
            InputProblem(
                "batch_size",
                f"must be 1 when temperature is above 0, got {shown(batch_size)}: batching is for greedy "
                "runs only (sampling uses one seed per prompt)",
            )
        )
    if validate > 0:
        found.append(
            InputProblem(
                "validate",
                f"must be 0 when temperature is above 0, got {shown(validate)}: only greedy runs are "
                "validated (real speculative decoding is compared token for token with greedy decoding); "
                "leave it blank or use temperature 0",
            )
        )
    return found
