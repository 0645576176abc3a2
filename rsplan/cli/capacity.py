"""``rsplan capacity``: the most ``-np``, ``-c`` and ``n_rs_seq`` that fit a GPU, and the llama.cpp flags to use.

The budget options (``--budget`` / ``--gpu``, ``--weights``, ``--fit-target``, ``--compute``, ``-ngl``,
``--tensor-split``, ``--no-kv-offload``) are shared with ``rsplan report`` through ``budget_options``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import click

from rsplan.cli.engine_options import engine_options, pop_engine_values
from rsplan.cli.errors import user_errors
from rsplan.cli.options import CONTEXT_KEYS, context_options, model_options, pop_context_params
from rsplan.cli.sections import Decorator, SectionedCommand, section
from rsplan.errors import RsplanError
from rsplan.planner.context import CTX_PAD, MAX_CTX
from rsplan.planner.engines import NATIVE
from rsplan.planner.placement import MAX_DEVICES
from rsplan.render.units import MAX_SIZE, parse_size, shown

#: ``--ctx`` entries: tokens, or ``<n>k`` for n * 1024 tokens (as people say "8k context").
_CTX = re.compile(r"^\s*([0-9]{1,12})\s*([kK]?)\s*$", re.ASCII)
#: The largest context per sequence: llama.cpp pads it to a multiple of 256 and keeps it in a uint32.
MAX_CTX_PER_SEQ = MAX_CTX // CTX_PAD * CTX_PAD

#: The "Memory budget" section of capacity's and report's --help (rsplan.cli.sections): one line per option.
BUDGET_OPTIONS: list[Decorator] = [
    click.option("--budget", metavar="SIZE[,SIZE...]", default=None,
                 help="Memory per GPU, with units (24GiB, 80GB, 81920MiB); several values = several GPUs."),
    click.option("--gpu", metavar="[INDEX,...]", is_flag=False, flag_value="all", default=None,
                 help="Read the budget from these NVIDIA GPUs via NVML (no value: every GPU)."),
    click.option("--gpu-memory", type=click.Choice(["free", "total"]), default=None,
                 help="With --gpu: budget the GPUs' free memory (default, as llama.cpp's --fit does) or their "
                 "total memory (an empty GPU)."),
    click.option("--weights", "weights", metavar="SIZE", multiple=True,
                 help="Model weights, with units; overrides the model file's size. Without it and without a "
                 "size in the model file, weights are NOT counted (the output says so)."),
    click.option("--quant", "quant", metavar="TYPE", default=None,
                 help="Weights as llama-quantize TYPE (Q4_K_M, Q8_0, BF16, ...) writes them from the bf16 GGUF "
                 "(presets with vocab_size); --weights overrides it."),
    click.option("--fit-target", "fit_target", metavar="MiB[,MiB...]", default="1024", show_default=True,
                 help="Margin left free on each GPU, MiB (llama.cpp's --fit-target; one value for all GPUs)."),
    click.option("--compute", "compute", metavar="SIZE", default=None,
                 help="Compute buffer per GPU. Default: llama.cpp's compute buffer for -c/-np as rsplan models "
                 "it (llama-server's outputs), or 512MiB for archs it does not model."),
    click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "n_gpu_layers", metavar="N|all", default=None,
                 help="Layers on the GPUs, counted from the last (llama.cpp -ngl); default all."),
    click.option("-ts", "--tensor-split", "tensor_split", metavar="A,B,...", default=None,
                 help="Proportions of the layers per GPU (llama.cpp -ts); default: by free memory / budget."),
    click.option("-nkvo", "--no-kv-offload", "no_kv_offload", is_flag=True,
                 help="Keep every cache in host memory (llama.cpp -nkvo)."),
    click.option("--overhead", "overhead", metavar="SIZE", default=None,
                 help="vllm / sglang: memory per GPU besides weights and caches (vLLM: activations and CUDA graphs, "
                 "default 4GiB; SGLang: the CUDA context before the weights load, default 1GiB)."),
    click.option("--rope-scaling", "rope_scaling", type=click.Choice(["none", "linear", "yarn"]), default=None,
                 help="llama.cpp --rope-scaling. Recommendations stop at the training context unless YaRN "
                 "(--rope-scaling yarn --rope-scale N) extends it."),
    click.option("--rope-scale", "rope_scale", type=click.FloatRange(min=0, min_open=True, max=1e6), default=None,
                 metavar="N",
                 help="llama.cpp --rope-scale: context scaling factor (YaRN context = --yarn-orig-ctx x N)."),
    click.option("--yarn-orig-ctx", "yarn_orig_ctx", type=click.IntRange(0, MAX_CTX), default=None, metavar="N",
                 help="llama.cpp --yarn-orig-ctx: the model's original context (default: its training context)."),
]

BUDGET_KEYS = ("budget", "gpu", "gpu_memory", "weights", "quant", "fit_target", "compute", "n_gpu_layers",
               "tensor_split", "no_kv_offload", "overhead", "rope_scaling", "rope_scale", "yarn_orig_ctx")
#: Budget flags only llama.cpp's planner reads.
NATIVE_BUDGET_KEYS = ("gpu_memory", "quant", "fit_target", "compute", "n_gpu_layers", "tensor_split",
                      "no_kv_offload", "rope_scaling", "rope_scale", "yarn_orig_ctx")


def budget_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the budget and placement flags to a click command, under "Memory budget"."""
    return section("Memory budget", BUDGET_OPTIONS)(func)


def ladder_option(help_text: str) -> Decorator:
    """``--ctx N[,N...]``: the per-sequence contexts a capacity table answers for."""
    return section("Context ladder", [click.option("--ctx", "ctx_list", metavar="N[,N...]", default=None,
                                                  help=help_text)])


def parse_ctx_list(text: str, largest: int = MAX_CTX_PER_SEQ,
                   why: str = f"llama.cpp's largest context {MAX_CTX_PER_SEQ} (a uint32, padded to {CTX_PAD})",
                   ) -> list[int]:
    """``--ctx 4096,8k,32768`` -> [4096, 8192, 32768] tokens per sequence (each once, each at most ``largest``:
    by default a context llama.cpp can hold)."""
    out: list[int] = []
    for item in text.split(","):
        m = _CTX.match(item)
        if not m or int(m.group(1)) == 0:
            raise RsplanError(f"--ctx: cannot read '{shown(item.strip())}' as a context length > 0 "
                              "(examples: 4096, 8k, 32768)")
        ctx = int(m.group(1)) * (1024 if m.group(2) else 1)
        if ctx > largest:
            raise RsplanError(f"--ctx: {item.strip()} is {ctx} tokens, more than {why}")
        if ctx in out:
            raise RsplanError(f"--ctx: {ctx} tokens given twice")
        out.append(ctx)
    return out


def size_or_zero(text: str, what: str) -> int:
    """A size with units, where zero is allowed (``--compute 0``); a number without a unit is refused."""
    return parse_size(text, what, allow_zero=True, require_unit=True)


def _parse_ngl(text: str | None) -> int | None:
    if text is None or text.strip().lower() == "all":
        return None
    if not re.fullmatch(r"\s*-?[0-9]+\s*", text, re.ASCII):
        raise RsplanError(f"-ngl: expected a number of layers or 'all', got '{shown(text)}'")
    if len(text.strip().lstrip("-")) > 9:
        raise RsplanError(f"-ngl {shown(text.strip())}: more layers than any model has; use -ngl all")
    return int(text)


def _parse_tensor_split(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    parts = []
    for item in re.split(r"[,/]+", text.strip()):
        try:
            if len(item) > 40 or not item.isascii():
                raise ValueError(item)
            parts.append(float(item))
        except ValueError:
            raise RsplanError(f"--tensor-split: cannot read '{shown(item)}' as a proportion (example: 3,1)") from None
    return tuple(parts)


def _parse_fit_target(text: str) -> list[int]:
    out = []
    for item in re.split(r"[,/]+", text.strip()):
        if not re.fullmatch(r"\s*-?[0-9]+\s*", item, re.ASCII):
            raise RsplanError(f"--fit-target: cannot read '{shown(item)}' as a whole number of MiB")
        if len(item.strip().lstrip("-")) > 20:  # before int(): Python refuses to convert thousands of digits
            raise RsplanError(f"--fit-target: '{shown(item.strip())}' MiB is absurdly large")
        value = int(item)
        if value < 0:
            raise RsplanError(f"--fit-target: must be >= 0 MiB, got {value}")
        if value << 20 > MAX_SIZE:
            raise RsplanError(f"--fit-target: '{value}' MiB is absurdly large")
        out.append(value << 20)
    return out


def _device_budgets(budget: str | None, gpu: str | None, gpu_memory: str | None) -> list[Any]:
    from rsplan.planner.capacity import DeviceBudget

    if budget is not None and gpu is not None:
        raise RsplanError("give either --budget or --gpu, not both")
    if budget is None and gpu is None:
        raise RsplanError("give a memory budget: --budget SIZE (e.g. 24GiB) or --gpu [INDEX,...]")
    if gpu_memory is not None and gpu is None:
        raise RsplanError("--gpu-memory applies to --gpu only")
    if budget is not None:
        sizes = [s.strip() for s in budget.split(",")]
        if len(sizes) > MAX_DEVICES:
            raise RsplanError(f"--budget: {len(sizes)} GPUs; llama.cpp handles at most {MAX_DEVICES}")
        out = []
        for i, size in enumerate(sizes):
            if size.startswith("-"):
                raise RsplanError(f"--budget: must be positive, got '{size}'")
            name = f"GPU {i}" if len(sizes) > 1 else "GPU"
            out.append(DeviceBudget(name, parse_size(size, "--budget", require_unit=True), f"--budget {size}"))
        return out
    from rsplan.gpu import gpu_memory as read_gpus

    assert gpu is not None  # one of --budget and --gpu is given (checked above)
    indices = None
    if gpu != "all":
        try:
            indices = [int(i) for i in gpu.split(",")]
        except ValueError:
            raise RsplanError(f"--gpu: expected GPU indices like 0 or 0,1, got '{shown(gpu)}'") from None
    which = gpu_memory or "free"
    out = []
    for g in read_gpus(indices):
        value = g.free_bytes if which == "free" else g.total_bytes
        out.append(DeviceBudget(f"GPU{g.index} {g.name}", value, f"NVML GPU{g.index} {which} memory",
                                total_bytes=g.total_bytes, free_bytes=g.free_bytes))
    return out


def make_planners(specs: list[Any], refs: list[str], params: Any, options: dict[str, Any],
                  spec_type: str | None = None) -> list[Any]:
    """One CapacityPlanner per model from the budget flags (shared by capacity and report); the flags as given
    are checked against each model's context limit and llama.cpp's draft bound. ``spec_type``: ``--spec-type``
    (None or ``none``: the draft type each model can use)."""
    from rsplan.planner.capacity import Budget, CapacityPlanner
    from rsplan.planner.context_limit import RopeFlags

    rope = RopeFlags(options["rope_scaling"], options["rope_scale"], options["yarn_orig_ctx"])

    devices = _device_budgets(options["budget"], options["gpu"], options["gpu_memory"])
    margins = _parse_fit_target(options["fit_target"])
    if len(margins) == 1:
        margins = margins * len(devices)
    elif len(margins) != len(devices):
        raise RsplanError(f"--fit-target has {len(margins)} values for {len(devices)} device(s)")
    compute_flag = None if options["compute"] is None else size_or_zero(options["compute"], "--compute")
    weights_flags = list(options["weights"])
    if weights_flags and len(weights_flags) != len(specs):
        models = f"{len(specs)} model" + ("s" if len(specs) > 1 else "")
        raise RsplanError(f"give --weights once per --model ({models}, {len(weights_flags)} --weights)")
    planners = []
    quant = options["quant"]
    for i, (spec, ref) in enumerate(zip(specs, refs, strict=True)):
        if weights_flags:
            weights, source = size_or_zero(weights_flags[i], "--weights"), f"--weights {weights_flags[i]}"
            source += " (overrides --quant)" if quant is not None else ""
        elif quant is not None:
            from rsplan.cli.quant_weights import quantized_model

            spec, _, how = quantized_model(ref, spec, quant, backend="GPU")
            weights, source = spec.weights_bytes, f"{how} of {ref}, padded as in a CUDA buffer"
        elif spec.weights_bytes is not None:
            weights, source = spec.weights_bytes, f"weights_bytes of {ref}"
        else:
            weights, source = None, "unknown for this model: NOT counted (give --weights SIZE)"
        compute, compute_source = _compute_bytes(spec, params, compute_flag, options)
        budget = Budget(tuple(devices), weights, source, tuple(margins), compute, compute_source)
        planner = CapacityPlanner(
            spec, params, budget,
            n_gpu_layers=_parse_ngl(options["n_gpu_layers"]),
            tensor_split=_parse_tensor_split(options["tensor_split"]),
            offload_kqv=not options["no_kv_offload"],
            rope=rope,
            spec_type=None if spec_type == "none" else spec_type,
        )
        planner.check_request()
        planners.append(planner)
    return planners


def _compute_bytes(spec: Any, params: Any, flag: int | None, options: dict[str, Any]) -> tuple[int, str]:
    """The compute buffer charged to each GPU, and where the figure comes from."""
    from rsplan.planner.capacity import DEFAULT_COMPUTE_BYTES
    from rsplan.planner.compute import ComputeModelError, compute_buffer

    if flag is not None:
        return flag, f"--compute {options['compute']}"
    try:
        cb = compute_buffer(spec, params)
    except ComputeModelError as exc:
        return DEFAULT_COMPUTE_BYTES, f"an allowance: {exc}"
    return cb.bytes, (f"llama.cpp's compute buffer at -c {params.n_ctx} -np {params.n_seq_max} "
                      f"(n_outputs_max {cb.n_outputs_max}, as llama-server; CPU-backend graph, used for every "
                      "setting searched)")


def pop_budget_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: kwargs.pop(key) for key in BUDGET_KEYS}


def serving_budget(spec: Any, ref: str, options: dict[str, Any], weights_flag: str | None, tp: int,
                   default_overhead: int) -> Any:
    """The ServingBudget of a serving engine (vLLM, SGLang) from the budget flags: one GPU's memory (the
    smallest of the GPUs given, whose count must be the tensor-parallel size), weights and overhead."""
    from rsplan.planner.engines.base import ServingBudget

    devices = _device_budgets(options["budget"], options["gpu"], None)
    if len(devices) not in (1, tp):
        what = "--gpu" if options["gpu"] is not None else "--budget"
        raise RsplanError(f"{what} gives {len(devices)} GPUs but the tensor-parallel size is {tp}: give one GPU "
                          f"budget, or -tp {len(devices)}")
    smallest = min(devices, key=lambda d: d.total_bytes if d.total_bytes is not None else d.budget_bytes)
    gpu_bytes = smallest.total_bytes if smallest.total_bytes is not None else smallest.budget_bytes
    source = (f"NVML {smallest.name} total memory" if smallest.total_bytes is not None else smallest.source)
    if weights_flag is not None:
        weights, w_source = size_or_zero(weights_flag, "--weights"), f"--weights {weights_flag}"
    elif spec.weights_bytes is not None:
        weights, w_source = spec.weights_bytes, f"weights_bytes of {ref}"
    else:
        weights, w_source = None, "unknown for this model: NOT counted (give --weights SIZE)"
    overhead = default_overhead if options["overhead"] is None else size_or_zero(options["overhead"], "--overhead")
    return ServingBudget(gpu_bytes, source, weights, w_source, overhead, smallest.free_bytes)


@click.command(cls=SectionedCommand)
@model_options()
@budget_options
@ladder_option("Per-sequence contexts for the ladder (tokens; 8k = 8192). Default: 4k, 8k, ... up to the model's "
               "training context.")
@context_options
@engine_options
@section("Output", [click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                                 show_default=True, help="table, or json (every number, in bytes).")])
@user_errors
def capacity(model_ref: str, ctx_list: str | None, fmt: str, engine: str, **kwargs: Any) -> None:
    """The most parallel sequences, context and rollback planes whose caches fit a memory budget.

    Subtracts the weights, a margin (--fit-target) and a compute allowance (--compute) from the budget, then
    searches the exact cache plan. llama.cpp's -c is the TOTAL over all sequences: 4 sequences of 8192 tokens
    are -c 32768 -np 4. -c/-np given here are the setting for the --n-rs-seq question and the per-device table.

    \b
    Examples:
      rsplan capacity --model qwen3-next-80b-a3b --budget 80GiB --weights 45GiB
      rsplan capacity --model lfm2-1.2b --gpu 0 -np 8 --spec-type eagle3 --format json
      rsplan capacity --model model.gguf --budget 24GiB,24GiB -ts 3,1 --ctx 8k,32k,128k
      rsplan capacity --model qwen3-next-80b-a3b --engine vllm --budget 141GiB --weights 151GB -tp 2
      rsplan capacity --model nemotron-h-8b-base-8k --engine sglang --gpu 0
    """
    from rsplan.hparams.sources import load_model

    values = pop_engine_values(kwargs, engine, CONTEXT_KEYS + NATIVE_BUDGET_KEYS)
    if engine != NATIVE:
        _capacity_engine(model_ref, engine, values, ctx_list, fmt, kwargs)
        return
    if kwargs["overhead"] is not None:
        raise RsplanError("--overhead applies to --engine vllm / sglang; llama.cpp's allowance is --compute")
    from rsplan.planner.capacity import run_capacity
    from rsplan.render.capacity import capacity_dict, render_capacity

    spec_type = kwargs["spec_type"]
    options = pop_budget_options(kwargs)
    params = pop_context_params(kwargs)
    contexts = parse_ctx_list(ctx_list) if ctx_list is not None else None
    spec = load_model(model_ref)
    (planner,) = make_planners([spec], [model_ref], params, options, spec_type)
    result = run_capacity(planner, contexts)
    if fmt == "json":
        click.echo(json.dumps(capacity_dict(planner, result), indent=2))
    else:
        click.echo(render_capacity(planner, result))


def _capacity_engine(model_ref: str, engine: str, values: dict[str, Any], ctx_list: str | None, fmt: str,
                     kwargs: dict[str, Any]) -> None:
    """``capacity --engine vllm|sglang``: the engine's answers for the budget."""
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines import engine as load_engine

    options = pop_budget_options(kwargs)
    rules = load_engine(engine)
    settings = rules.settings(values)
    spec = load_model(model_ref)
    weights = options["weights"]
    if len(weights) > 1:
        raise RsplanError(f"give --weights once (one --model, {len(weights)} --weights)")
    budget = serving_budget(spec, model_ref, options, weights[0] if weights else None,
                            settings.tensor_parallel_size, rules.default_overhead_bytes)
    contexts = parse_serving_ctx_list(ctx_list) if ctx_list is not None else None
    result = rules.capacity(spec, settings, budget, contexts)
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        from rsplan.render.engine import render_engine_capacity

        click.echo(render_engine_capacity(result))


def parse_serving_ctx_list(text: str) -> list[int]:
    """``--ctx`` for a serving engine: the same syntax; each value is a --max-model-len / --context-length (contexts
    beyond the model's are left out of the answers)."""
    return parse_ctx_list(text, MAX_CTX, f"the largest context a model config holds ({MAX_CTX})")
