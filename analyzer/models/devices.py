"""Where and in which precision an analysis runs: device and dtype names, their resolution on this
machine, the memory a model needs there, and the plain-words guarantee each dtype carries.

Names are checked without torch (:func:`check_device_name`, :func:`check_dtype_name`), so web forms
and ``create_run`` can refuse a typo at once; :func:`resolve` needs torch and answers for the machine
it runs on (a worker may have a GPU that the web server lacks). ``auto`` means CUDA in bfloat16 where
a GPU is present, else the CPU in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.checks import (
    CostModeError,
    DeviceError,
    check_cost_mode_device,
    check_device_name,
    check_dtype_name,
)
from analyzer.names import DEVICE_CHOICES, DTYPE_ALIASES, DTYPE_CHOICES, MAX_PROFILE_BATCH_SIZE  # noqa: F401

if TYPE_CHECKING:
    import torch

    from analyzer.run_params import RunParams

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_GPU_BATCH_SIZES = (1, 4, 16)
DEFAULT_CPU_BATCH_SIZES = (1,)


class ModelTooLarge(DeviceError):
    """A model does not fit in the memory of the device it was asked to run on."""

    code = "model_too_large"


@dataclass(frozen=True)
class Placement:
    """A resolved device and dtype: ``device`` is ``cpu`` or ``cuda:N``, ``dtype`` one of
    float32 / bfloat16 / float16, ``name`` the hardware's name (the GPU or CPU model)."""

    device: str
    dtype: str
    name: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)


def parse_batch_sizes(text: str | None) -> tuple[int, ...] | None:
    """``"1,4,16"`` -> (1, 4, 16), sorted and unique; None for empty text (the device's default).
    DeviceError for anything that is not a list of integers from 1 to MAX_PROFILE_BATCH_SIZE."""
    if text is None or not str(text).strip():
        return None
    sizes = set()
    for item in str(text).split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_PROFILE_BATCH_SIZE:
            raise DeviceError(
                f"batch sizes must be integers from 1 to {MAX_PROFILE_BATCH_SIZE}, "
                f"comma-separated (e.g. 1,4,16); got {item!r}"
            )
        sizes.add(int(item))
    return tuple(sorted(sizes))


def default_batch_sizes(placement: Placement) -> tuple[int, ...]:
    """The batch sizes profiled when none are given: 1, 4 and 16 on a GPU, 1 on the CPU (where a
    batch already uses the idle compute that speculation would need)."""
    return DEFAULT_GPU_BATCH_SIZES if placement.is_cuda else DEFAULT_CPU_BATCH_SIZES


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or what the platform module knows elsewhere."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown cpu"


def _probe(device: str, dtype: str) -> None:
    """Run the operations a forward pass needs (matmul, softmax, argmax) in ``dtype`` on ``device``;
    raises whatever torch raises when the pair is unsupported."""
    import torch

    x = torch.ones((2, 8), dtype=getattr(torch, dtype), device=device)
    weight = torch.ones((8, 8), dtype=getattr(torch, dtype), device=device)
    torch.softmax(x @ weight, dim=-1).argmax(dim=-1).cpu()


def resolve(device: str | None = "auto", dtype: str | None = "auto") -> Placement:
    """Resolve device and dtype names on this machine. ``auto`` device = ``cuda:0`` when torch sees
    a GPU, else ``cpu``; ``auto`` dtype = bfloat16 on a GPU that supports it (float16 on older GPUs),
    float32 on the CPU. Raises DeviceError for a device that is absent (no CUDA, a GPU index beyond
    the count) and for a dtype the device cannot run (bfloat16 on a GPU without bf16 support, or a
    probe operation that fails)."""
    import torch

    device_name, dtype_name = check_device_name(device), check_dtype_name(dtype)
    if device_name == "auto":
        device_name = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device_name.startswith("cuda"):
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            )
            raise DeviceError(
                f"device {device_name!r} asked for, but torch {torch.__version__} ({build}) sees no "
                "CUDA GPU on this machine; use --device cpu (or auto)"
            )
        index = int(device_name.partition(":")[2] or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise DeviceError(
                f"device cuda:{index} asked for, but this machine has {count} CUDA GPU"
                f"{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})"
            )
        device_name = f"cuda:{index}"
        hardware = torch.cuda.get_device_name(index)
        if dtype_name == "auto":
            dtype_name = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        elif dtype_name == "bfloat16" and not torch.cuda.is_bf16_supported():
            major, minor = torch.cuda.get_device_capability(index)
            raise DeviceError(
                f"{hardware} (compute capability {major}.{minor}) cannot run bfloat16; "
                "use --dtype float16 or float32"
            )
    else:
        hardware = cpu_model_name()
        if dtype_name == "auto":
            dtype_name = "float32"
    try:
        _probe(device_name, dtype_name)
    except (RuntimeError, TypeError) as error:
        raise DeviceError(f"{device_name} ({hardware}) cannot run {dtype_name}: {error}") from error
    return Placement(device_name, dtype_name, hardware)


def available_memory_bytes(device: str) -> int | None:
    """Free memory on ``device`` in bytes: the GPU's free memory (``torch.cuda.mem_get_info``), or
    MemAvailable from /proc/meminfo for the CPU; None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def model_bytes(parameter_count: int, dtype: str) -> int:
    """Bytes of ``parameter_count`` weights stored in ``dtype``."""
    return int(parameter_count) * DTYPE_BYTES[dtype]


def gib(n_bytes: float) -> str:
    """A byte count for people: ``12.35 GiB``."""
    return f"{n_bytes / 2**30:.2f} GiB"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is torch running out of device or host memory."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "can't allocate memory" in text or isinstance(error, MemoryError)
    )


def guarantee_sentence(
    dtype: str | None,
    *,
    sampling: bool = False,
    fidelity: dict | None = None,
    estimate_opening: str | None = None,
    repriced_from: int | None = None,
) -> str:
    """What this run's numbers guarantee, in one plain sentence. float32 greedy: an exact replay;
    bfloat16/float16 greedy: an estimate whose measured fidelity is quoted when known; sampling: an
    expectation under i.i.d. acceptance. An engine whose replay is always an estimate (llama.cpp:
    quantized weights, whose batched and one-token kernels differ) gives its ``estimate_opening``
    (:meth:`analyzer.engine.engine_base.Engine.estimate_opening`), followed by the measured fidelity. A run
    re-priced from run
    ``repriced_from`` has no validations of its own: where it would suggest --validate, it points to
    that run's and to the engine that priced it instead."""
    dtype = dtype or "float32"
    if estimate_opening is not None:
        return _estimate_sentence(estimate_opening, fidelity, repriced_from)
    if sampling:
        return (
            "Sampling mode: the speedups are expectations under i.i.d. acceptance (alpha = mean overlap), "
            "not a replay of any particular generation."
        )
    if dtype == "float32":
        return (
            "float32: the replay is exact — each round counted here is what greedy assisted generation "
            "does on this device, token for token (tested; only a float near-tie can flip an argmax)."
        )
    return _estimate_sentence(
        f"{dtype}: the replay is an estimate, not exact — batched verification and one-token "
        "decoding round differently, so real speculative decoding can take other paths",
        fidelity,
        repriced_from,
    )


def _estimate_sentence(opening: str, fidelity: dict | None, repriced_from: int | None = None) -> str:
    """``opening`` followed by the measured fidelity, or how to measure it."""
    parts = [opening]
    if fidelity and fidelity.get("mismatch_share") is not None:
        parts.append(
            f"; a teacher-forced pass disagreed with the generated token at "
            f"{100 * fidelity['mismatch_share']:.2f}% of positions"
        )
    if fidelity and fidelity.get("validated"):
        parts.append(
            f"; {fidelity['identical']} of {fidelity['validated']} validated outputs matched plain greedy"
        )
        if fidelity.get("passes_error_pct") is not None:
            parts.append(
                f" and target passes differed from the replayed rounds by {fidelity['passes_error_pct']:.1f}% "
                "on average"
            )
    elif repriced_from is not None:
        parts.append(
            f"; a re-priced run has no validations of its own: see run {repriced_from}'s, and validate the "
            "speedups in the engine that priced it"
        )
    else:
        parts.append("; run with --validate N to measure it against real speculative decoding")
    return "".join(parts) + "."


def run_placement(params: RunParams) -> Placement:
    """The device and dtype a run asks for, resolved on this machine (DeviceError if absent; RunError when the
    run's cost mode cannot time on it: cuda-graphs on a CPU)."""
    from analyzer.run_params import RunError

    placement = resolve(params.device, params.dtype)
    try:
        check_cost_mode_device(params.cost_mode, "cuda" if placement.is_cuda else "cpu")
    except CostModeError as error:
        raise RunError(str(error)) from None
    return placement


def run_batch_sizes(params: RunParams, placement: Placement) -> tuple[int, ...]:
    """The batch sizes a run profiles: the ones it asks for, else the device's default."""
    return tuple(params.profile_batch_sizes) if params.profile_batch_sizes else default_batch_sizes(placement)
