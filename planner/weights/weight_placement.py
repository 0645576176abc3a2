"""Which buffer each weight tensor lands in, and the bytes per device: llama.cpp's ``load_tensors``, tensor by tensor.

llama.cpp 0c1e57098:

- src/llama-model.cpp ``load_tensors``: the input layer (``LLM_TENSOR_LAYER_INPUT``: ``token_embd``) always stays
  on the CPU (src/llama-model.cpp:1605 dev_input); repeating layer ``il`` (``blk.{il}.*``, and ``token_embd_norm``,
  which the loaders create with layer number 0) goes where planner.weights.placement puts unit ``il``; the output layer
  (``LLM_TENSOR_LAYER_OUTPUT``: ``output``, ``output_norm``) where it puts unit ``n_layer_all``
  (src/llama-model.cpp:1614 dev_output).
- A model without ``output.weight`` (tied embeddings) creates the output as a ``TENSOR_DUPLICATED`` copy of
  ``token_embd`` in the OUTPUT layer's buffer (src/llama-model-loader.cpp:1166 TENSOR_DUPLICATED): on a GPU that
  is a second copy of the embedding matrix; on the host the mapped file is shared and it is not counted twice.
  ``-ot`` patterns see that copy under the name ``token_embd.weight``, and where it lands in the buffer type of
  the input copy (``-ot token_embd=CUDA0`` with the output layer there), it is the same tensor
  (src/llama-model-loader.cpp:1371 ggml_get_tensor): no second copy.
- src/llama-model-loader.cpp ``buft_for_tensor``: the first ``-ot PATTERN=BUFT`` whose pattern ``regex_search``-es
  the tensor name wins (src/llama-model-loader.cpp:1237 tensor_buft_overrides); an override to ``CPU`` puts the
  tensor in host memory, one to a device's buffer type on that device. ``--cpu-moe`` is
  ``-ot '\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'`` and ``--n-cpu-moe N`` adds
  ``blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU`` for ``i < N`` (common/common.h:1198 LLM_FFN_EXPS_REGEX).
- A weight whose op the devices refuse (the loader's test: planner.backends.loader_ops, e.g. PLaMo-2's ``ssm_a`` or a
  ternary matrix on CUDA) goes down its layer's buffer list to host memory; an ``-ot`` entry naming a device is
  not tested.
- Each tensor takes ``GGML_PAD(get_alloc_size, alignment)`` bytes of its buffer (planner.backends.buffers rules).

The host bytes here are the weights read into a buffer (``host_rule``), as a dry run counts them; which host
buffer types llama.cpp names them under (``CPU_Mapped`` span, ``CPU``, ``CPU_REPACK``, ``CUDA_Host``) is
planner.weights.host_weights. Not modelled here: ``-sm row`` (split buffer types).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsplan.errors import RsplanError, excerpt
from rsplan.hparams.ggml_types import weight_type
from rsplan.hparams.model_limits import MAX_LAYERS
from rsplan.planner.backends.buffers import CPU_RULE, BufferRule
from rsplan.planner.backends.cpu_repack import Target
from rsplan.planner.weights.host_weights import HostTensor, buffer_bytes, host_buffer_type

if TYPE_CHECKING:
    from rsplan.planner.backends.loader_ops import LoaderCheck
    from rsplan.planner.weights.placement import Placement

#: common/common.h:1198 LLM_FFN_EXPS_REGEX: the sparse expert tensors --cpu-moe / --n-cpu-moe keep on the host.
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: A dense FFN weight (common/common.h LLM_FFN_DENSE_REGEX: ``--n-cpu-ffn``).
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."

#: Tensors outside ``blk.N.`` and their layer (src/llama-arch.cpp:727 LLM_TENSOR_INFOS): "input", "output", or a
#: repeating layer number (``token_embd_norm`` is created with layer number 0: src/llama-arch.cpp:732
#: LLM_TENSOR_TOKEN_EMBD_NORM).
NAMED_LAYERS: dict[str, str | int] = {
    "token_embd": "input",
    "pos_embd": "input",
    "token_types": "input",
    "token_embd_norm": 0,
    "output": "output",
    "output_norm": "output",
}
#: Per-arch exceptions to NAMED_LAYERS: LFM2's and LFM2-MoE's output norm is named ``token_embd_norm`` in the GGUF
#: (src/llama-arch.cpp:442 LLM_TENSOR_OUTPUT_NORM_LFM2) but belongs to the output layer (src/llama-arch.cpp:740
#: LLM_TENSOR_OUTPUT_NORM_LFM2; src/models/lfm2.cpp:39 output_norm), so it goes where the output layer goes.
ARCH_NAMED_LAYERS: dict[str, dict[str, str | int]] = {
    "lfm2": {"token_embd_norm": "output"},
    "lfm2moe": {"token_embd_norm": "output"},
}

#: The output norm's GGUF stem where it is not ``output_norm`` (ARCH_NAMED_LAYERS' output-layer entries): the name
#: the graph's output norm weight has for ``-ot`` patterns.
OUTPUT_NORM_STEM: dict[str, str] = {arch: stem for arch, table in ARCH_NAMED_LAYERS.items()
                                    for stem, layer in table.items() if layer == "output"}

#: A repeating layer's tensor name: ``blk.N.`` then the rest (group 1: N).
BLOCK_NAME = re.compile(r"^blk\.(\d+)\.")


class WeightPlacementError(RsplanError):
    """A tensor or an override llama.cpp would refuse."""


@dataclass(frozen=True)
class Weight:
    """One weight tensor: its GGUF name, bytes (``ggml_nbytes``), ggml type name and row length ``ne[0]``."""

    name: str
    n_bytes: int
    type: str
    ne0: int


@dataclass(frozen=True)
class TensorOverride:
    """One ``-ot PATTERN=BUFT`` entry: ``buffer`` is ``CPU`` or a device index (its buffer type)."""

    pattern: str
    buffer: str | int

    def flag_text(self, device_names: Sequence[str]) -> str:
        """``PATTERN=BUFT`` as llama.cpp prints it (the device's buffer type name, e.g. ``CUDA0``)."""
        name = self.buffer if isinstance(self.buffer, str) else device_names[self.buffer]
        return f"{self.pattern}={name}"


def overrides_from_flags(flags: Sequence[tuple[str, str]], device_names: Sequence[str]) -> tuple[TensorOverride, ...]:
    """The tensor overrides of ``flags``: (flag, value) pairs of ``-ot``, ``--cpu-moe`` (an empty value),
    ``--n-cpu-moe`` and ``--n-cpu-ffn`` in command-line order, each occurrence's entries where it stands, as
    llama.cpp appends them to one list (common/arg.cpp:2756 parse_tensor_buffer_overrides for -ot, the three others
    just after it); the first entry that matches a tensor places it. ``device_names``: the buffer types an ``-ot``
    may name besides ``CPU``."""
    out: list[TensorOverride] = []
    for flag, value in flags:
        if flag == "-ot":
            out += parse_overrides(value, device_names)
        elif flag == "--cpu-moe":
            out.append(TensorOverride(FFN_EXPS_REGEX, "CPU"))
        elif flag == "--n-cpu-moe":
            out += n_cpu_moe_overrides(int(value))
        elif flag == "--n-cpu-ffn":
            out += n_cpu_ffn_overrides(int(value))
        else:
            raise ValueError(f"override flag {flag!r}")
    return tuple(out)


def override_flags_text(flags: Sequence[tuple[str, str]]) -> str:
    """``flags`` (``overrides_from_flags``') as a shell command line carries them, in order."""
    import shlex  # deferred: shlex, which a command without override flags does not need (rsplan estimate's start-up)

    return " ".join(flag if flag == "--cpu-moe" else f"{flag} {shlex.quote(value)}" for flag, value in flags)


def n_cpu_ffn_overrides(n: int) -> list[TensorOverride]:
    """``--n-cpu-ffn N``: the dense FFN weights (``ffn_up`` / ``ffn_down`` / ``ffn_gate``) of the first ``n``
    layers on the host, one pattern per layer (common/common.h llm_add_n_cpu_ffn_overrides with
    LLM_FFN_DENSE_REGEX; left out past LLAMA_MAX_LAYERS, as ``n_cpu_moe_overrides``)."""
    if n < 0:
        raise WeightPlacementError(f"--n-cpu-ffn {n}: must be >= 0")
    return [TensorOverride(rf"blk\.{i}{FFN_DENSE_REGEX}", "CPU") for i in range(min(n, MAX_LAYERS))]


def n_cpu_moe_overrides(n: int) -> list[TensorOverride]:
    """``--n-cpu-moe N``: the experts of the first ``n`` layers on the host.

    llama.cpp adds one pattern per layer up to ``n`` (``--n-cpu-moe 999`` is a common "all"); the patterns past
    LLAMA_MAX_LAYERS name no tensor of any model, so they are left out (each would be tried on every tensor at
    every step of the fit: ``-ncmoe 100000`` took hours).
    """
    if n < 0:
        raise WeightPlacementError(f"--n-cpu-moe {n}: must be >= 0")
    return [TensorOverride(rf"blk\.{i}{FFN_EXPS_REGEX}", "CPU") for i in range(min(n, MAX_LAYERS))]


#: The group openers std::regex's ECMAScript grammar knows after ``(?``: non-capturing ``(?:`` and the lookaheads
#: ``(?=`` / ``(?!``. Python also reads lookbehinds, named groups, inline flags, comments and atomic groups, which
#: std::regex refuses (std::regex_error when llama.cpp's loader builds the pattern: the model does not load).
_ECMA_GROUPS = ":=!"


def _python_only_group(pattern: str) -> str | None:
    """The first ``(?X`` group of ``pattern`` that std::regex (ECMAScript) does not read, e.g. ``(?P<`` (None:
    none). Escaped characters and bracket expressions are skipped."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":  # "[]...]": a leading ']' is a member
                i += 1
        elif c == "(" and pattern[i + 1:i + 2] == "?" and pattern[i + 2:i + 3] not in tuple(_ECMA_GROUPS):
            return pattern[i:i + 4]
        i += 1
    return None


def parse_overrides(text: str, device_names: Sequence[str]) -> list[TensorOverride]:
    """``-ot`` / ``--override-tensor`` text: ``PATTERN=BUFT,...`` with BUFT ``CPU`` or one of ``device_names``.

    Read as common/arg.cpp:252 parse_tensor_buffer_overrides reads it: split at every ``,``
    (common/common.h:822 string_split keeps empty parts, so an empty entry, a leading / trailing / doubled comma
    or an empty value is refused: no ``=`` in it), each entry split at its first ``=``; the buffer type must be one
    of the devices' (an empty one is not). An empty pattern is accepted, as llama.cpp accepts it: it
    ``regex_search``-es every tensor name.
    """
    out: list[TensorOverride] = []
    for item in text.split(","):
        pattern, sep, buft = item.partition("=")
        if not item:
            raise WeightPlacementError(
                f"-ot '{excerpt(text)}': an empty entry; llama.cpp refuses it (each comma-separated entry is "
                "PATTERN=BUFFER_TYPE)")
        if not sep:
            raise WeightPlacementError(f"-ot '{excerpt(item)}': expected PATTERN=BUFFER_TYPE")
        try:
            with warnings.catch_warnings():
                # Python's re warns where it reads a pattern otherwise than before ("[[:alpha:]]": a set of
                # characters, not std::regex's POSIX class): a pattern that matches other tensors is refused
                warnings.simplefilter("error", FutureWarning)
                re.compile(pattern)
        except re.error as exc:
            raise WeightPlacementError(f"-ot '{excerpt(item)}': bad pattern: {exc}") from None
        except FutureWarning as exc:
            raise WeightPlacementError(f"-ot '{excerpt(item)}': a pattern rsplan cannot read as llama.cpp's "
                                       f"std::regex does ({exc}; POSIX classes such as [[:alpha:]] are not "
                                       "supported)") from None
        group = _python_only_group(pattern)
        if group is not None:
            raise WeightPlacementError(
                f"-ot '{excerpt(item)}': '{excerpt(group)}...' is not a group llama.cpp's std::regex (ECMAScript) "
                "reads (only (?:, (?= and (?!); llama.cpp would fail to load the model")
        if buft == "CPU":
            out.append(TensorOverride(pattern, "CPU"))
        elif buft in device_names:
            out.append(TensorOverride(pattern, list(device_names).index(buft)))
        else:
            have = ", ".join(["CPU", *device_names])
            raise WeightPlacementError(f"-ot '{excerpt(item)}': unknown buffer type '{excerpt(buft)}' (have: {have})")
    return out


def layer_of(name: str, n_layer_all: int, *, arch: str) -> str | int:
    """The layer a tensor of a model of ``arch`` belongs to: ``"input"``, ``"output"`` or a repeating layer
    number."""
    m = BLOCK_NAME.match(name)
    if m:
        il = int(m.group(1))
        if il >= n_layer_all:
            raise WeightPlacementError(f"tensor {name}: layer {il} but the model has {n_layer_all} layers")
        return il
    stem = name.rsplit(".", 1)[0] if "." in name else name
    layer = ARCH_NAMED_LAYERS.get(arch, {}).get(stem, NAMED_LAYERS.get(stem))
    if layer is None:
        raise WeightPlacementError(f"tensor {name}: no llama.cpp layer known for it")
    return layer


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes per device (index = device) and in host memory, as the buffers hold them."""

    device: tuple[int, ...]
    host: int

    @property
    def total(self) -> int:
        return sum(self.device) + self.host


def place_weights(
    weights: Sequence[Weight],
    placement: Placement,
    device_rule: BufferRule,
    overrides: Sequence[TensorOverride] = (),
    host_rule: BufferRule = CPU_RULE,
    *,
    arch: str,
    host_repack: Target | None = None,
    loader: LoaderCheck | None = None,
) -> WeightBytes:
    """Bytes of ``weights`` (the tensors a context loads) per device and on the host, the host's unmapped (each
    tensor padded: a dry run, or --no-mmap).

    Args:
        weights: loaded tensors (MTP layers' tensors only when they are loaded).
        placement: planner.weights.placement's unit -> device assignment (``-ngl``, ``-ts``).
        device_rule: how the devices' buffer type pads a tensor (CUDA_RULE on CUDA, CPU_RULE for RPC to a CPU).
        overrides: ``-ot`` entries in order (``--cpu-moe`` / ``--n-cpu-moe`` expanded), first match wins.
        host_rule: the host buffer's padding.
        arch: the model's arch (which layer its global tensors belong to: ``layer_of``).
        host_repack: the CPU backend's repack target where the host weights' buffer list starts with CPU_REPACK
            (no devices' host buffer type before it: a CPU-only or RPC start, or ``--no-host``); None where it does
            not. A tied output on the host is then a second copy where the target repacks it as the output matrix
            (MUL_MAT) while the embedding (GET_ROWS) stays in CPU.
        loader: the devices' op test of the loader (planner.backends.loader_ops; None: they take every weight): a weight
            of a device layer that they refuse is in host memory.
    """
    device = [0] * placement.n_devices
    host = 0
    names = {w.name for w in weights}
    tied = "token_embd.weight" in names and "output.weight" not in names
    matcher = override_matcher(tuple(overrides))
    for w in weights:
        layer = layer_of(w.name, placement.n_layer_all, arch=arch)
        refused = loader is not None and loader.refuses_weight(w.name, w.n_bytes, w.type, w.ne0)
        where = where_weight(w.name, layer, placement, matcher, refused)
        if where is None:
            host += host_rule.alloc_nbytes(w.n_bytes, w.type, w.ne0)
        else:
            device[where] += device_rule.alloc_nbytes(w.n_bytes, w.type, w.ne0)
        if tied and w.name == "token_embd.weight":
            # the output layer's TENSOR_DUPLICATED copy: placed as an output-layer tensor under token_embd's name
            # (the -ot patterns see that name), a second tensor unless it lands in the buffer type holding the
            # input copy (src/llama-model-loader.cpp:1371 TENSOR_DUPLICATED); on the host the mapping is shared
            # (tested as the output matrix: MUL_MAT)
            from rsplan.planner.backends.loader_ops import weight_shape  # deferred: the loader's op tests

            out = where_weight(w.name, "output", placement, matcher, loader is not None
                               and loader.refuses("output", weight_shape(w.n_bytes, w.type, w.ne0), w.type))
            if out is None and where is not None:
                host += host_rule.alloc_nbytes(w.n_bytes, w.type, w.ne0)
            elif out is None:
                host += _host_output_copy(w, host_repack)
            elif out != where:
                device[out] += device_rule.alloc_nbytes(w.n_bytes, w.type, w.ne0)
    return WeightBytes(tuple(device), host)


def _host_output_copy(embd: Weight, target: Target | None) -> int:
    """The bytes of the tied output's copy of the token embedding ``embd`` (2-D: ``ne[1]`` from its bytes), both
    on the host: where ``target`` puts it, as the output matrix, in another host buffer type than the embedding's
    own CPU (CPU_REPACK, or AMX in its own layout: planner.weights.host_weights), else 0 (the same tensor)."""

    if target is None or weight_type(embd.type) is None or not embd.ne0:
        return 0
    # deferred: the loader's op tests (planner.backends.loader_ops), which a CPU estimate does not load
    from rsplan.planner.backends.loader_ops import weight_shape

    ne1 = weight_shape(embd.n_bytes, embd.type, embd.ne0)[1]
    as_output = HostTensor("output.weight", embd.n_bytes, embd.type, (embd.ne0, ne1), 0)
    buft = host_buffer_type(as_output, target, None, use_mmap=False)
    return 0 if buft == "CPU" else buffer_bytes(as_output, buft)


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled once: re's own cache holds 512 patterns, and more -ot entries than that (or
    --n-cpu-moe past 512) recompiled every pattern for every tensor."""
    return re.compile(pattern)


class OverrideMatcher:
    """The first of some ``-ot`` entries whose pattern matches a tensor name, remembered by name: a fit schedules
    the same weights under the same patterns hundreds of times (``override_matcher`` gives one per list)."""

    def __init__(self, overrides: tuple[TensorOverride, ...]) -> None:
        self.overrides = overrides
        self._first: dict[str, TensorOverride | None] = {}

    def first(self, name: str) -> TensorOverride | None:
        try:
            return self._first[name]
        except KeyError:
            hit = next((o for o in self.overrides if _regex(o.pattern).search(name)), None)
            self._first[name] = hit
            return hit


@functools.lru_cache(maxsize=64)
def override_matcher(overrides: tuple[TensorOverride, ...]) -> OverrideMatcher:
    """The matcher of ``overrides`` (one per distinct list, the last 64 kept)."""
    return OverrideMatcher(overrides)


def where_weight(name: str, layer: str | int | None, placement: Placement, overrides: OverrideMatcher,
                 refused: bool = False) -> int | None:
    """The device holding weight ``name`` of ``layer`` (None: host memory): the first matching ``-ot`` entry
    (``overrides``: the entries' matcher, ``override_matcher``), else its layer's device (the input layer always
    on the host); ``refused``: the devices refuse the weight's op (planner.backends.loader_ops), so that its layer's
    buffer list gives it host memory (an ``-ot`` entry naming a device is not tested)."""
    o = overrides.first(name)
    if o is not None:
        return None if o.buffer == "CPU" else int(o.buffer)
    if layer == "input" or refused:
        return None
    if layer == "output":
        return placement.unit_device[placement.n_layer_all]
    if not isinstance(layer, int):
        raise WeightPlacementError(f"tensor {name}: no llama.cpp layer known for it")
    return placement.unit_device[layer]


def loaded(name: str, n_layer: int, load_mtp: bool) -> bool:
    """Whether a context loads tensor ``name``: the MTP (nextn) layers ``blk.{il >= n_layer}`` only with
    ``--spec-type mtp`` (llama.cpp's ``load_mtp``)."""
    m = BLOCK_NAME.match(name)
    return load_mtp or not (m and int(m.group(1)) >= n_layer)


def gguf_weights(tensors: Sequence[tuple[str, int]], rows: Sequence[tuple[str, int]], n_layer: int,
                 load_mtp: bool = False) -> list[Weight]:
    """The loaded tensors of a GGUF from its tensor table ((name, bytes)) and rows ((type, ne0)), same order."""
    if len(tensors) != len(rows):
        raise WeightPlacementError("the GGUF tensor table and its row table differ in length")
    return [Weight(name, n_bytes, type_, ne0) for (name, n_bytes), (type_, ne0) in zip(tensors, rows, strict=True)
            if loaded(name, n_layer, load_mtp)]
