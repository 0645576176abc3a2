"""MemoryPlan -> text tables (tabulate)."""

from __future__ import annotations

from tabulate import tabulate

from rsplan.planner.plan import MemoryPlan, TensorPlan
from rsplan.render.units import human, mib

_KIND_LABEL = {"k": "K", "v": "V", "r": "R (conv state)", "s": "S (recurrent state)"}


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in shape) + "]"


def context_line(plan: MemoryPlan) -> str:
    c = plan.context
    streams = "1 unified stream" if c.n_stream == 1 else f"{c.n_stream} streams"
    rs = f"n_rs_seq {c.n_rs_seq}"
    if c.n_rs_seq_clamp_reason:
        rs += f" (requested {c.n_rs_seq_requested}, clamped: {c.n_rs_seq_clamp_reason})"
    fa = "on" if c.flash_attn else "off (V transposed)"
    line = f"n_ctx {c.n_ctx} = {c.n_ctx_seq} cells x {streams}; n_seq_max {c.n_seq_max}; {rs}; flash_attn {fa}"
    if c.n_swa_cells:
        line += f"; SWA cells {c.n_swa_cells}"
    return line


def totals_table(plan: MemoryPlan) -> str:
    rows = []
    by_kind: dict[str, list[TensorPlan]] = {}
    for t in plan.tensors:
        by_kind.setdefault(t.kind, []).append(t)
    for kind in ("k", "v", "r", "s"):
        ts = by_kind.get(kind, [])
        if not ts:
            continue
        n = sum(t.bytes for t in ts)
        shapes = sorted({_fmt_shape(t.shape) for t in ts})
        shape = shapes[0] if len(shapes) == 1 else f"{len(shapes)} shapes"
        rows.append([_KIND_LABEL[kind], len(ts), shape, ts[0].type, mib(n), f"{n:,}"])
    total = plan.total_bytes
    rows.append(["total", len(plan.tensors), "", "", mib(total), f"{total:,}"])
    return tabulate(rows, headers=["cache", "tensors", "shape", "type", "MiB", "bytes"],
                    colalign=("left", "right", "left", "left", "right", "right"), disable_numparse=True)


def per_layer_table(plan: MemoryPlan) -> str:
    layers: dict[int, dict[str, int]] = {}
    for t in plan.tensors:
        layers.setdefault(t.layer, {})[t.kind] = t.bytes
    rows = []
    for il in sorted(layers):
        kinds = layers[il]
        carries = "+".join(k.upper() for k in ("k", "v", "r", "s") if k in kinds)
        n = sum(kinds.values())
        rows.append([il, carries, *(f"{kinds.get(k, 0):,}" for k in ("k", "v", "r", "s")), mib(n)])
    return tabulate(rows, headers=["layer", "caches", "K bytes", "V bytes", "R bytes", "S bytes", "MiB"],
                    colalign=("right", "left", "right", "right", "right", "right", "right"), disable_numparse=True)


def buffers_table(plan: MemoryPlan) -> str:
    rows = [
        [backend, f"{b['kv']:,}", f"{b['recurrent']:,}", human(b["kv"] + b["recurrent"])]
        for backend, b in plan.buffer_bytes.items()
    ]
    return tabulate(rows, headers=["buffer (per-tensor padding)", "KV bytes", "RS bytes", "total"],
                    colalign=("left", "right", "right", "right"), disable_numparse=True)


def render_plan(plan: MemoryPlan, per_layer: bool = False) -> str:
    parts = [
        f"model {plan.model} (arch {plan.arch})",
        context_line(plan),
        "",
        totals_table(plan),
    ]
    if per_layer:
        parts += ["", per_layer_table(plan)]
    parts += ["", buffers_table(plan)]
    for w in plan.warnings:
        parts.append(f"note: {w}")
    return "\n".join(parts)
