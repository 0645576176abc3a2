"""The floating-point types a Hugging Face config names for its weights or states (``torch_dtype`` / ``dtype``)."""

from __future__ import annotations

from typing import Literal, TypeGuard

#: Floating-point types a Hugging Face config names for its weights or states (``torch_dtype`` / ``dtype``).
HF_DTYPES = ("float32", "float16", "bfloat16")
HFDtype = Literal["float32", "float16", "bfloat16"]


def is_hf_dtype(name: str) -> TypeGuard[HFDtype]:
    """``name`` is one of HF_DTYPES."""
    return name in HF_DTYPES
