"""The llama.cpp engine: measures GGUF models as shipped, in llama-cpp-python on the CPU, greedy and one
sequence per context, and prices with llama.cpp's own step times. Its loaded pair is
:class:`analyzer.engine.llamacpp_run.LlamaCppRunModels`; ``llama_cpp`` is an optional dependency (the
``llamacpp`` extra), imported only when a pair loads or the installation is checked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from analyzer.checks import check_device_name, check_dtype_name
from analyzer.engine.engine_base import LoadedPair
from analyzer.measuring.acceptance import LLAMA_CPP_RULE, DraftingRule
from analyzer.names import CUDA_GRAPHS, EAGER, LLAMA_CPP
from analyzer.run_params import RunError, RunParams

if TYPE_CHECKING:
    from analyzer.models.specs import ModelSpecRef
    from analyzer.orm import ModelPair

LLAMA_CPP_SPEC_KINDS = ("gguf", "builtin")  # the spec kinds llama.cpp loads natively (GGUF files)


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python, as :class:`analyzer.engine.engine_base.Engine` describes an engine."""

    name = LLAMA_CPP
    measures = True
    analyzes_settings = False
    cost_modes: tuple[str, ...] = ()

    @property
    def rule(self) -> DraftingRule:
        return LLAMA_CPP_RULE

    def check_params(self, params: RunParams) -> None:
        """Greedy, on the CPU, in the GGUF file's own quantization, one sequence at a time."""
        if params.cost_mode == CUDA_GRAPHS:
            raise RunError(
                f"cost mode {CUDA_GRAPHS} is the transformers engine's; {self.name} times its own steps"
            )
        if params.temperature != 0:
            raise RunError("the llama.cpp engine measures greedy decoding only; use temperature 0")
        if check_device_name(params.device) not in ("auto", "cpu"):
            raise RunError(
                f"the llama.cpp engine runs on the CPU here; use device auto or cpu, not {params.device!r}"
            )
        if check_dtype_name(params.dtype) != "auto":
            raise RunError(
                "the llama.cpp engine measures the GGUF file's own quantization (Q4_1, Q8_0, ...) as "
                f"shipped; leave dtype auto, not {params.dtype!r}"
            )
        if params.batch_size != 1 or tuple(params.profile_batch_sizes or (1,)) != (1,):
            raise RunError(
                "the llama.cpp engine runs one sequence per context (llama-cpp-python): use batch size 1 "
                "and profile batch size 1 only"
            )

    def check_specs(self, target: ModelSpecRef, draft: ModelSpecRef) -> None:
        """A GGUF target (``gguf:`` or ``builtin:``) and a GGUF or n-gram draft."""
        if target.kind not in LLAMA_CPP_SPEC_KINDS:
            raise RunError(
                f"the llama.cpp engine loads GGUF files only: the target must be gguf:<folder>#<file.gguf> "
                f"or builtin:<name>, not {target.canonical!r}"
            )
        if draft.kind not in LLAMA_CPP_SPEC_KINDS + ("ngram",):
            raise RunError(
                f"the llama.cpp engine loads GGUF files only: the draft must be ngram, "
                f"gguf:<folder>#<file.gguf> or builtin:<name>, not {draft.canonical!r}"
            )

    def cost_mode_for(self, asked: str | None, setting: str) -> str:
        """The setting is the transformers engine's default: llama.cpp stores eager unless asked
        otherwise (an explicit cuda-graphs is refused by :meth:`check_params`)."""
        return asked or EAGER

    def require_installed(self) -> None:
        from analyzer.engine.llamacpp_engine import require_llama_cpp

        require_llama_cpp()

    def placement_text(self, params: RunParams, *, queue_only: bool) -> str:
        if not queue_only:
            self.require_installed()
        return f"engine {self.name} on the CPU, the GGUF files' own quantization"

    def load_key(self, params: RunParams) -> tuple[Any, ...]:
        return ("in llama.cpp on the CPU", params.gamma_max, params.n_ctx)

    def load(self, pair: ModelPair, cache_dir: Path, params: RunParams, *, allow_network: bool) -> LoadedPair:
        from analyzer.engine.llamacpp_run import load_llamacpp_models  # llama_cpp is optional

        return load_llamacpp_models(pair, cache_dir, params)

    def report_cost_mode(self, params: RunParams) -> str | None:
        return None

    def replay_mode(self, dtype: str) -> str | None:
        return f"greedy (replay estimate in llama.cpp, {dtype} weights)"

    def estimate_opening(self, dtype: str) -> str | None:
        return (
            f"llama.cpp, {dtype} weights: the replay is an estimate, not exact — llama.cpp's "
            "batched verification and one-token decoding use different kernels, so real "
            "speculative decoding can take other paths"
        )

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
        """The pool to send the request to and what its server speculates with (llama.cpp fixes it per
        server, so the pool names it): prompt lookup or a draft model, at most ``gamma`` drafted tokens;
        None for a plain pool. None in all for a llama-server drafter ``setting``: its drafting rules are
        not llama-cpp-python's."""
        if speculate and setting is not None:
            return None
        speculative = {"draft": "prompt-lookup" if draft_kind == "ngram" else "model", "n_max": gamma}
        return {"pool": pool, "speculative": speculative if speculate else None}
