"""The registry of engines: one object per engine (:class:`analyzer.engine.engine_base.Engine`), looked up by the
name a run, profile or policy set stores. Code outside the engines' own modules asks the engine object
what to do and never compares engine names (tests/test_engine_registry.py looks for such comparisons).
Adding an engine is a module implementing the protocol and one line here.

The names, the protocols and the name checks are in :mod:`analyzer.engine.engine_base` (re-exported here).
"""

from __future__ import annotations

from analyzer.engine.engine_base import (  # noqa: F401  (re-exported: importers name them here)
    COST_MODE_WORDS,
    COST_MODES,
    CUDA_GRAPHS,
    DEFAULT_COST_MODE,
    DEFAULT_ENGINE,
    EAGER,
    ENGINES,
    IMPORTED,
    LLAMA_CPP,
    LLAMA_SERVER,
    TRANSFORMERS,
    CostModeError,
    Engine,
    EngineError,
    EngineUnavailable,
    LoadedPair,
    ProfilingPlan,
    check_cost_mode_device,
    check_cost_mode_name,
    check_engine_name,
)
from analyzer.engine.engine_imported import ImportedEngine
from analyzer.engine.engine_llama_server import LlamaServerEngine
from analyzer.engine.engine_llamacpp import LlamaCppEngine
from analyzer.engine.engine_transformers import TransformersEngine
from analyzer.run_params import RunParams

REGISTRY: dict[str, Engine] = {
    engine.name: engine
    for engine in (TransformersEngine(), LlamaCppEngine(), ImportedEngine(), LlamaServerEngine())
}


def engine_named(name: str | None) -> Engine:
    """The engine ``name`` stores (None: transformers, the engine of everything stored before engines
    were recorded); EngineError naming the known ones for any other name."""
    try:
        return REGISTRY[name or DEFAULT_ENGINE]
    except KeyError:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(REGISTRY)}") from None


def analyzes_settings(name: str | None) -> bool:
    """Whether engine ``name`` analyzes its server's own drafting settings (its analysis is not a run)."""
    return name is not None and name in REGISTRY and REGISTRY[name].analyzes_settings


def measuring_engine(name: str | None) -> Engine:
    """The engine ``name`` when it measures (one of ENGINES); EngineError naming those otherwise."""
    engine = engine_named(check_engine_name(name or DEFAULT_ENGINE))
    assert engine.measures, name  # ENGINES names the measuring entries of REGISTRY (a test checks)
    return engine


def pricing_entry(priced_by: str | None, source: str | None) -> Engine:
    """The registry entry behind a cost profile: its measuring engine for a profile specroute measured,
    the imported entry for one imported from another engine's benchmark (``source`` "imported")."""
    if source == IMPORTED:
        return REGISTRY[IMPORTED]
    return engine_named(priced_by)


def check_run(params: RunParams) -> RunParams:
    """``params`` checked in full: the ranges every run shares (:meth:`RunParams.check`), then what its
    engine cannot measure (:meth:`Engine.check_params`); RunError naming the first problem."""
    params.check()
    measuring_engine(params.engine).check_params(params)
    return params
