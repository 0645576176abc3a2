"""The ops rsplan has kernels for, as data: what the profiler needs to size, feed and time each one.

A family's layer runs the ops hparams.recurrent lists for it (``FAMILY_OPS``, ``RWKV_OPS``); each op is a package
``rsplan.kernels.<op>`` with ``<op>`` (fast), ``<op>_ref`` (reference) and a ``profile`` module that builds
plausible inputs and counts the least bytes one call moves. ``OPS`` maps the op to its keyword dims (the legend
of rsplan.kernels) as read off the model's ``RecurrentDims`` (attribute names, so this module imports neither
hparams nor torch). The profiler derives everything per op from here; a new op is its package and its line in
``OPS`` (docs/adding-a-recurrent-family.md).

Each ``rsplan.kernels.<op>.profile`` module defines:
    ``inputs(dims, draw, token_shift) -> dict``: fp32 inputs for ``draw.N`` sequences x ``draw.T`` tokens
        (decays below 1 keep states bounded); ``token_shift``: RWKV's token shift (conv_state only).
    ``call_bytes(dims, *, n_seqs, n_tokens, n_planes, clamp, itemsize) -> int``: the least bytes one call moves
        (``n_planes``: planes written, 1 for an op without planes; ``itemsize``: bytes per pool element).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Op:
    """One op's profiling facts.

    Attributes:
        dims: kernel keyword dim -> the ``RecurrentDims`` attribute giving it.
        layer_inputs: the inputs depend on the layer (lightning's per-layer slopes), so they are built per layer.
    """

    dims: dict[str, str]
    layer_inputs: bool = False


_HEADS = {"H": "n_heads", "S": "state_size"}

#: op -> its profiling facts.
OPS: dict[str, Op] = {
    "conv_state": Op({"D": "conv_channels", "W": "conv_width"}),
    "shortconv": Op({"D": "conv_channels", "L": "conv_width"}),
    "ssm_scan": Op({"H": "n_heads", "P": "head_dim", "G": "n_groups", "S": "state_size"}),
    "gated_delta": Op({"Hk": "n_groups", "Hv": "n_heads", "Dk": "state_size", "Dv": "head_dim"}),
    "rwkv6": Op(_HEADS),
    "gla": Op(_HEADS),
    "rwkv7": Op(_HEADS),
    "lightning": Op(_HEADS, layer_inputs=True),
}


@dataclass(frozen=True)
class Draw:
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


def op_dims(op: str, dims: Any) -> dict[str, int]:
    """The keyword dims of ``op`` for a model's ``RecurrentDims`` ``dims``."""
    return {name: getattr(dims, attr) for name, attr in OPS[op].dims.items()}


def profile_function(op: str, name: str) -> Callable[..., Any]:
    """``inputs`` or ``call_bytes`` of ``op`` (imports its package, and torch with it)."""
    return getattr(import_module(f"rsplan.kernels.{op}.profile"), name)  # deferred: torch
