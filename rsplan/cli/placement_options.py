"""llama.cpp's layer placement flags (``-ngl``, ``-ts``, ``-nkvo``, ``-ot``, ``--cpu-moe``, ``--n-cpu-moe``,
``--n-cpu-ffn``): their click options, shared by ``rsplan estimate``, ``capacity`` and ``report``, and how their
text is read as llama.cpp reads it."""

from __future__ import annotations

import re
import struct
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.sections import PARAM_ORDER, Decorator
from rsplan.errors import RsplanError, printable
from rsplan.planner.weights.placement import MAX_DEVICES
from rsplan.render.units import shown


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


def placement_options(split_default: str) -> list[Decorator]:
    """llama.cpp's layer placement flags (-ngl, -ts, -nkvo and the tensor overrides); ``split_default``: what -ts
    defaults to in the command."""
    return [
        click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "n_gpu_layers", metavar="N|auto|all", default=None,
                     help="Layers on the GPUs, counted from the last (llama.cpp -ngl); default all (so are auto and "
                     "negative values, as llama.cpp places them)."),
        click.option("-ts", "--tensor-split", "tensor_split", metavar="A,B,...", default=None,
                     help=f"Proportions of the layers per GPU (llama.cpp -ts); default: {split_default}."),
        click.option("-nkvo", "--no-kv-offload", "no_kv_offload", is_flag=True,
                     help="Keep every cache in host memory (llama.cpp -nkvo)."),
        *override_options("Needs the model's tensors (a GGUF, or --quant)."),
    ]


PLACEMENT_OPTIONS = placement_options("by free memory / budget")


#: The options whose entries llama.cpp appends to one tensor-override list, by click name: their flag.
_OVERRIDE_OPTIONS = {"override_tensor": "-ot", "cpu_moe": "--cpu-moe", "n_cpu_moe": "--n-cpu-moe",
                     "n_cpu_ffn": "--n-cpu-ffn"}
#: The placement options by click name: their flag.
PLACEMENT_FLAGS = {"n_gpu_layers": "-ngl", "tensor_split": "-ts", "no_kv_offload": "-nkvo", **_OVERRIDE_OPTIONS}
PLACEMENT_KEYS = tuple(PLACEMENT_FLAGS)


def given_placement_flags(ctx: click.Context) -> list[str]:
    """The placement flags given on the command line (``-ngl``, ...), in --help order."""
    return [flag for key, flag in PLACEMENT_FLAGS.items()
            if ctx.get_parameter_source(key) not in (None, ParameterSource.DEFAULT)]


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


def parse_ngl(text: str | None) -> int | None:
    """capacity's / report's / estimate's ``-ngl``: None (every layer) for unset, ``all``, ``auto`` and every
    negative value.

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
    if len(items) >= MAX_DEVICES:  # common/arg.cpp:2840 llama_max_devices refuses as many parts as devices
        raise RsplanError(f"--tensor-split: {len(items)} parts; llama.cpp takes fewer than {MAX_DEVICES} "
                          f"(LLAMA_MAX_DEVICES)")
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
