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
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from rsplan.cli.options import FiniteFloatRange
from rsplan.cli.sections import PARAM_ORDER, Decorator, section
from rsplan.errors import RsplanError, printable
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
DEVICE_KINDS = ("CUDA", "ROCm", "MUSA", "SYCL", "RPC")
#: ``--device-kind`` of fit, capacity and report.
DEVICE_KIND_OPTION: Decorator = click.option(
    "--device-kind", type=click.Choice(DEVICE_KINDS), default="CUDA", show_default=True,
    help="The devices' backend (buffer names and padding; RPC: rpc-server on a CPU).")

#: The "Memory budget" section of capacity's and report's --help (rsplan.cli.sections): one line per option.
def override_options(note: str) -> list[Decorator]:
    """llama.cpp's tensor-override flags (-ot, --cpu-moe, --n-cpu-moe, --n-cpu-ffn), read by ``override_flags``;
    ``note`` ends -ot's help (what the command does with them)."""
    return [
        click.option("-ot", "--override-tensor", "override_tensor", metavar="PATTERN=BUFT,...", multiple=True,
                     help="Tensors whose name matches PATTERN in buffer BUFT (CPU, or a device: CUDA0, ...), as "
                     "llama.cpp -ot; given again, it adds entries. With --cpu-moe, --n-cpu-moe and --n-cpu-ffn, "
                     "entries are tried in command-line order, first match wins, as llama.cpp appends them. "
                     + note),
        click.option("-cmoe", "--cpu-moe", "cpu_moe", count=True,
                     help="llama.cpp --cpu-moe: every expert on the host."),
        click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=click.IntRange(0, 100000), multiple=True, metavar="N",
                     help="llama.cpp --n-cpu-moe: the experts of the first N layers on the host."),
        click.option("-ncffn", "--n-cpu-ffn", "n_cpu_ffn", type=click.IntRange(0, 100000), multiple=True, metavar="N",
                     help="llama.cpp --n-cpu-ffn: the dense FFN weights (ffn_up / ffn_down / ffn_gate) of the first N "
                     "layers on the host."),
    ]


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
    click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "n_gpu_layers", metavar="N|auto|all", default=None,
                 help="Layers on the GPUs, counted from the last (llama.cpp -ngl); default all (so are auto and "
                 "negative values, as llama.cpp places them)."),
    click.option("-ts", "--tensor-split", "tensor_split", metavar="A,B,...", default=None,
                 help="Proportions of the layers per GPU (llama.cpp -ts); default: by free memory / budget."),
    click.option("-nkvo", "--no-kv-offload", "no_kv_offload", is_flag=True,
                 help="Keep every cache in host memory (llama.cpp -nkvo)."),
    *override_options("Needs the model's tensors (a GGUF, or --quant)."),
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


#: The smallest normal float (FLT_MIN): std::stof refuses a smaller non-zero magnitude.
_FLT_MIN = 2.0 ** -126

#: What ``std::stoi`` reads: leading white space, a sign, decimal digits; the text after them is ignored.
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", re.ASCII)


def read_ngl(text: str) -> int:
    """``-ngl`` as llama.cpp reads it (common/arg.cpp:2791 n_gpu_layers): ``auto`` -1, ``all`` -2 (both case-sensitive),
    else ``std::stoi``: leading spaces and a sign allowed, trailing text ignored, a value outside int32 refused
    (std::out_of_range; arg.cpp:871-875 turns it into "error while handling argument").

    The value keeps llama.cpp's meaning (common/common.h:475 n_gpu_layers: "-1 is auto, <= -2 is all"):
    src/llama-model.cpp:2002 llama_model::n_gpu_layers offloads every layer for any negative value, and
    --fit moves layers only for the default -1 (common/fit.cpp:463 n_gpu_layers).
    """
    if text == "auto":
        return -1
    if text == "all":
        return -2
    m = _STOI.match(text)
    if not m:
        raise RsplanError(f"-ngl: cannot read '{shown(printable(text))}' as a number of layers, auto or all")
    value = m.group(1)
    if len(value.lstrip("+-")) > 10 or not -(1 << 31) <= int(value) < (1 << 31):
        raise RsplanError(f"-ngl {shown(value)}: out of range (llama.cpp reads an int32; for every layer: -ngl all)")
    return int(value)


def _parse_ngl(text: str | None) -> int | None:
    """capacity's / report's ``-ngl``: None (every layer) for unset, ``all``, ``auto`` and every negative value.

    They place the layers as given: ``-ngl all`` and any value <= -2 offload every layer in llama.cpp, and so does
    the default -1 (``auto``) unless --fit moves layers, which it does only where the setting does not fit;
    the settings printed fit as placed (and carry ``-ngl all``)."""
    if text is None:
        return None
    ngl = read_ngl(text)
    return None if ngl < 0 else ngl


def parse_tensor_split(text: str | None) -> tuple[float, ...] | None:
    """``-ts`` as llama.cpp reads it (common/arg.cpp:2838 sregex_token_iterator): split at runs of ``,`` and ``/`` by
    std::sregex_token_iterator, which gives an empty leading part but no empty trailing one ("1," is one part,
    ",1" two, "" none), each part read by std::stof (_stof)."""
    if text is None:
        return None
    items = re.split(r"[,/]+", text)
    if items[-1] == "":
        items.pop()
    parts = []
    for item in items:
        try:
            if len(item) > 40 or not item.isascii():
                raise ValueError(item)
            part = _stof(item)
        except ValueError:
            raise RsplanError(f"--tensor-split: cannot read '{shown(item)}' as a proportion (example: 3,1)") from None
        if not _stof_in_range(part):
            raise RsplanError(f"--tensor-split: '{shown(item)}' is outside the float range llama.cpp reads the parts "
                              "in (std::stof refuses it)")
        parts.append(part)
    return tuple(parts)


#: What ``std::stof`` (strtof) reads at the start of its text: white space, a sign, then a decimal or hexadecimal
#: number, inf/infinity or nan; the text after it is ignored ("1x" is 1, "1_0" is 1).
_STOF = re.compile(r"[ \t\n\v\f\r]*([+-]?)(?:(0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)"
                   r"|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)|(infinity|inf|nan))", re.ASCII | re.IGNORECASE)


def _stof(text: str) -> float:
    """The number ``std::stof`` reads from ``text`` (as a double: _stof_in_range checks the float range);
    ValueError where it reads none."""
    m = _STOF.match(text)
    if not m:
        raise ValueError(text)
    sign, hexa, dec, word = m.groups()
    value = float.fromhex(hexa) if hexa else float(dec) if dec else float(word)
    return -value if sign == "-" else value


def _stof_in_range(x: float) -> bool:
    """Whether ``std::stof`` (common/arg.cpp:2847 stof) takes ``x`` (its text): not past FLT_MAX (it rounds to
    inf) and not below FLT_MIN but zero (glibc's strtof reports ERANGE for both, and std::stof throws
    std::out_of_range); inf and nan themselves are read (the tensor split check refuses them)."""
    if x != x or x in (float("inf"), float("-inf")) or x == 0:
        return True
    try:
        (f32,) = struct.unpack("f", struct.pack("f", x))
    except OverflowError:
        return False
    return f32 not in (float("inf"), float("-inf")) and abs(x) >= _FLT_MIN


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


#: The options whose entries llama.cpp appends to one tensor-override list, by click name: their flag.
_OVERRIDE_OPTIONS = {"override_tensor": "-ot", "cpu_moe": "--cpu-moe", "n_cpu_moe": "--n-cpu-moe",
                     "n_cpu_ffn": "--n-cpu-ffn"}


def override_flags(ctx: click.Context | None, options: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """-ot, --cpu-moe, --n-cpu-moe and --n-cpu-ffn as given, each occurrence with its value, in command-line
    order (``ctx.meta[PARAM_ORDER]``; without it: -ot, --cpu-moe, --n-cpu-moe, --n-cpu-ffn): llama.cpp appends each
    one's entries to the same list as it parses them, and the first entry that matches a tensor places it
    (planner.weights.weight_placement.overrides_from_flags)."""
    counts = {"override_tensor": len(options["override_tensor"]), "cpu_moe": options["cpu_moe"],
              "n_cpu_moe": len(options["n_cpu_moe"]), "n_cpu_ffn": len(options["n_cpu_ffn"])}
    order = [n for n in (ctx.meta.get(PARAM_ORDER, ()) if ctx is not None else ()) if n in _OVERRIDE_OPTIONS]
    if any(order.count(name) != n for name, n in counts.items()):  # not parsed from a command line
        order = [name for name, n in counts.items() for _ in range(n)]
    values = {name: iter(options[name]) for name in ("override_tensor", "n_cpu_moe", "n_cpu_ffn")}
    return tuple((_OVERRIDE_OPTIONS[name], "" if name == "cpu_moe" else str(next(values[name]))) for name in order)


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
        n_gpu_layers=_parse_ngl(options["n_gpu_layers"]),
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
