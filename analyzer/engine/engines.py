"""The registry of engines: one object per engine, looked up by the name a run, profile or policy set stores,
in a table per capability (:mod:`analyzer.engine.engine_base`'s protocols): :data:`MEASURING`, what measures
analysis runs (transformers, llama.cpp); :data:`SERVING`, what serves a routing decision (those two and
llama-server); :data:`COST_SOURCES`, where a cost profile comes from (those three and imported profiles). An
engine is in the tables of the capabilities it has, and implements only those. Code outside the engines' own
modules asks the engine object what to do and never compares engine names (tests/test_engine_registry.py
looks for such comparisons). Adding an engine is a module implementing its capabilities and one line here.

The protocols are :mod:`analyzer.engine.engine_base`'s; the engines' names are :mod:`analyzer.names`', their
checks :mod:`analyzer.checks`'.
"""

from __future__ import annotations

from analyzer.checks import (
    EngineError,
    check_engine_name,
)
from analyzer.engine.engine_base import (
    CostSource,
    MeasuringEngine,
    ServingEngine,
)
from analyzer.engine.engine_imported import ImportedEngine
from analyzer.engine.engine_llama_server import LlamaServerEngine
from analyzer.engine.engine_llamacpp import LlamaCppEngine
from analyzer.engine.engine_transformers import TransformersEngine
from analyzer.names import (
    DEFAULT_ENGINE,
    IMPORTED,
)
from analyzer.run_params import RunParams

_TRANSFORMERS, _LLAMA_CPP, _IMPORTED, _LLAMA_SERVER = (
    TransformersEngine(),
    LlamaCppEngine(),
    ImportedEngine(),
    LlamaServerEngine(),
)
MEASURING: dict[str, MeasuringEngine] = {e.name: e for e in (_TRANSFORMERS, _LLAMA_CPP)}
SERVING: dict[str, ServingEngine] = {e.name: e for e in (_TRANSFORMERS, _LLAMA_CPP, _LLAMA_SERVER)}
COST_SOURCES: dict[str, CostSource] = {
    e.name: e for e in (_TRANSFORMERS, _LLAMA_CPP, _IMPORTED, _LLAMA_SERVER)
}
REGISTRY: dict[str, object] = {**COST_SOURCES, **SERVING, **MEASURING}  # every entry by name


def engine_named(name: str | None) -> MeasuringEngine:
    """The measuring engine a run stores (None: transformers, the engine of everything stored before engines
    were recorded); EngineError naming the known ones for any other name."""
    try:
        return MEASURING[name or DEFAULT_ENGINE]
    except KeyError:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(MEASURING)}") from None


def analyzes_settings(name: str | None) -> bool:
    """Whether engine ``name`` analyzes its server's own drafting settings (its analysis is not a run)."""
    return name is not None and name in SERVING and SERVING[name].analyzes_settings


def measuring_engine(name: str | None) -> MeasuringEngine:
    """The engine ``name`` when it measures (one of ENGINES); EngineError naming those otherwise."""
    return MEASURING[
        check_engine_name(name or DEFAULT_ENGINE)
    ]  # ENGINES names MEASURING's entries (a test checks)


def pricing_entry(priced_by: str | None, source: str | None) -> CostSource:
    """The cost source behind a cost profile: its measuring engine for a profile specroute measured, the
    imported entry for one imported from another engine's benchmark (``source`` "imported")."""
    if source == IMPORTED:
        return COST_SOURCES[IMPORTED]
    try:
        return COST_SOURCES[priced_by or DEFAULT_ENGINE]
    except KeyError:
        raise EngineError(f"unknown engine {priced_by!r}; known: {', '.join(COST_SOURCES)}") from None


def check_run(params: RunParams) -> RunParams:
    """``params`` checked in full: the ranges every run shares (:meth:`RunParams.check`), then what its
    engine cannot measure (:meth:`Engine.check_params`); RunError naming the first problem."""
    params.check()
    measuring_engine(params.engine).check_params(params)
    return params
