"""Hostile GGUF files, built byte by byte: each must end as ONE line ``Error: <file>: <key>: <problem>`` with a
non-zero exit, quickly and without allocating what the header claims. Also: truncation at every byte, and single
bit flips across the whole header, none of which may raise anything but an RsplanError."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from rsplan.errors import RsplanError
from rsplan.hparams.gguf_file import load_gguf

HUGE = 1 << 40


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", 4, value)


def kv_str(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", 8) + gstr(value)


def kv_arr(key: str, elem: int, count: int, payload: bytes = b"") -> bytes:
    return gstr(key) + struct.pack("<IIQ", 9, elem, count) + payload


def header(n_tensors: int, n_kv: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor(name: str | bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + struct.pack(
        "<IQ", ggml_type, offset
    )


KVS = [
    kv_str("general.architecture", "mamba2"),
    kv_u32("mamba2.context_length", 4096),
    kv_u32("mamba2.embedding_length", 64),
    kv_u32("mamba2.block_count", 2),
    kv_u32("mamba2.ssm.conv_kernel", 4),
    kv_u32("mamba2.ssm.inner_size", 128),
    kv_u32("mamba2.ssm.state_size", 16),
    kv_u32("mamba2.ssm.time_step_rank", 8),
    kv_u32("mamba2.ssm.group_count", 1),
]


def gguf(kvs: list[bytes] = KVS, tensors: list[bytes] = (), *, n_kv: int | None = None,
         n_tensors: int | None = None, data: bytes = b"", version: int = 3) -> bytes:
    head = header(len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv, version)
    body = head + b"".join(kvs) + b"".join(tensors)
    if tensors:
        body += b"\0" * (-len(body) % 32)
    return body + data


def valid_file() -> bytes:
    """A valid mamba2 file with two f32 tensors (64 and 16 elements) and their data."""
    return gguf(tensors=[tensor("a", [64]), tensor("b", [16], offset=256)], data=b"\1" * (256 + 64))


CASES: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", "empty file, not a GGUF model"),
    "bad magic": (b"GGML" + valid_file()[4:], "header (magic): 'GGML' is not 'GGUF', not a GGUF file"),
    "truncated magic": (b"GG", "header (magic): truncated (needs 4 bytes at offset 0, the file has 2 bytes)"),
    "version 1": (gguf(version=1), "header (version): GGUF version 1 is no longer supported by llama.cpp"),
    "unknown version": (gguf(version=4), "header (version): unknown GGUF version 4 (newest known: 3)"),
    "big-endian": (gguf(version=3 << 24), "header (version): bad GGUF version 50331648 (a big-endian file?)"),
    "tensor count 2^40": (gguf(n_tensors=HUGE), f"header (tensor_count): {HUGE} tensors, more than the 65536 allowed"),
    "kv count 2^64-1": (
        gguf(n_kv=2**64 - 1), f"header (kv_count): {2**64 - 1} metadata pairs, more than the 65536 allowed"
    ),
    "kv count beyond the data": (
        gguf(n_kv=len(KVS) + 1),
        f"metadata pair #{len(KVS)} (key): truncated (needs 8 bytes at offset {len(gguf())}, "
        f"the file has {len(gguf())} bytes)",
    ),
    "key length 2^40": (
        gguf([gstr("x", HUGE)]), f"metadata pair #0 (key): string of {HUGE} bytes, more than the 65536 allowed"
    ),
    "string value 2^40": (
        gguf([gstr("general.architecture") + struct.pack("<I", 8) + gstr(b"mamba2", HUGE)]),
        f"general.architecture: truncated (needs {HUGE} bytes at offset 64, the file has 70 bytes)",
    ),
    "array length 2^40": (
        gguf([*KVS, kv_arr("tokenizer.ggml.tokens", 8, HUGE)]),
        f"tokenizer.ggml.tokens: array of {HUGE} elements, more than the 4194304 allowed",
    ),
    "array longer than the file": (
        gguf([kv_arr("tokenizer.ggml.tokens", 8, 1 << 22)]),
        "tokenizer.ggml.tokens: truncated (needs 33554432 bytes at offset 69, the file has 69 bytes)",
    ),
    "string in an array 2^40": (
        gguf([kv_arr("tokenizer.ggml.tokens", 8, 2, gstr("a") + gstr("b", HUGE))]),
        f"tokenizer.ggml.tokens[1]: truncated (needs {HUGE} bytes at offset 86, the file has 87 bytes)",
    ),
    "u32 array beyond the file": (
        gguf([kv_arr("mamba2.feed_forward_length", 4, 1000)]),
        "mamba2.feed_forward_length: truncated (needs 4000 bytes at offset 74, the file has 74 bytes)",
    ),
    "invalid value type": (
        gguf([gstr("mamba2.block_count") + struct.pack("<I", 13)]), "mamba2.block_count: invalid GGUF value type 13"
    ),
    "nested array": (gguf([kv_arr("x", 9, 1)]), "x: invalid GGUF array element type 9"),
    "duplicate key": (gguf([*KVS, kv_u32("mamba2.block_count", 3)]), "mamba2.block_count: duplicate key"),
    "empty key": (gguf([KVS[0], kv_u32("", 1)]), "metadata pair #1 (key): empty key"),
    "control characters in a key": (gguf([kv_u32("a\nb", 1), kv_u32("a\nb", 2)]), "a\\nb: duplicate key"),
    "alignment not a power of 2": (
        gguf([*KVS, kv_u32("general.alignment", 48)]), "general.alignment: 48 is not a power of 2"
    ),
    "alignment of the wrong type": (
        gguf([*KVS, kv_str("general.alignment", "32")]), "general.alignment: wrong type str, expected u32"
    ),
    "tensor name length 2^40": (
        gguf(tensors=[gstr("w", HUGE)]), f"tensor #0 (name): string of {HUGE} bytes, more than the 65536 allowed"
    ),
    "tensor name too long": (
        gguf(tensors=[tensor("w" * 64, [4])]), f"tensor '{'w' * 64}': name of 64 bytes, ggml allows 63"
    ),
    "duplicate tensor": (
        gguf(tensors=[tensor("w", [8]), tensor("w", [8], offset=32)]), "tensor 'w': duplicate tensor name"
    ),
    "5 dimensions": (gguf(tensors=[tensor("w", [1, 1, 1, 1, 1])]), "tensor 'w': 5 dimensions, ggml allows 4"),
    "2^31 dimensions": (
        gguf(tensors=[gstr("w") + struct.pack("<I", 1 << 31)]), f"tensor 'w': {1 << 31} dimensions, ggml allows 4"
    ),
    "negative dimension": (gguf(tensors=[tensor("w", [-1])]), "tensor 'w': dimension 0 has -1 elements"),
    "element overflow": (
        gguf(tensors=[tensor("w", [1 << 62, 4])]), f"tensor 'w': shape [{1 << 62}, 4] has more than INT64_MAX elements"
    ),
    "unknown tensor type": (gguf(tensors=[tensor("w", [8], 99)]), "tensor 'w': unknown ggml type 99"),
    "row not whole blocks": (
        gguf(tensors=[tensor("w", [33], 8)]),
        "tensor 'w': 33 elements per row is not a multiple of the q8_0 block size 32",
    ),
    "tensor out of order": (
        gguf(tensors=[tensor("w", [8], offset=64)]),
        "tensor 'w': data offset 64, expected 0 (tensors are stored in order, each padded to 32 bytes)",
    ),
    "tensor data beyond the file": (
        gguf(tensors=[tensor("w", [1 << 40])]),
        f"tensor 'w': data ends at byte {4 * (1 << 40) + 416}, beyond the end of the file (416 bytes): "
        "truncated or corrupt",
    ),
    "missing architecture": (gguf(KVS[1:]), "general.architecture: required key not found"),
    "missing required ssm key": (
        gguf([k for k in KVS if b"state_size" not in k]), "mamba2.ssm.state_size: required key not found"
    ),
    "metadata type flipped": (
        gguf([*KVS[:3], gstr("mamba2.block_count") + struct.pack("<Ii", 5, 2), *KVS[4:]]),
        "mamba2.block_count: wrong type i32, expected u32",
    ),
}


#: A hang guard, not a speed test (benchmarks/bench_gguf.py measures speed): a scan that walked a claimed 2^40
#: entries would take hours, while a loaded 2-core machine can stretch a real sub-second refusal several times.
HANG_GUARD_S = 5.0


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_is_one_line_error(case, raw_file, rsplan):
    data, message = CASES[case]
    path = raw_file(data)
    start = time.perf_counter()
    r = rsplan("estimate", "--model", str(path))
    assert time.perf_counter() - start < HANG_GUARD_S
    assert r.exit_code == 1
    assert r.output.count("\n") == 1
    assert isinstance(r.exception, SystemExit)  # click's exit, not an escaped exception
    assert r.output == f"Error: {path}: {message}\n"


def test_truncated_at_every_byte(raw_file):
    data = valid_file()
    assert load_gguf(raw_file(data, "whole.gguf")).block_count == 2
    path = raw_file(b"", "cut.gguf")
    for size in range(len(data)):
        path.write_bytes(data[:size])
        with pytest.raises(RsplanError) as err:
            load_gguf(path)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and "\n" not in message
        assert "truncated" in message or "empty file" in message, message


@pytest.mark.parametrize("bit", [0, 1, 4, 7])
def test_single_bit_flips_never_escape(bit, raw_file):
    """Every single-bit flip in the header, metadata and tensor infos either still reads or is an RsplanError."""
    data = valid_file()
    header_end = len(data) - (256 + 64)
    path = raw_file(b"", "flip.gguf")
    start = time.perf_counter()
    for pos in range(header_end):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << bit
        path.write_bytes(bytes(flipped))
        try:
            load_gguf(path)
        except RsplanError as exc:
            assert "\n" not in str(exc)
    assert time.perf_counter() - start < 10 * HANG_GUARD_S


HOSTILE_HEADERS = {
    "2^40 tensors": gguf(n_tensors=HUGE),
    "2^40-element array": gguf([*KVS, kv_arr("tokenizer.ggml.tokens", 8, HUGE)]),
    "2^40-byte string": gguf([gstr("general.name") + struct.pack("<I", 8) + gstr(b"x", HUGE)]),
    "4M empty strings claimed": gguf([*KVS, kv_arr("tokenizer.ggml.tokens", 8, (1 << 22) - 1)]),
    "65536 pairs claimed": gguf(n_kv=1 << 16),
    "65536 tensors claimed": gguf(n_tensors=1 << 16),
}


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_hostile_header_allocates_little_and_returns_quickly(case, raw_file, tmp_path: Path):
    load_gguf(raw_file(valid_file(), "warm.gguf"))  # import gguf/numpy before measuring
    path = raw_file(HOSTILE_HEADERS[case])
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(RsplanError):
            load_gguf(path)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{case}: peak {peak} bytes"
    assert elapsed < HANG_GUARD_S


def test_a_directory_or_missing_file(tmp_path: Path, rsplan):
    missing = tmp_path / "missing.gguf"
    r = rsplan("estimate", "--model", str(missing))
    assert r.output == f"Error: {missing}: no such file\n"
