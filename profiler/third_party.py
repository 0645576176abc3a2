"""Optional side-by-side timings of third-party decode kernels on the same shapes (CUDA only).

Where mamba-ssm (``selective_state_update``) or flash-linear-attention (``fused_recurrent_gated_delta_rule``)
is importable, one decode step of the model's shapes is timed with it and with rsplan's kernel. They are never
required; a missing library or an API mismatch is reported, not raised. Their layouts differ from llama.cpp's
(fla keeps the state [K, V], mamba-ssm broadcasts A and dt over the head dim), so only the time is compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsplan.profiler.device import Timer
from rsplan.profiler.errors import import_torch
from rsplan.profiler.families import Family, Kernel, kernel_bytes


def _time(dev: Any, fn: Callable[[], Any], iters: int, warmup: int) -> dict[str, float]:
    timer = Timer(dev)
    for _ in range(max(1, warmup)):
        fn()
    timer.sync()
    for _ in range(iters):
        timer.region("k", fn)
        timer.flush()
    return timer.samples["k"].summary()


def _entry(t: dict[str, float], n_bytes: int) -> dict[str, Any]:
    return {"available": True, "time": t, "bytes": n_bytes, "gb_s": n_bytes / t["median_s"] / 1e9}


def _mamba(dev: Any, k: Kernel, n: int, iters: int, warmup: int) -> dict[str, Any]:
    try:
        # deferred: mamba_ssm (optional; torch, triton)
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    except ImportError as exc:
        return {"available": False, "reason": f"mamba-ssm not importable ({exc})"}
    torch = import_torch()
    from rsplan.kernels.ssm_scan import ssm_scan  # deferred: torch

    H, P, G, S = k.dims["H"], k.dims["P"], k.dims["G"], k.dims["S"]
    state = torch.zeros(n, H, P, S, device=dev)
    x = torch.randn(n, H, P, device=dev)
    dt = (torch.randn(n, H, 1, device=dev) - 2).expand(n, H, P)
    A = (-torch.rand(H, 1, 1, device=dev)).expand(H, P, S)
    B = torch.randn(n, G, S, device=dev)
    C = torch.randn(n, G, S, device=dev)
    rows = list(range(n))
    b = kernel_bytes(k, n, 1, 1, 4)
    theirs = _time(dev, lambda: selective_state_update(state, x, dt, A, B, C, dt_softplus=True), iters, warmup)
    ours = _time(
        dev,
        lambda: ssm_scan(
            pool=state,
            x=x[:, None],
            dt=dt[:, None, :, 0].contiguous(),
            A=A[:, 0, 0],
            B=B[:, None],
            C=C[:, None],
            src_rows=rows,
            dst_rows=rows,
        ),
        iters,
        warmup,
    )
    return {"theirs": _entry(theirs, b), "rsplan": _entry(ours, b)}


def _fla(dev: Any, k: Kernel, n: int, iters: int, warmup: int) -> dict[str, Any]:
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # deferred: fla (optional; torch, triton)
    except ImportError as exc:
        return {"available": False, "reason": f"flash-linear-attention not importable ({exc})"}
    torch = import_torch()
    F = torch.nn.functional
    from rsplan.kernels.gated_delta import gated_delta  # deferred: torch

    Hk, Hv, Dk, Dv = k.dims["Hk"], k.dims["Hv"], k.dims["Dk"], k.dims["Dv"]
    q = F.normalize(torch.randn(n, 1, Hk, Dk, device=dev), dim=-1)
    kk = F.normalize(torch.randn(n, 1, Hk, Dk, device=dev), dim=-1)
    v = torch.randn(n, 1, Hv, Dv, device=dev)
    g = -F.softplus(torch.randn(n, 1, Hv, device=dev))
    beta = torch.sigmoid(torch.randn(n, 1, Hv, device=dev))
    h0 = torch.zeros(n, Hv, Dk, Dv, device=dev)
    pool = torch.zeros(n, Hv, Dv, Dk, device=dev)
    rows = list(range(n))
    b = kernel_bytes(k, n, 1, 1, 4)
    if k.dims.get("kda"):
        return {"available": False, "reason": "KDA's per-key decay is not timed against fla here"}
    theirs = _time(
        dev,
        lambda: fused_recurrent_gated_delta_rule(
            q=q, k=kk, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True
        ),
        iters,
        warmup,
    )
    ours = _time(
        dev, lambda: gated_delta(pool=pool, q=q, k=kk, v=v, g=g, beta=beta, src_rows=rows, dst_rows=rows), iters, warmup
    )
    return {"theirs": _entry(theirs, b), "rsplan": _entry(ours, b)}


def time_third_party(dev: Any, family: Family, n_seqs: int, iters: int, warmup: int) -> dict[str, Any]:
    """Timings by library name (each entry may say it is unavailable and why)."""
    out: dict[str, Any] = {}
    for k in family.kernels:
        try:
            if k.op == "ssm_scan" and not k.dims.get("mamba1"):
                out["mamba_ssm.selective_state_update"] = _mamba(dev, k, n_seqs, iters, warmup)
            elif k.op == "gated_delta":
                out["fla.fused_recurrent_gated_delta_rule"] = _fla(dev, k, n_seqs, iters, warmup)
        except Exception as exc:  # an API that moved on: report it, keep profiling
            out[k.op] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    return out
