"""The entries of the registry that no analysis run measures in (:class:`RunlessEngine`): imported cost
profiles, which only price, and llama-server, whose analyses are its own. Every run method refuses with the
entry's ``refusal``, and the report texts fall back to the generic ones."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from analyzer.engine.engine_base import LoadedPair
from analyzer.run_params import RunError, RunParams

if TYPE_CHECKING:
    from analyzer.measuring.acceptance import DraftingRule
    from analyzer.models.specs import ModelSpecRef
    from analyzer.orm import ModelPair


class RunlessEngine:
    """An :class:`analyzer.engine.engine_base.Engine` that measures no run: a subclass names itself, says in
    ``refusal`` what to do instead, and gives its ``decision_settings`` (and ``profile_note`` where it
    prices)."""

    name: str
    refusal: str
    measures = False
    analyzes_settings = False
    cost_modes: tuple[str, ...] = ()

    def _refuse(self) -> NoReturn:
        raise RunError(self.refusal)

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
        return None
