"""safetensors headers -> exact weight bytes per dtype, without reading the tensor data.

A safetensors file is a little-endian u64 ``N``, ``N`` bytes of JSON (tensor name -> ``{"dtype", "shape",
"data_offsets": [begin, end]}``, plus an optional ``__metadata__`` object), then the data. The bytes of a tensor
are ``end - begin``; they are checked against ``prod(shape) * bits(dtype) / 8`` and the tensors against each other
(contiguous from 0, no overlap, as the safetensors library requires), and, where the file's size is known, the
data against it. The header is bounded (``MAX_HEADER``, the safetensors library's own limit) before it is fetched
or parsed. Local files are read with two reads; remote ones by range (``hparams.remote``).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rsplan.errors import ModelFileError, printable
from rsplan.files import JSONValueError, open_regular, parse_json

#: The safetensors library refuses headers above 100 MB.
MAX_HEADER = 100_000_000
#: Tensors in one file (real files: up to a few thousand).
MAX_TENSORS = 1 << 20
#: Bits per element of each safetensors dtype (safetensors' Dtype::bitsize).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
}


@dataclass(frozen=True)
class SafetensorsHeader:
    """One file's header, summed.

    Attributes:
        header_bytes: bytes of the header (8 + N).
        data_bytes: bytes of the data section (the last tensor's end).
        dtype_bytes: dtype -> bytes of the tensors of that dtype.
        n_tensors: tensors in the file.
    """

    header_bytes: int
    data_bytes: int
    dtype_bytes: dict[str, int]
    n_tensors: int


def header_length(first8: bytes, where: str) -> int:
    """N, from the file's first 8 bytes, checked against MAX_HEADER."""
    if len(first8) < 8:
        raise ModelFileError(f"{where}: {len(first8)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", first8[:8])
    if n < 2 or n > MAX_HEADER:
        raise ModelFileError(f"{where}: safetensors header of {n} bytes (allowed: 2..{MAX_HEADER:,}): not a "
                             "safetensors file, or a corrupt one")
    return n


def parse_header(raw: bytes, where: str, file_size: int | None = None) -> SafetensorsHeader:
    """Sum the JSON header ``raw`` (the N bytes after the length); ``file_size`` checks the data fits the file."""
    try:
        data = parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelFileError(f"{where}: safetensors header is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{where}: safetensors header: invalid JSON at column {exc.colno}: {exc.msg}") from None
    except JSONValueError as exc:
        raise ModelFileError(f"{where}: safetensors header: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{where}: safetensors header is not a JSON object")
    tensors = [(k, v) for k, v in data.items() if k != "__metadata__"]
    if len(tensors) > MAX_TENSORS:
        raise ModelFileError(f"{where}: {len(tensors)} tensors, more than the {MAX_TENSORS} allowed")
    spans: list[tuple[int, int, str]] = []
    dtype_bytes: dict[str, int] = {}
    for name, info in tensors:
        dtype, begin, stop = _tensor_entry(f"{where}: tensor '{printable(name[:100])}'", info)
        spans.append((begin, stop, name))
        dtype_bytes[dtype] = dtype_bytes.get(dtype, 0) + stop - begin
    spans.sort()
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            raise ModelFileError(f"{where}: tensor '{printable(name[:100])}' starts at data byte {begin}, expected "
                                 f"{end} (tensors are stored contiguously)")
        end = stop
    if file_size is not None and 8 + len(raw) + end != file_size:
        raise ModelFileError(f"{where}: header and data make {8 + len(raw) + end} bytes, the file has {file_size}: "
                             "truncated or corrupt")
    return SafetensorsHeader(8 + len(raw), end, dict(sorted(dtype_bytes.items())), len(tensors))


def _tensor_entry(what: str, info: object) -> tuple[str, int, int]:
    """``(dtype, begin, end)`` of one tensor's header entry, checked: a known dtype, a shape of at most 16
    dimensions, and data offsets that hold exactly its bytes."""
    if not isinstance(info, dict):
        raise ModelFileError(f"{what}: expected an object with dtype, shape, data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or (bits := DTYPE_BITS.get(dtype)) is None:
        raise ModelFileError(f"{what}: dtype {json.dumps(dtype)[:40]} is not a safetensors dtype rsplan knows "
                             f"({', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or len(shape) > 16 or not all(_uint(d) for d in shape):
        raise ModelFileError(f"{what}: shape {json.dumps(shape)[:60]} is not a list of dimensions")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_uint(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise ModelFileError(f"{what}: data_offsets {json.dumps(offsets)[:60]} is not [begin, end]")
    n_elements = 1
    for d in shape:
        n_elements *= d
    n_bits = n_elements * bits
    if n_bits % 8 or n_bits // 8 != offsets[1] - offsets[0]:
        raise ModelFileError(f"{what}: {offsets[1] - offsets[0]} bytes of data for shape {shape} of {dtype} "
                             f"({n_bits / 8:g} bytes)")
    return dtype, offsets[0], offsets[1]


def _uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


#: A file git cloned without git-lfs holds this pointer text instead of the weights.
LFS_POINTER = b"version https://git-lfs"


def is_lfs_pointer(path: Path) -> bool:
    """Whether ``path`` is a git-lfs pointer file (the weights were not downloaded)."""
    try:
        with open_regular(path) as fh:
            return fh.read(len(LFS_POINTER)) == LFS_POINTER
    except OSError:
        return False


def read_local(path: Path) -> SafetensorsHeader:
    """The header of the local safetensors file ``path`` (two reads: the length, then the header)."""
    where = str(path)
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            first = fh.read(8)
            if first == LFS_POINTER[:8] and (first + fh.read(len(LFS_POINTER) - 8)) == LFS_POINTER:
                raise ModelFileError(f"{where}: a git-lfs pointer, not the weights (run `git lfs pull`)")
            n = header_length(first, where)
            if 8 + n > size:
                raise ModelFileError(f"{where}: header of {n} bytes, the file has {size}: truncated")
            raw = fh.read(n)
    except OSError as exc:
        raise ModelFileError(f"{where}: cannot read file: {exc.strerror or exc}") from None
    return parse_header(raw, where, size)
