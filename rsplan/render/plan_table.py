"""MemoryPlan -> text tables (rsplan.render.tables)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsplan.planner.backends.buffers import BufferRule, device_rule, parse_backend
from rsplan.planner.caches.plan import CacheHome, MemoryPlan, TensorPlan, alloc_nbytes, bytes_by_buffer
from rsplan.render.tables import prose, table
from rsplan.render.units import human, mib

if TYPE_CHECKING:
    from rsplan.planner.estimate.breakdown import Breakdown

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
    return table(rows, ["cache", "tensors", "shape", "type", "MiB", "bytes"],
                 align=("left", "right", "left", "left", "right", "right"))


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
    return table(rows, ["layer", "caches", "K bytes", "V bytes", "R bytes", "S bytes", "MiB"],
                 align=("right", "left", "right", "right", "right", "right", "right"))


def backend_rule(backend: str) -> BufferRule:
    """The rule a buffer of ``backend`` (``CPU``, ``CUDA0``, ``ROCm0``, ``MTL0``, ``Vulkan0:64``, ...) pads a tensor
    by: planner.backends.buffers.parse_backend's (a Vulkan device without its alignment: the devices' default)."""
    b = parse_backend(backend)
    return b.rules[0] if len(b.rules) == 1 else device_rule(b.name)


def buffers_table(plan: MemoryPlan, backend: str = "CPU",
                  home: CacheHome | None = None) -> str:
    """The buffers llama.cpp allocates for these caches (one KV and one RS buffer per buffer type holding them:
    ``home`` gives each layer's, planner.estimate.offload.GpuRun.cache_home; None: every layer on ``backend``), and
    what they hold."""
    if home is None:
        rule = backend_rule(backend)
        home = lambda _il: (backend.split(":")[0], rule)  # noqa: E731
    caches = {
        ("KV", "K and V tensors"): bytes_by_buffer((t for t in plan.tensors if t.kind in ("k", "v")), home),
        ("RS", "R and S tensors"): bytes_by_buffer((t for t in plan.tensors if t.kind not in ("k", "v")), home),
    }
    rows = [[f"{name} {cache} buffer", holds, mib(n), f"{n:,}"]
            for (cache, holds), sizes in caches.items() for name, n in sizes.items() if n]
    aligns = {home(t.layer)[1].alignment for t in plan.tensors}
    names = sorted({name for sizes in caches.values() for name in sizes}, key=str.encode)
    if len(names) == 1 and len(aligns) == 1:
        other = "CUDA0" if names[0] == "CPU" else "CPU"
        where = (f"The buffers llama.cpp allocates on {names[0]} (its 'KV / RS buffer size' log lines): the tensors "
                 f"above, each padded to {aligns.pop()} bytes; --backend {other} for {other}'s.")
    else:
        where = (f"The buffers llama.cpp allocates on {', '.join(names)} (its 'KV / RS buffer size' log lines, one "
                 "per buffer type): the tensors above, each padded by its buffer's rule ("
                 + ", ".join(f"{a}" for a in sorted(aligns)) + " bytes).")
    return "\n".join([
        table(rows, ["buffer", "holds", "MiB", "bytes"], align=("left", "left", "right", "right")),
        prose(where),
    ])


#: The warning llama.cpp logs whenever the context is not a multiple of the sequences' padded share
#: (src/llama-context.cpp:304 LLAMA_LOG_WARN): "rounding down", although with at most 256 sequences n_ctx only grows
#: (n x pad(P // n, 256) > P - n, both multiples of 256).
_LLAMA_ROUNDING = "n_ctx is not divisible by n_seq_max - rounding down to "


def user_notes(plan: MemoryPlan) -> list[str]:
    """``plan.warnings`` in the user's words: llama.cpp's rounding warning says that -c grew, and why (the log
    format keeps llama.cpp's own words)."""
    c = plan.context
    notes = []
    for w in plan.warnings:
        if w.startswith(_LLAMA_ROUNDING) and c.n_ctx_asked:
            w = (f"-c {c.n_ctx_asked:,} is rounded up to {c.n_ctx:,}: each of the {c.n_seq_max} sequences gets "
                 f"{c.n_ctx_seq:,} cells (llama.cpp pads each sequence's share to a multiple of 256; its log says "
                 f"'rounding down' either way)")
        notes.append(w)
    return notes


def render_plan(plan: MemoryPlan, per_layer: bool = False, backend: str = "CPU",
                breakdown: Breakdown | None = None) -> str:
    parts = [f"model {plan.model} (arch {plan.arch})"]
    if breakdown is not None and breakdown.weights_source is not None:
        # the assumption the model bytes rest on goes in the answer's first lines, not with the notes under the table
        parts.append(prose(f"weights: {breakdown.weights_source}"))
        breakdown = breakdown.without_weights_source()
    if breakdown is not None and breakdown.device_note is not None:
        parts.append(prose(breakdown.device_note))
        breakdown = breakdown.without_device_note()
    parts += [
        prose(context_line(plan)),
        "",
        totals_table(plan),
    ]
    if per_layer:
        parts += ["", per_layer_table(plan)]
    run = breakdown.run if breakdown is not None else None
    parts += ["", buffers_table(plan, backend, home=run.cache_home if run is not None else None)]
    if breakdown is not None:
        parts += ["", breakdown_table(breakdown)]
    parts += [prose(f"note: {w}") for w in user_notes(plan)]
    return "\n".join(parts)


def _kind_bytes(plan: MemoryPlan, kind: str) -> int:
    return sum(t.bytes for t in plan.tensors if t.kind == kind)


def render_comparison(plans: list[MemoryPlan], backend: str = "CPU") -> str:
    """Several models under the same flags, one column each: the context each gets and its cache bytes."""
    rule = backend_rule(backend)
    name = backend.split(":")[0]

    def rs(p: MemoryPlan) -> str:
        c = p.context
        return str(c.n_rs_seq) + (f" (asked {c.n_rs_seq_requested})" if c.n_rs_seq_clamp_reason else "")

    rows: list[list[str]] = [
        ["arch", *(p.arch for p in plans)],
        ["n_ctx (cells x streams)", *(f"{p.context.n_ctx:,} = {p.context.n_ctx_seq:,} x {p.context.n_stream}"
                                      for p in plans)],
        ["n_seq_max", *(str(p.context.n_seq_max) for p in plans)],
        ["n_rs_seq", *(rs(p) for p in plans)],
        ["flash_attn", *("on" if p.context.flash_attn else "off" for p in plans)],
    ]
    for kind in ("k", "v", "r", "s"):
        rows.append([f"{_KIND_LABEL[kind]} bytes", *(f"{_kind_bytes(p, kind):,}" for p in plans)])
    rows.append(["total bytes", *(f"{p.total_bytes:,}" for p in plans)])
    rows.append(["total MiB", *(mib(p.total_bytes) for p in plans)])
    rows.append([f"{name} buffers bytes", *(f"{sum(alloc_nbytes(rule, t) for t in p.tensors):,}" for p in plans)])
    parts = [
        f"{len(plans)} models side by side, under the same flags",
        "",
        table(rows, ["model", *(p.model for p in plans)], align=("left", *("right",) * len(plans))),
        prose(f"{name} buffers: the KV and RS buffers llama.cpp allocates on {name}, each tensor padded to "
              f"{rule.alignment} bytes."),
    ]
    for p in plans:
        if p.context.n_rs_seq_clamp_reason:
            parts.append(prose(f"note ({p.model}): n_rs_seq {p.context.n_rs_seq_requested} clamped to "
                               f"{p.context.n_rs_seq}: {p.context.n_rs_seq_clamp_reason}"))
        parts += [prose(f"note ({p.model}): {w}") for w in user_notes(p)]
    return "\n".join(parts)


#: A breakdown cell whose bytes are not known (the note under the table says why).
UNKNOWN = "unknown"


def breakdown_table(bd: Breakdown) -> str:
    """The breakdown in llama.cpp's shape (common_memory_breakdown_print): one row per device, the host buffer
    types as "Host", in MiB, with the exact bytes beside; then the output buffer and the compute graphs."""

    def cell(n: int | None) -> str:
        return UNKNOWN if n is None else mib(n)

    rows = []
    for r in bd.breakdown:
        parts = (r.model_bytes, r.context_bytes, r.compute_bytes)
        self_bytes = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
        rows.append([f"{r.device} ({r.buffer_type})", cell(self_bytes), cell(r.model_bytes), cell(r.context_bytes),
                     cell(r.compute_bytes), UNKNOWN if self_bytes is None else f"{self_bytes:,}"])
    lines = [table(rows, ["memory breakdown [MiB]", "self", "model", "context", "compute", "self bytes"],
                   align=("left", "right", "right", "right", "right", "right"))]
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
        compute = UNKNOWN if d.compute_bytes is None else f"{d.compute_bytes:,}"
        if d.host_compute_bytes is not None:
            compute += f" (host compute {d.host_compute_bytes:,})"
        output = UNKNOWN if d.output_bytes is None else f"{d.output_bytes:,}"
        lines.append(f"MTP draft context ({d.buffer_type}): KV {d.kv_bytes:,} bytes, compute {compute} bytes; "
                     f"its output buffer {output} bytes (host)")
    if bd.server_host is not None and bd.server_host.checkpoint_bytes is not None:
        h = bd.server_host
        draft = (f" (+ up to {h.draft_checkpoint_bytes:,} of the MTP draft's KV cells of the sequence)"
                 if h.draft_checkpoint_bytes else "")
        lines.append(f"llama-server host memory: context checkpoints {h.checkpoint_bytes:,} bytes each{draft}, up to "
                     f"{h.n_checkpoints_per_slot} per slot x {h.n_slots} slots = {h.checkpoints_max_bytes:,} bytes "
                     f"(--ctx-checkpoints); prompt cache up to {human(h.cache_ram_limit_bytes or 0)} (--cache-ram)")
    lines += [f"note: {n}" for n in bd.notes]
    return "\n".join(prose(line) for line in lines)
