"""GGUF files -> ModelSpec: the metadata and the tensor table, never the tensor data.

The file is read through a read-only memory map by a small scanner that bounds every count and length
before it uses it (a corrupt header cannot make rsplan allocate or loop on what it claims), with the
``gguf`` package's tables for the value types, the ggml tensor types (``GGML_QUANT_SIZES``), the magic, the
version and the default alignment. The structural rules are llama.cpp's (ggml/src/gguf.cpp
``gguf_init_from_reader``): no duplicate or empty keys, tensor names shorter than 64 bytes, at most 4
dimensions, known tensor types whose block size divides the row, tensors stored in order and padded to the
alignment, and (src/llama-model-loader.cpp) all tensor data inside the file. The hyper-parameters are then read
by ``llama_loader.load_spec``, exactly as llama.cpp's loader reads them.

gguf (and numpy, which it imports) are imported on the first GGUF read only.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError, excerpt, require
from rsplan.files import open_regular, path_kind
from rsplan.hparams.gguf_keys import General, Split
from rsplan.hparams.llama_loader import LoadedModel, MetaInfo, load_spec, printable
from rsplan.hparams.model import MAX_LAYERS, ModelSpec

#: Limits far above any real model file and far below what a corrupt count would ask for.
MAX_KV = 1 << 16  # metadata pairs (real files: a few dozen)
MAX_TENSORS = 1 << 16  # tensor infos (real files: up to a few thousand)
MAX_KEY_BYTES = 1 << 16  # bytes of one key
MAX_ARRAY_LEN = 1 << 22  # elements of one metadata array (vocabularies and merges: up to ~1M)
MAX_STRINGS = 1 << 23  # strings in all metadata arrays together (bounds the time to walk them)
MAX_VALUE_STRING = 1 << 16  # bytes of a string value rsplan decodes at most (general.name, general.architecture)
MAX_DECODED_ARRAY = 4 * MAX_LAYERS  # elements of an array value rsplan decodes (per-layer keys)
GGML_MAX_NAME = 64  # a tensor name is shorter (ggml.h)
GGML_MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

#: llama_split_path: "<prefix>-%05d-of-%05d.gguf"
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class _Tables:
    """The gguf package's facts, keyed the way the scanner looks them up."""

    magic: bytes
    version: int
    default_alignment: int
    #: GGUF value type code -> (llama.cpp's type name, struct code of a fixed-size value or None)
    value_types: dict[int, tuple[str, str | None]]
    #: ggml type code -> (name, elements per block, bytes per block)
    tensor_types: dict[int, tuple[str, int, int]]


@cache
def _tables() -> _Tables:
    require("gguf", "reading a GGUF file", "gguf")
    from gguf.constants import (
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
    return _Tables(
        magic=_U32.pack(GGUF_MAGIC),
        version=GGUF_VERSION,
        default_alignment=GGUF_DEFAULT_ALIGNMENT,
        value_types={int(code): v for code, v in value_types.items()},
        tensor_types={int(q): (q.name.lower(), block, size) for q, (block, size) in GGML_QUANT_SIZES.items()},
    )


@dataclass(frozen=True)
class _Entry:
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
    entries: dict[str, _Entry]
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


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF file read for sizing: the spec, where each number came from, and the tensor table summary."""

    loaded: LoadedModel
    index: GGUFIndex
    files: tuple[str, ...]  # the file, then its other split parts
    split_tensor_bytes: dict[str, int]  # tensor bytes by type over all split parts

    @property
    def spec(self) -> ModelSpec:
        return self.loaded.spec


class NeedBytes(Exception):
    """The scan of a file prefix needs the file's first ``end`` bytes (``end`` <= the file's size)."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _Cursor:
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


def _scan_header(cur: _Cursor, tables: _Tables) -> tuple[int, int, int]:
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


def _scan_kv(cur: _Cursor, tables: _Tables, n_kv: int) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
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
            entries[key] = _Entry(MetaInfo("arr", etype[0], count), offset)
        elif fmt is None:  # a string
            offset = cur.pos
            cur.skip_strings(1, what)
            entries[key] = _Entry(MetaInfo(name), offset)
        else:
            offset = cur.pos
            n_bytes = struct.calcsize(fmt)
            cur.need(n_bytes, what)
            cur.pos += n_bytes
            entries[key] = _Entry(MetaInfo(name), offset)
    return entries


def _alignment(cur: _Cursor, tables: _Tables, entries: dict[str, _Entry]) -> int:
    entry = entries.get(General.ALIGNMENT)
    if entry is None:
        return tables.default_alignment
    if entry.info.type != "u32":
        raise cur.fail(General.ALIGNMENT, f"wrong type {entry.info.type}, expected u32")
    (alignment,) = _U32.unpack_from(cur.buf, entry.offset)
    if alignment == 0 or alignment & (alignment - 1):
        raise cur.fail(General.ALIGNMENT, f"{alignment} is not a power of 2")
    return alignment


def _scan_tensors(
    cur: _Cursor, tables: _Tables, n_tensors: int, alignment: int
) -> tuple[dict[str, int], dict[str, int], int, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...],
           tuple[tuple[int, ...], ...]]:
    """The tensor infos: bytes and counts per ggml type, the data section's offset, each tensor's bytes, each
    tensor's (type, row length) and shape."""
    sizes: list[tuple[str, int]] = []
    shapes: list[tuple[int, ...]] = []
    rows: list[tuple[str, int]] = []
    seen: set[bytes] = set()
    tensor_bytes: dict[str, int] = {}
    tensor_counts: dict[str, int] = {}
    expected_offset = 0
    last: tuple[str, int] = ("", 0)  # (name, end of its data within the data section)
    for i in range(n_tensors):
        raw = cur.string(f"tensor #{i} (name)", MAX_KEY_BYTES)
        name = printable(raw.decode("utf-8", "replace"))
        what = f"tensor '{excerpt(name)}'"
        if len(raw) >= GGML_MAX_NAME:
            raise cur.fail(what, f"name of {len(raw)} bytes, ggml allows {GGML_MAX_NAME - 1}")
        if raw in seen:
            raise cur.fail(what, "duplicate tensor name")
        seen.add(raw)
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
        code = cur.u32(f"{what} (type)")
        ttype = tables.tensor_types.get(code)
        if ttype is None:
            raise cur.fail(what, f"unknown ggml type {code}")
        type_name, block, type_size = ttype
        row = ne[0] if ne else 1
        if row % block:
            raise cur.fail(what, f"{row} elements per row is not a multiple of the {type_name} block size {block}")
        n_bytes = n_elements // block * type_size
        offset = cur.u64(f"{what} (offset)")
        if offset != expected_offset:
            raise cur.fail(
                what,
                f"data offset {offset}, expected {expected_offset} (tensors are stored in order, "
                f"each padded to {alignment} bytes)",
            )
        expected_offset += _pad(n_bytes, alignment)
        tensor_bytes[type_name] = tensor_bytes.get(type_name, 0) + n_bytes
        tensor_counts[type_name] = tensor_counts.get(type_name, 0) + 1
        sizes.append((name, n_bytes))
        rows.append((type_name, row))
        shapes.append(tuple(ne))
        last = (name, offset + n_bytes)
    data_offset = _pad(cur.pos, alignment) if n_tensors else cur.pos
    if n_tensors and data_offset + last[1] > cur.size:
        raise cur.fail(
            f"tensor '{last[0]}'",
            f"data ends at byte {data_offset + last[1]}, beyond the end of the file ({cur.size} bytes): "
            "truncated or corrupt",
        )
    return tensor_bytes, tensor_counts, data_offset, tuple(sizes), tuple(rows), tuple(shapes)


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[Any, int]]:
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


def _scan(buf: Any, size: int, where: str, avail: int | None = None) -> GGUFIndex:
    tables = _tables()
    cur = _Cursor(buf, size, where, avail)
    version, n_tensors, n_kv = _scan_header(cur, tables)
    entries = _scan_kv(cur, tables, n_kv)
    alignment = _alignment(cur, tables, entries)
    tensor_bytes, tensor_counts, data_offset, sizes, rows, shapes = _scan_tensors(cur, tables, n_tensors, alignment)
    return GGUFIndex(
        version=version,
        entries=entries,
        n_tensors=n_tensors,
        tensor_bytes=tensor_bytes,
        tensor_counts=tensor_counts,
        data_offset=data_offset,
        data_bytes=sum(_pad(n, alignment) for n in tensor_bytes.values()),
        alignment=alignment,
        tensors=sizes,
        tensor_rows=rows,
        tensor_shapes=shapes,
    )


def scan_prefix(buf: bytes, size: int, where: str) -> GGUFIndex:
    """Scan a GGUF file of ``size`` bytes of which ``buf`` holds the first ``len(buf)``.

    The same scanner and limits as for a local file; the tensor data is checked to lie inside ``size``.

    Raises:
        NeedBytes: the header goes on past ``buf`` (its ``end``: the prefix length the scan needs next).
        ModelFileError: as ``scan_gguf``.
    """
    return _scan(buf, size, where, avail=len(buf))


def scan_gguf(path: str | os.PathLike[str]) -> GGUFIndex:
    """Scan the header, metadata and tensor infos of the GGUF file ``path`` (no tensor data is read)."""
    path = Path(path)
    with _mapped(path) as (buf, size):
        return _scan(buf, size, str(path))


class _GGUFMetadata:
    """llama_loader.Metadata over a scanned file: values are decoded from the map on request."""

    def __init__(self, buf: Any, index: GGUFIndex, where: str) -> None:
        self.buf = buf
        self.entries = index.entries
        self.where = where
        self._formats = {name: fmt for name, fmt in _tables().value_types.values() if fmt}

    def info(self, key: str) -> MetaInfo | None:
        entry = self.entries.get(key)
        return entry.info if entry else None

    def value(self, key: str) -> Any:
        entry = self.entries[key]
        info = entry.info
        if info.type == "str":
            # the scanner checked the string lies in the file; decode at most MAX_VALUE_STRING bytes of it
            (n,) = _U64.unpack_from(self.buf, entry.offset)
            start = entry.offset + 8
            return bytes(self.buf[start : start + min(n, MAX_VALUE_STRING)]).decode("utf-8", "replace")
        if info.type == "arr":
            fmt = self._formats.get(info.elem or "")
            if fmt is None or info.count > MAX_DECODED_ARRAY:
                raise ModelFileError(f"{self.where}: {printable(key)}: cannot decode an array of {info.elem}")
            return list(struct.unpack_from(f"<{info.count}{fmt}", self.buf, entry.offset))
        (v,) = struct.unpack_from("<" + self._formats[info.type], self.buf, entry.offset)
        return v

    def describe(self, key: str) -> str:
        return printable(key)


def _u16(cur: _Cursor, entries: dict[str, _Entry], key: str) -> int | None:
    entry = entries.get(key)
    if entry is None:
        return None
    if entry.info.type not in ("u16", "u32"):
        raise cur.fail(key, f"wrong type {entry.info.type}, expected u16")
    fmt = "<H" if entry.info.type == "u16" else "<I"
    (v,) = struct.unpack_from(fmt, cur.buf, entry.offset)
    return v


def split_part_names(name: str, buf: Any, index: GGUFIndex, where: str) -> list[str]:
    """The file names of the other parts of a model split in parts (llama_split_path), from the first part's
    ``split.count`` / ``split.no`` keys and its file name ``name``; [] for a model in one file."""
    cur = _Cursor(buf, len(buf), where)
    count = _u16(cur, index.entries, Split.COUNT) or 1
    if count <= 1:
        return []
    no = _u16(cur, index.entries, Split.NO) or 0
    if no != 0:
        raise cur.fail(Split.NO, f"this is part {no + 1} of {count}; give the first part of the model")
    match = _SPLIT_NAME.match(name)
    if match is None or int(match["count"]) != count:
        raise cur.fail(
            Split.COUNT, f"a model in {count} parts, but the file name is not '<name>-00001-of-{count:05d}.gguf'"
        )
    return [f"{match['prefix']}-{i + 1:05d}-of-{count:05d}.gguf" for i in range(1, count)]


def _split_parts(path: Path, buf: Any, index: GGUFIndex) -> list[Path]:
    """The other files of a model split in parts, checked to exist."""
    parts = [path.with_name(name) for name in split_part_names(path.name, buf, index, str(path))]
    count = len(parts) + 1
    for part in parts:
        try:
            kind = path_kind(part)
        except OSError as exc:
            raise ModelFileError(f"{path}: split.count: part {part.name}: cannot read: {exc.strerror or exc}") from None
        if kind == "missing":
            raise ModelFileError(f"{path}: split.count: part {part.name} of this {count}-part model is missing")
        if kind != "file":
            raise ModelFileError(f"{path}: split.count: part {part.name} of this {count}-part model is not a "
                                 "regular file")
    return parts


def model_from_index(buf: Any, index: GGUFIndex, where: str, *, fallback_name: str,
                     parts: Sequence[tuple[str, GGUFIndex]] = ()) -> GGUFModel:
    """The GGUFModel of a scanned first file (``buf`` holds at least its header) and the scanned tensor tables of
    its other split ``parts`` (name, index): the one place where a GGUF header becomes a spec, for local and
    remote files alike."""
    split_bytes = dict(index.tensor_bytes)
    for _, part in parts:
        for type_name, n in part.tensor_bytes.items():
            split_bytes[type_name] = split_bytes.get(type_name, 0) + n
    loaded = load_spec(
        _GGUFMetadata(buf, index, where),
        fallback_name=fallback_name,
        source=where,
        weights_bytes=sum(split_bytes.values()),
    )
    loaded.sources["weights_bytes"] = f"tensor table ({index.n_tensors} tensors" + (
        f" in {len(parts) + 1} parts)" if parts else ")"
    )
    names = {name for name, _ in index.tensors}.union(*({name for name, _ in part.tensors} for _, part in parts))
    loaded = _flags_from_tensor_table(loaded, names, where)
    return GGUFModel(loaded, index, (where, *(name for name, _ in parts)), split_bytes)


#: Spec flags a GGUF says only through its tensor table: (arch, spec field) -> the optional per-layer tensor whose
#: presence sets it. Falcon-H1's grouped Mamba-2 norm is created TENSOR_NOT_REQUIRED
#: (src/models/falcon-h1.cpp:83 ssm_norm) and applied where present; no metadata key records config.json's
#: mamba_rms_norm. ARWKV-7's time-mix group norm likewise (src/models/arwkv7.cpp:103 time_mix_ln).
TENSOR_TABLE_FLAGS: dict[tuple[str, str], str] = {
    ("falcon-h1", "mamba_rms_norm"): "ssm_norm.weight",
    ("arwkv7", "wkv_group_norm"): "time_mix_ln.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")


def _flags_from_tensor_table(loaded: LoadedModel, names: set[str], where: str) -> LoadedModel:
    """``loaded`` with each TENSOR_TABLE_FLAGS flag of its arch set from the tensor ``names`` (all files): true when
    every layer has the tensor, false when none has; a file whose tensor table does not cover every layer (metadata
    only, a test file) leaves it unset.

    Raises:
        ModelFileError: only some layers have it (rsplan models the flag for the whole model)."""
    spec = loaded.spec
    layers = {int(m.group(1)) for m in map(_LAYER_TENSOR.match, names) if m}
    if layers != set(range(spec.block_count)):
        return loaded
    for (arch, field_name), suffix in TENSOR_TABLE_FLAGS.items():
        if spec.arch != arch or getattr(spec, field_name) is not None:
            continue
        having = [il for il in range(spec.block_count) if f"blk.{il}.{suffix}" in names]
        if having and len(having) != spec.block_count:
            raise ModelFileError(
                f"{where}: blk.N.{suffix}: present in {len(having)} of {spec.block_count} layers; rsplan models "
                f"{field_name} for all layers or none"
            )
        loaded.sources[field_name] = f"tensor table (blk.N.{suffix} {'present' if having else 'absent'})"
        loaded = LoadedModel(spec.model_copy(update={field_name: bool(having)}), loaded.sources)
        spec = loaded.spec
    return loaded


def read_gguf(path: str | os.PathLike[str]) -> GGUFModel:
    """Read the GGUF file ``path`` for sizing: hyper-parameters as llama.cpp reads them, and weight bytes.

    Only the header, the metadata and the tensor infos are read (through a memory map); the tensor data is
    only checked to lie inside the file. For a model split in parts, give the first part; the others' tensor
    tables are read for the weight bytes.

    Raises:
        ModelFileError: the file is unreadable, truncated, corrupt, or lacks a key llama.cpp requires.
        UnsupportedArchError: its architecture is not one rsplan sizes.
    """
    path = Path(path)
    where = str(path)
    with _mapped(path) as (buf, size):
        index = _scan(buf, size, where)
        parts = [(str(part), scan_gguf(part)) for part in _split_parts(path, buf, index)]
        return model_from_index(buf, index, where, fallback_name=path.stem, parts=parts)


def load_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    """The ModelSpec of the GGUF file ``path`` (see ``read_gguf``)."""
    return read_gguf(path).spec
