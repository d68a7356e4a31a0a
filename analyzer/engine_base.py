"""The engines an analysis can measure in, named once: the CLI's ``--engine``, the web form's select,
the ``SPECROUTE_ENGINE`` setting and :class:`analyzer.run_records.RunParams` all check names here.

Acceptance travels between engines; cost does not (DESIGN.md, "Engines"): so every run, cost profile
and policy set records the engine that priced it. Names are checked without importing either engine.
"""

from __future__ import annotations

from analyzer.errors import SpecrouteError

TRANSFORMERS, LLAMA_CPP = "transformers", "llama.cpp"
ENGINES = (TRANSFORMERS, LLAMA_CPP)
DEFAULT_ENGINE = TRANSFORMERS


class EngineError(SpecrouteError, ValueError):
    """An engine name that is not one of :data:`ENGINES`; the message names the allowed ones."""

    status, code = 400, "invalid_engine"


def check_engine_name(text: str | None) -> str:
    """``text`` when it is one of :data:`ENGINES`, written exactly so (the name is stored and compared
    as it is); EngineError naming the allowed values otherwise."""
    if text not in ENGINES:
        raise EngineError(f"unknown engine {text!r}; use one of: {', '.join(ENGINES)}")
    return text


# How transformers' costs are timed (DESIGN.md, "Cost model and speedup"): eager forwards, as
# generate() runs them, or forwards replayed from captured CUDA graphs over a static KV cache, as
# vLLM, SGLang and TensorRT-LLM serve (analyzer/graph_cost.py; a CUDA GPU only).
EAGER, CUDA_GRAPHS = "eager", "cuda-graphs"
COST_MODES = (EAGER, CUDA_GRAPHS)
DEFAULT_COST_MODE = EAGER


class CostModeError(SpecrouteError, ValueError):
    """A cost mode that is not one of :data:`COST_MODES`, or one this engine or device cannot time."""

    status, code = 400, "invalid_cost_mode"


def check_cost_mode_name(text: str | None) -> str:
    """``text`` when it is one of :data:`COST_MODES`; CostModeError naming the allowed ones otherwise."""
    if text not in COST_MODES:
        raise CostModeError(f"unknown cost mode {text!r}; use one of: {', '.join(COST_MODES)}")
    return text


def check_cost_mode_device(cost_mode: str, device_type: str) -> None:
    """CostModeError when ``cost_mode`` cannot time on a device of ``device_type`` (cuda-graphs needs a
    CUDA GPU: a CPU has no CUDA graphs, and its eager cost is already what llama.cpp or torch pays)."""
    if cost_mode == CUDA_GRAPHS and device_type != "cuda":
        raise CostModeError(
            f"cost mode {CUDA_GRAPHS} times CUDA graphs, which need a CUDA GPU; this run's device is "
            f"{device_type}. Use --cost-mode {EAGER} here, or run on a machine with a GPU "
            f"(device auto or cuda)."
        )
