"""A smaller GGUF model for the llama-server tests that check machinery rather than advice: the embedded SmolLM2's
first layers, with its vocabulary, tokenizer, chat template, embedding (the tied head) and final norm copied as
they are. The servers tokenize and template every prompt as the embedded model does and draft by the same rules;
a step costs ~1.7 ms here against ~10 ms, so an analysis through real servers takes seconds, not a minute and a
half. The demo's tests keep the embedded model itself (the main job)."""

from __future__ import annotations

from pathlib import Path

LAYERS = 4  # of the embedded model's 30


def first_layers_of(source: Path, target: Path, layers: int = LAYERS) -> Path:
    """Write ``target``: the GGUF model ``source`` cut to its first ``layers`` transformer blocks (the
    metadata's block count set to match, its name saying so); every other tensor and key copied byte for
    byte, quantized ones included."""
    from gguf import GGUFValueType, GGUFWriter

    from analyzer.models.gguf_fields import QuickGGUFReader

    reader = QuickGGUFReader(source)  # gguf's own reader's fields (tests/test_gguf_fields.py), 2.5 s quicker
    arch = reader.fields["general.architecture"].contents()
    if not 1 <= layers <= reader.fields[f"{arch}.block_count"].contents():
        raise ValueError(f"{source.name} has no {layers} layers to keep")
    writer = GGUFWriter(target, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":  # the writer writes these itself
            continue
        value = field.contents()
        if key == f"{arch}.block_count":
            value = layers
        elif key == "general.name":
            value = f"{value} (first {layers} layers)"
        kind = field.types[0]
        writer.add_key_value(
            key, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None
        )
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and int(tensor.name.split(".")[1]) >= layers:
            continue
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def gguf_spec(path: Path) -> str:
    """The model spec of a GGUF file, as ``--model``, ``--target`` and a job's ``model`` take it."""
    return f"gguf:{path.parent}#{path.name}"
