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
