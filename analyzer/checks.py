"""The checks of the shared names (:mod:`analyzer.names`) and the errors they raise: an engine's, a cost
mode's, a device's and a dtype's name, as a setting, a form field or a stored run gives it. Pure string checks
(no torch, no engine), so the settings, a run's parameters and every layer above can refuse a typo at once,
importing them from here."""

from __future__ import annotations

import re

from analyzer.errors import SpecrouteError
from analyzer.names import (
    AUTO_ENGINE,
    COST_MODES,
    CUDA_GRAPHS,
    DEVICE_CHOICES,
    DTYPE_ALIASES,
    DTYPE_CHOICES,
    EAGER,
    ENGINES,
)

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d{1,3})?)$")


class EngineError(SpecrouteError, ValueError):
    """An engine name that is not one of :data:`~analyzer.names.ENGINES`; the message names the allowed ones."""

    status, code = 400, "invalid_engine"


class CostModeError(SpecrouteError, ValueError):
    """A cost mode that is not one of :data:`~analyzer.names.COST_MODES`, or one this engine or device cannot
    time."""

    status, code = 400, "invalid_cost_mode"


class DeviceError(SpecrouteError, ValueError):
    """The device or dtype asked for cannot be used on this machine; the message says why and what
    would work."""

    status, code = 400, "invalid_device"


def shown(raw: object, length: int = 40) -> str:
    """A value as the user gave it, quoted, its first ``length`` characters and an ellipsis when longer (no
    name a run takes is that long: a message quotes what the user gave without repeating a page of it)."""
    text = raw if isinstance(raw, str) else str(raw)
    return repr(text if len(text) <= length else text[: length - 1] + "…")


def check_engine_name(text: str | None) -> str:
    """``text`` when it is one of :data:`~analyzer.names.ENGINES`, written exactly so (the name is stored and
    compared as it is); EngineError naming the allowed values otherwise."""
    if text not in ENGINES:
        raise EngineError(f"unknown engine {text!r}; use one of: {', '.join(ENGINES)}")
    return text


def check_engine_input(text: str) -> str:
    """``text`` when it names an engine or ``auto`` (the setting and the inputs); EngineError naming the
    choices otherwise."""
    if text != AUTO_ENGINE and text not in ENGINES:
        raise EngineError(f"unknown engine {shown(text)}; use one of: {', '.join((AUTO_ENGINE, *ENGINES))}")
    return text


def check_cost_mode_name(text: str | None) -> str:
    """``text`` when it is one of :data:`~analyzer.names.COST_MODES`; CostModeError naming the allowed ones
    otherwise."""
    if text not in COST_MODES:
        raise CostModeError(f"unknown cost mode {text!r}; use one of: {', '.join(COST_MODES)}")
    return text


def check_cost_mode_device(cost_mode: str, device_type: str) -> None:
    """CostModeError when ``cost_mode`` cannot time on a device of ``device_type`` (cuda-graphs needs a
    CUDA GPU: a CPU has no CUDA graphs, and its eager cost is already what llama.cpp or torch pays)."""
    if cost_mode == CUDA_GRAPHS and device_type != "cuda":
        raise CostModeError(
            f"cost mode {CUDA_GRAPHS} times CUDA graphs, which need a CUDA GPU; this run's device is "
            f"{device_type}. Use --cost-mode {EAGER} here, or run on a machine with a GPU "
            f"(device auto or cuda)."
        )


def check_device_name(text: str | None) -> str:
    """The device name normalised (lower case, stripped); DeviceError unless it is auto, cpu, cuda
    or cuda:N."""
    name = (text or "auto").strip().lower()
    if not _DEVICE.match(name):
        raise DeviceError(f"unknown device {text!r}; use one of: {', '.join(DEVICE_CHOICES)}")
    return name


def check_dtype_name(text: str | None) -> str:
    """The dtype name normalised (aliases fp32/bf16/fp16/half accepted); DeviceError for others."""
    name = (text or "auto").strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_CHOICES:
        raise DeviceError(f"unknown dtype {text!r}; use one of: {', '.join(DTYPE_CHOICES)}")
    return name
