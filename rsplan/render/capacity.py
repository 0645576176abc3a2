"""``rsplan capacity`` output: the JSON form (every number, bytes) and the text tables (binary units)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rsplan.planner.caches.context import CTX_PAD
from rsplan.planner.caches.speculative import usable_spec_types
from rsplan.planner.capacity.answers import CapacityResult, Rung
from rsplan.planner.capacity.charges import Charge
from rsplan.planner.capacity.limits import HOST
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.render.tables import prose, table
from rsplan.render.units import human

#: Why a search stopped, in words (``n_ctx_train`` and ``draft_max`` get their numbers from ``limit_words``).
LIMITS = {
    "memory": "memory",
    "max_seq": "llama.cpp's 256-sequence maximum",
    "max_ctx": "llama.cpp's largest -c, a uint32",
    "n_ctx_train": "the model's training context",
    "draft_max": "llama.cpp's draft bound (n_rs_seq + 1 < n_ubatch)",
    "max_rs_seq": "rsplan's 1024-plane bound",
    "nothing_fits": "nothing fits",
    "llama_abort": "llama.cpp aborting one step up",
    "llama_abort_first": "llama.cpp aborting at the smallest setting",
}


def limit_words(planner: CapacityPlanner, limited_by: str, bound_device: str | None = None,
                draft_bound: int | None = None) -> str:
    """The binding limit of one answer, in words: ``GPU 1's budget``, ``the trained context (config) 8,192``,
    ``llama.cpp's draft bound at -ub 512: 510``."""
    if limited_by == "memory":
        return f"{bound_device}'s budget" if bound_device else "memory"
    if limited_by == "n_ctx_train":
        return planner.ctx_limit.describe()
    if limited_by == "draft_max" and draft_bound is not None:
        return f"llama.cpp's draft bound {draft_bound} (n_rs_seq + 1 < n_ubatch {draft_bound + 2})"
    return LIMITS[limited_by]


def no_context_words(planner: CapacityPlanner, n_seq_max: int) -> str:
    """Why no context runs at ``n_seq_max`` sequences where llama.cpp aborts already at the smallest one searched
    (a ``llama_abort_first`` answer): ``none, llama.cpp aborts at 256 tokens per sequence (-c N): <why>``."""
    first = planner.params(CTX_PAD * n_seq_max, n_seq_max)
    return f"none, llama.cpp aborts at 256 tokens per sequence (-c {first.n_ctx}): {planner.aborts(first)}"


def _layers(placement: Any, device: int | None) -> str:
    """``38: blk 12-48, out``: how many of llama.cpp's -ngl units ``device`` holds, then which: the repeating
    layers by their GGUF ``blk.N`` index (MTP layers included, as -ot patterns name them), ``out`` for the output
    layer (the last unit)."""
    units = [il for il, d in enumerate(placement.unit_device) if d == device]
    if not units:
        return "0"
    layers = [il for il in units if il < placement.n_layer_all]
    parts = [f"blk {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"blk {layers[0]}"] if layers else []
    if len(layers) < len(units):
        parts.append("out")
    return f"{len(units)}: {', '.join(parts)}"


def units_words(planner: CapacityPlanner) -> str:
    """The model's layers as llama.cpp's -ngl counts them: ``48 layers (12 KV, 36 recurrent) + 1 MTP + output =
    50 -ngl units``."""
    layout = planner.layout
    n_mtp = layout.n_layer_all - layout.n_layer
    mtp = f" + {n_mtp} MTP" if n_mtp else ""
    return (f"{layout.n_layer} layers ({len(layout.kv_layers)} KV, {len(layout.recurrent_layers)} recurrent){mtp} "
            f"+ output = {layout.n_layer_all + 1} -ngl units")


def _draft_fields(charge: Charge | None, i: int | None) -> dict[str, Any]:
    """The MTP draft context's bytes on device ``i`` (None: the host) at the flags given (None: no draft)."""
    if charge is None or charge.draft is None:
        return {"draft_kv_bytes": None, "draft_compute_bytes": None}
    row = charge.draft.host if i is None else charge.draft.devices[i]
    return {"draft_kv_bytes": row.context, "draft_compute_bytes": row.compute}


def _host_weight_fields(planner: CapacityPlanner) -> dict[str, Any]:
    """The host row's weight buffers at the flags given (planner.weights.host_charge; None where the file's tensor table
    is not known), and the options they were laid out with."""
    hw = planner.host_weights()
    host = planner.budget.host
    return {"weight_buffers": hw.buffers if hw else None,
            "mapped_elsewhere_bytes": hw.mapped_elsewhere if hw else None,
            "load_mode": host.mode, "cpu_repack": host.repack.name}


def device_rows(planner: CapacityPlanner, result: CapacityResult) -> list[dict[str, Any]]:
    """Per GPU (then the host): budget, what it holds, its compute buffer, the MTP draft context and the caches at
    the given -c/-np (compute and draft None where llama.cpp aborts at those flags)."""
    rows = []
    budget = planner.budget
    charge = planner.charge_given()
    for i, d in enumerate(budget.devices):
        rows.append({
            "name": d.name,
            "budget_bytes": d.budget_bytes,
            "budget_source": d.source,
            "total_bytes": d.total_bytes,
            "free_bytes": d.free_bytes,
            "layers": [il for il, dev in enumerate(planner.placement.unit_device) if dev == i],
            "weights_bytes": planner.weights_on_device[i],
            "margin_bytes": budget.margin_bytes[i],
            "compute_bytes": charge.compute[i] if charge else None,
            "compute_source": budget.compute_source,
            **_draft_fields(charge, i),
            "cache_budget_bytes": planner.cache_budget[i],
            "cache_bytes": result.usage.devices[i].total_bytes,
            "kv_bytes": result.usage.devices[i].kv_bytes,
            "recurrent_bytes": result.usage.devices[i].recurrent_bytes,
        })
    host = result.usage.host
    cps = planner.checkpoints(planner.base)
    rows.append({
        "name": "host",
        "budget_bytes": planner.budget.host_budget_bytes,
        "budget_source": planner.budget.host_source if planner.budget.host_budget_bytes is not None else "not budgeted",
        "needed_bytes": planner.host_bytes(planner.base, charge=charge) if charge else None,
        "needed_start_bytes": planner.host_need(planner.base, charge)[0] if charge else None,
        "total_bytes": None,
        "free_bytes": None,
        "layers": [il for il, dev in enumerate(planner.placement.unit_device) if dev is None],
        "weights_bytes": planner.weights_on_host,
        **_host_weight_fields(planner),
        "margin_bytes": 0,
        "compute_bytes": charge.compute_host if charge else None,
        **_draft_fields(charge, None),
        "draft_output_bytes": charge.draft_output if charge else None,
        "cache_budget_bytes": None,
        "cache_bytes": host.total_bytes,
        "kv_bytes": host.kv_bytes,
        "recurrent_bytes": host.recurrent_bytes,
        "checkpoint_bytes": cps.bytes,
        "checkpoints": {"per_checkpoint_bytes": cps.per_checkpoint_bytes, "per_slot": cps.per_slot,
                        "n_slots": cps.n_slots, "ctx_checkpoints": planner.budget.ctx_checkpoints, "note": cps.note,
                        "draft_per_checkpoint_bytes": cps.draft_per_checkpoint_bytes},
    })
    return rows


def _rung_dict(planner: CapacityPlanner, r: Rung) -> dict[str, Any]:
    """One ladder rung with its flags, its limit in words and the host memory it needs."""
    d = dataclasses.asdict(r)
    d["flags"] = planner.flags(planner.params(r.n_ctx_flag, r.max_parallel)) if r.n_ctx_flag else None
    d["limit"] = limit_words(planner, r.limited_by, r.bound_device)
    need = rung_host_need(planner, r)
    d["host_start_bytes"], d["host_max_bytes"] = need if need else (None, None)
    return d


def _max_ctx_dict(planner: CapacityPlanner, result: CapacityResult) -> dict[str, Any]:
    """The largest context at the -np given, with its flags (where one fits) and its limit in words."""
    max_ctx = dataclasses.asdict(result.max_ctx)
    if result.max_ctx.n_ctx_flag:
        max_ctx["flags"] = planner.flags(planner.params(result.max_ctx.n_ctx_flag, result.max_ctx.n_seq_max))
    max_ctx["limit"] = limit_words(planner, result.max_ctx.limited_by, result.max_ctx.bound_device)
    return max_ctx


def _max_rs_dict(planner: CapacityPlanner, result: CapacityResult) -> dict[str, Any]:
    """The largest n_rs_seq at the flags given, with its flags and its limit in words where there is one."""
    max_rs = dataclasses.asdict(result.max_rs)
    if result.max_rs.n_rs_seq is not None:
        p = planner.params(result.max_rs.n_ctx, result.max_rs.n_seq_max, result.max_rs.n_rs_seq)
        max_rs["flags"] = planner.flags(p)
        max_rs["limit"] = limit_words(planner, result.max_rs.limited_by or "", result.max_rs.bound_device,
                                      result.max_rs.draft_bound)
    return max_rs


def _model_fields(planner: CapacityPlanner) -> dict[str, Any]:
    """The model: its name, layers, training context, context limit and draft type."""
    layout = planner.layout
    limit = planner.ctx_limit
    return {
        "model": planner.spec.name,
        "arch": planner.spec.arch,
        "source": planner.spec.source,
        "n_layer": layout.n_layer,
        "n_kv_layers": len(layout.kv_layers),
        "n_recurrent_layers": len(layout.recurrent_layers),
        "n_ctx_train": layout.n_ctx_train,
        "context_limit": {"tokens": limit.tokens, "kind": limit.kind, "note": limit.note,
                          "rope_flags": limit.rope.flags()},
        "draft": {"spec_type": planner.draft.spec_type, "needs_draft_model": planner.draft.needs_draft_model,
                  "usable_spec_types": list(usable_spec_types(planner.spec))},
    }


def _budget_fields(planner: CapacityPlanner) -> dict[str, Any]:
    """The budget and what it is charged at the flags given (bytes, summed over the GPUs), down to the caches'
    share."""
    budget = planner.budget
    charge = planner.charge_given()
    return {
        "budget_bytes": sum(d.budget_bytes for d in budget.devices),
        "weights_bytes": budget.weights_bytes or 0,
        "weights_counted": budget.weights_bytes is not None,
        "weights_source": budget.weights_source,
        "weights_on_gpus_bytes": sum(planner.weights_on_device),
        "margin_bytes": sum(budget.margin_bytes),
        "compute_bytes": sum(charge.compute) if charge else None,
        "compute_source": budget.compute_source,
        "compute_per_setting": budget.compute_per_setting,
        "device_kind": budget.device_kind,
        "mtp_draft": dataclasses.asdict(charge.draft) if charge and charge.draft else None,
        "cache_budget_bytes": sum(planner.cache_budget),
    }


def capacity_dict(planner: CapacityPlanner, result: CapacityResult) -> dict[str, Any]:
    """``rsplan capacity --format json``: every number, in bytes; sums are over the GPUs."""
    return {
        **_model_fields(planner),
        **_budget_fields(planner),
        "params": dataclasses.asdict(result.params),
        "flags": planner.flags(result.params),
        "cache_bytes": result.usage.total_bytes,
        "snapshot_bytes": result.usage.snapshot_bytes,
        "placement": {
            "n_gpu_layers": planner.placement.n_gpu_layers,
            "n_offloadable": planner.placement.n_layer_all + 1,
            "tensor_split": list(planner.split_parts),
            "offload_kqv": planner.placement.offload_kqv,
            "unit_device": list(planner.placement.unit_device),
        },
        "devices": device_rows(planner, result),
        "ladder": [_rung_dict(planner, r) for r in result.ladder],
        "max_ctx": _max_ctx_dict(planner, result),
        "max_n_rs_seq": _max_rs_dict(planner, result),
        "notes": notes(planner),
    }


def notes(planner: CapacityPlanner) -> list[str]:
    """What the numbers assume, in sentences."""
    out = []
    if planner.budget.weights_bytes is None:
        out.append("weights are NOT counted: their size is unknown for this model (give --weights SIZE)")
    out.append(compute_words(planner))
    if planner.budget.weights:
        out.append("weights per device placed tensor by tensor as llama.cpp places them (the token embedding stays "
                   "in host memory)")
    elif planner.placement.n_devices > 1 or planner.placement.n_gpu_layers <= planner.placement.n_layer_all:
        out.append("weights per device are spread evenly over the offloadable layers (an estimate); cache bytes "
                   "per device are exact")
    if planner.budget.weights_bytes is not None:
        out.append(host_weight_words(planner))
    host = planner.budget.host_budget_bytes
    if host is not None:
        charge = planner.charge_given()
        need = (f"{human(planner.host_bytes(planner.base, charge=charge))} at the flags given" if charge else
                "not known at the flags given, where llama.cpp aborts")
        out.append(f"host memory: {human(host)} ({planner.budget.host_source}) must hold what stays on the host "
                   f"(weights not offloaded, host caches, the output buffer, host compute, llama-server's context "
                   f"checkpoints): {need}")
        out.append(_checkpoint_words(planner))
    draft = draft_words(planner)
    if draft:
        out.append(draft)
    out.append("-c is the total over all sequences: each of the -np sequences gets -c / -np tokens")
    if planner.layout.arch.rollback and planner.draft.needs_draft_model:
        out.append(f"rollback planes need a draft model (-md FILE, --spec-type {planner.draft.spec_type}; eagle3, "
                   "dflash or dspark)" + ("" if planner.spec_type else
                                          f": {planner.spec.name} has no MTP (nextn) layers for --spec-type mtp")
                   + "; the draft model's own weights and caches are not counted")
    return out


def host_weight_words(planner: CapacityPlanner) -> str:
    """Which host weight buffers are charged, under which --load-mode / --cpu-repack, in a sentence."""
    hw = planner.host_weights()
    how = planner.budget.host.describe()
    if hw is None:
        return (f"host weights: {human(planner.weights_on_host)}, as llama.cpp's dry run reads them (each tensor "
                f"padded to 32 bytes): without the file's tensor table the buffers a started llama.cpp holds under "
                f"{how} are not known")
    out = (f"host weights: what a started llama-server holds under {how} ({hw.describe()}), "
           f"{human(hw.total)} charged to the host")
    if hw.gpu_host is not None and hw.options.repack.repacks:
        out += f" (nothing repacked: the devices' host buffer type {hw.gpu_host} comes before CPU_REPACK)"
    if hw.mapped_elsewhere:
        out += (f"; {human(hw.mapped_elsewhere)} of the CPU_Mapped span are tensors repacked or offloaded (page "
                "cache read once at load, which the OS may reclaim), charged too")
    return out


def compute_words(planner: CapacityPlanner) -> str:
    """Where the compute buffer charged to each answer comes from, in a sentence."""
    budget = planner.budget
    where = ("each GPU that runs a layer (and the host when a layer runs there)" if budget.device_kind is None or
             not budget.compute_per_setting else
             f"each {budget.device_kind} device its own share of the graph as llama.cpp's scheduler splits it "
             "(the host's share in host memory)")
    if not budget.compute_per_setting:
        return f"compute buffer: {human(budget.compute_bytes)} on {where}, for every setting, {budget.compute_source}"
    text = (f"compute buffer: each setting is charged its own, on {where}, {budget.compute_source}; each answer's "
            "in its row")
    if planner.charges.estimate:
        text += f" (an estimate: {planner.charges.estimate})"
    if planner.charges.host_ops:
        text += f"; {planner.charges.host_ops}"
    return text


def draft_words(planner: CapacityPlanner) -> str | None:
    """How the MTP draft context is charged, in a sentence (None when no printed command runs it: no MTP layers,
    or an arch without rollback, where llama.cpp clamps n_rs_seq to 0 and no command carries a draft)."""
    if not planner.charges.mtp or not planner.layout.arch.rollback:
        return None
    return ("--spec-type mtp: every setting with rollback planes (printed with --spec-type draft-mtp) is also charged "
            "the draft context as llama.cpp's --fit adds it: its KV cache over the nextn layers and its compute buffer "
            "on the devices holding them, its output buffer on the host, and the target's MTP-layer weights")


def _checkpoint_words(planner: CapacityPlanner) -> str:
    """llama-server's context checkpoints at the flags given, in a sentence."""
    cps = planner.checkpoints(planner.base)
    if cps.note is not None:
        return f"llama-server context checkpoints: {cps.note}"
    draft = (f" + up to {human(cps.draft_per_checkpoint_bytes)} ({cps.draft_per_checkpoint_bytes:,} B) of the MTP "
             f"draft's KV cells of the sequence (all of a slot's n_ctx_seq)" if cps.draft_per_checkpoint_bytes else "")
    return (f"llama-server context checkpoints (host memory): {cps.per_slot} per slot (--ctx-checkpoints) x "
            f"{cps.n_slots} slots x {human(cps.per_checkpoint_bytes)} ({cps.per_checkpoint_bytes:,} B, one "
            f"sequence's recurrent state{draft}) = {human(cps.bytes)} at most, charged to the host budget")


def render_capacity(planner: CapacityPlanner, result: CapacityResult, explain: bool = False,
                    fitted: str | None = None) -> str:
    """The text form of ``rsplan capacity``: the budget in a few lines, the answers (the largest context at the
    flags given, the ladder), the devices at the flags given, and the notes a user can act on; ``explain`` adds
    where each figure comes from (the context limit, margin, compute rules, modelling notes). ``fitted``: the
    placement flags llama.cpp's --fit chose at the flags given (planner.capacity.fit_placement), every answer's."""
    p = planner.base
    placed = ([prose(f"Layers:   {fitted}: what llama.cpp's --fit (on by default) chooses at -c {p.n_ctx} -np "
                     f"{p.n_seq_max}, as rsplan fit; every answer below uses it")] if fitted else [])
    lines = [
        *_budget_lines(planner, explain), *placed, "",
        *_largest_lines(planner, result, explain), "",
        *_ladder_lines(planner, result, explain), "",
        *_device_lines(planner, result), "",
    ]
    lines.extend(f"Note: {n}" for n in (notes(planner) if explain else action_notes(planner, result)))
    return "\n".join(prose(line) for line in lines).rstrip("\n")


def action_notes(planner: CapacityPlanner, result: CapacityResult) -> list[str]:
    """The notes of the default output: only what a user can act on, one line each (``notes`` has them all)."""
    out = []
    budget = planner.budget
    if not budget.compute_per_setting and budget.compute_source.startswith("an allowance"):
        out.append(f"compute buffer: an allowance of {human(budget.compute_bytes)} per GPU (not modelled for this "
                   "model); --compute SIZE gives yours")
    host_bound = any(r.limited_by == "memory" and r.bound_device == HOST for r in result.ladder)
    cps = planner.checkpoints(planner.base)
    if host_bound and cps.bytes:
        out.append(f"host memory binds: llama-server's context checkpoints take up to {human(cps.bytes)} at the "
                   f"flags given; a lower --ctx-checkpoints (now {budget.ctx_checkpoints}) fits more")
    if planner.layout.arch.rollback and planner.draft.needs_draft_model:
        out.append(f"rollback planes need a draft model (-md FILE, --spec-type {planner.draft.spec_type}), whose "
                   "own weights and caches are not counted")
    return out


def _budget_lines(planner: CapacityPlanner, explain: bool = False) -> list[str]:
    """The model and where each part of the budget comes from (``explain``: the context limit, margin, compute and
    cache budget too)."""
    spec, layout, budget = planner.spec, planner.layout, planner.budget
    lines = [
        f"{spec.name} ({spec.arch}): {units_words(planner)}; trained at {layout.n_ctx_train:,}",
    ]
    if explain:
        lines.append(f"Context:  recommendations stop at {planner.ctx_limit.tokens:,} tokens per sequence "
                     f"({planner.ctx_limit.note})")
    for d in budget.devices:
        extra = ""
        if d.total_bytes is not None:
            extra = f" (free {human(d.free_bytes or 0)} of {human(d.total_bytes)})"
        lines.append(f"Budget:   {d.name}: {human(d.budget_bytes)} from {d.source}{extra}")
    lines.append(f"Host:     {host_words(planner)}")
    if budget.weights_bytes is None:
        lines.append("Weights:  NOT COUNTED - unknown for this model; give --weights SIZE")
    else:
        lines.append(f"Weights:  {human(budget.weights_bytes)} ({budget.weights_bytes:,} B) "
                     f"from {budget.weights_source}")
    if not explain:
        return lines
    margins = sorted(set(budget.margin_bytes))
    lines.append("Margin:   " + ", ".join(human(m) for m in margins) + " per GPU (--fit-target)")
    kind = f"{budget.device_kind} devices, " if budget.device_kind else ""
    if budget.compute_per_setting:
        lines.append(f"Compute:  per setting and per device ({kind}{budget.compute_source}); at the flags given in "
                     "the table below")
        lines.append(f"Caches:   {human(sum(planner.cache_budget))} left for KV and recurrent caches at the flags "
                     "given")
    else:
        lines.append(f"Compute:  {human(budget.compute_bytes)} on each GPU that runs a layer ({kind}"
                     f"{budget.compute_source})")
        lines.append(f"Caches:   {human(sum(planner.cache_budget))} left for KV and recurrent caches at the flags "
                     "given")
    return lines


def host_words(planner: CapacityPlanner) -> str:
    """The host's budget and what the flags given need there (at start, and at most once llama-server's context
    checkpoints have grown), in words: a requirement where the host is not budgeted (``--budget`` plans another
    machine), else checked against the budget."""
    charge = planner.charge_given()
    if charge is None:
        need = "need not known at the flags given, where llama.cpp aborts"
    else:
        start, most = planner.host_need(planner.base, charge)
        need = f"needs {human(start)} at start, up to {human(most)}"
    host = planner.budget.host_budget_bytes
    if host is None:
        return f"{need}; {NOT_LIMITED}"
    return f"{need}, of {human(host)} from {planner.budget.host_source}"


#: The host of a machine rsplan does not know (``--budget``), in words.
NOT_LIMITED = "not limited (another machine: --host-budget SIZE checks it)"


def _device_lines(planner: CapacityPlanner, result: CapacityResult) -> list[str]:
    """The per-device table at the given -c/-np (the host only when it holds layers or caches)."""
    n_devices = len(planner.budget.devices)
    charge = planner.charge_given()
    draft = charge is not None and charge.draft is not None
    rows = []
    for i, row in enumerate(device_rows(planner, result)):
        host = i == n_devices
        if host and not row["layers"] and not row["cache_bytes"] and not row["compute_bytes"]:
            continue
        rows.append([
            row["name"],
            human(row["budget_bytes"]) if row["budget_bytes"] is not None else "-",
            _layers(planner.placement, None if host else i),
            human(row["weights_bytes"]),
            human(row["compute_bytes"]) if row["compute_bytes"] is not None else "aborts",
            *([human(row["draft_kv_bytes"] + row["draft_compute_bytes"]
                     + (row.get("draft_output_bytes") or 0))] if draft else []),
            human(row["cache_budget_bytes"]) if row["cache_budget_bytes"] is not None else "-",
            human(row["cache_bytes"]),
        ])
    p = result.params
    lines = [table(rows, ["device", "budget", "-ngl units", "weights", "compute", *(["MTP draft"] if draft else []),
                          "cache budget", f"caches at -c {p.n_ctx} -np {p.n_seq_max}"], wrap=(0, 2))]
    if charge is not None and charge.draft is not None:
        d = charge.draft
        lines.append("MTP draft context (--spec-type draft-mtp) at the flags given: KV "
                     + ", ".join(human(r.context) for r in d.devices) + " and compute "
                     + ", ".join(human(r.compute) for r in d.devices)
                     + f" on the GPUs; KV {human(d.host.context)}, compute {human(d.host.compute)} and output buffer "
                     f"{human(charge.draft_output)} on the host")
    if result.usage.ctx.n_rs_seq:
        lines.append(f"Rollback snapshots: {human(result.usage.snapshot_bytes)} ({result.usage.snapshot_bytes:,} B) "
                     f"of these caches: n_rs_seq {result.usage.ctx.n_rs_seq} planes of R and S per sequence")
    return lines


def _ladder_lines(planner: CapacityPlanner, result: CapacityResult, explain: bool = False) -> list[str]:
    """The most parallel sequences at each context per sequence (``explain``: each answer's compute buffer too)."""
    per_setting = planner.budget.compute_per_setting and explain
    draft = any(r.charge is not None and r.charge.draft is not None for r in result.ladder)
    # tensor overrides make long flags: said once, above the table, rather than in every row
    shared = bool(planner.override_flags)
    ladder_rows: list[list[Any]] = []
    for r in result.ladder:
        if r.n_ctx_flag is None or r.cache_bytes is None or r.headroom_bytes is None:  # not even one sequence fits
            ladder_rows.append([f"{r.ctx_per_seq:,}", 0, "nothing fits", "does not fit", "-", "-"]
                               + (["-"] if per_setting else []) + (["-"] if draft else []))
            continue
        ladder_rows.append([
            f"{r.ctx_per_seq:,}",
            f"{r.max_parallel}",
            limit_words(planner, r.limited_by, r.bound_device),
            planner.flags(planner.params(r.n_ctx_flag, r.max_parallel), placement=not shared),
            human(r.cache_bytes),
            _host_cell(planner, r),
        ] + ([_per_gpu(r.compute_bytes)] if per_setting else []) + ([_draft_cell(r.charge)] if draft else []))
    headers = ["ctx/seq", "max -np", "limited by", "llama.cpp flags", "caches", "host start/most"]
    return [
        "Most parallel sequences per context (llama.cpp's -c is the total over all sequences"
        + (f"; every command ends in {planner.placement_flags()}" if shared else "")
        + ("; compute: the compute buffer charged to each GPU at that setting" if per_setting else "")
        + ("; MTP draft: the draft context's KV and compute on the GPUs" if draft else "") + "):",
        table(ladder_rows, headers + (["compute"] if per_setting else []) + (["MTP draft"] if draft else []),
              wrap=(2, 3, 5)),
    ]


def _largest_lines(planner: CapacityPlanner, result: CapacityResult, explain: bool = False) -> list[str]:
    """The largest context at the given -np, and the largest n_rs_seq at the given -c/-np (for an arch without
    rollback, only with ``explain``)."""
    lines = []
    m = result.max_ctx
    if m.limited_by == "llama_abort_first":
        lines.append(f"Largest context at -np {m.n_seq_max}: {no_context_words(planner, m.n_seq_max)}")
    elif m.n_ctx_flag is None or m.cache_bytes is None:
        lines.append(f"Largest context at -np {m.n_seq_max}: nothing fits (not even 256 tokens per sequence)")
    else:
        limit = f", limited by {limit_words(planner, m.limited_by, m.bound_device)}"
        lines.append(
            f"Largest context at -np {m.n_seq_max}: {m.ctx_per_seq:,} tokens per sequence{limit}: "
            f"{planner.flags(planner.params(m.n_ctx_flag, m.n_seq_max))} (caches {human(m.cache_bytes)}"
            f"{_compute_part(planner, m.compute_bytes, m.charge)})"
        )
    rs = result.max_rs
    if not planner.layout.arch.rollback and not explain:
        return lines  # no rollback planes for this arch: no question to answer
    if rs.n_rs_seq is None or rs.cache_bytes is None:
        lines.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: n/a, {rs.reason}")
    else:
        limit = f", limited by {limit_words(planner, rs.limited_by or '', rs.bound_device, rs.draft_bound)}"
        flags = planner.flags(planner.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq))
        how = f" {planner.draft.describe()}" if planner.draft.needs_draft_model else ""
        lines.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: {rs.n_rs_seq}{how}{limit}: {flags} "
                     f"(caches {human(rs.cache_bytes)}{_compute_part(planner, rs.compute_bytes, rs.charge)})")
        lines.append(f"Rollback snapshots at n_rs_seq {rs.n_rs_seq}: {human(rs.snapshot_bytes or 0)} "
                     f"({rs.snapshot_bytes or 0:,} B) of those caches")
    return lines


def rung_host_need(planner: CapacityPlanner, r: Rung) -> tuple[int, int] | None:
    """(at start, at most) host memory of a ladder answer (``CapacityPlanner.host_need``), None where none fits."""
    if r.n_ctx_flag is None:
        return None
    return planner.host_need(planner.params(r.n_ctx_flag, r.max_parallel), r.charge)


def _host_cell(planner: CapacityPlanner, r: Rung) -> str:
    """``42.33 MiB / 9.46 GiB``: a ladder answer's host memory at start and at most."""
    need = rung_host_need(planner, r)
    return "-" if need is None else f"{human(need[0])} / {human(need[1])}"


def _per_gpu(compute_bytes: tuple[int, ...] | None) -> str:
    """``215.00 MiB`` (one GPU) or ``215.00 MiB, 0 B`` (per GPU, in device order)."""
    return ", ".join(human(c) for c in compute_bytes) if compute_bytes else "-"


def _draft_cell(charge: Charge | None) -> str:
    """The MTP draft context's bytes on the GPUs at one setting (``-`` without a draft)."""
    if charge is None or charge.draft is None:
        return "-"
    return human(sum(d.total for d in charge.draft.devices))


def _compute_part(planner: CapacityPlanner, compute_bytes: tuple[int, ...] | None,
                  charge: Charge | None = None) -> str:
    """``, compute 215.00 MiB on the GPUs`` when each setting is charged its own compute buffer (and the MTP draft
    context's bytes on the GPUs when it runs), else nothing."""
    out = ""
    if planner.budget.compute_per_setting and compute_bytes is not None:
        out = f", compute {_per_gpu(compute_bytes)} on the GPU" + ("s" if len(compute_bytes) > 1 else "")
    if charge is not None and charge.draft is not None:
        out += f", MTP draft {_draft_cell(charge)} on the GPUs"
    return out
