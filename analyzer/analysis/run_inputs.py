"""A new analysis run's parameters read from what a user typed (the command line, the web form and the demo
all call :func:`read_inputs`, so a bad value gets the same words everywhere), and the engine chosen for it:
``SPECROUTE_ENGINE``'s default, ``auto``, picks the first engine of
:data:`~analyzer.names.AUTO_ENGINE_ORDER` that can measure the run as asked (llama.cpp for a greedy run of a
GGUF target on the CPU, transformers otherwise). The parameters themselves, their limits and their stored form
are :mod:`analyzer.run_params`'s."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

from analyzer.checks import (
    CostModeError,
    DeviceError,
    EngineError,
    check_cost_mode_name,
    check_device_name,
    check_dtype_name,
    check_engine_input,
)
from analyzer.models.devices import parse_batch_sizes
from analyzer.models.specs import SpecError, parse_spec
from analyzer.names import AUTO_ENGINE, AUTO_ENGINE_ORDER, DEFAULT_VALIDATE
from analyzer.run_params import (
    FLAG_INPUTS,
    LIMITS,
    LONG_PROMPT_RULES,
    N_CTX_LIMIT,
    NUMBER_INPUTS,
    InputProblem,
    Refused,
    RunError,
    RunInputError,
    RunParams,
    clipped,
    greedy_only,
    long_prompts_text,
    number_text,
    read_flag,
    read_number,
)

if TYPE_CHECKING:
    from analyzer.engine.engine_base import MeasuringEngine
    from analyzer.settings import Settings


class RunInputs(NamedTuple):
    """A new run's parameters read from its inputs, and how its engine was chosen, in words (None: the
    inputs named it)."""

    params: RunParams
    engine_why: str | None


def params_from_inputs(
    raw: Mapping[str, object], settings: Settings, *, engines: Mapping[str, MeasuringEngine]
) -> RunParams:
    """The parameters of a new run from what a user gave (:func:`read_inputs`; ``engines``: the measuring
    engines, :data:`analyzer.engine.engines.MEASURING`). Callers then call
    :func:`analyzer.engine.engines.check_run` on the result (``create_run`` does) for what its engine
    refuses."""
    return read_inputs(raw, settings, engines=engines).params


def _given(raw: Mapping[str, object], name: str) -> object | None:
    """The input ``name`` as given; None when it is absent or blank (the default)."""
    value = raw.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value


def read_inputs(
    raw: Mapping[str, object], settings: Settings, *, engines: Mapping[str, MeasuringEngine]
) -> RunInputs:
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
    _read_engine_context(raw, values, problems)
    asked_engine, asked_mode = _given(raw, "engine"), _given(raw, "cost_mode")
    for name, read in (
        ("engine", lambda: check_engine_input(str(asked_engine or settings.engine).strip())),
        ("cost_mode", lambda: asked_mode and check_cost_mode_name(clipped(str(asked_mode).strip()))),
        ("device", lambda: check_device_name(clipped(str(_given(raw, "device") or settings.device)))),
        ("dtype", lambda: check_dtype_name(clipped(str(_given(raw, "dtype") or settings.dtype)))),
        ("batch_sizes", lambda: _batch_sizes(_given(raw, "batch_sizes"))),
    ):
        try:
            values[name] = read()
        except (DeviceError, EngineError, CostModeError) as error:
            problems.append(InputProblem(name, clipped(str(error), 300), names_field=False))
    temperature = values.get("temperature", RunParams.temperature)
    if "validate" not in values and not any(p.field == "validate" for p in problems):
        values["validate"] = DEFAULT_VALIDATE if temperature == 0 else 0
    if not any(p.field in ("temperature", "batch_size", "validate") for p in problems):
        problems += greedy_only(
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
            number = read_number(name, given)
        except Refused as refused:
            problems.append(refused.problem)
            continue
        if not LIMITS[name].admits(number):
            problems.append(InputProblem(name, number_text(name, given)))
            continue
        values[name] = number


def _read_engine_context(
    raw: Mapping[str, object], values: dict[str, Any], problems: list[InputProblem]
) -> None:
    """Read ``n_ctx`` (the context of an engine that has one; the command line's ``--ctx``) and ``long_prompts``
    (what to do with prompts it cannot hold) into ``values``, or their problems into ``problems``."""
    given = _given(raw, "n_ctx")
    if given is not None:
        try:
            number = read_number("n_ctx", given)
        except Refused as refused:
            problems.append(refused.problem)
        else:
            if N_CTX_LIMIT.admits(number):
                values["n_ctx"] = number
            else:
                problems.append(InputProblem("n_ctx", number_text("n_ctx", given)))
    rule = _given(raw, "long_prompts")
    if rule is not None:
        if str(rule).strip() in LONG_PROMPT_RULES:
            values["long_prompts"] = str(rule).strip()
        else:
            problems.append(InputProblem("long_prompts", long_prompts_text(rule)))


def _read_flag_inputs(
    raw: Mapping[str, object], values: dict[str, Any], problems: list[InputProblem]
) -> None:
    """Read each given input of :data:`FLAG_INPUTS` into ``values``, or its problem into ``problems``."""
    for name in FLAG_INPUTS:
        given = _given(raw, name)
        if given is not None:
            try:
                values[name] = read_flag(name, given)
            except Refused as refused:
                problems.append(refused.problem)


def _batch_sizes(given: object | None) -> tuple[int, ...] | None:
    """The profile batch sizes: text ``1,4,16`` or a sequence of numbers (DeviceError as for text)."""
    if given is None or isinstance(given, str):
        return parse_batch_sizes(given)
    if isinstance(given, (list, tuple)):
        return parse_batch_sizes(",".join(str(size) for size in given))
    return parse_batch_sizes(str(given))


def _auto_engine(
    in_engine: Callable[[str], RunParams], engines: Mapping[str, MeasuringEngine], raw: Mapping[str, object]
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
