"""Shared argument handling of the state ops: row plans, shape checks, and the Triton switch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import torch

Rows = torch.Tensor | Sequence[int]


def host_rows(rows: Rows) -> list[int]:
    """Row indices as a host list (one device sync when ``rows`` lives on a GPU)."""
    if isinstance(rows, torch.Tensor):
        if rows.dim() != 1:
            raise ValueError(f"row indices must be 1-D, got shape {tuple(rows.shape)}")
        return [int(r) for r in rows.tolist()]
    return [int(r) for r in rows]


def softplus(v: torch.Tensor) -> torch.Tensor:
    """ggml_compute_softplus_f32: ``v`` above 20, else ``log(1 + exp(v))`` (not log1p)."""
    return torch.where(v > 20.0, v, torch.log(1.0 + torch.exp(v)))


@dataclass(frozen=True)
class RowPlan:
    """Which sequences run, where they read and write, and whether a read row is written by another sequence.

    Attributes:
        src, dst: the row lists (negative = padding).
        active: indices of the non-padding sequences.
        n_written: planes written per sequence.
        mem_size: M, cells per plane.
        hazard: True when some sequence reads a row that another sequence writes: the inputs must then be
            gathered before any output is stored.
    """

    src: tuple[int, ...]
    dst: tuple[int, ...]
    active: tuple[int, ...]
    n_written: int
    mem_size: int
    hazard: bool

    def out_rows(self, i: int) -> list[int]:
        return [p * self.mem_size + self.dst[i] for p in range(self.n_written)]


def plan_rows(
    *, n_pool_rows: int, src_rows: Rows, dst_rows: Rows, n_seqs: int, n_planes: int, n_written: int
) -> RowPlan:
    """Validate the row indices of one call and find read-after-write hazards between sequences
    (memoised: a decode loop asks the same question every step)."""
    return _plan_rows(n_pool_rows, tuple(host_rows(src_rows)), tuple(host_rows(dst_rows)), n_seqs, n_planes, n_written)


@lru_cache(maxsize=4096)
def _plan_rows(
    n_pool_rows: int, src: tuple[int, ...], dst: tuple[int, ...], n_seqs: int, n_planes: int, n_written: int
) -> RowPlan:
    if len(src) != n_seqs or len(dst) != n_seqs:
        raise ValueError(f"src_rows ({len(src)}) and dst_rows ({len(dst)}) need one entry per sequence ({n_seqs})")
    if n_planes < 1:
        raise ValueError(f"n_planes must be >= 1, got {n_planes}")
    if n_pool_rows % n_planes:
        raise ValueError(f"pool rows ({n_pool_rows}) are not a multiple of n_planes ({n_planes})")
    mem_size = n_pool_rows // n_planes
    active = tuple(i for i in range(n_seqs) if src[i] >= 0 and dst[i] >= 0)
    owner: dict[int, int] = {}
    for i in active:
        if src[i] >= n_pool_rows:
            raise ValueError(f"src_rows[{i}] = {src[i]} is outside the pool ({n_pool_rows} rows)")
        if dst[i] >= mem_size:
            raise ValueError(f"dst_rows[{i}] = {dst[i]} is outside plane 0 ({mem_size} cells)")
        for p in range(n_written):
            row = p * mem_size + dst[i]
            if row in owner:
                raise ValueError(f"sequences {owner[row]} and {i} both write row {row}")
            owner[row] = i
    hazard = any(owner.get(src[i], i) != i for i in active)
    return RowPlan(src, dst, active, n_written, mem_size, hazard)


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")


def output(out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """The caller's ``out`` (checked) or a new zero-filled fp32 tensor."""
    if out is None:
        return torch.zeros(shape, dtype=torch.float32, device=like.device)
    check_shape("out", out, shape)
    if out.dtype != torch.float32:
        raise ValueError(f"out must be float32, got {out.dtype}")
    return out


@cache
def triton_available() -> bool:
    """Whether the Triton kernels can be launched on CUDA tensors here."""
    try:
        import triton  # noqa: F401  # deferred: triton (this probes whether it is installed)
    except ImportError:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """The fast path runs Triton for CUDA tensors (unless RSPLAN_KERNELS=torch), torch otherwise."""
    if os.environ.get("RSPLAN_KERNELS", "") == "torch":
        return False
    return t.is_cuda and triton_available()


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def device_rows(rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """Row indices as an int32 tensor on ``device``, memoised: a decode loop reuses the same rows every step,
    and a cached tensor needs no host-to-device copy (which CUDA-graph capture forbids)."""
    return _device_rows(tuple(int(r) for r in rows), str(device))


@lru_cache(maxsize=1024)
def _device_rows(rows: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=device)


def gather_inputs(pool: torch.Tensor, plan: RowPlan) -> tuple[torch.Tensor, list[int]]:
    """The input rows of every sequence copied out of the pool (for calls where a sequence reads a row another
    one writes): the copy, and each sequence's row in it (-1 for padding)."""
    src_pool = pool.index_select(0, device_rows([max(r, 0) for r in plan.src], pool.device))
    return src_pool, [i if i in plan.active else -1 for i in range(len(plan.src))]
