"""``rsplan fit``: llama.cpp's ``--fit`` offline (planner.fit.steps), for devices the user gives or has.

It answers what llama-server / llama-cli would choose at start-up (``--fit on`` is their default) on devices with
the given free memory: the context, ``-ngl``, ``-ts`` and ``-ot``, as ``llama-fit-params`` prints them, with the
projected memory per device and on the host, and a check llama.cpp does not make: whether the host can hold what
stays there (weights, host caches and compute buffer, the output buffer, llama-server's checkpoints).
"""

from __future__ import annotations

import json
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli import ends_with_command
from rsplan.cli.budget import DEVICE_KIND_OPTION, parse_fit_target
from rsplan.cli.errors import user_errors
from rsplan.cli.host_options import host_options, pop_host_options
from rsplan.cli.options import context_options, model_options, pop_context_params
from rsplan.cli.placement_options import override_flags, override_options, parse_tensor_split, read_ngl
from rsplan.cli.sections import Decorator, SectionedCommand, section
from rsplan.errors import RsplanError
from rsplan.planner.compute.reserve import paused_gc
from rsplan.render.units import parse_size

FIT_OPTIONS: list[Decorator] = [
    click.option("--budget", metavar="SIZE[,SIZE...]", default=None,
                 help="Free memory per device, with units (24GiB, 81920MiB); several values = several devices. "
                 "Without --budget and --gpu: no device (a CPU-only build, as llama.cpp on a machine without "
                 "GPUs)."),
    click.option("--gpu", metavar="[INDEX,...]", is_flag=False, flag_value="all", default=None,
                 help="Read the devices' free memory from these NVIDIA GPUs via NVML (no value: every GPU)."),
    DEVICE_KIND_OPTION,
    click.option("--host-budget", metavar="SIZE", default=None,
                 help="Host memory. Default: with --budget (another machine) none: the answer states what it "
                 "needs; else this machine's (llama.cpp's --fit without devices budgets the total memory; rsplan's "
                 "host check the memory available now)."),
    click.option("-fitt", "--fit-target", "fit_target", metavar="MiB[,MiB...]", default="1024", show_default=True,
                 help="Margin to leave free per device, MiB (one value for all devices)."),
    click.option("-fitc", "--fit-ctx", "fit_ctx", type=click.IntRange(0, 2**32 - 1), default=4096,
                 show_default=True, metavar="N", help="Smallest context per sequence --fit may choose."),
    click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "n_gpu_layers", metavar="N|auto|all", default=None,
                 help="As given to llama.cpp: a value other than auto stops --fit from moving layers."),
    click.option("-ts", "--tensor-split", "tensor_split", metavar="A,B,...", default=None,
                 help="As given to llama.cpp (several devices: stops --fit from moving layers)."),
    *override_options("They stop --fit from moving layers."),
    click.option("-nkvo", "--no-kv-offload", "no_kv_offload", is_flag=True,
                 help="llama.cpp -nkvo: every cache in host memory."),
    click.option("-ctxcp", "--ctx-checkpoints", "ctx_checkpoints", type=click.IntRange(0, 1 << 20), default=32,
                 show_default=True, metavar="N",
                 help="llama-server --ctx-checkpoints: context checkpoints per slot, counted in the host check at "
                 "this limit; 0 turns them off."),
    click.option("--compute", "compute", metavar="SIZE", default=None,
                 help="Compute buffer per device instead of rsplan's model of it (e.g. read from a real log)."),
    click.option("--quant", metavar="TYPE", default=None,
                 help="Weights as llama-quantize TYPE writes them from the bf16 GGUF (presets with a tensor "
                 "list; default Q4_K_M); a GGUF gives its own tensors."),
]

OUTPUT_OPTIONS = [
    click.option("--tool", type=click.Choice(["server", "cli"]), default="server", show_default=True,
                 help="Whose start-up fit: llama-server's (its outputs size the compute buffer; also llama-cli's, "
                 "which runs llama-server in-process) or llama-fit-params' (n_batch outputs)."),
    click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                 help="table, or json (every number)."),
    click.option("--explain", is_flag=True,
                 help="Also print llama-fit-params' own line, the host's items, --fit's steps and the notes."),
]


@click.command(cls=SectionedCommand, context_settings={"default_map": {"n_ctx": 0}})
@model_options()
@context_options
@section("Devices and --fit", FIT_OPTIONS)
@section("Output", OUTPUT_OPTIONS)
@host_options
@user_errors
@paused_gc(ends_with_command)
def fit(model_ref: str, fmt: str, explain: bool, **options: Any) -> None:
    """What llama.cpp's --fit would choose: context, -ngl, -ts, -ot, for the given devices.

    Mirrors llama.cpp's start-up fitting (common/fit.cpp, on by default in llama-server and llama-cli) step by
    step, with rsplan's byte counts in place of its dry runs; -c defaults to 0 (the training context, reduced
    as needed) as in llama.cpp. Where --fit gives up, the answer is printed and the exit status is 1, as
    llama-fit-params's. --load-mode / --no-mmap / --no-repack go into the command printed: llama.cpp's
    --fit measures a dry run that never maps the file and keeps repacked weights at their size, so they do not
    change the fit.

    \b
    Examples:
      rsplan fit -m lfm2-8b-a1b --quant Q4_K_M --budget 8GiB
      rsplan fit -m qwen3-next-80b-a3b --quant Q4_K_M --budget 24GiB,24GiB -np 4
      rsplan fit -m model.gguf --gpu
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.fit.run import FitOptions, run_fit
    from rsplan.render.fit import fit_json, fit_table

    ctx = click.get_current_context()
    explicit_ctx = ctx.get_parameter_source("n_ctx") == ParameterSource.COMMANDLINE
    spec_type = options["spec_type"]
    if spec_type not in ("none", "mtp"):
        raise RsplanError(f"--spec-type {spec_type}: needs a separate draft model (-md), whose weights, caches and "
                          "compute llama.cpp's --fit adds as an extra model; rsplan fit models only --spec-type mtp "
                          "(the draft context on the model's own MTP layers)")
    if spec_type == "none" and (options["n_rs_seq"] or 0) > 0:
        # llama.cpp keeps rollback planes only with speculative decoding (n_rs_seq is --spec-draft-n-max)
        raise RsplanError("--n-rs-seq: llama.cpp keeps rollback planes only with speculative decoding; give "
                          "--spec-type mtp [--spec-draft-n-max N] instead")
    host = pop_host_options(options, ctx)  # contradictions first, as estimate's
    if host.repack.repacks and ctx.get_parameter_source("cpu_repack") != ParameterSource.DEFAULT:
        raise RsplanError(f"--cpu-repack {host.repack.name}: rsplan fit measures llama.cpp's --fit dry run for the "
                          "default target only (x86-avx2: a repacked weight keeps its bytes, a tied output it repacks "
                          "is a second copy); other targets, such as AMX's larger layout, are not modelled in fit "
                          "(estimate, capacity and report lay the host buffers out by it)")
    params = pop_context_params(options)
    opts = FitOptions(
        budgets=_budgets(options["budget"], options["gpu"]),
        device_kind=options["device_kind"],
        **_host(options["host_budget"], another_machine=options["budget"] is not None),
        margins=parse_fit_target(options["fit_target"]),
        fit_ctx=options["fit_ctx"], explicit_zero_ctx=explicit_ctx and params.n_ctx == 0,
        n_gpu_layers=_ngl(options["n_gpu_layers"]), tensor_split=parse_tensor_split(options["tensor_split"]),
        override_flags=override_flags(ctx, options),
        no_kv_offload=options["no_kv_offload"],
        compute=_size_or_none(options["compute"], "--compute", allow_zero=True),
        quant=options["quant"], tool=options["tool"], ctx_checkpoints=options["ctx_checkpoints"],
        spec_mtp=spec_type == "mtp", host=host,
    )
    answer = run_fit(model_ref, params, opts)
    click.echo(json.dumps(fit_json(answer), indent=2) if fmt == "json" else fit_table(answer, explain))
    if answer.result.failure:
        ctx.exit(1)  # as llama-fit-params (tools/fit-params/fit-params.cpp:40 exit), the answer printed first


def _host(text: str | None, another_machine: bool) -> dict[str, Any]:
    """The host budget: ``--host-budget``; else none where ``--budget`` describes another machine (whose RAM
    rsplan does not know: the answer states what it needs; llama.cpp's --fit budgets the host only without devices,
    planner.fit.steps ``_fits_as_is``, so with --budget its total is not read); else this machine's (--gpu, or no
    device)."""
    if text is not None:
        size = _size_or_none(text, "--host-budget")
        return {"host_total": size, "host_available": size, "host_source": f"--host-budget {text.strip()}"}
    if another_machine:
        return {"host_total": 0, "host_available": None, "host_source": "not limited (another machine: "
                "--host-budget SIZE checks it)"}
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.cli.budget import host_memory

    total, available = host_memory()
    return {"host_total": total, "host_available": available, "host_source": "this machine"}


def _size_or_none(text: str | None, what: str, allow_zero: bool = False) -> int | None:
    if text is None:
        return None
    if text.strip().startswith("-"):
        raise RsplanError(f"{what}: must be positive, got '{text.strip()}'")
    return parse_size(text, what, allow_zero=allow_zero, require_unit=True)


def _budgets(budget: str | None, gpu: str | None) -> list[tuple[str, int]] | None:
    """(description, free bytes) per device; None without devices."""
    if budget is not None and gpu is not None:
        raise RsplanError("give either --budget or --gpu, not both")
    if budget is not None:
        out = []
        for size in (s.strip() for s in budget.split(",")):
            if size.startswith("-"):
                raise RsplanError(f"--budget: must be positive, got '{size}'")
            out.append((f"--budget {size}", parse_size(size, "--budget", require_unit=True)))
        return out
    if gpu is None:
        return None
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.gpu import gpu_memory as read_gpus

    indices = None
    if gpu != "all":
        try:
            indices = [int(i) for i in gpu.split(",")]
        except ValueError:
            raise RsplanError(f"--gpu: expected GPU indices like 0 or 0,1, got '{gpu}'") from None
    return [(f"NVML GPU{g.index} {g.name} free memory", g.free_bytes) for g in read_gpus(indices)]


def _ngl(text: str | None) -> int | None:
    """llama.cpp's -ngl for --fit: None for unset and for auto / -1 (the default, which --fit may change), else the
    value as given (``all`` -2; any value but -1 stops --fit from moving layers, common/fit.cpp:463 n_gpu_layers)."""
    if text is None:
        return None
    ngl = read_ngl(text)
    return None if ngl == -1 else ngl
