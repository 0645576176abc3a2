"""The parts of a GGUF model split in several files (llama.cpp's llama_split_path names and ``split.*`` keys)."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError
from rsplan.files import path_kind
from rsplan.hparams.gguf_keys import Split
from rsplan.hparams.gguf_scan import Cursor, GGUFIndex, MetaEntry

#: llama_split_path: "<prefix>-%05d-of-%05d.gguf"
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _u16(cur: Cursor, entries: dict[str, MetaEntry], key: str) -> int | None:
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
    cur = Cursor(buf, len(buf), where)
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


def split_part_paths(path: Path, buf: Any, index: GGUFIndex) -> list[Path]:
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

