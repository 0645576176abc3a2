"""GGUF files -> ModelSpec: the metadata and the tensor table, never the tensor data.

The header is scanned by ``gguf_scan`` (bounded, llama.cpp's structural rules); the metadata values are decoded
from the map on request, and the hyper-parameters read by ``llama_loader.load_spec``, exactly as llama.cpp's loader
reads them. A model split in parts (``gguf_split``) is read from its first part, the others' tensor tables summed.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError
from rsplan.hparams.gguf_scan import GGUFIndex, gguf_tables, mapped_file, scan_buffer, scan_gguf
from rsplan.hparams.gguf_split import split_part_paths
from rsplan.hparams.llama_loader import LoadedModel, MetaInfo, load_spec, printable
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.model_limits import MAX_LAYERS

#: What the metadata decoder reads of one value at most.
MAX_VALUE_STRING = 1 << 16  # bytes of a string value rsplan decodes at most (general.name, general.architecture)
MAX_DECODED_ARRAY = 4 * MAX_LAYERS  # elements of an array value rsplan decodes (per-layer keys)


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


class _GGUFMetadata:
    """llama_loader.Metadata over a scanned file: values are decoded from the map on request."""

    def __init__(self, buf: Any, index: GGUFIndex, where: str) -> None:
        self.buf = buf
        self.entries = index.entries
        self.where = where
        self._formats = {name: fmt for name, fmt in gguf_tables().value_types.values() if fmt}

    def info(self, key: str) -> MetaInfo | None:
        entry = self.entries.get(key)
        return entry.info if entry else None

    def value(self, key: str) -> Any:
        entry = self.entries[key]
        info = entry.info
        if info.type == "str":
            # the scanner checked the string lies in the file; decode at most MAX_VALUE_STRING bytes of it
            (n,) = struct.unpack_from("<Q", self.buf, entry.offset)
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
    layers = {int(m.group(1)) for m in map(_LAYER_TENSOR.match, names) if m}
    if layers == set(range(loaded.spec.block_count)):  # a table that covers every layer (not metadata only)
        loaded = _layers_from_tensor_table(_flags_from_tensor_table(loaded, names, where), names)
    return GGUFModel(loaded, index, (where, *(name for name, _ in parts)), split_bytes)


#: Spec flags a GGUF says only through its tensor table: (arch, spec field) -> the optional per-layer tensor whose
#: presence sets it. Falcon-H1's grouped Mamba-2 norm is created TENSOR_NOT_REQUIRED
#: (src/models/falcon-h1.cpp:83 ssm_norm) and applied where present; no metadata key records config.json's
#: mamba_rms_norm. ARWKV-7's time-mix group norm likewise (src/models/arwkv7.cpp:103 time_mix_ln).
TENSOR_TABLE_FLAGS: dict[tuple[str, str], str] = {
    ("falcon-h1", "mamba_rms_norm"): "ssm_norm.weight",
    ("arwkv7", "wkv_group_norm"): "time_mix_ln.weight",
}
#: Per-layer spec lists a GGUF says only through its tensor table: (arch, spec field) -> the optional per-layer
#: tensor whose presence marks a layer. Jamba's router is created TENSOR_NOT_REQUIRED and a layer with it builds
#: the expert FFN, one without it the dense one (src/models/jamba.cpp:88 ffn_gate_inp, :152); no metadata key
#: records config.json's expert_layer_offset / expert_layer_period.
TENSOR_TABLE_LAYERS: dict[tuple[str, str], str] = {
    ("jamba", "expert_layers"): "ffn_gate_inp.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")


def _flags_from_tensor_table(loaded: LoadedModel, names: set[str], where: str) -> LoadedModel:
    """``loaded`` with each TENSOR_TABLE_FLAGS flag of its arch set from the tensor ``names`` (all files, covering
    every layer): true when every layer has the tensor, false when none has.

    Raises:
        ModelFileError: only some layers have it (rsplan models the flag for the whole model)."""
    spec = loaded.spec
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


def _layers_from_tensor_table(loaded: LoadedModel, names: set[str]) -> LoadedModel:
    """``loaded`` with each TENSOR_TABLE_LAYERS list of its arch set from the tensor ``names`` (a layer is marked
    where it has the tensor, ``names`` covering every layer), where the metadata left it unset."""
    spec = loaded.spec
    for (arch, field_name), suffix in TENSOR_TABLE_LAYERS.items():
        if spec.arch != arch or getattr(spec, field_name) is not None:
            continue
        marked = [f"blk.{il}.{suffix}" in names for il in range(spec.block_count)]
        loaded.sources[field_name] = f"tensor table (blk.N.{suffix} in {sum(marked)} of {spec.block_count} layers)"
        loaded = LoadedModel(spec.model_copy(update={field_name: marked}), loaded.sources)
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
    with mapped_file(path) as (buf, size):
        index = scan_buffer(buf, size, where)
        parts = [(str(part), scan_gguf(part)) for part in split_part_paths(path, buf, index)]
        return model_from_index(buf, index, where, fallback_name=path.stem, parts=parts)


def load_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    """The ModelSpec of the GGUF file ``path`` (see ``read_gguf``)."""
    return read_gguf(path).spec
