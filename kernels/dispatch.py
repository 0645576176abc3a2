"""The one dispatcher of every op: Triton on CUDA, the C decode kernels on the CPU, torch everywhere else.

Each op's folder holds its implementations only, each file named for its algorithm (the table in
rsplan.kernels): ``reference.py`` (``<op>_ref``, plain and obviously correct), ``recurrent.py`` (``<op>_torch``:
vectorised torch, token by token for decode, ``chunked.py``'s form for prefill), ``fused_recurrent.py``
(``<op>_triton``) and ``native.py`` (``<op>_native``: C). Which one a call runs is decided here, from ``PATHS``, a
table of facts: the public ``<op>`` of each package is ``dispatched(op, <op>_torch)``, with the torch path's
signature (keyword-only, as the reference's) and its docstring.

A call runs, in order:
    1. Triton, where the op has a Triton kernel, the pool is a CUDA tensor, Triton is importable and
       ``RSPLAN_KERNELS`` is not ``torch`` (``_common.use_triton``), and the op's ``triton_if`` holds for the call;
    2. C, where the op has a C kernel, the pool is a CPU tensor, the kernels built here and ``RSPLAN_KERNELS`` is
       not ``torch`` (``_native.use_native``);
    3. torch otherwise.
Implementations are imported on the first call that takes them (Triton and the C build may be absent).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, TypeVar, cast

from rsplan.kernels._common import use_triton
from rsplan.kernels._native import use_native

F = TypeVar("F", bound=Callable[..., Any])


def _mamba2(*, A: Any, **_: Any) -> bool:
    """ssm_scan's Triton kernel is Mamba-2's: one decay per head (A [H]), not Mamba-1's per state column."""
    return bool(A.dim() == 1)


@dataclass(frozen=True)
class Paths:
    """Where one op's implementations live, as ``"<module under rsplan.kernels>:<function>"``.

    Attributes:
        torch: the torch path (always there).
        triton: the Triton kernel, or None.
        native: the C kernel, or None.
        triton_if: a further condition on the call's keyword arguments for taking Triton (None: always).
    """

    torch: str
    triton: str | None = None
    native: str | None = None
    triton_if: Callable[..., bool] | None = None


def _paths(op: str, *, triton_if: Callable[..., bool] | None = None) -> Paths:
    """The usual layout: ``<op>.recurrent:<op>_torch``, ``<op>.fused_recurrent:<op>_triton``,
    ``<op>.native:<op>_native``."""
    return Paths(f"{op}.recurrent:{op}_torch", f"{op}.fused_recurrent:{op}_triton", f"{op}.native:{op}_native",
                 triton_if)


#: op -> its implementations. shortconv has no Triton kernel of its own: on CUDA it runs its gating around
#: conv_state's Triton kernel (shortconv.fused_recurrent:shortconv_triton).
PATHS: dict[str, Paths] = {
    "ssm_scan": _paths("ssm_scan", triton_if=_mamba2),
    "conv_state": _paths("conv_state"),
    "shortconv": _paths("shortconv"),
    "gated_delta": _paths("gated_delta"),
    "rwkv6": _paths("rwkv6"),
    "rwkv7": _paths("rwkv7"),
    "lightning": _paths("lightning"),
    "gla": _paths("gla"),
    "state_gather": Paths("state_copy.row_copy:state_gather_torch", "state_copy.fused_row_copy:state_gather_triton"),
    "state_scatter": Paths(
        "state_copy.row_copy:state_scatter_torch", "state_copy.fused_row_copy:state_scatter_triton"
    ),
}


def load(path: str) -> Callable[..., Any]:
    """The function at ``"<module under rsplan.kernels>:<function>"`` (imports its module on first use; later
    calls find it in sys.modules, which keeps a call's dispatch under a microsecond)."""
    module, _, name = path.partition(":")
    full = "rsplan.kernels." + module  # deferred: triton, the C build (the chosen implementation's module)
    return cast(Callable[..., Any], getattr(sys.modules.get(full) or import_module(full), name))


def choose(op: str, kwargs: dict[str, Any]) -> str:
    """The path (``PATHS[op]``'s torch, triton or native string) a call of ``op`` with ``kwargs`` runs."""
    paths = PATHS[op]
    pool = kwargs["pool"]
    if paths.triton is not None and use_triton(pool) and (paths.triton_if is None or paths.triton_if(**kwargs)):
        return paths.triton
    if paths.native is not None and use_native(pool):
        return paths.native
    return paths.torch


def dispatched(op: str, torch_path: F) -> F:
    """The public ``op``: ``torch_path``'s signature, each call run by the implementation ``choose`` picks."""

    @functools.wraps(torch_path)
    def call(**kwargs: Any) -> Any:
        return load(choose(op, kwargs))(**kwargs)

    call.__name__ = call.__qualname__ = op
    call.__doc__ = (f"``{op}``: Triton on CUDA, C on the CPU, else ``{torch_path.__name__}`` (rsplan.kernels.dispatch)."
                    f"\n\n{torch_path.__doc__ or ''}")
    return cast(F, call)
