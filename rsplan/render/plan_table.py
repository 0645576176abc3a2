"""MemoryPlan -> text tables (tabulate)."""

from __future__ import annotations

from tabulate import tabulate

from rsplan.planner.breakdown import Breakdown
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


def render_plan(plan: MemoryPlan, per_layer: bool = False, breakdown: Breakdown | None = None) -> str:
    parts = [
        f"model {plan.model} (arch {plan.arch})",
        context_line(plan),
        "",
        totals_table(plan),
    ]
    if per_layer:
        parts += ["", per_layer_table(plan)]
    parts += ["", buffers_table(plan)]
    if breakdown is not None:
        parts += ["", breakdown_table(breakdown)]
    for w in plan.warnings:
        parts.append(f"note: {w}")
    return "\n".join(parts)


def breakdown_table(bd: Breakdown) -> str:
    """The breakdown in llama.cpp's shape (common_memory_breakdown_print): one row per device, the host buffer
    types as "Host", in MiB, with the exact bytes beside; then the output buffer and the compute graphs."""

    def cell(n: int | None) -> str:
        return "?" if n is None else mib(n)

    rows = []
    for r in bd.breakdown:
        parts = (r.model_bytes, r.context_bytes, r.compute_bytes)
        self_bytes = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
        rows.append([f"{r.device} ({r.buffer_type})", cell(self_bytes), cell(r.model_bytes), cell(r.context_bytes),
                     cell(r.compute_bytes), "?" if self_bytes is None else f"{self_bytes:,}"])
    table = tabulate(rows, headers=["memory breakdown [MiB]", "self", "model", "context", "compute", "self bytes"],
                     colalign=("left", "right", "right", "right", "right", "right"), disable_numparse=True)
    lines = [table]
    if bd.output_buffer is not None:
        o = bd.output_buffer
        lines.append(f"output buffer ({o.buffer_type}): {o.bytes:,} bytes (logits of {o.n_outputs} outputs), "
                     f"grows to {o.grown_bytes:,} bytes at n_outputs_max")
    if bd.compute is not None:
        c = bd.compute
        graphs = "; ".join(f"{g.name} {g.n_tokens} tokens, {g.n_outputs} outputs: {g.bytes:,}" for g in c.graphs)
        lines.append(f"compute buffer ({c.buffer_type}, n_outputs_max {c.n_outputs_max} as {c.tool}): {graphs}")
    if bd.mtp_draft is not None:
        d = bd.mtp_draft
        compute = "?" if d.compute_bytes is None else f"{d.compute_bytes:,}"
        lines.append(f"MTP draft context ({d.buffer_type}): KV {d.kv_bytes:,} bytes, compute {compute} bytes")
    if bd.server_host is not None and bd.server_host.checkpoint_bytes is not None:
        h = bd.server_host
        lines.append(f"llama-server host memory: context checkpoints {h.checkpoint_bytes:,} bytes each, up to "
                     f"{h.n_checkpoints_per_slot} per slot x {h.n_slots} slots = {h.checkpoints_max_bytes:,} bytes "
                     f"(--ctx-checkpoints); prompt cache up to {human(h.cache_ram_limit_bytes or 0)} (--cache-ram)")
    lines += [f"note: {n}" for n in bd.notes]
    return "\n".join(lines)
