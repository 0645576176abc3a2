"""The budget flags of ``rsplan capacity`` and ``rsplan report``, and their parsing into planner.capacity.budget's
request.

``--budget`` / ``--gpu``, ``--weights``, ``--fit-target``, ``--compute``, ``-ngl``, ``--tensor-split``,
``--no-kv-offload`` ... are declared once here (BUDGET_OPTIONS, under "Memory budget" in ``--help``) with the
context ladder ``--ctx``; ``budget_request`` turns their text into bytes, counts and proportions
(planner.capacity.request.BudgetRequest), and planner.capacity.budget assembles the planners from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from rsplan.cli.options import FiniteFloatRange
from rsplan.cli.placement_options import PLACEMENT_OPTIONS, override_flags, parse_ngl, parse_tensor_split
from rsplan.cli.sections import Decorator, section
from rsplan.errors import RsplanError
from rsplan.planner.caches.context import CTX_PAD, MAX_CTX
from rsplan.planner.weights.placement import MAX_DEVICES
from rsplan.render.units import MAX_SIZE, parse_size, shown

if TYPE_CHECKING:
    from rsplan.planner.capacity.limits import DeviceBudget
    from rsplan.planner.capacity.request import BudgetRequest, GivenSize
    from rsplan.planner.weights.host_weights import HostOptions

#: ``--ctx`` entries: tokens, or ``<n>k`` for n * 1024 tokens (as people say "8k context").
_CTX = re.compile(r"^\s*([0-9]{1,12})\s*([kK]?)\s*$", re.ASCII)
#: The largest context per sequence: llama.cpp pads it to a multiple of 256 and keeps it in a uint32.
MAX_CTX_PER_SEQ = MAX_CTX // CTX_PAD * CTX_PAD

#: The buffer types devices may be (``--device-kind``), with the padding rule planner.backends.buffers gives them.
DEVICE_KINDS = ("CUDA", "ROCm", "MUSA", "SYCL", "Vulkan", "Metal", "RPC")
#: ``--device-kind`` of fit, capacity and report.
DEVICE_KIND_OPTION: Decorator = click.option(
    "--device-kind", type=click.Choice(DEVICE_KINDS), default="CUDA", show_default=True,
    help="The devices' backend (buffer names and padding; RPC: rpc-server on a CPU).")

BUDGET_OPTIONS: list[Decorator] = [
    click.option("--budget", metavar="SIZE[,SIZE...]", default=None,
                 help="Memory per GPU, with units (24GiB, 80GB, 81920MiB); several values = several GPUs."),
    click.option("--gpu", metavar="[INDEX,...]", is_flag=False, flag_value="all", default=None,
                 help="Read the budget from these NVIDIA GPUs via NVML (no value: every GPU)."),
    DEVICE_KIND_OPTION,
    click.option("--gpu-memory", type=click.Choice(["free", "total"]), default=None,
                 help="With --gpu: budget the GPUs' free memory (default, as llama.cpp's --fit does) or their "
                 "total memory (an empty GPU)."),
    click.option("--weights", "weights", metavar="SIZE", multiple=True,
                 help="Model weights, with units; overrides the model file's size. Without it: a GGUF's tensors, "
                 "else the model file's size, else the model's tensor list at a default type (llama.cpp: --quant "
                 "Q4_K_M; vllm / sglang: the checkpoint's dtype)."),
    click.option("--quant", "quant", metavar="TYPE", default=None,
                 help="Weights as llama-quantize TYPE (Q4_K_M, Q8_0, BF16, ...) writes them from the bf16 GGUF "
                 "(presets, config.json files giving vocab_size; default Q4_K_M); --weights overrides it."),
    click.option("--fit-target", "fit_target", metavar="MiB[,MiB...]", default="1024", show_default=True,
                 help="Margin left free on each GPU, MiB (llama.cpp's --fit-target; one value for all GPUs)."),
    click.option("--compute", "compute", metavar="SIZE", default=None,
                 help="Compute buffer per GPU, one figure for every setting searched. Default: each setting is "
                 "charged llama.cpp's compute buffer at that setting as rsplan models it (llama-server's "
                 "outputs), or 512MiB for archs it does not model."),
    *PLACEMENT_OPTIONS,
    click.option("--host-budget", "host_budget", metavar="SIZE", default=None,
                 help="llama.cpp: host memory for what stays there (weights of layers not offloaded, -nkvo caches, "
                 "the output buffer, host compute). Default: with --gpu, this machine's available memory; with "
                 "--budget (another machine) none: the answer states the host memory it needs."),
    click.option("-ctxcp", "--ctx-checkpoints", "ctx_checkpoints", type=click.IntRange(0, 1 << 20), default=32,
                 show_default=True, metavar="N",
                 help="llama-server --ctx-checkpoints: context checkpoints per slot (one recurrent state each), "
                 "charged to the host budget at this limit; 0 turns them off."),
    click.option("--overhead", "overhead", metavar="SIZE", default=None,
                 help="vllm / sglang: memory per GPU besides weights and caches (vLLM: activations and CUDA graphs, "
                 "default 4GiB; SGLang: the CUDA context before the weights load, default 1GiB)."),
    click.option("--rope-scaling", "rope_scaling", type=click.Choice(["none", "linear", "yarn"]), default=None,
                 help="llama.cpp --rope-scaling (default: the model file's rope.scaling.type). Recommendations stop "
                 "at the training context unless YaRN (--rope-scaling yarn --rope-scale N) extends it."),
    click.option("--rope-scale", "rope_scale", type=FiniteFloatRange(min=0, min_open=True, max=1e6), default=None,
                 metavar="N",
                 help="llama.cpp --rope-scale: context scaling factor (YaRN context = --yarn-orig-ctx x N)."),
    click.option("--yarn-orig-ctx", "yarn_orig_ctx", type=click.IntRange(0, MAX_CTX), default=None, metavar="N",
                 help="llama.cpp --yarn-orig-ctx: the model's original context (default: the file's "
                 "rope.scaling.original_context_length, else its training context)."),
]

BUDGET_KEYS = ("budget", "gpu", "gpu_memory", "device_kind", "weights", "quant", "fit_target", "compute",
               "n_gpu_layers", "tensor_split", "no_kv_offload", "override_tensor", "cpu_moe", "n_cpu_moe",
               "n_cpu_ffn", "host_budget", "ctx_checkpoints", "overhead", "rope_scaling", "rope_scale",
               "yarn_orig_ctx")
#: Budget flags only llama.cpp's planner reads.
NATIVE_BUDGET_KEYS = ("gpu_memory", "device_kind", "quant", "fit_target", "compute", "n_gpu_layers", "tensor_split",
                      "no_kv_offload", "override_tensor", "cpu_moe", "n_cpu_moe", "n_cpu_ffn", "host_budget",
                      "ctx_checkpoints", "rope_scaling", "rope_scale", "yarn_orig_ctx")


def budget_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the budget and placement flags to a click command, under "Memory budget"."""
    return section("Memory budget", BUDGET_OPTIONS)(func)


def weight_table(read: Any) -> Any:
    """A read model's tensor table (hparams.sources.ReadModel) as planner.weights.host_weights.WeightTable, None without
    one (shapes may be empty: the host buffers then stay unknown)."""
    # deferred: the planner's budget modules, loaded only when a command with these flags runs
    from rsplan.planner.weights.host_weights import WeightTable

    if not (read.tensors and read.tensor_rows):
        return None
    return WeightTable(read.tensors, read.tensor_rows, read.tensor_shapes or (), read.tensor_alignment)


def ladder_option(help_text: str) -> Decorator:
    """``--ctx N[,N...]``: the per-sequence contexts a capacity table answers for."""
    return section("Context ladder", [click.option("--ctx", "ctx_list", metavar="N[,N...]", default=None,
                                                  help=help_text)])


def pop_budget_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the budget flags from a command's kwargs: {key: value as given}."""
    return {key: kwargs.pop(key) for key in BUDGET_KEYS}


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


def parse_serving_ctx_list(text: str) -> list[int]:
    """``--ctx`` for a serving engine: the same syntax; each value is a --max-model-len / --context-length (contexts
    beyond the model's are left out of the answers)."""
    return parse_ctx_list(text, MAX_CTX, f"the largest context a model config holds ({MAX_CTX})")


def size_or_zero(text: str, what: str) -> int:
    """A size with units, where zero is allowed (``--compute 0``); a number without a unit is refused."""
    return parse_size(text, what, allow_zero=True, require_unit=True)


def _given_size(text: str | None, flag: str) -> GivenSize | None:
    # deferred: the planner's budget modules, loaded only when a command with these flags runs
    from rsplan.planner.capacity.request import GivenSize

    return None if text is None else GivenSize(size_or_zero(text, flag), text)


def parse_fit_target(text: str) -> tuple[int, ...]:
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
    return tuple(out)


def _devices(budget: str | None, gpu: str | None, gpu_memory: str | None) -> tuple[DeviceBudget, ...]:
    """``--budget`` sizes, or the ``--gpu`` indices read through NVML: planner.capacity.limits.DeviceBudget each."""
    # deferred: the planner's budget modules, loaded only when a command with these flags runs
    from rsplan.planner.capacity.request import GivenSize, nvml_devices, size_budgets

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
        given = []
        for size in sizes:
            if size.startswith("-"):
                raise RsplanError(f"--budget: must be positive, got '{size}'")
            given.append(GivenSize(parse_size(size, "--budget", require_unit=True), size))
        return size_budgets(given)
    indices = None
    if gpu is not None and gpu != "all":
        try:
            indices = [int(i) for i in gpu.split(",")]
        except ValueError:
            raise RsplanError(f"--gpu: expected GPU indices like 0 or 0,1, got '{shown(gpu)}'") from None
    return nvml_devices(indices, "total" if gpu_memory == "total" else "free")


def host_memory() -> tuple[int, int]:
    """This machine's (total, available) memory, bytes: sysconf as ggml's CPU device reads it, and
    /proc/meminfo's MemAvailable (the total where it cannot be read)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return total, int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return total, total


#: Where the host budget of ``--gpu`` comes from: the GPUs are this machine's, so its RAM is the host's.
THIS_MACHINE_HOST = "this machine's available memory (--gpu plans this machine)"


def _host_budget(text: str | None, this_machine: bool) -> Any:
    """``--host-budget``; without it, this machine's available memory where the devices are this machine's
    (``--gpu``), else None: ``--budget`` describes a machine that is not this one, whose RAM rsplan does not know,
    so the host is not checked and each answer states what it needs there."""
    # deferred: the planner's budget modules, loaded only when a command with these flags runs
    from rsplan.planner.capacity.request import GivenSize

    if text is not None:
        # as rsplan fit: a host with no memory for the output buffer holds no start at all
        size = parse_size(text, "--host-budget", allow_zero=False, require_unit=True)
        return GivenSize(size, f"--host-budget {text}")
    if this_machine:
        return GivenSize(host_memory()[1], THIS_MACHINE_HOST)
    return None


def budget_request(options: dict[str, Any], host: HostOptions | None = None) -> BudgetRequest:
    """The budget flags as ``pop_budget_options`` returns them, parsed: a planner.capacity.request.BudgetRequest (with
    the host-weight options ``host``, rsplan.cli.host_options; None: llama.cpp's defaults).

    Raises:
        RsplanError: a value that cannot be read (named with its flag), or ``--budget`` and ``--gpu`` together /
            neither; NVML errors for ``--gpu``.
    """
    # deferred: the planner's budget modules, loaded only when a command with these flags runs
    from rsplan.planner.caches.context_limit import RopeFlags
    from rsplan.planner.capacity.request import BudgetRequest, GivenSize

    devices = _devices(options["budget"], options["gpu"], options["gpu_memory"])
    return BudgetRequest(
        devices=devices,
        from_nvml=options["gpu"] is not None,
        margin_bytes=parse_fit_target(options["fit_target"]),
        compute=_given_size(options["compute"], "--compute"),
        weights=tuple(GivenSize(size_or_zero(text, "--weights"), text) for text in options["weights"]),
        quant=options["quant"],
        n_gpu_layers=parse_ngl(options["n_gpu_layers"]),
        tensor_split=parse_tensor_split(options["tensor_split"]),
        offload_kqv=not options["no_kv_offload"],
        override_flags=override_flags(click.get_current_context(silent=True), options),
        overhead=_given_size(options["overhead"], "--overhead"),
        host_budget=_host_budget(options.get("host_budget"), this_machine=options["gpu"] is not None),
        rope=RopeFlags(options["rope_scaling"], options["rope_scale"], options["yarn_orig_ctx"]),
        ctx_checkpoints=options["ctx_checkpoints"],
        device_kind=options["device_kind"],
        **({"host": host} if host is not None else {}),
    )
