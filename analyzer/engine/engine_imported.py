"""The imported entry: cost profiles from another engine's own benchmark (vLLM, SGLang, TensorRT-LLM,
llama-server: analyzer/analysis/cost_import.py). Such a profile prices stored acceptance
(analyzer/analysis/repricing.py) and measures nothing, so every measuring method refuses; its
``priced_by`` is the engine the file names, and specroute judges neither its timing quality nor its fidelity."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from analyzer.engine.engine_base import IMPORTED, LoadedPair
from analyzer.run_params import RunError, RunParams

if TYPE_CHECKING:
    from analyzer.measuring.acceptance import DraftingRule
    from analyzer.models.specs import ModelSpecRef
    from analyzer.orm import ModelPair


class ImportedEngine:
    """Imported cost profiles, as :class:`analyzer.engine.engine_base.Engine` describes an engine that prices
    only."""

    name = IMPORTED
    measures = False
    cost_modes: tuple[str, ...] = ()

    def _refuse(self) -> NoReturn:
        raise RunError(
            "imported cost profiles price stored acceptance; they measure nothing: analyze in transformers "
            "or llama.cpp and price with --cost-profile"
        )

    @property
    def rule(self) -> DraftingRule:
        self._refuse()

    def check_params(self, params: RunParams) -> None:
        self._refuse()

    def check_specs(self, target: ModelSpecRef, draft: ModelSpecRef) -> None:
        self._refuse()

    def cost_mode_for(self, asked: str | None, setting: str) -> str:
        self._refuse()

    def require_installed(self) -> None:
        self._refuse()

    def placement_text(self, params: RunParams, *, queue_only: bool) -> str:
        self._refuse()

    def load_key(self, params: RunParams) -> tuple[Any, ...]:
        self._refuse()

    def load(self, pair: ModelPair, cache_dir: Path, params: RunParams, *, allow_network: bool) -> LoadedPair:
        self._refuse()

    def report_cost_mode(self, params: RunParams) -> str | None:
        return None

    def replay_mode(self, dtype: str) -> str | None:
        return None

    def estimate_opening(self, dtype: str) -> str | None:
        return None

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
