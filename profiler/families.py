"""What each recurrent family runs per layer: its kernels, their pool views, inputs and byte counts.

A ``Family`` knows, for one model, how to view a layer's ``cache_r_l*`` / ``cache_s_l*`` tensors as kernel pools,
how to build plausible inputs for a ubatch of N sequences x T tokens, and how many bytes each kernel moves. Which
ops a family runs comes from the model's ``RecurrentDims`` (hparams.recurrent: ``FAMILY_OPS``, ``RWKV_OPS``); each
op's sizes, inputs and bytes from the kernel registry (kernels.registry: ``OPS`` and the op's ``profile``
module). This module knows neither families nor ops: a new family or op changes hparams and kernels only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from rsplan.hparams.layout import CacheLayout
from rsplan.kernels.registry import OPS, Draw, op_dims, profile_function
from rsplan.profiler.errors import WorkloadError, import_torch

#: Inputs whose dim 1 is the token axis (sliced for prefix checks); the others are parameters.
TOKEN_INPUTS = frozenset({"x", "dt", "B", "C", "q", "k", "v", "g", "beta", "r", "w", "a", "b", "c"})


@dataclass(frozen=True)
class Kernel:
    """One kernel of a layer: the op, the pool kind it works on (r or s), the pool row shape, and how many
    planes it writes (``clamp``: all K, the delta-net conv rule)."""

    op: str  # module under rsplan.kernels, also the function name
    kind: str  # "r" or "s"
    row_shape: tuple[int, ...]
    planes: bool  # takes n_planes
    clamp: bool = False
    dims: dict[str, int] = field(default_factory=dict)
    token_shift: bool = False  # RWKV: the conv's output is the previous token (weights [1, 0])

    def fast(self) -> Callable[..., tuple]:
        return getattr(import_module(f"rsplan.kernels.{self.op}"), self.op)

    def ref(self) -> Callable[..., tuple]:
        return getattr(import_module(f"rsplan.kernels.{self.op}"), f"{self.op}_ref")


@dataclass(frozen=True)
class Family:
    """The kernels of one recurrent layer of a model (``conv`` first, then ``scan``)."""

    name: str
    kernels: tuple[Kernel, ...]
    n_layer: int

    @property
    def planes(self) -> bool:
        return any(k.planes for k in self.kernels)


def family_of(layout: CacheLayout) -> Family:
    """The kernels rsplan runs for a model's recurrent layers, from its RecurrentDims (``layout.recurrent``).

    Raises:
        RecurrentDimsError: a state that does not split into whole heads and groups.
    """
    dims = layout.recurrent.require_heads()
    kernels = tuple(
        Kernel(
            op.op,
            op.pool,
            dims.conv_row if op.pool == "r" else dims.state_row,
            op.planes,
            clamp=op.clamp,
            dims={**op_dims(op.op, dims), **dict.fromkeys(op.modes, 1)},
            token_shift=op.token_shift,
        )
        for op in dims.ops
    )
    return Family(dims.name, kernels, layout.n_layer)


def make_inputs(k: Kernel, n_seqs: int, n_tokens: int, layer: int, n_layer: int, dev: Any, seed: int) -> dict:
    """Plausible inputs of kernel ``k`` for N sequences x T tokens (fp32; decays below 1 keep states bounded), built
    by its op's ``profile.inputs`` (kernels.registry)."""
    torch = import_torch()
    if k.op not in OPS:  # pragma: no cover - tests/kernels/test_registry.py keeps the registry complete
        raise WorkloadError(f"no kernel registered for op {k.op}")
    draw = Draw(torch, torch.Generator().manual_seed(seed), n_seqs, n_tokens, layer, n_layer)
    out = profile_function(k.op, "inputs")(k.dims, draw, k.token_shift)
    return {name: t.to(dev) for name, t in out.items()}


def inputs_depend_on_layer(k: Kernel) -> bool:
    """Whether ``k``'s inputs differ per layer (kernels.registry ``layer_inputs``), so they are built per layer."""
    return OPS[k.op].layer_inputs


def slice_tokens(inputs: dict, n_tokens: int) -> dict:
    """The inputs of the first ``n_tokens`` tokens (parameters unchanged)."""
    return {n: (t[:, :n_tokens] if n in TOKEN_INPUTS else t) for n, t in inputs.items()}


def select_seqs(inputs: dict, seqs: list[int]) -> dict:
    """The inputs of some sequences (parameters unchanged)."""
    return {n: (t[seqs] if n in TOKEN_INPUTS else t) for n, t in inputs.items()}


def call(
    k: Kernel,
    fn: Callable[..., tuple],
    pool: Any,
    inputs: dict,
    src: list[int],
    dst: list[int],
    n_planes: int,
    out: Any = None,
) -> Any:
    """Run ``fn`` (fast or reference) of kernel ``k`` on ``pool``; returns y."""
    kw = dict(inputs)
    if k.planes:
        kw["n_planes"] = n_planes
    if k.clamp:
        kw["clamp_planes"] = True
    (y,) = fn(pool=pool, src_rows=src, dst_rows=dst, out=out, **kw)
    return y


def kernel_bytes(k: Kernel, n_seqs: int, n_tokens: int, n_planes: int, itemsize: int) -> int:
    """The least bytes kernel ``k`` moves for one call (rows read and planes written once, inputs and outputs
    once; its op's ``profile.call_bytes``, which reads each op's ``*_bytes``)."""
    return profile_function(k.op, "call_bytes")(
        k.dims, n_seqs=n_seqs, n_tokens=n_tokens, n_planes=n_planes if k.planes else 1, clamp=k.clamp,
        itemsize=itemsize,
    )


def state_row_bytes(k: Kernel, itemsize: int) -> int:
    n = 1
    for dim in k.row_shape:
        n *= dim
    return n * itemsize
