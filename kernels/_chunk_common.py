"""Layout helpers of the chunked scans (``_chunk``, ``_chunk_head``): chunk-major views of token-major inputs
and the map from value heads to the key heads they read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch

#: How value head h of H finds its key head of Hk: "div" h // (H / Hk) (Mamba-2 groups), "mod" h % Hk
#: (ggml_repeat of q and k, the delta nets).
KeyHeads = Literal["div", "mod"]


def tokens(x: torch.Tensor, t0: int, t1: int, C: int) -> torch.Tensor:
    """x[:, t0:t1] ([N, T, heads, ...]) zero-padded to whole chunks, viewed as [n, N, heads, C, ...]."""
    part = x[:, t0:t1]
    n = -(-(t1 - t0) // C)
    if n * C != t1 - t0:
        pad = torch.zeros(x.shape[0], n * C - (t1 - t0), *x.shape[2:], dtype=x.dtype, device=x.device)
        part = torch.cat([part, pad], 1)
    part = part.reshape(x.shape[0], n, C, *x.shape[2:])
    return part.permute(1, 0, 3, 2, *range(4, part.dim()))


@dataclass(frozen=True)
class Heads:
    """N sequences x H value heads reading Hk key heads (``how``: see KeyHeads); R = H / Hk."""

    N: int
    H: int
    Hk: int
    how: KeyHeads

    @property
    def R(self) -> int:
        return self.H // self.Hk

    def key_rows(self, b: torch.Tensor) -> torch.Tensor:
        """The key row (``n * Hk + key head``) that value row b (``n * H + h``) reads."""
        seq, h = b // self.H, b % self.H
        return seq * self.Hk + (h // self.R if self.how == "div" else h % self.Hk)

    def grouped(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """x with its value-head axis ``dim`` (size H) split into (Hk, R): key head first (a view)."""
        shape = x.shape[:dim]
        rest = x.shape[dim + 1 :]
        if self.how == "div":
            return x.view(*shape, self.Hk, self.R, *rest)
        return x.view(*shape, self.R, self.Hk, *rest).transpose(dim, dim + 1)

    def times(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """x [n, N, Hk, ...] (per key head) times f [n, N, H, ...] -> [n, N * H, ...], contiguous."""
        out = torch.empty(f.shape[:3] + torch.broadcast_shapes(x.shape[3:], f.shape[3:]), device=f.device)
        torch.mul(x.unsqueeze(3), self.grouped(f), out=self.grouped(out))
        return out.view(f.shape[0], self.N * self.H, *out.shape[3:])

    def group_state(self, state: torch.Tensor) -> torch.Tensor:
        """state [N * H, Dv, Dk] as [N * Hk, R * Dv, Dk], the value heads of a key head side by side: a view
        when the layout allows it, else a contiguous copy (``store_state`` copies it back)."""
        Dv, Dk = state.shape[1:]
        if self.how == "div" and state.is_contiguous():
            return state.view(self.N * self.Hk, self.R * Dv, Dk)
        g = self.grouped(state.view(self.N, self.H, Dv, Dk), 1)  # [N, Hk, R, Dv, Dk]
        return g.contiguous().view(self.N * self.Hk, self.R * Dv, Dk)

    def ungroup_state(self, sg: torch.Tensor) -> torch.Tensor:
        """A grouped state [N * Hk, R * Dv, Dk] back in the state's order [N * H, Dv, Dk] (a new tensor)."""
        Dk = sg.shape[2]
        out = torch.empty(self.N * self.H, sg.shape[1] // self.R, Dk, device=sg.device)
        self.store_state(out, sg)
        return out

    def store_state(self, state: torch.Tensor, sg: torch.Tensor) -> None:
        """Copy a grouped state into ``state`` (nothing to do when ``sg`` is a view of it: ``group_state``
        returns one where the layouts agree, e.g. "div" on a contiguous state, or one key head with "mod")."""
        if sg.data_ptr() == state.data_ptr():
            return
        Dv, Dk = state.shape[1:]
        self.grouped(state.view(self.N, self.H, Dv, Dk), 1).copy_(sg.view(self.N, self.Hk, self.R, Dv, Dk))


@contextmanager
def one_thread() -> Iterator[None]:
    """torch (and its BLAS) on one thread inside the block, the caller's count restored after."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """``(I + L)^-1`` for L the strictly lower triangle of a [..., C, C] (its diagonal and upper triangle are
    not read), one batched triangular solve.

    The solve runs on one thread: the batch is hundreds of small matrices and BLAS's trsm opens a parallel
    region per matrix, so with several threads every matrix waits for all of them; on a loaded machine that
    made the solve 3x to 100x slower than on one thread (and most of a chunked prefill's time).
    """
    eye = torch.eye(a.shape[-1], device=a.device).expand_as(a)
    if a.device.type != "cpu":
        return torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)
    with one_thread():
        return torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)
