"""The bounded scanner of a GGUF file's header: metadata keys and tensor infos, never the tensor data.

The file is read through a read-only memory map (or, for a remote file, a prefix of it) by a small scanner that
bounds every count and length before it uses it (a corrupt header cannot make rsplan allocate or loop on what it
claims), with the ``gguf`` package's tables for the value types, the ggml tensor types (``GGML_QUANT_SIZES``), the
magic, the version and the default alignment. The structural rules are llama.cpp's (ggml/src/gguf.cpp
``gguf_init_from_reader``): no duplicate or empty keys, tensor names shorter than 64 bytes, at most 4
dimensions, known tensor types whose block size divides the row, tensors stored in order and padded to the
alignment, and (src/llama-model-loader.cpp) all tensor data inside the file.

gguf (and numpy, which it imports) are imported on the first scan only.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError, excerpt, require
from rsplan.files import open_regular
from rsplan.hparams.gguf_keys import General
from rsplan.hparams.llama_loader import MetaInfo, printable

#: Limits far above any real model file and far below what a corrupt count would ask for.
MAX_KV = 1 << 16  # metadata pairs (real files: a few dozen)
MAX_TENSORS = 1 << 16  # tensor infos (real files: up to a few thousand)
MAX_KEY_BYTES = 1 << 16  # bytes of one key
MAX_ARRAY_LEN = 1 << 22  # elements of one metadata array (vocabularies and merges: up to ~1M)
MAX_STRINGS = 1 << 23  # strings in all metadata arrays together (bounds the time to walk them)
GGML_MAX_NAME = 64  # a tensor name is shorter (ggml.h)
GGML_MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


@dataclass(frozen=True)
class GGUFTables:
    """The gguf package's facts, keyed the way the scanner looks them up."""

    magic: bytes
    version: int
    default_alignment: int
    #: GGUF value type code -> (llama.cpp's type name, struct code of a fixed-size value or None)
    value_types: dict[int, tuple[str, str | None]]
    #: ggml type code -> (name, elements per block, bytes per block)
    tensor_types: dict[int, tuple[str, int, int]]


@cache
def gguf_tables() -> GGUFTables:
    require("gguf", "reading a GGUF file", "gguf")
    from gguf.constants import (  # deferred: gguf (and numpy, which it imports)
        GGML_QUANT_SIZES,
        GGUF_DEFAULT_ALIGNMENT,
        GGUF_MAGIC,
        GGUF_VERSION,
        GGUFValueType,
    )

    t = GGUFValueType
    # names as llama.cpp's gguf_type_name prints them, with the struct code of each fixed-size type
    value_types = {
        t.UINT8: ("u8", "B"), t.INT8: ("i8", "b"), t.UINT16: ("u16", "H"), t.INT16: ("i16", "h"),
        t.UINT32: ("u32", "I"), t.INT32: ("i32", "i"), t.FLOAT32: ("f32", "f"), t.BOOL: ("bool", "?"),
        t.STRING: ("str", None), t.ARRAY: ("arr", None), t.UINT64: ("u64", "Q"), t.INT64: ("i64", "q"),
        t.FLOAT64: ("f64", "d"),
    }
    return GGUFTables(
        magic=_U32.pack(GGUF_MAGIC),
        version=GGUF_VERSION,
        default_alignment=GGUF_DEFAULT_ALIGNMENT,
        value_types={int(code): v for code, v in value_types.items()},
        tensor_types={int(q): (q.name.lower(), block, size) for q, (block, size) in GGML_QUANT_SIZES.items()},
    )


@dataclass(frozen=True)
class MetaEntry:
    """One metadata key of a scanned file: its type, and where its value starts."""

    info: MetaInfo
    offset: int  # where the value (for arrays: the first element) starts


@dataclass(frozen=True)
class GGUFIndex:
    """What the scanner found in one GGUF file.

    Attributes:
        version: GGUF version.
        entries: metadata key -> type and value offset (values are decoded on request).
        n_tensors: tensor infos in the file.
        tensor_bytes: ggml type name -> bytes of the tensors of that type (unpadded, as ggml_nbytes).
        tensor_counts: ggml type name -> number of tensors of that type.
        data_offset: where the tensor data starts.
        data_bytes: bytes of the data section (tensors padded to the alignment).
        alignment: data alignment, bytes.
        tensors: (name, bytes) of each tensor, in file order.
        tensor_rows: (ggml type name, ``ne[0]``) of each tensor, in the same order (how a device buffer pads it).
        tensor_shapes: the shape (ne0 first) of each tensor, in the same order (which ones the CPU repacks).
    """

    version: int
    entries: dict[str, MetaEntry]
    n_tensors: int
    tensor_bytes: dict[str, int]
    tensor_counts: dict[str, int]
    data_offset: int
    data_bytes: int
    alignment: int
    tensors: tuple[tuple[str, int], ...] = ()
    tensor_rows: tuple[tuple[str, int], ...] = ()
    tensor_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def weights_bytes(self) -> int:
        return sum(self.tensor_bytes.values())




class NeedBytes(Exception):
    """The scan of a file prefix needs the file's first ``end`` bytes (``end`` <= the file's size)."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class Cursor:
    """Bounded little-endian reads over a buffer: every read checks the bytes it needs exist first.

    ``size`` is the file's size; ``buf`` holds its first ``avail`` bytes (all of them for a local file, a prefix
    for a remote one). A read past ``size`` is a truncated file (ModelFileError); a read inside the file but past
    ``avail`` raises NeedBytes, so that a remote reader can fetch more of the header and scan again.
    """

    __slots__ = ("avail", "buf", "pos", "size", "where")

    def __init__(self, buf: Any, size: int, where: str, avail: int | None = None) -> None:
        self.buf = buf
        self.size = size
        self.avail = size if avail is None else avail
        self.pos = 0
        self.where = where

    def fail(self, what: str, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.where}: {what}: {problem}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                what, f"truncated (needs {n} bytes at offset {self.pos}, the file has {self.size} bytes)"
            )
        if n > self.avail - self.pos:
            raise NeedBytes(self.pos + n)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, limit: int) -> bytes:
        n = self.u64(what)
        if n > limit:
            raise self.fail(what, f"string of {n} bytes, more than the {limit} allowed")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw

    def skip_strings(self, count: int, what: str) -> None:
        """Step over ``count`` strings (a u64 length, then the bytes, each)."""
        buf, pos, size, unpack = self.buf, self.pos, self.avail, _U64.unpack_from
        for i in range(count):
            if pos + 8 > size or (n := unpack(buf, pos)[0]) > size - pos - 8:
                self.pos = pos if pos + 8 > size else pos + 8
                self.need(8 if pos + 8 > size else n, what if count == 1 else f"{what}[{i}]")
            pos += 8 + n
        self.pos = pos


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


#: The magics of the ggml formats before GGUF (llama.cpp's old loaders: ggml, ggmf, ggjt), as the bytes start a
#: file (little-endian u32) and as written out: a header error names them.
_GGML_MAGICS = (b"lmgg", b"fmgg", b"tjgg", b"GGML", b"GGMF", b"GGJT")


def _scan_header(cur: Cursor, tables: GGUFTables) -> tuple[int, int, int]:
    """Magic, version, tensor count and KV count, each checked (gguf_init_from_reader)."""
    if cur.size == 0:
        raise ModelFileError(f"{cur.where}: empty file, not a GGUF model")
    cur.need(4, "header (magic)")
    magic = bytes(cur.buf[0:4])
    if magic != tables.magic:
        # the bytes are named only where they are another ggml format's magic: a file that is no model at all
        # (a text file named .gguf) does not have its first bytes echoed
        shown = magic.decode("ascii") if magic in _GGML_MAGICS else None
        raise ModelFileError(f"{cur.where}: header (magic): "
                             + (f"'{shown}' is not 'GGUF'" if shown else "the file does not start with 'GGUF'")
                             + ", not a GGUF file")
    cur.pos = 4
    version = cur.u32("header (version)")
    if version == 0 or version & 0xFFFF == 0:
        raise cur.fail("header (version)", f"bad GGUF version {version} (a big-endian file?)")
    if version == 1:
        raise cur.fail("header (version)", "GGUF version 1 is no longer supported by llama.cpp")
    if version > tables.version:
        raise cur.fail("header (version)", f"unknown GGUF version {version} (newest known: {tables.version})")
    n_tensors = cur.u64("header (tensor_count)")
    if n_tensors > MAX_TENSORS:
        raise cur.fail("header (tensor_count)", f"{n_tensors} tensors, more than the {MAX_TENSORS} allowed")
    n_kv = cur.u64("header (kv_count)")
    if n_kv > MAX_KV:
        raise cur.fail("header (kv_count)", f"{n_kv} metadata pairs, more than the {MAX_KV} allowed")
    return version, n_tensors, n_kv


def _scan_kv(cur: Cursor, tables: GGUFTables, n_kv: int) -> dict[str, MetaEntry]:
    entries: dict[str, MetaEntry] = {}
    n_strings = 0
    for i in range(n_kv):
        raw = cur.string(f"metadata pair #{i} (key)", MAX_KEY_BYTES)
        if not raw:
            raise cur.fail(f"metadata pair #{i} (key)", "empty key")
        key = raw.decode("utf-8", "replace")
        what = excerpt(key)
        if key in entries:
            raise cur.fail(what, "duplicate key")
        code = cur.u32(f"{what} (type)")
        vtype = tables.value_types.get(code)
        if vtype is None:
            raise cur.fail(what, f"invalid GGUF value type {code}")
        name, fmt = vtype
        if name == "arr":
            ecode = cur.u32(f"{what} (array element type)")
            etype = tables.value_types.get(ecode)
            if etype is None or etype[0] == "arr":
                raise cur.fail(what, f"invalid GGUF array element type {ecode}")
            count = cur.u64(f"{what} (array length)")
            if count > MAX_ARRAY_LEN:
                raise cur.fail(what, f"array of {count} elements, more than the {MAX_ARRAY_LEN} allowed")
            offset = cur.pos
            if etype[1] is None:  # strings: each needs at least its 8-byte length
                n_strings += count
                if n_strings > MAX_STRINGS:
                    raise cur.fail(what, f"more than {MAX_STRINGS} strings in the metadata")
                cur.need(8 * count, what)
                cur.skip_strings(count, what)
            else:
                n_bytes = count * struct.calcsize(etype[1])
                cur.need(n_bytes, what)
                cur.pos += n_bytes
            entries[key] = MetaEntry(MetaInfo("arr", etype[0], count), offset)
        elif fmt is None:  # a string
            offset = cur.pos
            cur.skip_strings(1, what)
            entries[key] = MetaEntry(MetaInfo(name), offset)
        else:
            offset = cur.pos
            n_bytes = struct.calcsize(fmt)
            cur.need(n_bytes, what)
            cur.pos += n_bytes
            entries[key] = MetaEntry(MetaInfo(name), offset)
    return entries


def _alignment(cur: Cursor, tables: GGUFTables, entries: dict[str, MetaEntry]) -> int:
    entry = entries.get(General.ALIGNMENT)
    if entry is None:
        return tables.default_alignment
    if entry.info.type != "u32":
        raise cur.fail(General.ALIGNMENT, f"wrong type {entry.info.type}, expected u32")
    (alignment,) = _U32.unpack_from(cur.buf, entry.offset)
    if alignment == 0 or alignment & (alignment - 1):
        raise cur.fail(General.ALIGNMENT, f"{alignment} is not a power of 2")
    return alignment


@dataclass(frozen=True)
class _TensorInfo:
    """One tensor info as the file gives it, checked: name, ggml type, shape (ne0 first), bytes, data offset."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int

    @property
    def row(self) -> int:
        return self.shape[0] if self.shape else 1


@dataclass(frozen=True)
class _TensorTable:
    """The tensor infos of a file, summed: bytes and counts per ggml type, the data section's offset, and each
    tensor's (name, bytes), (type, row length) and shape in file order."""

    tensor_bytes: dict[str, int]
    tensor_counts: dict[str, int]
    data_offset: int
    sizes: tuple[tuple[str, int], ...]
    rows: tuple[tuple[str, int], ...]
    shapes: tuple[tuple[int, ...], ...]


def _scan_shape(cur: Cursor, what: str) -> tuple[list[int], int]:
    """A tensor's dimensions (at most GGML_MAX_DIMS, none negative) and its element count (at most INT64_MAX)."""
    n_dims = cur.u32(f"{what} (n_dims)")
    if n_dims > GGML_MAX_DIMS:
        raise cur.fail(what, f"{n_dims} dimensions, ggml allows {GGML_MAX_DIMS}")
    ne = [cur.i64(f"{what} (dimension {j})") for j in range(n_dims)]
    n_elements = 1
    for j, n in enumerate(ne):
        if n < 0:
            raise cur.fail(what, f"dimension {j} has {n} elements")
        n_elements *= n
    if n_elements > INT64_MAX:
        raise cur.fail(what, f"shape {ne} has more than INT64_MAX elements")
    return ne, n_elements


def _scan_tensor_info(cur: Cursor, tables: GGUFTables, i: int, seen: set[bytes]) -> _TensorInfo:
    """Tensor info #``i``: a name shorter than GGML_MAX_NAME not in ``seen`` (added to it), its shape, a known
    ggml type whose block size divides the row, and the data offset."""
    raw = cur.string(f"tensor #{i} (name)", MAX_KEY_BYTES)
    name = printable(raw.decode("utf-8", "replace"))
    what = f"tensor '{excerpt(name)}'"
    if len(raw) >= GGML_MAX_NAME:
        raise cur.fail(what, f"name of {len(raw)} bytes, ggml allows {GGML_MAX_NAME - 1}")
    if raw in seen:
        raise cur.fail(what, "duplicate tensor name")
    seen.add(raw)
    ne, n_elements = _scan_shape(cur, what)
    code = cur.u32(f"{what} (type)")
    ttype = tables.tensor_types.get(code)
    if ttype is None:
        raise cur.fail(what, f"unknown ggml type {code}")
    type_name, block, type_size = ttype
    row = ne[0] if ne else 1
    if row % block:
        raise cur.fail(what, f"{row} elements per row is not a multiple of the {type_name} block size {block}")
    offset = cur.u64(f"{what} (offset)")
    return _TensorInfo(name, type_name, tuple(ne), n_elements // block * type_size, offset)


def _scan_tensors(cur: Cursor, tables: GGUFTables, n_tensors: int, alignment: int) -> _TensorTable:
    """The tensor infos, each stored in order and padded to ``alignment``, and all their data inside the file."""
    infos: list[_TensorInfo] = []
    seen: set[bytes] = set()
    expected_offset = 0
    for i in range(n_tensors):
        t = _scan_tensor_info(cur, tables, i, seen)
        if t.offset != expected_offset:
            raise cur.fail(
                f"tensor '{excerpt(t.name)}'",
                f"data offset {t.offset}, expected {expected_offset} (tensors are stored in order, "
                f"each padded to {alignment} bytes)",
            )
        expected_offset += _pad(t.n_bytes, alignment)
        infos.append(t)
    data_offset = _pad(cur.pos, alignment) if n_tensors else cur.pos
    if infos and data_offset + infos[-1].offset + infos[-1].n_bytes > cur.size:
        raise cur.fail(
            f"tensor '{infos[-1].name}'",
            f"data ends at byte {data_offset + infos[-1].offset + infos[-1].n_bytes}, beyond the end of the file "
            f"({cur.size} bytes): truncated or corrupt",
        )
    tensor_bytes: dict[str, int] = {}
    tensor_counts: dict[str, int] = {}
    for t in infos:
        tensor_bytes[t.type_name] = tensor_bytes.get(t.type_name, 0) + t.n_bytes
        tensor_counts[t.type_name] = tensor_counts.get(t.type_name, 0) + 1
    return _TensorTable(tensor_bytes, tensor_counts, data_offset, tuple((t.name, t.n_bytes) for t in infos),
                        tuple((t.type_name, t.row) for t in infos), tuple(t.shape for t in infos))


@contextmanager
def mapped_file(path: Path) -> Iterator[tuple[Any, int]]:
    """The file as a read-only buffer and its size (an empty buffer for an empty file)."""

    def unreadable(exc: OSError | ValueError) -> ModelFileError:
        return ModelFileError(f"{path}: cannot read file: {getattr(exc, 'strerror', None) or exc}")

    try:
        fh = open_regular(path)
    except OSError as exc:
        raise unreadable(exc) from None
    with fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError) as exc:
            raise unreadable(exc) from None
        if mm is None:
            yield b"", 0
            return
        with mm:
            yield mm, size


def scan_buffer(buf: Any, size: int, where: str, avail: int | None = None) -> GGUFIndex:
    """Scan a GGUF file of ``size`` bytes whose first ``avail`` (default: all) are in ``buf`` (see ``Cursor``)."""
    tables = gguf_tables()
    cur = Cursor(buf, size, where, avail)
    version, n_tensors, n_kv = _scan_header(cur, tables)
    entries = _scan_kv(cur, tables, n_kv)
    alignment = _alignment(cur, tables, entries)
    table = _scan_tensors(cur, tables, n_tensors, alignment)
    return GGUFIndex(
        version=version,
        entries=entries,
        n_tensors=n_tensors,
        tensor_bytes=table.tensor_bytes,
        tensor_counts=table.tensor_counts,
        data_offset=table.data_offset,
        data_bytes=sum(_pad(n, alignment) for n in table.tensor_bytes.values()),
        alignment=alignment,
        tensors=table.sizes,
        tensor_rows=table.rows,
        tensor_shapes=table.shapes,
    )


def scan_prefix(buf: bytes, size: int, where: str) -> GGUFIndex:
    """Scan a GGUF file of ``size`` bytes of which ``buf`` holds the first ``len(buf)``.

    The same scanner and limits as for a local file; the tensor data is checked to lie inside ``size``.

    Raises:
        NeedBytes: the header goes on past ``buf`` (its ``end``: the prefix length the scan needs next).
        ModelFileError: as ``scan_gguf``.
    """
    return scan_buffer(buf, size, where, avail=len(buf))


def scan_gguf(path: str | os.PathLike[str]) -> GGUFIndex:
    """Scan the header, metadata and tensor infos of the GGUF file ``path`` (no tensor data is read)."""
    path = Path(path)
    with mapped_file(path) as (buf, size):
        return scan_buffer(buf, size, str(path))

