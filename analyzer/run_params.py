"""An analysis run's parameters: one typed object, read once from what a user typed by
:meth:`RunParams.from_inputs` (the command line, the web form and the demo all call it, so a bad value
gets the same words everywhere), stored as JSON with the run (``AnalysisRun.params``) and read back with
:meth:`RunParams.from_json` (all the worker reads: it parses no user input).

One set of limits (:data:`LIMITS`) and one set of defaults: an input left blank takes the field's default
below, except ``validate`` (:data:`DEFAULT_VALIDATE` prompts for a greedy run, 0 for a sampling one) and
the engine, cost mode, device and dtype, which take the settings (``SPECROUTE_ENGINE`` and so on).
``SPECROUTE_ENGINE``'s default, ``auto``, picks the first engine of :data:`AUTO_ENGINE_ORDER` that can
measure the run as asked: llama.cpp for a greedy run of a GGUF target on the CPU (the demo's run),
transformers otherwise.

What the router needs of them travels with each published policy set (gamma_max, margin, engine):
see :class:`router.policy.PolicyContract`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

from analyzer.engine.engine_base import (
    DEFAULT_COST_MODE,
    DEFAULT_ENGINE,
    ENGINES,
    LLAMA_CPP,
    TRANSFORMERS,
    CostModeError,
    EngineError,
    check_cost_mode_device,
    check_cost_mode_name,
    check_engine_name,
)
from analyzer.errors import SpecrouteError
from analyzer.measuring.entropy import ENTROPY_EDGES_NATS
from analyzer.models.devices import (
    MAX_PROFILE_BATCH_SIZE,
    DeviceError,
    Placement,
    check_device_name,
    check_dtype_name,
    default_batch_sizes,
    parse_batch_sizes,
    resolve,
)
from analyzer.models.specs import SpecError, parse_spec

if TYPE_CHECKING:
    from analyzer.engine.engine_base import Engine
    from analyzer.settings import Settings

DEFAULT_MARGIN = 0.05  # speculate only where the predicted speedup clears 1 + margin
DEFAULT_GAMMA_MAX = 16
# prompts a new greedy run validates with real speculative decoding when the input is left blank (a
# sampling run validates none: validation compares token for token with greedy decoding)
DEFAULT_VALIDATE = 3
# SPECROUTE_ENGINE's default: the first engine of AUTO_ENGINE_ORDER that can measure the run as asked
AUTO_ENGINE = "auto"
AUTO_ENGINE_ORDER = (LLAMA_CPP, TRANSFORMERS)


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


# The one set of limits: RunParams.from_inputs (so the CLI, the web form and the demo), the web form's
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
    limit: int | None = None
    chat_template: bool = True
    batch_size: int = 1
    margin: float = DEFAULT_MARGIN
    seed: int = 0
    reprofile: bool = False
    max_prompt_tokens: int | None = None
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
        sampling run), in the words :meth:`from_inputs` uses. What the run's engine cannot measure is
        its engine's to say: :func:`analyzer.engine.engines.check_run`."""
        found = [
            InputProblem(name, _number_text(name, getattr(self, name)))
            for name, limit in LIMITS.items()
            if getattr(self, name) is not None and not limit.admits(getattr(self, name))
        ]
        found += _greedy_only(self.temperature, self.batch_size, self.validate)
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
    def from_inputs(
        cls, raw: Mapping[str, object], settings: Settings, *, engines: Mapping[str, Engine]
    ) -> RunParams:
        """The parameters of a new run from what a user gave: :func:`read_inputs` (``engines`` is the
        registry, :data:`analyzer.engine.engines.REGISTRY`: this module sits below it). Callers then call
        :func:`analyzer.engine.engines.check_run` on the result (``create_run`` does) for what its engine
        refuses."""
        return read_inputs(raw, settings, engines=engines).params

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunParams:
        """The parameters stored on a run (keys it does not know are ignored; missing ones take the
        defaults, as for runs stored before a parameter existed). A value of the wrong type (a row edited
        by hand) is refused with the words :meth:`from_inputs` uses; ranges and names are not checked
        again, so a run stored under older limits still reads back (they were checked when it was
        created)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (data or {}).items() if k in known}
        problems = []
        for name, value in list(values.items()):
            try:
                values[name] = _stored_value(name, value)
            except _Refused as refused:
                problems.append(refused.problem)
        if problems:
            raise RunInputError(problems)
        return cls(**values)

    def placement(self) -> Placement:
        """The device and dtype this run asks for, resolved on this machine (DeviceError if absent;
        RunError when the run's cost mode cannot time on it: cuda-graphs on a CPU)."""
        placement = resolve(self.device, self.dtype)
        try:
            check_cost_mode_device(self.cost_mode, "cuda" if placement.is_cuda else "cpu")
        except CostModeError as error:
            raise RunError(str(error)) from None
        return placement

    def batch_sizes(self, placement: Placement) -> tuple[int, ...]:
        """The batch sizes to profile: the ones asked for, else the device's default."""
        return tuple(self.profile_batch_sizes) if self.profile_batch_sizes else default_batch_sizes(placement)


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
FLAG_INPUTS = ("chat_template", "reprofile")
NAME_INPUTS = ("engine", "cost_mode", "device", "dtype", "batch_sizes")
BLANK_MEANS = {"limit": "all"}  # an optional input: what leaving it blank means
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class _Refused(Exception):
    """One input that cannot be read (collected into a :class:`RunInputError`)."""

    def __init__(self, problem: InputProblem):
        super().__init__(problem.message())
        self.problem = problem


class RunInputs(NamedTuple):
    """A new run's parameters read from its inputs, and how its engine was chosen, in words (None: the
    inputs named it)."""

    params: RunParams
    engine_why: str | None


def whole_number(name: str) -> bool:
    """Whether the parameter ``name`` is a whole number (declared ``int`` on :class:`RunParams`)."""
    declared = _HINTS[name]
    return declared is int or int in typing.get_args(declared)


def _clipped(text: str, length: int = 40) -> str:
    """``text``, or its first characters and an ellipsis when it is longer than ``length`` (no name a run
    takes is that long: a message quotes what the user gave without repeating a page of it)."""
    return text if len(text) <= length else text[: length - 1] + "…"


def _shown(raw: object) -> str:
    """A value as the user gave it, quoted (a long one clipped): ``'0'``, ``'abc'``."""
    return repr(_clipped(raw if isinstance(raw, str) else str(raw)))


def _number_text(name: str, raw: object) -> str:
    """``must be a whole number from 1 to 4096, got '0'``: what a numeric input must be."""
    kind = "a whole number" if whole_number(name) else "a number"
    blank = f"blank ({BLANK_MEANS[name]}) or " if name in BLANK_MEANS else ""
    limit = LIMITS.get(name)
    bounds = f" {range_words(limit)}" if limit else ""
    return f"must be {blank}{kind}{bounds}, got {_shown(raw)}"


def _read_number(name: str, raw: object) -> int | float:
    """``raw`` (text or a number) as the field's type: a whole number, or a finite number."""
    refused = _Refused(InputProblem(name, _number_text(name, raw)))
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


def _read_flag(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in TRUE_WORDS or text in FALSE_WORDS:
        return text in TRUE_WORDS
    raise _Refused(InputProblem(name, f"must be true or false, got {_shown(raw)}"))


def _stored_value(name: str, value: Any) -> Any:
    """A stored parameter of the right type (``from_json``): numbers and flags read as inputs are,
    ranges left alone; None where the field may be None."""
    if value is None and type(None) in typing.get_args(_HINTS[name]):
        return None
    if name in LIMITS or _HINTS[name] in (int, float) or whole_number(name):
        return _read_number(name, value)
    if name in FLAG_INPUTS:
        return _read_flag(name, value)
    if name in ("profile_batch_sizes", "entropy_edges"):
        whole = name == "profile_batch_sizes"
        try:
            if not isinstance(value, (list, tuple)):
                raise TypeError(name)
            return tuple(
                None if v is None and not whole else _read_number("batch_size" if whole else "margin", v)
                for v in value
            )
        except (_Refused, TypeError):
            kind = "whole numbers" if whole else "numbers"
            raise _Refused(InputProblem(name, f"must be a list of {kind}, got {_shown(value)}")) from None
    if not isinstance(value, str):
        raise _Refused(InputProblem(name, f"must be a name, got {_shown(value)}"))
    return value


def _greedy_only(temperature: float, batch_size: int, validate: int) -> list[InputProblem]:
    """What a sampling run (temperature above 0) cannot have: a batch, or validated prompts."""
    if not temperature > 0:
        return []
    found = []
    if batch_size > 1:
        found.append(
            InputProblem(
                "batch_size",
                f"must be 1 when temperature is above 0, got {_shown(batch_size)}: batching is for greedy "
                "runs only (sampling uses one seed per prompt)",
            )
        )
    if validate > 0:
        found.append(
            InputProblem(
                "validate",
                f"must be 0 when temperature is above 0, got {_shown(validate)}: only greedy runs are "
                "validated (real speculative decoding is compared token for token with greedy decoding); "
                "leave it blank or use temperature 0",
            )
        )
    return found


def check_engine_input(text: str) -> str:
    """``text`` when it names an engine or ``auto`` (the setting and the inputs); EngineError naming the
    choices otherwise."""
    if text != AUTO_ENGINE and text not in ENGINES:
        raise EngineError(f"unknown engine {_shown(text)}; use one of: {', '.join((AUTO_ENGINE, *ENGINES))}")
    return text


def _given(raw: Mapping[str, object], name: str) -> object | None:
    """The input ``name`` as given; None when it is absent or blank (the default)."""
    value = raw.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value


def read_inputs(raw: Mapping[str, object], settings: Settings, *, engines: Mapping[str, Engine]) -> RunInputs:
    """A new run's parameters from ``raw``: the inputs of :data:`NUMBER_INPUTS`, :data:`FLAG_INPUTS` and
    :data:`NAME_INPUTS` as text (the web form) or typed values (the CLI, the demo); absent, None or blank
    means the default (the field's; :data:`DEFAULT_VALIDATE` for a greedy run and 0 for a sampling one;
    the settings for engine, cost mode, device and dtype). ``target`` and ``draft`` (spec strings) are
    read only to choose the engine under ``auto``; other keys are left to the caller. Every problem is
    collected and raised together as a :class:`RunInputError`. The engine comes from ``engines`` (the
    registry), which also gives the cost mode a run stores (``Engine.cost_mode_for``)."""
    problems: list[InputProblem] = []
    values: dict[str, Any] = {}
    _read_number_inputs(raw, values, problems)
    _read_flag_inputs(raw, values, problems)
    asked_engine, asked_mode = _given(raw, "engine"), _given(raw, "cost_mode")
    for name, read in (
        ("engine", lambda: check_engine_input(str(asked_engine or settings.engine).strip())),
        ("cost_mode", lambda: asked_mode and check_cost_mode_name(_clipped(str(asked_mode).strip()))),
        ("device", lambda: check_device_name(_clipped(str(_given(raw, "device") or settings.device)))),
        ("dtype", lambda: check_dtype_name(_clipped(str(_given(raw, "dtype") or settings.dtype)))),
        ("batch_sizes", lambda: _batch_sizes(_given(raw, "batch_sizes"))),
    ):
        try:
            values[name] = read()
        except (DeviceError, EngineError, CostModeError) as error:
            problems.append(InputProblem(name, _clipped(str(error), 300), names_field=False))
    temperature = values.get("temperature", RunParams.temperature)
    if "validate" not in values and not any(p.field == "validate" for p in problems):
        values["validate"] = DEFAULT_VALIDATE if temperature == 0 else 0
    if not any(p.field in ("temperature", "batch_size", "validate") for p in problems):
        problems += _greedy_only(
            temperature, values.get("batch_size", RunParams.batch_size), values["validate"]
        )
    if problems:
        raise RunInputError(problems)
    engine_name, mode = values.pop("engine"), values.pop("cost_mode")
    values["profile_batch_sizes"] = values.pop("batch_sizes")
    params = RunParams(**values)

    def in_engine(name: str) -> RunParams:
        return replace(params, engine=name, cost_mode=engines[name].cost_mode_for(mode, settings.cost_mode))

    if engine_name == AUTO_ENGINE:  # asked for (the form's preselection, --engine auto) or the setting
        return _auto_engine(in_engine, engines, raw)
    return RunInputs(
        in_engine(engine_name), None if asked_engine is not None else f"SPECROUTE_ENGINE is {engine_name}"
    )


def _read_number_inputs(
    raw: Mapping[str, object], values: dict[str, Any], problems: list[InputProblem]
) -> None:
    """Read each given input of :data:`NUMBER_INPUTS` into ``values``, or its problem into ``problems``."""
    for name in NUMBER_INPUTS:
        given = _given(raw, name)
        if given is None:
            continue
        try:
            number = _read_number(name, given)
        except _Refused as refused:
            problems.append(refused.problem)
            continue
        if not LIMITS[name].admits(number):
            problems.append(InputProblem(name, _number_text(name, given)))
            continue
        values[name] = number


def _read_flag_inputs(
    raw: Mapping[str, object], values: dict[str, Any], problems: list[InputProblem]
) -> None:
    """Read each given input of :data:`FLAG_INPUTS` into ``values``, or its problem into ``problems``."""
    for name in FLAG_INPUTS:
        given = _given(raw, name)
        if given is not None:
            try:
                values[name] = _read_flag(name, given)
            except _Refused as refused:
                problems.append(refused.problem)


def _batch_sizes(given: object | None) -> tuple[int, ...] | None:
    """The profile batch sizes: text ``1,4,16`` or a sequence of numbers (DeviceError as for text)."""
    if given is None or isinstance(given, str):
        return parse_batch_sizes(given)
    if isinstance(given, (list, tuple)):
        return parse_batch_sizes(",".join(str(size) for size in given))
    return parse_batch_sizes(str(given))


def _auto_engine(
    in_engine: Callable[[str], RunParams], engines: Mapping[str, Engine], raw: Mapping[str, object]
) -> RunInputs:
    """The run in the first engine of :data:`AUTO_ENGINE_ORDER` that can measure it as asked (its own
    checks of the parameters and of the target and draft, when they parse), else in the last one (whose
    refusal :func:`analyzer.engine.engines.check_run` then reports)."""
    try:
        pair = parse_spec(str(raw.get("target") or "")), parse_spec(str(raw.get("draft") or ""))
    except (SpecError, ValueError, OSError):
        pair = None  # create_run refuses the specs with the reason
    refusals = []
    for name in AUTO_ENGINE_ORDER:
        params = in_engine(name)
        try:
            engines[name].check_params(params)
            if pair is not None:
                engines[name].check_specs(*pair)
        except (RunError, DeviceError) as refused:
            refusals.append(f"{name} cannot: {refused}")
            continue
        why = "; ".join([f"SPECROUTE_ENGINE is auto and {name} can measure this run as asked", *refusals])
        return RunInputs(params, why)
    return RunInputs(
        in_engine(AUTO_ENGINE_ORDER[-1]),
        "; ".join(["SPECROUTE_ENGINE is auto and no engine can measure this run as asked", *refusals]),
    )
