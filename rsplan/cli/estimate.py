"""``rsplan estimate``: every cache tensor llama.cpp would allocate, with exact bytes.

Several ``--model`` are compared side by side: ``--format table`` shows one column per model (llama.cpp) or one
section per model (``--engine``), ``--format json`` a ``{"models": [...]}`` list of the single-model objects, and
``--format log`` (one llama.cpp run's lines) takes one model.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from rsplan.cli import ends_with_command
from rsplan.cli.engine_options import engine_options, pop_engine_values
from rsplan.cli.errors import user_errors
from rsplan.cli.host_options import given_host_flags, host_options, metal_host, pop_host_options
from rsplan.cli.options import CONTEXT_KEYS, MODEL_HELP, context_options, model_options, pop_context_params
from rsplan.cli.placement_options import PLACEMENT_KEYS, given_placement_flags, placement_options
from rsplan.cli.sections import SectionedCommand, section
from rsplan.errors import BackendError
from rsplan.planner.compute.reserve import OutputsAsked, paused_gc
from rsplan.planner.engines import NATIVE

if TYPE_CHECKING:
    from rsplan.hparams.model import ModelSpec
    from rsplan.planner.backends.buffers import Backend
    from rsplan.planner.caches.plan import MemoryPlan
    from rsplan.planner.estimate.breakdown import Breakdown, WeightTable

#: The Vulkan drivers whose buffer alignments rsplan knows (planner.backends.vulkan_buffers.VULKAN_DEVICE_LIMITS).
VULKAN_DRIVERS = ("nvidia", "radv", "amd-windows", "anv", "intel-windows", "moltenvk", "adreno", "turnip")


OUTPUT_OPTIONS = [
    click.option("--format", "fmt", type=click.Choice(["table", "json", "log"]), default="table", show_default=True,
                 help="table; json (every number); log (the llama.cpp lines, to diff against a real run)."),
    click.option("--per-layer", is_flag=True, help="Table: add one row per layer."),
    click.option("--backend", default="CPU", show_default=True, metavar="NAME",
                 help="Where llama.cpp allocates the caches: the buffer of the table (CPU, CUDA0, ROCm0, MUSA0, "
                 "...) and of --format log (also SYCL0, MTL0, Vulkan0[:ALIGN]); its rules pad each tensor."),
    click.option("--vulkan-driver", "vulkan_driver", type=click.Choice(VULKAN_DRIVERS), default=None,
                 help="With a Vulkan0 --backend: the driver whose buffer alignments (minStorageBufferOffsetAlignment, "
                 "minMemoryMapAlignment) size the buffers; default nvidia (docs/sizing.md 9b lists each). "
                 "Vulkan0:ALIGN gives the first one itself."),
    click.option("--tool", type=click.Choice(["server", "cli"]), default="server", show_default=True,
                 help="Whose n_outputs_max sizes the compute buffer: llama-server (-np x (1 + draft)) or "
                 "llama-bench/llama-fit-params/library users (n_batch; this llama.cpp's llama-cli runs llama-server "
                 "in-process: server)."),
    click.option("--quant", metavar="TYPE", default=None,
                 help="Weights as llama-quantize TYPE (Q4_K_M, Q8_0, BF16, ...) writes them from the bf16 GGUF: "
                 "exact model bytes (presets, config.json files giving vocab_size; not a GGUF)."),
]

@click.command(cls=SectionedCommand)
@model_options(multiple=True, help_text=MODEL_HELP + " Repeat to compare models side by side.")
@context_options
@engine_options
@section("Output", OUTPUT_OPTIONS)
@section("GPU layers (with a GPU --backend)", placement_options("one device (CUDA0: -ts 1,1 adds CUDA1)"))
@host_options
@user_errors
# the collector would scan what this command loads and builds (alive until it ends) some 20 times as it runs, and
# everything once more as the interpreter exits: about 25 ms of a 190 ms start-up (planner.compute.reserve.paused_gc)
@paused_gc(ends_with_command)
def estimate(model_refs: tuple[str, ...], per_layer: bool, fmt: str, backend: str, tool: str, engine: str,
             quant: str | None, vulkan_driver: str | None, **kwargs: Any) -> None:
    """Exact bytes of every KV and recurrent-state cache tensor, as llama.cpp allocates them (or, with --engine
    vllm|sglang, that engine's state shapes, pages, blocks and the memory its flags need).

    \b
    Examples:
      rsplan estimate --model qwen3-next-80b-a3b -c 32k -np 4
      rsplan estimate --model qwen3-next-80b-a3b -c 0 -np 8 --spec-type mtp --spec-draft-n-max 4 --format json
      rsplan estimate --model model.gguf -c 8192 --format log --backend CUDA0
      rsplan estimate --model lfm2-1.2b --model mamba2-130m -c 8k
      rsplan estimate --model nemotron-h-8b-base-8k --engine vllm --max-num-seqs 64 --kv-cache-memory-bytes 40GiB
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import read_model

    ctx = click.get_current_context()
    refs = list(model_refs)
    values = pop_engine_values(kwargs, engine, CONTEXT_KEYS)
    if engine != NATIVE and quant is not None:
        raise click.UsageError("--quant applies to --engine llama.cpp only (llama-quantize's types)", ctx)
    placement = {key: kwargs.pop(key) for key in PLACEMENT_KEYS}
    if engine != NATIVE:
        given = given_host_flags(ctx) + given_placement_flags(ctx)
        if given:
            raise click.UsageError(f"{given[0]} applies to --engine llama.cpp only", ctx)
        _estimate_engine(refs, engine, values, per_layer, fmt, ctx)
        return
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.caches.plan import build_plan
    from rsplan.planner.estimate.breakdown import build_breakdown

    buffer = _native_output(refs, per_layer, fmt, backend, ctx)
    offload = _offload_flags(placement, ctx, backend)
    alignments, device_note = _device_properties(buffer, vulkan_driver, ctx)
    host = pop_host_options(kwargs, ctx)
    apple = metal_host(host, ctx) if buffer.name.startswith("MTL") else host
    if apple is not host:
        host = apple
        device_note = (f"{device_note}; its CPU: an ARM core with i8mm (M2 or newer) for the host weights' repacking "
                       "(--cpu-repack arm-dotprod for an M1)")
    spec_type, draft_max = kwargs["spec_type"], kwargs["draft_max"]
    params = pop_context_params(kwargs)
    models = [_model_weights(ref, read_model(ref), quant, buffer.name) for ref in refs]
    plans = [build_plan(m.spec, params) for m in models]
    _check_runnable_draft([m.spec for m in models], plans, spec_type)
    n_draft = 0 if spec_type == "none" else (3 if draft_max is None else draft_max)
    outputs = OutputsAsked(tool=tool, n_draft=n_draft)
    estimates = [_ModelEstimate(m.spec, plan, m.noted(build_breakdown(
        m.spec, params, plan, backend=buffer.name, outputs=outputs, mtp=spec_type == "mtp", table=m.weight_table(),
        host=host, offload=offload, alignments=alignments).with_device_note(device_note)))
        for m, plan in zip(models, plans, strict=True)]
    if device_note and fmt == "log":  # the log's lines stay llama.cpp's; the assumption goes to stderr
        click.echo(f"rsplan: {device_note}", err=True)
    _print_native(estimates, buffer, per_layer, fmt, backend)


@dataclasses.dataclass(frozen=True)
class _ModelEstimate:
    """One ``--model``'s estimate: its spec, its cache plan and its whole-device breakdown (None where the backend
    has none: the cache lines only)."""

    spec: ModelSpec
    plan: MemoryPlan
    breakdown: Breakdown | None


@dataclasses.dataclass(frozen=True)
class _ModelWeights:
    """One model's spec and weight tensors as estimate sizes them.

    Attributes:
        spec: the spec llama.cpp's plan sizes (weights_bytes set where the tensor list was quantized).
        tensors / rows / shapes / alignment: the tensor table (a GGUF's, or the quantized list's), or None.
        note: a note for the breakdown (why a config.json's vocabulary is unknown), or None.
        source: where the model bytes come from where this command sized them (the tensor list quantized).
    """

    spec: ModelSpec
    tensors: Any
    rows: Any
    shapes: Any
    alignment: int
    note: str | None = None
    source: str | None = None

    def weight_table(self) -> WeightTable | None:
        """The tensor table with each tensor's shape, where all of it is known (the breakdown sizes it exactly)."""
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.planner.estimate.breakdown import WeightTable

        if self.tensors and self.rows and self.shapes:
            return WeightTable(self.tensors, self.rows, self.shapes, self.alignment)
        return None

    def noted(self, bd: Breakdown) -> Breakdown:
        """``bd`` with this model's note and weights source."""
        if self.note:
            bd = dataclasses.replace(bd, notes=(*bd.notes, self.note))
        return bd.with_weights_source(self.source) if self.source else bd


def _model_weights(ref: str, read: Any, quant: str | None, backend: str) -> _ModelWeights:
    """The weights of one ``--model``: a GGUF's tensor table or a model file's size as read; else the tensor list
    quantized to ``--quant`` or, with neither, to planner.weights.default_weights.DEFAULT_QUANT where the model has a
    tensor list (without one its model bytes stay unknown, and the breakdown says so)."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.errors import RsplanError
    from rsplan.planner.backends.buffers import CPU_RULE, device_rule
    from rsplan.planner.weights.default_weights import DEFAULT_QUANT, DEFAULT_QUANT_NOTE, llama_cpp_spec
    from rsplan.planner.weights.quant_weights import quantized_model

    spec = llama_cpp_spec(read)  # a checkpoint's bytes are not llama.cpp's: sized at the default
    vocab = read.facts.get("vocab_size_unknown")
    # a config.json that does not give the token count says why, beside the buffers it leaves unsized
    as_read = _ModelWeights(spec, read.tensors, read.tensor_rows, read.tensor_shapes, read.tensor_alignment,
                            f"vocab_size: {vocab}" if vocab is not None else None)
    default = quant is None and read.tensors is None and spec.weights_bytes is None
    if quant is None and not default:
        return as_read
    try:
        rule = CPU_RULE if backend == "CPU" else device_rule(backend)
        q = quantized_model(ref, spec, quant or DEFAULT_QUANT, rule, vocab_unknown=vocab)
    except RsplanError:
        if not default:
            raise
        return as_read
    return _ModelWeights(q.spec, q.table, q.weights.rows, q.weights.shapes, 32,
                         source=q.note + (f" ({DEFAULT_QUANT_NOTE})" if default else ""))


def _device_properties(buffer: Backend, driver: str | None, ctx: click.Context
                       ) -> tuple[tuple[int | None, int | None], str | None]:
    """The device and host buffer alignments of a Vulkan ``--backend`` (``Vulkan0:ALIGN`` and ``--vulkan-driver``,
    else the default driver's: planner.backends.vulkan_buffers), with the line saying what was assumed; (None, None)
    and the GPU's assumption (Metal's family), or none, for the other backends."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.backends.vulkan_buffers import DEFAULT_VULKAN_DEVICE, VULKAN_DEVICE_LIMITS

    if not buffer.name.startswith("Vulkan"):
        if driver is not None:
            raise click.UsageError("--vulkan-driver applies to a Vulkan --backend (Vulkan0, ...)", ctx)
        if buffer.name.startswith("MTL"):
            return (None, None), "Metal device: an Apple Silicon GPU (M1 or newer) assumed"
        return (None, None), None
    limits = VULKAN_DEVICE_LIMITS[driver or DEFAULT_VULKAN_DEVICE]
    given = buffer.rules[0].alignment if len(buffer.rules) == 1 else None
    storage = given or limits.storage_alignment
    whose = "given" if driver else "assumed (--vulkan-driver for another)"
    note = (f"Vulkan device: {driver or DEFAULT_VULKAN_DEVICE} driver {whose}: minStorageBufferOffsetAlignment "
            f"{storage}{' (' + buffer.name + ':' + str(given) + ')' if given else ''}, minMemoryMapAlignment "
            f"{limits.map_alignment}")
    return (storage, limits.map_alignment), note


def _offload_flags(placement: dict[str, Any], ctx: click.Context, backend: str) -> Any:
    """The GPU placement flags as planner.estimate.offload.OffloadFlags; a usage error where they are given with
    the CPU backend, which has no GPU to place layers on."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.cli.placement_options import override_flags, parse_ngl, parse_tensor_split
    from rsplan.planner.estimate.offload import OffloadFlags

    given = given_placement_flags(ctx)
    if given and backend == "CPU":
        raise click.UsageError(f"{given[0]} places layers on GPUs: give a GPU --backend (CUDA0, MTL0, Vulkan0, ...)",
                               ctx)
    return OffloadFlags(parse_ngl(placement["n_gpu_layers"]), parse_tensor_split(placement["tensor_split"]),
                        override_flags(ctx, placement), not placement["no_kv_offload"])


def _native_output(refs: list[str], per_layer: bool, fmt: str, backend: str, ctx: click.Context) -> Backend:
    """Check the output options of a llama.cpp estimate; return ``--backend``'s buffer (every backend rsplan knows
    has its whole breakdown: planner.backends.devices)."""
    if fmt != "table" and per_layer:
        raise click.UsageError(f"--per-layer applies to --format table only (--format {fmt} has every tensor)", ctx)
    if fmt == "log" and len(refs) > 1:
        raise click.UsageError(f"--format log prints one llama.cpp run's lines: give one --model (got {len(refs)}), "
                               "or compare with --format table or json", ctx)
    if per_layer and len(refs) > 1:
        raise click.UsageError(f"--per-layer shows one model's layers: give one --model (got {len(refs)})", ctx)
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.backends.buffers import parse_backend

    try:
        buffer = parse_backend(backend)
    except BackendError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="--backend") from None
    return buffer


def _print_native(estimates: list[_ModelEstimate], buffer: Backend, per_layer: bool, fmt: str, backend: str) -> None:
    """Print the llama.cpp plans (one per model) with their breakdowns, as ``fmt``."""
    plans = [e.plan for e in estimates]
    if fmt == "json":
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        import json

        dicts = [{**e.plan.to_dict(), **e.breakdown.to_dict()} for e in estimates if e.breakdown is not None]
        click.echo(json.dumps(dicts[0] if len(dicts) == 1 else {"models": dicts}, indent=2))
    elif fmt == "log":
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.planner.estimate.load_log import load_log_lines

        first = estimates[0]
        for line in load_log_lines(first.plan, first.breakdown, buffer, first.spec.info.memory == "hybrid"):
            click.echo(line)
    elif len(plans) > 1:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.plan_table import render_comparison

        click.echo(render_comparison(plans, backend=backend))
    else:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.plan_table import render_plan

        click.echo(render_plan(plans[0], per_layer=per_layer, backend=backend, breakdown=estimates[0].breakdown))


def _check_runnable_draft(specs: list[Any], plans: list[Any], spec_type: str) -> None:
    """Refuse what llama.cpp would not run: ``--spec-type mtp`` for a model without MTP layers, and rollback
    planes past the batch split's bound (``n_ubatch > n_rs_seq + 1``), as capacity does."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.caches.speculative import check_draft, check_spec_type

    for spec, plan in zip(specs, plans, strict=True):
        if spec_type != "none":
            check_spec_type(spec, spec_type)
        what = "--spec-draft-n-max" if spec_type != "none" else "--n-rs-seq"
        check_draft(plan.context.n_rs_seq, plan.context.n_ubatch, what)


def _estimate_engine(refs: list[str], engine: str, values: dict[str, Any], per_layer: bool, fmt: str,
                     ctx: click.Context) -> None:
    """``estimate --engine vllm|sglang``: the engine's plan, as a table or JSON (one section / object per model)."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines import engine as load_engine

    if (fmt == "log" or per_layer or ctx.get_parameter_source("backend") != ParameterSource.DEFAULT
            or ctx.get_parameter_source("tool") != ParameterSource.DEFAULT):
        given = ("--format log" if fmt == "log" else "--per-layer" if per_layer
                 else "--backend" if ctx.get_parameter_source("backend") != ParameterSource.DEFAULT else "--tool")
        raise click.UsageError(f"{given} applies to --engine llama.cpp only", ctx)
    rules = load_engine(engine)
    settings = rules.settings(values)
    plans = [rules.plan(load_model(ref), settings) for ref in refs]
    if fmt == "json":
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        import json

        dicts = [plan.to_dict() for plan in plans]
        click.echo(json.dumps(dicts[0] if len(dicts) == 1 else {"models": dicts}, indent=2))
    else:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.engine import render_engine_plan

        click.echo("\n\n".join(render_engine_plan(plan) for plan in plans))
