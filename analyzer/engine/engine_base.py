"""What every engine is: the protocols of its capabilities (:class:`MeasuringEngine`, :class:`ServingEngine`,
:class:`CostSource`) and the :class:`LoadedPair` protocol of a pair loaded in one; the engines' names live in
:mod:`analyzer.names`, their checks in :mod:`analyzer.checks`.

Acceptance travels between engines; cost does not (DESIGN.md, "Engines"). So every run, cost profile and
policy set records two engines: the one that **measured** the acceptance (``measured_by``: an engine of
:data:`ENGINES`, which measure) and the one that **priced** it (``priced_by``: the same engine, or the
engine an imported cost profile came from, vLLM or SGLang for example). The registry of engine objects
is :mod:`analyzer.engine.engines`; this module imports no engine, so any module may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Protocol

from analyzer.errors import SpecrouteError

if TYPE_CHECKING:
    from pathlib import Path

    from analyzer.engine.overhead import MachineryOverhead
    from analyzer.measuring.acceptance import DraftingRule
    from analyzer.measuring.cost import CostMeasurement
    from analyzer.measuring.prompt_encoding import EncodedPrompt
    from analyzer.measuring.prompt_passes import PromptPasses
    from analyzer.models.specs import ModelSpecRef
    from analyzer.orm import ModelPair, Prompt
    from analyzer.run_params import RunParams


class ProfilingPlan(NamedTuple):
    """Where a loaded pair times its cost profiles: the device and dtype as stored, the text progress
    shows, the machinery timed around the model calls, the batch sizes and the cost mode (None where
    the engine times its own way), and the widest verification it prices beyond gamma_max + 1 (0: none;
    transformers with a draft model: its assisted generation's defaults draft up to 20, verifying 21)."""

    device: str
    dtype: str
    where: str
    machinery: str
    batch_sizes: tuple[int, ...]
    cost_mode: str | None
    verify_up_to: int = 0


class MeasuringEngine(Protocol):
    """What measures analysis runs: its drafting rule, what it loads and where, what it refuses, how it
    times (its cost modes) and what its numbers guarantee. transformers and llama.cpp implement it
    (:data:`analyzer.engine.engines.MEASURING`). An engine implements only the capabilities it has: this one,
    :class:`ServingEngine` (what serves a decision) and :class:`CostSource` (where a cost profile comes from).
    Callers look an entry up by name in :mod:`analyzer.engine.engines` and ask it; they never compare names."""

    name: str
    cost_modes: tuple[str, ...]  # how it can time its steps; () where it times its own way only

    @property
    def rule(self) -> DraftingRule:
        """The drafting rule its replay follows (analyzer/measuring/acceptance.py)."""
        ...

    def check_params(self, params: RunParams) -> None:
        """Raise :class:`RunError` for the first setting of ``params`` this engine cannot measure."""
        ...

    def check_specs(self, target: ModelSpecRef, draft: ModelSpecRef) -> None:
        """Raise :class:`RunError` unless this engine can load the pair."""
        ...

    def cost_mode_for(self, asked: str | None, setting: str) -> str:
        """The cost mode a run stores: ``asked`` when given, else the engine's default under the
        ``SPECROUTE_COST_MODE`` ``setting`` (an unusable asked mode is refused by check_params)."""
        ...

    def require_installed(self) -> None:
        """Raise :class:`EngineUnavailable` (saying how to install it) unless it can run here."""
        ...

    def placement_text(self, params: RunParams, *, queue_only: bool) -> str:
        """Where a run of ``params`` measures, resolved on this machine unless it is only queued."""
        ...

    def load_key(self, params: RunParams) -> tuple[Any, ...]:
        """What, beyond the pair, decides whether an already-loaded pair serves a run of ``params``
        (its first item is the text that says where it loads)."""
        ...

    def load(self, pair: ModelPair, cache_dir: Path, params: RunParams, *, allow_network: bool) -> LoadedPair:
        """The pair loaded in this engine, as ``params`` asks."""
        ...

    def report_cost_mode(self, params: RunParams) -> str | None:
        """The cost mode a report names before any profile is linked (None: the engine's own timing)."""
        ...

    def replay_mode(self, dtype: str) -> str | None:
        """How a greedy replay in this engine relates to real decoding, for the report's ``mode`` (None:
        the generic words for ``dtype``)."""
        ...

    def estimate_opening(self, dtype: str) -> str | None:
        """The guarantee's opening where this engine's replay is always an estimate (None: the generic
        sentences for ``dtype``)."""
        ...


class ServingEngine(Protocol):
    """What serves a routing decision: the decision in the engine's own terms (transformers, llama.cpp and
    llama-server implement it: :data:`analyzer.engine.engines.SERVING`); ``analyzes_settings``: its analyses
    compare the server's own drafting settings (analyzer/analysis/server_analysis.py, ``specroute analyze
    --engine NAME``), not a run's gammas."""

    name: str
    analyzes_settings: bool

    def decision_settings(
        self,
        speculate: bool,
        gamma: int,
        draft_kind: str,
        ngram_max: int,
        pool: str,
        setting: str | None = None,
    ) -> dict[str, Any] | None:
        """A routing decision in this engine's own terms (the ``engine`` object of ``/v1/route``): what
        to speculate with at ``gamma`` for a draft of ``draft_kind`` ("ngram": prompt lookup of n-grams up
        to ``ngram_max``; else a draft model), or plain decoding; ``pool`` is the deployment the decision
        names; ``setting`` the llama-server drafter setting a policy from a llama-server analysis names
        (None otherwise). None: the engine cannot run this decision (an imported profile's engine; a
        llama-server setting in another engine)."""
        ...

    def settings_in(self, decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """This engine's terms in a routing decision as the router answered it (what
        :meth:`decision_settings` gave; None: none for it, as for a llama-server setting in transformers)."""
        ...


class CostSource(Protocol):
    """Where a cost profile's step times come from: measured by a measuring engine (``measures``), fitted from a
    server's own timings (llama-server), or imported from another engine's benchmark (the imported entry), and
    what a report says of that profile's quality (:data:`analyzer.engine.engines.COST_SOURCES`)."""

    name: str
    measures: bool  # its profiles are measured by specroute in this engine (False: fitted or imported)

    def profile_note(self, profile: dict[str, Any]) -> str | None:
        """What a report says of the quality of a cost profile this entry priced with (``profile`` as
        :func:`analyzer.advice.report.profile_dict` gives it); None: its measured timing quality."""
        ...


Engine = MeasuringEngine  # the name run_params' readers annotate the registry of measuring engines with


class LoadedPair(Protocol):
    """A target and draft loaded in one engine: what an analysis asks of it (runs.py, run_costs.py,
    run_validation.py). ``analyzer.engine.run_models.RunModels`` and ``analyzer.engine.llamacpp_run.LlamaCppRunModels``
    implement it."""

    engine: str
    rule: DraftingRule
    draft: Any
    eos_ids: list[int]
    pad_id: int

    def device_text(self) -> str: ...

    def dtype_text(self) -> str: ...

    def library_versions(self) -> dict[str, Any]: ...

    def profiling_plan(self, params: RunParams) -> ProfilingPlan:
        """Where and at which batch sizes this pair's cost profiles are timed."""
        ...

    def warmup_passes(self) -> int:
        """The untimed passes before each timed model's first timed pass."""
        ...

    @property
    def ngram_max(self) -> int | None:
        """The prompt-lookup n-gram size (None for a model draft)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The target's tokenizer (``decode`` turns output ids into text)."""
        ...

    def tokenizers(self) -> tuple[Any, Any | None]:
        """The target's and a model draft's tokenizers (None for prompt lookup), for fingerprints."""
        ...

    def prompt_limit(self, params: RunParams) -> int:
        """The most prompt tokens a run of ``params`` keeps: its ``max_prompt_tokens``, else what the
        context holds beside the new tokens (a longer prompt does not fit)."""
        ...

    def encode(self, prompt: Prompt, params: RunParams) -> EncodedPrompt:
        """The prompt's token ids under the run's chat template and :meth:`prompt_limit`."""
        ...

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's text, for the report's drill-down."""
        ...

    def measure_batch(
        self, encoded: list[EncodedPrompt], params: RunParams, *, seed: int
    ) -> list[PromptPasses]:
        """The passes of a batch of prompts, one :class:`PromptPasses` per prompt."""
        ...

    def measure_costs(
        self,
        context: list[int],
        k_max: int,
        batch_size: int,
        on_repeat: Any,
        *,
        on_draft_repeat: Any = None,
        cost_mode: str | None = ...,
    ) -> CostMeasurement:
        """The cost measurement at ``batch_size`` over a cache of ``context``, timed in ``cost_mode``."""
        ...

    def measure_overhead(
        self, context: list[int], params: RunParams, on_generate: Any = None
    ) -> MachineryOverhead:
        """The machinery's own time around the model calls, per plain step and per round."""
        ...

    def validate(self, prompt_ids: list[int], params: RunParams, gamma: int) -> Any:
        """Plain against speculative greedy generation of one prompt at ``gamma``."""
        ...


class EngineUnavailable(SpecrouteError, RuntimeError):
    """The engine a run asks for is not installed on this machine; the message says how to install it."""

    status, code = 503, "engine_unavailable"
