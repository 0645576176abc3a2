"""The HTML tables and lines of the capacity report (``rsplan report``): each model's budget line, capacity ladder
and answers, each engine's arithmetic, and the parameters with where every number comes from."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from rsplan.render.capacity import host_words, limit_words, no_context_words
from rsplan.render.report_inputs import EngineReport, ModelReport
from rsplan.render.units import human

if TYPE_CHECKING:  # the profile's models (pydantic) are built only where a report has a profile
    from rsplan.render.profile_input import ProfileResults

#: llama.cpp version whose rules the planner reproduces.
LLAMA_CPP_REF = "0c1e57098"


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bytes_cell(n: int | None) -> str:
    if n is None:
        return "-"
    return f'<span title="{n:,} B">{_e(human(n))}</span>'


def ladder_table(m: ModelReport) -> str:
    rows = []
    planner = m.planner
    for r in m.result.ladder:
        if r.n_ctx_flag is None:
            rows.append([f"{r.ctx_per_seq:,}", "0", _e(limit_words(planner, r.limited_by)), "-", "-", "-", "-"])
            continue
        rows.append([
            f"{r.ctx_per_seq:,}", f"{r.max_parallel}", _e(limit_words(planner, r.limited_by, r.bound_device)),
            f"<code>{_e(planner.flags(planner.params(r.n_ctx_flag, r.max_parallel)))}</code>",
            f"{_bytes_cell(r.cache_bytes)} ({r.cache_bytes:,} B)", _bytes_cell(r.headroom_bytes),
            _per_gpu_cell(r.compute_bytes),
        ])
    return _table(["context per sequence", "max -np", "limited by", "llama.cpp flags", "caches", "headroom",
                   "compute per GPU"], rows, {0})


def _per_gpu_cell(values: tuple[int, ...] | None) -> str:
    """Bytes per GPU, in device order (``-`` when unknown)."""
    return ", ".join(_bytes_cell(v) for v in values) if values else "-"


def budget_line(m: ModelReport) -> str:
    p = m.planner
    b = p.budget
    weights = "weights NOT COUNTED (unknown)" if b.weights_bytes is None else \
        f"weights {human(sum(p.weights_on_device))}"
    n = len(b.devices)
    per = "" if n == 1 else f" over {n} GPUs"
    charge = p.charge_given()
    compute = f"compute {human(sum(charge.compute))}" if charge else "compute (llama.cpp aborts at these flags)"
    draft = f" - MTP draft {human(sum(d.total for d in charge.draft.devices))}" if charge and charge.draft else ""
    text = (f"Budget {human(sum(d.budget_bytes for d in b.devices))}{per} - {weights} - margin "
            f"{human(sum(b.margin_bytes))} - {compute}{draft} = {human(sum(p.cache_budget))} for the caches at the "
            "flags given.")
    if b.compute_per_setting:
        text += " Each answer is charged the compute buffer of its own setting on each GPU (the tables show it)."
    text += f" Weights: {b.weights_source}. Host memory: {host_words(p)}."
    return f"<p class='budget'>{_e(text)}</p>"


def answers(m: ModelReport) -> str:
    planner, result = m.planner, m.result
    out = []
    mc = result.max_ctx
    if mc.n_ctx_flag:
        limit = f", limited by {limit_words(planner, mc.limited_by, mc.bound_device)}"
        flags = planner.flags(planner.params(mc.n_ctx_flag, mc.n_seq_max))
        out.append(f"Largest context at -np {mc.n_seq_max}: {mc.ctx_per_seq:,} tokens per sequence{_e(limit)}: "
                   f"<code>{_e(flags)}</code>; compute {_per_gpu_cell(mc.compute_bytes)} per GPU")
    elif mc.limited_by == "llama_abort_first":
        out.append(f"Largest context at -np {mc.n_seq_max}: {_e(no_context_words(planner, mc.n_seq_max))}")
    else:
        out.append(f"Largest context at -np {mc.n_seq_max}: nothing fits")
    rs = result.max_rs
    if rs.n_rs_seq is None:
        out.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: n/a, {_e(rs.reason)}")
    else:
        flags = planner.flags(planner.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq))
        how = f" {planner.draft.describe()}" if planner.draft.needs_draft_model else ""
        limit = limit_words(planner, rs.limited_by or "", rs.bound_device, rs.draft_bound)
        out.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: {rs.n_rs_seq}{_e(how)}, limited by "
                   f"{_e(limit)}: <code>{_e(flags)}</code>; rollback snapshots {_bytes_cell(rs.snapshot_bytes)} "
                   f"({rs.snapshot_bytes or 0:,} B); compute {_per_gpu_cell(rs.compute_bytes)} per GPU")
    return "<ul>" + "".join(f"<li>{line}</li>" for line in out) + "</ul>"


def sources_table(models: list[ModelReport], profile: ProfileResults | None, profile_path: str | None,
                  command: str) -> str:
    rows: list[list[str]] = [["command", f"<code>{_e(command)}</code>", "as run"]]
    first = models[0].planner
    budget = first.budget
    for d in budget.devices:
        extra = ""
        if d.total_bytes is not None:
            extra = f" (total {d.total_bytes:,} B, free {d.free_bytes:,} B)"
        rows.append([f"budget: {_e(d.name)}", f"{d.budget_bytes:,} B = {_e(human(d.budget_bytes))}",
                     _e(d.source + extra)])
    rows.append(["margin per GPU", ", ".join(f"{x:,} B = {_e(human(x))}" for x in budget.margin_bytes),
                 "--fit-target (MiB; llama.cpp's --fit default is 1024)"])
    charge = first.charge_given()
    per_gpu = ", ".join(f"{c:,} B = {_e(human(c))}" for c in charge.compute) if charge else "llama.cpp aborts"
    kind = f"{budget.device_kind} devices; " if budget.device_kind else ""
    rows.append(["compute buffer per GPU at the flags given", per_gpu,
                 _e(kind + budget.compute_source) + (" (each answer and each heat-map row's boundary is charged "
                                                     "its own setting's)" if budget.compute_per_setting else "")])
    for m in models:
        p = m.planner
        spec, layout = p.spec, p.layout
        w = p.budget.weights_bytes
        rows.append([f"<b>{_e(spec.name)}</b>", "", ""])
        rows.append(["model", f"{_e(spec.arch)}, {layout.n_layer} layers "
                     f"({len(layout.kv_layers)} KV, {len(layout.recurrent_layers)} recurrent), "
                     f"training context {layout.n_ctx_train:,}", f"{_e(m.ref)}: {_e(spec.source)}"])
        rows.append(["context limit", f"{p.ctx_limit.tokens:,} tokens per sequence", _e(p.ctx_limit.note)])
        rows.append(["draft type", _e(p.draft.spec_type + (" with a draft model (-md FILE)"
                                                          if p.draft.needs_draft_model else " (nextn layers)")),
                     "MTP needs the model's own nextn layers; eagle3 / dflash / dspark a separate draft model"])
        rows.append(["row widths", f"n_embd_r {layout.n_embd_r:,}, n_embd_s {layout.n_embd_s:,}",
                     "derived from the model's hyper-parameters by llama.cpp's rules (llama-hparams.cpp)"])
        rows.append(["weights", "<span class='warn'>NOT COUNTED</span>" if w is None
                     else f"{w:,} B = {_e(human(w))}", _e(p.budget.weights_source)])
        rows.append(["weights per GPU", ", ".join(f"{x:,} B" for x in p.weights_on_device),
                     "spread evenly over the offloadable layers on each GPU (an estimate)"])
        split = "" if p.placement.n_devices == 1 else \
            f", split {','.join(f'{x:g}' for x in p.split_parts)}"
        kv = "" if p.placement.offload_kqv else ", caches in host memory (-nkvo)"
        rows.append(["layer placement",
                     _e(f"-ngl {p.placement.n_gpu_layers} of {p.placement.n_layer_all + 1}{split}{kv}"),
                     f"llama.cpp {LLAMA_CPP_REF} layer split (llama-model.cpp load_tensors)"])
        rows.append(["context flags", f"<code>{_e(p.flags(p.base))}</code>",
                     "command line (-c is the total over all sequences)"])
        rows.append(["cache bytes", f"{m.result.usage.total_bytes:,} B at the flags above",
                     f"rsplan planner, exact: llama.cpp {LLAMA_CPP_REF} rules (llama-kv-cache.cpp, "
                     "llama-memory-recurrent.cpp)"])
    if profile is not None:
        rows.append(["profile", f"{len(profile.kernels)} kernels"
                     + (f" on {_e(profile.device)}" if profile.device else ""), _e(profile_path or "")])
    return _table(["what", "value", "source"], rows).replace("<table>", "<table class='sources'>", 1)


def engine_table(e: EngineReport) -> str:
    """One engine's budget arithmetic, answers and flags for one model."""
    if e.capacity is None:
        return f"<h2>{_e(e.model)}: {_e(e.engine)} {_e(e.version)}</h2><p class='warn'>{_e(e.refused)}</p>"
    facts = [[_e(f.label), (f"{f.value:,} B = {_e(human(f.value))}" if f.unit == "B" and isinstance(f.value, int)
                            else _e(f"{f.value:,}" if isinstance(f.value, int) else f.value)), _e(f.note)]
             for f in e.capacity.facts]
    ladder = [[f"{p.max_model_len:,}", str(p.max_concurrency), f"<code>{_e(p.flags)}</code>" if p.flags
               else _e(p.note)] for p in e.capacity.ladder]
    notes_html = "".join(f"<li>{_e(w)}</li>" for w in e.capacity.warnings)
    lines = "".join(f"<li><code>{_e(line)}</code></li>" for line in e.capacity.log_lines)
    return (f"<h2>{_e(e.model)}: {_e(e.engine)} {_e(e.version)}</h2>"
            f"<p>Flags to use: <code>{_e(e.capacity.flags)}</code></p>"
            + _table(["what", "value", "note"], facts)
            + _table(["context per request", "requests at once", f"{_e(e.engine)} flags"], ladder, {0})
            + (f"<p class='note'>{_e(e.engine)} would log:</p><ul class='note'>{lines}</ul>" if lines else "")
            + (f"<ul class='note'>{notes_html}</ul>" if notes_html else ""))

