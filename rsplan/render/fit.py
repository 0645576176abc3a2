"""``rsplan fit`` output: the flags llama.cpp's --fit would choose, per-device memory, the host check, the steps."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from rsplan.planner.capacity.llama_flags import llama_flags
from rsplan.planner.fit.memory import DeviceUsage
from rsplan.planner.fit.run import FitAnswer
from rsplan.render.tables import command_lines, prose, table
from rsplan.render.units import mib


def _command(a: FitAnswer) -> str:
    """llama-server with the context flags as given (planner.capacity.llama_flags, the fitted -c), the fitted
    layer flags and the load mode / repacking asked for (HostOptions.flags); the flags are already fitted, so
    --fit off keeps llama.cpp from fitting again (it would refuse: -ngl is set)."""
    nkvo = ["-nkvo"] if a.no_kv_offload else []
    return " ".join(["llama-server -m", _model(a), llama_flags(a.params, ctx_checkpoints=a.ctx_checkpoints),
                     a.command_placement_flags, *nkvo, *a.host.flags(), "--fit off"])


def _usage_row(name: str, free: int | None, margin: int | None, u: DeviceUsage) -> list[str]:
    left = "" if free is None else mib(free - u.total)
    return [name, "" if free is None else mib(free), mib(u.model), mib(u.context), mib(u.compute), mib(u.total),
            left, "" if margin is None else mib(margin)]


def host_line(a: FitAnswer) -> str:
    """The host memory the start needs (at start, at most), and its budget or why there is none."""
    need = f"needs {mib(a.host_start_bytes)} MiB at start, up to {mib(a.host_bytes)} MiB"
    if a.host_budget is None:
        return f"{need}; {a.host_budget_source}"
    return f"{need}, of {mib(a.host_budget)} MiB ({a.host_budget_source})"


def _model(a: FitAnswer) -> str:
    return shlex.quote(a.model_ref) if a.is_file else "MODEL.gguf"


def run_command(a: FitAnswer) -> str:
    """The plain command that lets llama.cpp choose (--fit is on by default, common/common.h fit_params): the
    context flags as given (no -c where none was given: --fit then lowers the training context as needed), the
    placement flags only where the user gave them (--fit changes nothing then), the load mode asked for."""
    given = a.given_params or a.params
    ctx = llama_flags(given, ctx_checkpoints=a.ctx_checkpoints)
    if not a.ctx_given:
        ctx = ctx.removeprefix(f"-c {given.n_ctx} ")
    flags = a.result.flags
    user_placement = not a.result.changed and (flags.n_gpu_layers is not None or flags.overrides
                                               or flags.tensor_split)
    nkvo = ["-nkvo"] if a.no_kv_offload else []
    return " ".join(["llama-server -m", _model(a), ctx, *([a.command_placement_flags] if user_placement else []),
                     *nkvo, *a.host.flags()])


def chosen_flags(a: FitAnswer) -> str:
    """The flags --fit chooses, as short as llama.cpp's flags write them (its -ot entries merged: FitAnswer)."""
    return f"-c {a.result.flags.n_ctx} {a.command_placement_flags}"


def fit_table(a: FitAnswer, explain: bool = False) -> str:
    """``rsplan fit``'s text: the plain command, what --fit chooses and the same start pinned, the host's need,
    the devices; ``explain`` adds llama-fit-params' own line, the host items, --fit's steps and the notes."""
    r = a.result
    lines = [prose(f"llama.cpp --fit for {a.model} ({a.weights_source}), "
                   + (f"{len(a.device_names)} device(s)" if a.device_names else "no device (CPU only)"))]
    if r.failure:
        lines.append(f"--fit gives up: {r.failure}; llama.cpp starts with the flags as given "
                     "(llama-fit-params exits 1)")
    else:
        lines.append(command_lines("Run:     ", run_command(a)) + "  # --fit, on by default, places the layers")
        lines.append(command_lines("Chosen:  ", chosen_flags(a)) + ("" if r.changed else "  # no change needed"))
        lines.append(command_lines("Pinned:  ", _command(a)))
        if explain:
            lines.append(f"llama-fit-params prints: {a.fitted_flags}")
        if not a.is_file:
            lines.append(f"  (MODEL.gguf: your GGUF of {a.model})")
    lines.append(prose(f"Host:    {host_line(a)}"))
    rows = [_usage_row(f"{n} ({s})", free, m, u) for n, s, free, m, u in
            zip(a.device_names, a.device_sources, a.device_free, a.margins[:len(a.device_names)], r.usage.devices,
                strict=True)]
    rows.append(_usage_row("Host", None, None, r.usage.host))
    lines += ["", table(rows, ["device", "free MiB", "model MiB", "context MiB", "compute MiB", "total MiB",
                               "left MiB", "margin MiB"],
                        align=["left"] + ["right"] * 7, wrap=[0])]
    if a.draft is not None:
        parts = [f"{n} KV {mib(u.context)} + compute {mib(u.compute)} MiB"
                 for n, u in zip([*a.device_names, "Host"], [*a.draft.devices, a.draft.host], strict=True)
                 if u.context or u.compute]
        lines.append("MTP draft context (--spec-type mtp; included in the rows above, as --fit adds it): "
                     + "; ".join(parts))
    budget = "not limited" if a.host_budget is None else f"{a.host_budget_source}: {mib(a.host_budget)} MiB"
    if not explain:
        return "\n".join(lines + _host_limit_lines(a) + _action_notes(a))
    lines += ["", f"Host memory ({budget}):"]
    items = [[i.what, mib(i.bytes), "grows to" if i.grows else "at start"] for i in a.host_items]
    lines.append(table([*items, ["at start", mib(a.host_start_bytes), ""], ["at most", mib(a.host_bytes), ""]],
                       ["host item", "MiB", "when"], align=["left", "right", "left"]))
    lines += _host_limit_lines(a)
    lines += ["", "Steps:"] + [prose(t) for t in r.trace]
    notes = list(a.notes)  # fit_run notes why per-device compute is an estimate where it is (compute_exact)
    if not a.compute_exact:
        notes.append("--compute SIZE overrides the per-device compute buffer")
    if notes:
        lines += ["", "Notes:"] + [prose(n) for n in notes]
    return "\n".join(lines)


def _action_notes(a: FitAnswer) -> list[str]:
    """The default output's notes: a wrapped plan (it changes what llama.cpp does) said in one line."""
    if a.result.wrapped:
        return ["", prose("Note: llama.cpp's --fit wraps a layer count around here (uint32_t arithmetic); the "
                          "choice above is what it makes of them (--explain)")]
    return []


def _host_limit_lines(a: FitAnswer) -> list[str]:
    """Where the start does not fit the host budget (at start, or once the checkpoints have grown)."""
    lines = []
    if a.host_budget is not None and a.host_start_bytes > a.host_budget:
        lines.append(f"Limited by: host memory: {mib(a.host_start_bytes)} MiB needed at start, {mib(a.host_budget)} "
                     "MiB available: this start would swap or fail (llama.cpp's --fit checks the host only when "
                     "there is no device)")
    elif a.host_budget is not None and a.host_bytes > a.host_budget:
        lines.append(f"Host memory: llama-server's context checkpoints can grow past the host budget ("
                     f"{mib(a.host_bytes)} of {mib(a.host_budget)} MiB); lower --ctx-checkpoints (now "
                     f"{a.ctx_checkpoints} per slot) to bound them")
    return [prose(line) for line in lines]


def fit_json(a: FitAnswer) -> dict[str, Any]:
    r = a.result
    return {
        "model": a.model,
        "weights": a.weights_source,
        "fitted_flags": None if r.failure else a.fitted_flags,
        "chosen_flags": None if r.failure else chosen_flags(a),
        "run_command": run_command(a),
        "command": None if r.failure else _command(a),
        "changed": r.changed,
        "failure": r.failure,
        "n_ctx": r.flags.n_ctx,
        "n_gpu_layers": -1 if r.flags.n_gpu_layers is None else r.flags.n_gpu_layers,
        "tensor_split": list(r.flags.tensor_split) if r.flags.tensor_split else None,
        "overrides": [o.flag_text(a.device_names) for o in r.flags.overrides],
        "devices": [{"name": n, "source": s, "free_bytes": f, "margin_bytes": m, **dataclasses.asdict(u),
                     "total_bytes": u.total}
                    for n, s, f, m, u in zip(a.device_names, a.device_sources, a.device_free,
                                             a.margins[:len(a.device_names)], r.usage.devices, strict=True)],
        "host": {**dataclasses.asdict(r.usage.host), "total_bytes": r.usage.host.total},
        "host_check": {"budget_bytes": a.host_budget, "source": a.host_budget_source,
                       "items": [dataclasses.asdict(i) for i in a.host_items],
                       "start_bytes": a.host_start_bytes, "max_bytes": a.host_bytes,
                       "fits_at_start": None if a.host_budget is None else a.host_start_bytes <= a.host_budget,
                       "fits_at_most": None if a.host_budget is None else a.host_bytes <= a.host_budget},
        "compute_exact": a.compute_exact,
        "mtp_draft": None if a.draft is None else {
            "devices": [{"name": n, **dataclasses.asdict(u)} for n, u in zip(a.device_names, a.draft.devices,
                                                                               strict=True)],
            "host": dataclasses.asdict(a.draft.host)},
        "trace": r.trace,
        "measurements": r.measurements,
        "notes": a.notes,
    }
