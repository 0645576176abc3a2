"""What each recurrent family runs per layer: its kernels, their pool views, inputs and byte counts.

A ``Family`` knows, for one model, how to view a layer's ``cache_r_l*`` / ``cache_s_l*`` tensors as kernel pools,
how to build plausible inputs for a ubatch of N sequences x T tokens, and how many bytes each kernel moves. Which
ops a family runs and their sizes come from the model's ``RecurrentDims`` (hparams.recurrent: ``FAMILY_OPS``); this
module knows each op (``OP_DIMS``, ``INPUTS``, ``kernel_bytes``), not each family. Per family (llama.cpp
0c1e57098 src/models/*.cpp):
- mamba2 (Mamba-2, Falcon-H1, PLaMo-2, Granite-4.0-H, Nemotron-H): conv over ``x | B | C`` then ssm_scan;
- mamba (Mamba-1, Jamba): conv over x then the Mamba-1 scan (no snapshot planes);
- gated_delta_net (Qwen3-Next, Qwen3.5): conv over ``q | k | v`` with every plane written, then gated_delta;
- kda (Kimi Linear): the same with per-key decays;
- rwkv (RWKV-6/7): the token shift (a W = 2 conv_state) then the arch's op in hparams' ``RWKV_OPS``: wkv6, gla
  (ggml_gated_linear_attn, RWKV6-Qwen2) or wkv7;
- shortconv (LFM2): shortconv only (no S state);
- lightning (MiniMax-01): lightning only (no R state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.recurrent import RecurrentDims
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


#: How each op's sizes (its kernel's keyword dims, legend of rsplan.kernels) are read off the model's RecurrentDims.
OP_DIMS: dict[str, Callable[[RecurrentDims], dict[str, int]]] = {
    "conv_state": lambda d: {"D": d.conv_channels, "W": d.conv_width},
    "shortconv": lambda d: {"D": d.conv_channels, "L": d.conv_width},
    "ssm_scan": lambda d: {"H": d.n_heads, "P": d.head_dim, "G": d.n_groups, "S": d.state_size},
    "gated_delta": lambda d: {"Hk": d.n_groups, "Hv": d.n_heads, "Dk": d.state_size, "Dv": d.head_dim},
    "rwkv6": lambda d: {"H": d.n_heads, "S": d.state_size},
    "gla": lambda d: {"H": d.n_heads, "S": d.state_size},
    "rwkv7": lambda d: {"H": d.n_heads, "S": d.state_size},
    "lightning": lambda d: {"H": d.n_heads, "S": d.state_size},
}


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
            dims={**OP_DIMS[op.op](dims), **dict.fromkeys(op.modes, 1)},
            token_shift=op.token_shift,
        )
        for op in dims.ops
    )
    return Family(dims.name, kernels, layout.n_layer)


@dataclass(frozen=True)
class _Draw:
    """What the input builders draw from: torch, one seeded generator, N sequences x T tokens and the layer."""

    torch: Any
    g: Any
    N: int
    T: int
    layer: int
    n_layer: int

    def r(self, *shape: int, scale: float = 1.0) -> Any:
        return self.torch.randn(*shape, generator=self.g) * scale

    def decay(self, *shape: int) -> Any:
        """``exp(-exp(x - 1))``: per-element decays in (0, 1)."""
        return self.torch.exp(-self.torch.exp(self.r(*shape) - 1.0))


def _conv_state_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    d = k.dims
    if k.token_shift:  # a conv whose output is x[t - 1]
        weight = x.torch.zeros(d["D"], 2)
        weight[:, 0] = 1.0
    else:
        weight = x.r(d["D"], d["W"], scale=0.3)
    return {"x": x.r(x.N, x.T, d["D"]), "weight": weight}


def _shortconv_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    D = k.dims["D"]
    return {"b": x.r(x.N, x.T, D), "c": x.r(x.N, x.T, D), "x": x.r(x.N, x.T, D),
            "weight": x.r(D, k.dims["L"], scale=0.3)}


def _ssm_scan_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    d, N, T = k.dims, x.N, x.T
    H, P, G, S = d["H"], d["P"], d["G"], d["S"]
    a_shape = (H, S) if d.get("mamba1") else (H,)
    return {
        "x": x.r(N, T, H, P, scale=0.5),
        "dt": x.r(N, T, H, scale=0.5) - 2.0,
        "A": -x.torch.exp(x.torch.rand(*a_shape, generator=x.g) * 2.7),  # -exp(A_log), A_log in [0, log 16)
        "B": x.r(N, T, G, S, scale=0.3),
        "C": x.r(N, T, G, S, scale=0.3),
    }


def _gated_delta_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    d, N, T, F = k.dims, x.N, x.T, x.torch.nn.functional
    Hk, Hv, Dk, Dv = d["Hk"], d["Hv"], d["Dk"], d["Dv"]
    g_shape = (N, T, Hv, Dk) if d.get("kda") else (N, T, Hv)
    return {
        "q": F.normalize(x.r(N, T, Hk, Dk), dim=-1),
        "k": F.normalize(x.r(N, T, Hk, Dk), dim=-1),
        "v": x.r(N, T, Hv, Dv, scale=0.5),
        "g": -F.softplus(x.r(*g_shape) - 2.0),
        "beta": x.torch.sigmoid(x.r(N, T, Hv)),
    }


def _rwkv6_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    shape = (x.N, x.T, k.dims["H"], k.dims["S"])
    return {"r": x.r(*shape, scale=0.5), "k": x.r(*shape, scale=0.1), "v": x.r(*shape, scale=0.5),
            "w": x.decay(*shape), "u": x.r(k.dims["H"], k.dims["S"], scale=0.1)}


def _gla_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    """RWKV6-Qwen2: k is scaled by (1 - w) before the op, q is the receptance."""
    shape = (x.N, x.T, k.dims["H"], k.dims["S"])
    w = x.decay(*shape)
    return {"q": x.r(*shape, scale=0.5), "k": x.r(*shape, scale=0.1) * (1 - w), "v": x.r(*shape, scale=0.5),
            "g": w}


def _rwkv7_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    shape = (x.N, x.T, k.dims["H"], k.dims["S"])
    kk = x.torch.nn.functional.normalize(x.r(*shape), dim=-1)
    # llama.cpp's rwkv7 graph: w = exp(-0.606531 * sigmoid(.)) (models/rwkv7-base.cpp), in [0.545, 1)
    w = x.torch.exp(-0.606531 * x.torch.sigmoid(x.r(*shape)))
    return {"r": x.r(*shape, scale=0.5), "w": w, "k": x.r(*shape, scale=0.1),
            "v": x.r(*shape, scale=0.5), "a": -kk, "b": kk * x.torch.sigmoid(x.r(*shape))}


def _lightning_inputs(k: Kernel, x: _Draw) -> dict[str, Any]:
    from rsplan.kernels.lightning import lightning_slopes

    H, S = k.dims["H"], k.dims["S"]
    silu = x.torch.nn.functional.silu
    return {"q": silu(x.r(x.N, x.T, H, S)) / S**0.5, "k": silu(x.r(x.N, x.T, H, S)) / S**0.5,
            "v": silu(x.r(x.N, x.T, H, S)), "slope": lightning_slopes(H, x.layer, x.n_layer)}


#: op -> the builder of its inputs (fp32; decays below 1 keep states bounded).
INPUTS: dict[str, Callable[[Kernel, _Draw], dict[str, Any]]] = {
    "conv_state": _conv_state_inputs,
    "shortconv": _shortconv_inputs,
    "ssm_scan": _ssm_scan_inputs,
    "gated_delta": _gated_delta_inputs,
    "rwkv6": _rwkv6_inputs,
    "gla": _gla_inputs,
    "rwkv7": _rwkv7_inputs,
    "lightning": _lightning_inputs,
}


def make_inputs(k: Kernel, n_seqs: int, n_tokens: int, layer: int, n_layer: int, dev: Any, seed: int) -> dict:
    """Plausible inputs of kernel ``k`` for N sequences x T tokens (fp32; decays below 1 keep states bounded)."""
    torch = import_torch()
    build = INPUTS.get(k.op)
    if build is None:  # pragma: no cover - the table test keeps INPUTS complete
        raise WorkloadError(f"no inputs for kernel {k.op}")
    out = build(k, _Draw(torch, torch.Generator().manual_seed(seed), n_seqs, n_tokens, layer, n_layer))
    return {name: t.to(dev) for name, t in out.items()}


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
    once; see each op's ``*_bytes``)."""
    from rsplan.kernels.conv_state import conv_state_bytes
    from rsplan.kernels.gated_delta import gated_delta_bytes
    from rsplan.kernels.rwkv6 import rwkv_bytes
    from rsplan.kernels.ssm_scan import ssm_scan_bytes

    d, K = k.dims, (n_planes if k.planes else 1)
    if k.op == "conv_state":
        return conv_state_bytes(
            n_seqs=n_seqs,
            n_tokens=n_tokens,
            n_channels=d["D"],
            width=d["W"],
            n_planes=K,
            clamp_planes=k.clamp,
            state_itemsize=itemsize,
        )
    if k.op == "shortconv":
        return (
            conv_state_bytes(
                n_seqs=n_seqs,
                n_tokens=n_tokens,
                n_channels=d["D"],
                width=d["L"],
                n_planes=K,
                clamp_planes=False,
                state_itemsize=itemsize,
            )
            + 8 * n_seqs * n_tokens * d["D"]
        )
    if k.op == "ssm_scan":
        return ssm_scan_bytes(
            n_seqs=n_seqs,
            n_tokens=n_tokens,
            n_head=d["H"],
            head_dim=d["P"],
            n_group=d["G"],
            d_state=d["S"],
            n_planes=K,
            state_itemsize=itemsize,
        )
    if k.op == "gated_delta":
        return gated_delta_bytes(
            n_seqs=n_seqs,
            n_tokens=n_tokens,
            n_k_heads=d["Hk"],
            n_v_heads=d["Hv"],
            k_dim=d["Dk"],
            v_dim=d["Dv"],
            kda=bool(d.get("kda")),
            n_planes=K,
            state_itemsize=itemsize,
        )
    n_inputs = {"rwkv6": 4, "gla": 4, "rwkv7": 6, "lightning": 3}[k.op]
    return rwkv_bytes(
        n_seqs=n_seqs, n_tokens=n_tokens, n_head=d["H"], head_size=d["S"], n_inputs=n_inputs, state_itemsize=itemsize
    )


def state_row_bytes(k: Kernel, itemsize: int) -> int:
    n = 1
    for dim in k.row_shape:
        n *= dim
    return n * itemsize
