"""The imported entry: cost profiles from another engine's own benchmark (vLLM, SGLang, TensorRT-LLM,
llama-server: analyzer/analysis/cost_import.py). Such a profile prices stored acceptance
(analyzer/analysis/repricing.py) and measures nothing, so every measuring method refuses; its
``priced_by`` is the engine the file names, and specroute judges neither its timing quality nor its fidelity."""

from __future__ import annotations

from typing import Any

from analyzer.engine.engine_base import IMPORTED
from analyzer.engine.engine_runless import RunlessEngine


class ImportedEngine(RunlessEngine):
    """Imported cost profiles, as :class:`analyzer.engine.engine_base.Engine` describes an engine that prices
    only."""

    name = IMPORTED
    refusal = (
        "imported cost profiles price stored acceptance; they measure nothing: analyze in transformers "
        "or llama.cpp and price with --cost-profile"
    )

    def profile_note(self, profile: dict[str, Any]) -> str | None:
        """An imported profile is the engine's own benchmark: specroute did not time it, so does not
        judge it."""
        version = f" {profile['engine_version']}" if profile.get("engine_version") else ""
        return f"imported from {profile.get('engine')}{version}'s own benchmark, not judged here"

    def decision_settings(
        self,
        speculate: bool,
        gamma: int,
        draft_kind: str,
        ngram_max: int,
        pool: str,
        setting: str | None = None,
    ) -> dict[str, Any] | None:
        """An imported profile's engine is configured by its own server's flags (``pool`` names the
        deployment), not per request."""
        return None
