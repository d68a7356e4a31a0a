"""An analysis run's parameters: one typed object, parsed once, stored as JSON with the run
(``AnalysisRun.params``, read back with ``AnalysisRun.run_params``), and the limits every surface
checks them against (the command line, the web form and :meth:`RunParams.check` all read
:data:`LIMITS`).

What the router needs of them travels with each published policy set (gamma_max, margin, engine):
see :class:`router.policy.PolicyContract`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from analyzer.devices import (
    MAX_PROFILE_BATCH_SIZE,
    DeviceError,
    Placement,
    check_device_name,
    check_dtype_name,
    default_batch_sizes,
    resolve,
)
from analyzer.engine_base import (
    DEFAULT_COST_MODE,
    DEFAULT_ENGINE,
    CostModeError,
    EngineError,
    check_cost_mode_device,
    check_cost_mode_name,
    check_engine_name,
)
from analyzer.entropy import ENTROPY_EDGES_NATS
from analyzer.errors import SpecrouteError

DEFAULT_MARGIN = 0.05  # speculate only where the predicted speedup clears 1 + margin
DEFAULT_GAMMA_MAX = 16


class RunError(SpecrouteError, ValueError):
    """A run cannot be created or executed as asked; the message says why."""

    status, code = 400, "invalid_run"


class RunNotFound(RunError, LookupError):
    """No analysis run has the id asked for."""

    status, code = 404, "run_not_found"


@dataclass(frozen=True)
class Limit:
    """The accepted range of one numeric parameter: ``low <= value <= high`` (``high`` None: no upper
    bound; ``low_open``: ``low < value``)."""

    low: float
    high: float | None = None
    low_open: bool = False

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value <= self.high)

    def text(self) -> str:
        """``between 1 and 64``, ``>= 0``, ``in (0, 1]``."""
        if self.low_open:
            return f"in ({_number(self.low)}, {_number(self.high)}]"
        if self.high is None:
            return f">= {_number(self.low)}"
        return f"between {_number(self.low)} and {_number(self.high)}"


def _number(value: float | None) -> str:
    """``10,000,000``, ``0.5``: whole numbers with thousands separators, others as they are."""
    if value is None:
        return "none"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


# The one set of limits: CLI options, web form fields and RunParams.check all read these.
LIMITS: dict[str, Limit] = {
    "max_new_tokens": Limit(1, 4096),
    "gamma_max": Limit(1, 64),
    "temperature": Limit(0.0, 5.0),
    "top_p": Limit(0.0, 1.0, low_open=True),
    "validate": Limit(0, 10_000),
    "limit": Limit(1, 10_000_000),
    "batch_size": Limit(1, 64),
    "margin": Limit(0.0, 1.0),
    "chunk_size": Limit(1, 100_000),
}


@dataclass(frozen=True)
class RunParams:
    """Parameters of an analysis run (stored as JSON on the run)."""

    max_new_tokens: int = 128
    gamma_max: int = DEFAULT_GAMMA_MAX
    temperature: float = 0.0
    top_p: float = 1.0
    validate: int = 0
    limit: int | None = None
    chat_template: bool = True
    batch_size: int = 1
    margin: float = DEFAULT_MARGIN
    seed: int = 0
    reprofile: bool = False
    max_prompt_tokens: int | None = None
    engine: str = (
        DEFAULT_ENGINE  # transformers | llama.cpp (analyzer/engines.py): what measures and prices the run
    )
    # eager | cuda-graphs (analyzer/engines.py): how the transformers engine times its steps
    cost_mode: str = DEFAULT_COST_MODE
    device: str = "auto"  # auto | cpu | cuda | cuda:N, resolved by the worker that executes the run
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    profile_batch_sizes: tuple[int, ...] | None = None  # None: 1,4,16 on a GPU, 1 on the CPU
    chunk_size: int = 32  # prompts per chunk that one worker claims (analyzer/chunks.py)
    # stored with the run so its entropy table keeps its buckets if the defaults change (None = inf)
    entropy_edges: tuple[float | None, ...] = tuple(
        e if e != float("inf") else None for e in ENTROPY_EDGES_NATS
    )

    @property
    def sampling(self) -> bool:
        """Whether the run measures sampling expectations (temperature > 0) rather than greedy replays."""
        return self.temperature > 0

    def check(self) -> RunParams:
        """Raise :class:`RunError` naming the first parameter out of range, or unknown. What the run's
        engine cannot measure is its engine's to refuse: :func:`analyzer.engines.check_run` checks both."""
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if value is not None and not limit.admits(value):
                raise RunError(f"{name} must be {limit.text()}, got {value!r}")
        if self.batch_size > 1 and self.temperature > 0:
            raise RunError("batching is for greedy runs only (sampling uses one seed per prompt)")
        try:
            check_device_name(self.device), check_dtype_name(self.dtype), check_engine_name(self.engine)
        except (DeviceError, EngineError) as error:
            raise RunError(str(error)) from None
        try:
            check_cost_mode_name(self.cost_mode)
        except CostModeError as error:
            raise RunError(str(error)) from None
        sizes = self.profile_batch_sizes
        if sizes is not None and (not sizes or any(not 1 <= int(b) <= MAX_PROFILE_BATCH_SIZE for b in sizes)):
            raise RunError(f"profile batch sizes must be integers from 1 to {MAX_PROFILE_BATCH_SIZE}")
        return self

    def to_json(self) -> dict[str, Any]:
        """The JSON stored on the run."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunParams:
        """The parameters stored on a run (keys it does not know are ignored; missing ones take the
        defaults, as for runs stored before a parameter existed)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (data or {}).items() if k in known}
        if "entropy_edges" in values:
            values["entropy_edges"] = tuple(values["entropy_edges"])
        if values.get("profile_batch_sizes") is not None:
            values["profile_batch_sizes"] = tuple(int(b) for b in values["profile_batch_sizes"])
        return cls(**values)

    def placement(self) -> Placement:
        """The device and dtype this run asks for, resolved on this machine (DeviceError if absent;
        RunError when the run's cost mode cannot time on it: cuda-graphs on a CPU)."""
        placement = resolve(self.device, self.dtype)
        try:
            check_cost_mode_device(self.cost_mode, "cuda" if placement.is_cuda else "cpu")
        except CostModeError as error:
            raise RunError(str(error)) from None
        return placement

    def batch_sizes(self, placement: Placement) -> tuple[int, ...]:
        """The batch sizes to profile: the ones asked for, else the device's default."""
        return tuple(self.profile_batch_sizes) if self.profile_batch_sizes else default_batch_sizes(placement)
