"""The imported entry: cost profiles from another engine's own benchmark (vLLM, SGLang, TensorRT-LLM,
llama-server: analyzer/analysis/cost_import.py). Such a profile prices stored acceptance
(analyzer/analysis/repricing.py) and measures nothing, so the entry is a cost source only
(:class:`analyzer.engine.engine_base.CostSource`); its ``priced_by`` is the engine the file names, and
specroute judges neither its timing quality nor its fidelity."""

from __future__ import annotations

from typing import Any

from analyzer.names import IMPORTED


class ImportedEngine:
    """Imported cost profiles: a :class:`analyzer.engine.engine_base.CostSource` that specroute did not
    measure."""

    name = IMPORTED
    measures = False

    def profile_note(self, profile: dict[str, Any]) -> str | None:
        """An imported profile is the engine's own benchmark: specroute did not time it, so does not
        judge it."""
        version = f" {profile['engine_version']}" if profile.get("engine_version") else ""
        return f"imported from {profile.get('engine')}{version}'s own benchmark, not judged here"
