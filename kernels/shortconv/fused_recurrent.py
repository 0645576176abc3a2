"""LFM2 short conv on CUDA: the torch gates around conv_state's Triton kernel (shortconv has no kernel of its
own)."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows
from rsplan.kernels.conv_state.fused_recurrent import conv_state_triton
from rsplan.kernels.shortconv.recurrent import gated_conv


def shortconv_triton(
    *,
    pool: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``shortconv_ref`` with the conv step on conv_state's Triton kernel (CUDA; see there for shapes and rules)."""
    return gated_conv(conv_state_triton, pool=pool, b=b, c=c, x=x, weight=weight, src_rows=src_rows,
                      dst_rows=dst_rows, n_planes=n_planes, out=out)
