"""ggml tensor types that llama.cpp accepts for its caches, as data (mirrors gguf-py's GGML_QUANT_SIZES).

``row_nbytes(type, n)`` is ggml's ``ggml_row_size``: ``n / block_size * type_size`` bytes, and ``n`` must be a
multiple of the block size (ggml asserts it).
"""

from __future__ import annotations

from typing import NamedTuple

from rsplan.errors import ContextError


class GGMLType(NamedTuple):
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    @property
    def is_quantized(self) -> bool:
        return self.block_size > 1


#: ggml-backend.cpp TENSOR_ALIGNMENT: the CPU buffer type's alignment, bytes; each tensor's size is padded to it.
TENSOR_ALIGNMENT = 32

#: The cache types llama.cpp's ``-ctk`` / ``-ctv`` accept (common/arg.cpp ``kv_cache_types``).
GGML_TYPES: dict[str, GGMLType] = {
    t.name: t
    for t in (
        GGMLType("f32", 1, 4),
        GGMLType("f16", 1, 2),
        GGMLType("bf16", 1, 2),
        GGMLType("q8_0", 32, 34),
        GGMLType("q4_0", 32, 18),
        GGMLType("q4_1", 32, 20),
        GGMLType("iq4_nl", 32, 18),
        GGMLType("q5_0", 32, 22),
        GGMLType("q5_1", 32, 24),
    )
}

CACHE_TYPE_NAMES: tuple[str, ...] = tuple(GGML_TYPES)


def ggml_type(name: str) -> GGMLType:
    """Look a cache type up by its llama.cpp name (``f16``, ``q8_0``, ...)."""
    try:
        return GGML_TYPES[name.lower()]
    except KeyError:
        raise ContextError(
            f"unknown cache type '{name}' (allowed: {', '.join(CACHE_TYPE_NAMES)})"
        ) from None


def row_nbytes(type_: GGMLType, n_elements: int) -> int:
    """Bytes of one row of ``n_elements`` elements of ``type_`` (ggml_row_size)."""
    if n_elements % type_.block_size:
        raise ContextError(
            f"a row of {n_elements} elements is not a whole number of {type_.name} blocks "
            f"({type_.block_size} elements each); ggml cannot allocate it"
        )
    return n_elements // type_.block_size * type_.type_size


#: Every tensor type ggml knows at llama.cpp 0c1e57098, keyed by ``ggml_type_name`` (note the capital K of the
#: k-quants), with its enum value: ggml/src/ggml.c ``type_traits`` (``blck_size``, ``type_size``). The values were
#: read back from the built libggml-base (tests/golden/llamacpp-quantize/ggml_type_traits.json). Weights may be
#: stored in any of them; the caches take only ``GGML_TYPES`` above.
GGML_TYPE_IDS: dict[str, int] = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q8_1": 9,
    "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14, "q8_K": 15,
    "iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18, "iq1_s": 19, "iq4_nl": 20, "iq3_s": 21, "iq2_s": 22, "iq4_xs": 23,
    "i8": 24, "i16": 25, "i32": 26, "i64": 27, "f64": 28, "iq1_m": 29, "bf16": 30,
    "tq1_0": 34, "tq2_0": 35, "mxfp4": 39, "nvfp4": 40, "q1_0": 41, "q2_0": 42,
}  # fmt: skip

WEIGHT_TYPES: dict[str, GGMLType] = {
    t.name: t
    for t in (
        GGMLType("f32", 1, 4),
        GGMLType("f16", 1, 2),
        GGMLType("q4_0", 32, 18),
        GGMLType("q4_1", 32, 20),
        GGMLType("q5_0", 32, 22),
        GGMLType("q5_1", 32, 24),
        GGMLType("q8_0", 32, 34),
        GGMLType("q8_1", 32, 36),
        GGMLType("q2_K", 256, 84),
        GGMLType("q3_K", 256, 110),
        GGMLType("q4_K", 256, 144),
        GGMLType("q5_K", 256, 176),
        GGMLType("q6_K", 256, 210),
        GGMLType("q8_K", 256, 292),
        GGMLType("iq2_xxs", 256, 66),
        GGMLType("iq2_xs", 256, 74),
        GGMLType("iq3_xxs", 256, 98),
        GGMLType("iq1_s", 256, 50),
        GGMLType("iq4_nl", 32, 18),
        GGMLType("iq3_s", 256, 110),
        GGMLType("iq2_s", 256, 82),
        GGMLType("iq4_xs", 256, 136),
        GGMLType("i8", 1, 1),
        GGMLType("i16", 1, 2),
        GGMLType("i32", 1, 4),
        GGMLType("i64", 1, 8),
        GGMLType("f64", 1, 8),
        GGMLType("iq1_m", 256, 56),
        GGMLType("bf16", 1, 2),
        GGMLType("tq1_0", 256, 54),
        GGMLType("tq2_0", 256, 66),
        GGMLType("mxfp4", 32, 17),
        GGMLType("nvfp4", 64, 36),
        GGMLType("q1_0", 128, 18),
        GGMLType("q2_0", 64, 18),
    )
}

#: WEIGHT_TYPES by lower-case name: the GGUF reader names types as gguf-py's enum lowered (``q4_k``), ggml as
#: ``q4_K``.
_WEIGHT_TYPES_ANY_CASE = {name.lower(): t for name, t in WEIGHT_TYPES.items()}


def weight_type(name: str) -> GGMLType | None:
    """The weight type ``name`` in any case (``q4_K`` or ``q4_k``), or None when WEIGHT_TYPES has no such type."""
    return WEIGHT_TYPES.get(name) or _WEIGHT_TYPES_ANY_CASE.get(name.lower())


#: ggml type names by enum value (GGUF files store the value).
WEIGHT_TYPE_BY_ID: dict[int, GGMLType] = {GGML_TYPE_IDS[name]: t for name, t in WEIGHT_TYPES.items()}
