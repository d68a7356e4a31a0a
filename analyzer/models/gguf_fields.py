"""A GGUF file's metadata read quickly: :class:`QuickGGUFReader` is gguf's own ``GGUFReader`` with the arrays
of its key-value fields (a vocabulary of ~50,000 strings, its merges, its token types) read in one pass
instead of one memory-mapped slice per element, giving the same fields, parts and tensors.

gguf's reader slices its ``numpy.memmap`` three to five times per array element, and a memmap's slice costs
~10 us of Python: the embedded model's 147,000 elements took 2.5 s before transformers converted a single
token (every first load of a GGUF tokenizer or model; a 150,000-token vocabulary more). Here a string
array's lengths are read from the file's bytes and its parts sliced from a plain array over the same mapped
memory (no copy), a scalar array is one view sliced per element: 0.15 s for the same fields
(benchmarks/bench_gguf_read.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

_LENGTH = np.dtype(np.uint64)
_ARRAY_HEADER = 12  # the element type (uint32) and the element count (uint64)


class QuickGGUFReader(GGUFReader):
    """gguf's ``GGUFReader`` whose metadata arrays of strings and of scalars are read in one pass (nested
    arrays, and files of the other byte order, as gguf reads them). Each part is a numpy array over the
    file's mapped memory, equal in dtype, shape and values to gguf's own (a plain ndarray where gguf's is a
    memmap); the fields' offsets, data indices and types, and the tensors, are gguf's."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        element, count = GGUFValueType(int(raw_itype[0])), int(alen[0])
        start = orig_offs + _ARRAY_HEADER
        if element == GGUFValueType.STRING:
            parts, end = _string_parts(self.data.view(np.ndarray), start, count)
            indices = list(range(3, 2 + 2 * count, 2))  # each string's data, after its length
        elif (scalar := self.gguf_scalar_to_np.get(element)) is not None:
            size = np.dtype(scalar).itemsize
            end = start + size * count
            if end > len(self.data):
                raise ValueError(
                    f"a GGUF array of {count} values at byte {orig_offs} runs past the end of the file"
                )
            values = self.data.view(np.ndarray)[start:end].view(scalar)
            parts = [values[i : i + 1] for i in range(count)]
            indices = list(range(2, 2 + count))
        else:  # an array of arrays: gguf's own element walk
            return super()._get_field_parts(orig_offs, raw_type)
        types = [GGUFValueType.ARRAY] + ([element] if count else [])
        return end - orig_offs, [raw_itype, alen, *parts], indices, types


def _string_parts(data: np.ndarray, offset: int, count: int) -> tuple[list[np.ndarray], int]:
    """``count`` GGUF strings from ``offset`` of the file's bytes ``data`` (uint8): per string its length
    (uint64, shape (1,)) and its UTF-8 bytes (uint8, shape (length,)), views of ``data``; and the offset
    after the last one. Raises ValueError where a length runs past the end of the file."""
    raw = data.data  # a memoryview of the mapped bytes
    parts: list[np.ndarray] = []
    for _ in range(count):
        length = int.from_bytes(raw[offset : offset + 8], "little")
        end = offset + 8 + length
        if end > len(data):
            raise ValueError(f"a GGUF string at byte {offset} runs past the end of the file")
        parts += [data[offset : offset + 8].view(_LENGTH), data[offset + 8 : end]]
        offset = end
    return parts, offset
