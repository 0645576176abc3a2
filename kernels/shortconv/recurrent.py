"""LFM2 short conv in torch: the gates around conv_state's torch step (``gated_conv``, which
``fused_recurrent.py`` runs around conv_state's Triton kernel); one-token CPU steps run gates and conv together
in C (``native.py``). rsplan.kernels.dispatch chooses among them."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, host_rows, output
from rsplan.kernels.conv_state.recurrent import conv_state_torch
from rsplan.kernels.shortconv.reference import check_shortconv_args


def gated_conv(conv_fn, *, pool, b, c, x, weight, src_rows, dst_rows, n_planes, out):
    """``y = c * conv(b * x)`` with ``conv_fn`` (a conv_state implementation) for the conv step; shapes and rules
    as ``shortconv_ref``."""
    N, T, D, _ = check_shortconv_args(pool, b, c, x, weight)
    y = output(out, (N, T, D), x)
    src, dst = host_rows(src_rows), host_rows(dst_rows)
    bx = b.float() * x.float()
    conv = torch.zeros_like(bx)
    conv_fn(pool=pool, x=bx, weight=weight, src_rows=src, dst_rows=dst, n_planes=n_planes, out=conv)
    # padding sequences keep the caller's y: only the sequences that ran are gated and stored
    rows = torch.tensor([i for i in range(N) if src[i] >= 0 and dst[i] >= 0], dtype=torch.long, device=y.device)
    y.index_copy_(0, rows, (c.float() * conv).index_select(0, rows))
    return (y,)


def shortconv_torch(
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
    """``shortconv_ref`` on the torch conv-state path (see there for shapes and rules)."""
    return gated_conv(
        conv_state_torch,
        pool=pool,
        b=b,
        c=c,
        x=x,
        weight=weight,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=n_planes,
        out=out,
    )
