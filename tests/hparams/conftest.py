"""Fixtures that build GGUF files inside the tests: with gguf.GGUFWriter (metadata, a small tensor table and a
sparse data section, so no tensor data is ever written), or byte by byte for hostile files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from rsplan.cli import cli
from rsplan.hparams.gguf_keys import arch_key

#: A small tensor table: (name, numpy-order shape, ggml type name). Its bytes are derived in the tests.
TENSORS: list[tuple[str, tuple[int, ...], str]] = [
    ("token_embd.weight", (32, 64), "q8_0"),  # 32 rows of 64 elements: 32 * 2 blocks * 34 B = 2176
    ("output_norm.weight", (64,), "f32"),  # 64 * 4 = 256
    ("blk.0.attn_norm.weight", (64,), "f32"),  # 256
    ("output.weight", (32, 256), "q4_k"),  # 32 rows of one 256-block of 144 B = 4608
]
TENSOR_BYTES = {"q8_0": 2176, "f32": 512, "q4_k": 4608}


def _gguf_type(name: str) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name.upper()]


def write_gguf(
    path: Path,
    arch: str,
    kv: dict[str, Any],
    *,
    tensors: Sequence[tuple[str, tuple[int, ...], str]] = TENSORS,
    name: str | None = "test model",
    alignment: int | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """Write a GGUF with ``kv`` (keys without the ``{arch}.`` prefix unless they start with ``general.``,
    ``split.`` or ``tokenizer.``).

    Python values are written the way llama.cpp's converter writes them (GGUFWriter): int -> u32, bool ->
    bool, str -> str, float -> f32, lists -> arrays (of i32 for ints, bool for bools); a ``(type, value)`` pair
    forces a GGUF value type, e.g. ``("i32", 5)``. The data section is a hole (a sparse file). With
    ``split_max_tensors`` the model is written in parts (``<stem>-00001-of-0000N.gguf``, ...); the first is returned.
    """
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFValueType, GGUFWriter

    w = GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    if name is not None:
        w.add_name(name)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    forced = {"i32": GGUFValueType.INT32, "u64": GGUFValueType.UINT64, "u16": GGUFValueType.UINT16,
              "f32": GGUFValueType.FLOAT32, "bool": GGUFValueType.BOOL, "str": GGUFValueType.STRING,
              "u32": GGUFValueType.UINT32, "i64": GGUFValueType.INT64, "u8": GGUFValueType.UINT8}
    for key, value in kv.items():
        full = key if key.startswith(("general.", "split.", "tokenizer.")) else arch_key(arch, key)
        if isinstance(value, tuple):
            vtype, v = value
            if isinstance(v, list):
                w.add_key_value(full, v, GGUFValueType.ARRAY, sub_type=forced[vtype])
            else:
                w.add_key_value(full, v, forced[vtype])
        elif isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_array(full, value)
    for tname, shape, ttype in tensors:
        qtype = _gguf_type(ttype)
        block, size = GGML_QUANT_SIZES[qtype]
        w.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) // block * size, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    align = w.data_alignment
    paths = w.format_shard_names(path)
    for part, part_tensors in zip(paths, w.tensors, strict=True):
        if part_tensors:
            data_start = (part.stat().st_size + align - 1) // align * align
            total = sum((ti.nbytes + align - 1) // align * align for ti in part_tensors.values())
            os.truncate(part, data_start + total)  # the data section: a hole, never written
    path = paths[0]
    return path


@pytest.fixture
def gguf_file(tmp_path: Path) -> Callable[..., Path]:
    """``gguf_file(arch, kv, filename="model.gguf", **opts)``: write a GGUF in tmp_path (see write_gguf)."""

    def make(arch: str, kv: dict[str, Any], filename: str = "model.gguf", **opts: Any) -> Path:
        return write_gguf(tmp_path / filename, arch, kv, **opts)

    return make


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


@pytest.fixture
def raw_file(tmp_path: Path) -> Callable[..., Path]:
    """``raw_file(data, name="bad.gguf")``: write bytes to a file in tmp_path."""

    def make(data: bytes, name: str = "bad.gguf") -> Path:
        p = tmp_path / name
        p.write_bytes(data)
        return p

    return make


@pytest.fixture
def rsplan() -> Callable[..., Result]:
    """``rsplan(*args)``: run the CLI in-process."""
    return run_cli


@pytest.fixture
def estimate_json() -> Callable[..., dict[str, Any]]:
    """``estimate_json(model, *flags)``: ``rsplan estimate --format json`` parsed (exit code checked)."""

    def run(model: Path | str, *flags: str) -> dict[str, Any]:
        r = run_cli("estimate", "--model", str(model), "--format", "json", *flags)
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    return run
