"""Shared machinery of the kernel tests: one input builder per op and a runner that compares a fast path
against the reference output by output and row by row (imported by the test modules; conftest.py puts this
folder on sys.path and sets TRITON_INTERPRET first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rsplan.kernels.conv_state import conv_state_ref, conv_state_torch
from rsplan.kernels.dispatch import PATHS, load
from rsplan.kernels.gated_delta import gated_delta_ref, gated_delta_torch
from rsplan.kernels.gla import gla_ref, gla_torch
from rsplan.kernels.lightning import lightning_ref, lightning_slopes, lightning_torch
from rsplan.kernels.rwkv6 import rwkv6_ref, rwkv6_torch
from rsplan.kernels.rwkv7 import rwkv7_ref, rwkv7_torch
from rsplan.kernels.shortconv import shortconv_ref, shortconv_torch
from rsplan.kernels.ssm_scan import ssm_scan_ref, ssm_scan_torch

F = torch.nn.functional


@dataclass(frozen=True)
class Case:
    """One call: N sequences of T tokens, dims of the op, K planes of M cells, the rows, the pool dtype."""

    N: int
    T: int
    dims: dict[str, int]
    K: int = 1
    M: int = 4
    src: tuple[int, ...] = ()
    dst: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    clamp: bool = False
    id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> tuple[list[int], list[int]]:
        src = list(self.src) if self.src else list(range(self.N))
        dst = list(self.dst) if self.dst else list(range(self.N))
        return src, dst


def _ssm(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    H, P, G, S = c.dims["H"], c.dims["P"], c.dims["G"], c.dims["S"]
    mamba1 = c.dims.get("mamba1", 0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kw = {
        "x": r(c.N, c.T, H, P),
        "dt": r(c.N, c.T, H) - 1.0,
        "A": -torch.rand(H, S, generator=g) if mamba1 else -torch.rand(H, generator=g) * 4,
        "B": r(c.N, c.T, G, S),
        "C": r(c.N, c.T, G, S),
        "n_planes": c.K,
    }
    return kw, (H, P, S), (c.N, c.T, H, P)


def _conv(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    D, W = c.dims["D"], c.dims["W"]
    kw = {
        "x": torch.randn(c.N, c.T, D, generator=g),
        "weight": torch.randn(D, W, generator=g),
        "n_planes": c.K,
        "clamp_planes": c.clamp,
    }
    return kw, (D, W - 1), (c.N, c.T, D)


def _shortconv(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    D, L = c.dims["D"], c.dims["L"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kw = {"b": r(c.N, c.T, D), "c": r(c.N, c.T, D), "x": r(c.N, c.T, D), "weight": r(D, L), "n_planes": c.K}
    return kw, (D, L - 1), (c.N, c.T, D)


def _delta(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    Hk, Hv, Dk, Dv, kda = c.dims["Hk"], c.dims["Hv"], c.dims["Dk"], c.dims["Dv"], c.dims.get("kda", 0)
    kw = {
        "q": F.normalize(torch.randn(c.N, c.T, Hk, Dk, generator=g), dim=-1),
        "k": F.normalize(torch.randn(c.N, c.T, Hk, Dk, generator=g), dim=-1),
        "v": torch.randn(c.N, c.T, Hv, Dv, generator=g),
        "g": -torch.rand(*((c.N, c.T, Hv, Dk) if kda else (c.N, c.T, Hv)), generator=g),
        "beta": torch.rand(c.N, c.T, Hv, generator=g),
        "n_planes": c.K,
    }
    return kw, (Hv, Dv, Dk), (c.N, c.T, Hv, Dv)


def _rwkv6(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    H, S = c.dims["H"], c.dims["S"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kw = {
        "r": r(c.N, c.T, H, S),
        "k": r(c.N, c.T, H, S) * 0.3,
        "v": r(c.N, c.T, H, S),
        "w": torch.exp(-torch.exp(r(c.N, c.T, H, S))),
        "u": r(H, S),
    }
    return kw, (H, S, S), (c.N, c.T, H, S)


def _gla(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    H, S = c.dims["H"], c.dims["S"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w = torch.exp(-torch.exp(r(c.N, c.T, H, S)))
    kw = {"q": r(c.N, c.T, H, S), "k": r(c.N, c.T, H, S) * (1 - w), "v": r(c.N, c.T, H, S), "g": w}
    return kw, (H, S, S), (c.N, c.T, H, S)


def _rwkv7(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    H, S = c.dims["H"], c.dims["S"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kk = F.normalize(r(c.N, c.T, H, S), dim=-1)
    kw = {
        "r": r(c.N, c.T, H, S),
        "w": torch.exp(-torch.exp(r(c.N, c.T, H, S) - 1)),
        "k": r(c.N, c.T, H, S) * 0.3,
        "v": r(c.N, c.T, H, S),
        "a": -kk,
        "b": kk * torch.rand(c.N, c.T, H, S, generator=g),
    }
    return kw, (H, S, S), (c.N, c.T, H, S)


def _lightning(c: Case, g: torch.Generator) -> tuple[dict, tuple, tuple]:
    H, S = c.dims["H"], c.dims["S"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kw = {
        "q": F.silu(r(c.N, c.T, H, S)),
        "k": F.silu(r(c.N, c.T, H, S)),
        "v": F.silu(r(c.N, c.T, H, S)),
        "slope": lightning_slopes(H, 1, 4),
    }
    return kw, (H, S, S), (c.N, c.T, H, S)


@dataclass(frozen=True)
class Op:
    name: str
    ref: Callable[..., tuple]
    torch: Callable[..., tuple]
    build: Callable[[Case, torch.Generator], tuple[dict, tuple, tuple]]
    planes: bool  # K > 1 allowed

    def triton_fn(self) -> Callable[..., tuple]:
        """The op's Triton path, as the dispatcher names it (imported lazily: Triton may be absent)."""
        path = PATHS[self.name].triton
        assert path is not None
        return load(path)


OPS: dict[str, Op] = {
    "ssm_scan": Op("ssm_scan", ssm_scan_ref, ssm_scan_torch, _ssm, True),
    "conv_state": Op("conv_state", conv_state_ref, conv_state_torch, _conv, True),
    "shortconv": Op("shortconv", shortconv_ref, shortconv_torch, _shortconv, True),
    "gated_delta": Op("gated_delta", gated_delta_ref, gated_delta_torch, _delta, True),
    "rwkv6": Op("rwkv6", rwkv6_ref, rwkv6_torch, _rwkv6, False),
    "gla": Op("gla", gla_ref, gla_torch, _gla, False),
    "rwkv7": Op("rwkv7", rwkv7_ref, rwkv7_torch, _rwkv7, False),
    "lightning": Op("lightning", lightning_ref, lightning_torch, _lightning, False),
}


def n_written(case: Case) -> int:
    return case.K if case.clamp else min(case.T, case.K)


def written_rows(case: Case) -> set[int]:
    src, dst = case.rows()
    return {p * case.M + dst[i] for i in range(case.N) if src[i] >= 0 and dst[i] >= 0 for p in range(n_written(case))}


def make_call(op: str, case: Case, seed: int = 0, device: str = "cpu") -> tuple[dict, torch.Tensor, tuple]:
    """Inputs of one call (``pool`` included, rows as lists), the pool, and the output shape."""
    g = torch.Generator().manual_seed(seed)
    kw, row_shape, y_shape = OPS[op].build(case, g)
    pool = (torch.randn(case.M * case.K, *row_shape, generator=g) * 0.5).to(case.dtype)
    src, dst = case.rows()
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    kw.update(src_rows=src, dst_rows=dst)
    if not OPS[op].planes:
        kw.pop("n_planes", None)
    return kw, pool.to(device), y_shape


def run_and_compare(
    op: str, case: Case, fast: Callable[..., tuple], device: str = "cpu", permuted_out: bool = False
) -> None:
    """Run ``fast`` and the reference on the same inputs; compare y lane by lane and the pool row by row.

    Outputs start as NaN: a lane the fast path forgets stays NaN and fails; padding sequences must keep NaN.
    Rows no sequence writes must be bit-identical afterwards. With ``permuted_out`` the fast path writes into a
    dense but non-contiguous output (a permuted view), which it must fill exactly like a contiguous one.
    """
    kw, pool, y_shape = make_call(op, case, device="cpu")
    kw_dev = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    pool_ref, pool_fast = pool.clone(), pool.clone().to(device)
    y_ref = torch.full(y_shape, float("nan"))
    if permuted_out:
        y_fast = torch.full(tuple(reversed(y_shape)), float("nan"), device=device).permute(
            *reversed(range(len(y_shape)))
        )
        assert not y_fast.is_contiguous()
    else:
        y_fast = torch.full(y_shape, float("nan"), device=device)
    (y_ref,) = OPS[op].ref(pool=pool_ref, out=y_ref, **kw)
    (y_fast,) = fast(pool=pool_fast, out=y_fast, **kw_dev)
    y_fast, pool_fast = y_fast.cpu(), pool_fast.cpu()

    src, dst = case.rows()
    active = [i for i in range(case.N) if src[i] >= 0 and dst[i] >= 0]
    padding = [i for i in range(case.N) if i not in active]
    tol = {"rtol": 2e-2, "atol": 2e-2} if case.dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    for i in active:
        assert not torch.isnan(y_fast[i]).any(), f"sequence {i}: output lanes left unwritten"
        torch.testing.assert_close(y_fast[i], y_ref[i], **tol, msg=lambda m, i=i: f"y of sequence {i}: {m}")
    for i in padding:
        assert torch.isnan(y_fast[i]).all(), f"padding sequence {i}: its output rows were written"
    written = written_rows(case)
    for row in range(pool.shape[0]):
        if row in written:
            torch.testing.assert_close(
                pool_fast[row].float(), pool_ref[row].float(), **tol, msg=lambda m, row=row: f"pool row {row}: {m}"
            )
        else:
            assert torch.equal(pool_fast[row], pool[row]), f"pool row {row} is outside the batch but changed"
            assert torch.equal(pool_ref[row], pool[row]), f"reference changed row {row} outside the batch"
