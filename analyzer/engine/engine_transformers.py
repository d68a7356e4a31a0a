"""The transformers engine: measures with ``generate()`` (greedy output, per-step data, a teacher-forced
draft pass) on a CPU or GPU in any dtype, and prices in one of two cost modes, eager forwards as
``generate()`` runs them or CUDA graphs replayed over a static cache (analyzer/engine/graph_cost.py). Its
loaded pair is :class:`analyzer.engine.run_models.RunModels`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from analyzer.checks import CostModeError, check_cost_mode_device
from analyzer.engine.engine_base import LoadedPair
from analyzer.measuring.acceptance import TRANSFORMERS_RULE, DraftingRule
from analyzer.models.devices import resolve, run_placement
from analyzer.names import COST_MODES, CUDA_GRAPHS, DEFAULT_COST_MODE, TRANSFORMERS
from analyzer.run_params import RunError, RunParams

if TYPE_CHECKING:
    from analyzer.models.specs import ModelSpecRef
    from analyzer.orm import ModelPair


class TransformersEngine:
    """transformers, as :class:`analyzer.engine.engine_base.Engine` describes an engine."""

    name = TRANSFORMERS
    measures = True
    analyzes_settings = False
    cost_modes: tuple[str, ...] = COST_MODES

    @property
    def rule(self) -> DraftingRule:
        return TRANSFORMERS_RULE

    def check_params(self, params: RunParams) -> None:
        """Refuses cuda-graphs on an explicit CPU device (``auto`` is checked where it is resolved), and a
        context size: a transformers model holds its own (``max_position_embeddings``)."""
        if params.n_ctx is not None:
            raise RunError(
                "the transformers engine holds each model's own context (its max_position_embeddings); "
                "a context size (--ctx) applies to the llama.cpp and llama-server engines"
            )
        if params.device == "cpu":
            try:
                check_cost_mode_device(params.cost_mode, "cpu")
            except CostModeError as error:
                raise RunError(str(error)) from None

    def check_specs(self, target: ModelSpecRef, draft: ModelSpecRef) -> None:
        """Loads every model spec kind (Hugging Face folders and ids, GGUF files dequantized)."""

    def cost_mode_for(self, asked: str | None, setting: str) -> str:
        return asked or setting or DEFAULT_COST_MODE

    def require_installed(self) -> None:
        """A dependency of specroute itself: always installed."""

    def placement_text(self, params: RunParams, *, queue_only: bool) -> str:
        placement = resolve(params.device, params.dtype) if queue_only else run_placement(params)
        mode = " (steps timed as replayed CUDA graphs)" if params.cost_mode == CUDA_GRAPHS else ""
        return (
            f"engine {self.name}{mode}, device {placement.device} ({placement.name}), dtype {placement.dtype}"
        )

    def load_key(self, params: RunParams) -> tuple[Any, ...]:
        placement = run_placement(params)
        return (f"on {placement.device} ({placement.name}) in {placement.dtype}",)

    def load(self, pair: ModelPair, cache_dir: Path, params: RunParams, *, allow_network: bool) -> LoadedPair:
        from analyzer.engine.run_models import load_run_models  # torch and transformers load with the models

        return load_run_models(pair, cache_dir, allow_network, run_placement(params))

    def report_cost_mode(self, params: RunParams) -> str | None:
        return params.cost_mode

    def replay_mode(self, dtype: str) -> str | None:
        return None

    def estimate_opening(self, dtype: str) -> str | None:
        return None

    def profile_note(self, profile: dict[str, Any]) -> str | None:
        return None

    def settings_in(self, decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return decision["engine"].get(self.name)

    def decision_settings(
        self,
        speculate: bool,
        gamma: int,
        draft_kind: str,
        ngram_max: int,
        pool: str,
        setting: str | None = None,
    ) -> dict[str, Any] | None:
        """``generate()`` settings: no assistant, prompt lookup, or a draft model at a constant gamma
        with no confidence stop (what the analysis replayed). None for a llama-server drafter ``setting``,
        which only llama-server runs."""
        if not speculate:
            return {"assistant_model": False}
        if setting is not None:
            return None
        if draft_kind == "ngram":
            return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": ngram_max}
        return {
            "assistant_model": True,
            "assistant_generation_config": {
                "num_assistant_tokens": gamma,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            },
        }
