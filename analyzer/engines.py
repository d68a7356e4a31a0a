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
