"""The host memory buffers of the weights llama.cpp keeps on the host, named and sized as llama.cpp reports them.

llama.cpp 0c1e57098, for each weight on the host (the token embedding, layers not offloaded, ``-ot ...=CPU``):

- the loader takes the first buffer type of src/llama-model.cpp:1078 make_cpu_buft_list that supports the
  tensor's op: with a GPU device (and without ``--no-host``) that is the GPU's host buffer type (``CUDA_Host``:
  every weight op is taken as supported, as planner.compute.sched takes CUDA's supports_op); without one, ``CPU_REPACK``
  where planner.backends.cpu_repack says the CPU backend repacks the tensor, else ``CPU``;
- with mmap (llama.cpp's default ``--load-mode auto``; off with ``--load-mode none`` / ``mlock`` / ``dio``) a
  GPU host buffer type is replaced by ``CPU`` (src/llama-model-loader.cpp:1269 buft_dev: "avoid using a host
  buffer when using mmap"), so pinned memory holds weights only without mmap;
- the ``CPU`` weights are then mapped from the file (src/llama-model.cpp:1854 is_default_buft): one
  ``CPU_Mapped`` buffer (ggml/src/ggml-backend.cpp:2503 ggml_backend_cpu_buffer_from_ptr_type_get_name) spanning
  the file from the first of these tensors to the end of the last (src/llama-model-loader.cpp:1449
  llama_model_loader::get_mapping_range): the tensors between them that went elsewhere (repacked, offloaded)
  and the padding are inside the span; without mmap, a ``CPU`` buffer of the tensors each padded to 32 bytes;
- ``CPU_REPACK`` and ``CUDA_Host`` buffers are allocated and the tensors read into them: each padded to 32 bytes
  (both take the CPU buffer type's alignment and ggml_nbytes);
- a tied output (no ``output.weight``) is the token embedding again, tested with the output's op (MUL_MAT): a
  copy is made only when that lands in another buffer type (src/llama-model-loader.cpp:1371 TENSOR_DUPLICATED).

A dry run (llama-fit-params, ``no_alloc``) never maps: it reports the ``CPU`` (or ``CUDA_Host``) buffer of the
no-mmap case. Measured on the CPU backend (tests/golden/llamacpp-breakdown/buffer-types): CPU_Mapped, CPU and
CPU_REPACK with and without mmap and repacking; CUDA_Host comes from the source only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsplan.planner.backends.cpu_amx import amx_bytes
from rsplan.planner.backends.cpu_repack import DEFAULT_TARGET, Target, parse_target, repacked

if TYPE_CHECKING:
    from rsplan.planner.backends.loader_ops import LoaderCheck

#: The GGUF data alignment (general.alignment's default) and the host buffer types' alignment.
ALIGNMENT = 32


@dataclass(frozen=True)
class HostTensor:
    """One weight in the file: GGUF name, ggml_nbytes, ggml type, shape (ne0 first) and its data offset."""

    name: str
    n_bytes: int
    type: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class WeightTable:
    """A model's tensor table as the host buffers need it: (name, ggml_nbytes), (type, ne0) and the shape of each
    tensor in file order, and the file's data alignment (where each tensor lies: a CPU_Mapped span)."""

    tensors: Sequence[tuple[str, int]]
    rows: Sequence[tuple[str, int]]
    shapes: Sequence[tuple[int, ...]]
    alignment: int = 32


#: llama.cpp's ``--load-mode`` values (common/arg.cpp:2700 LLAMA_LOAD_MODE_AUTO ...); the loader maps the file for these
#: (src/llama-model-loader.cpp:559 use_mmap; ``auto`` unless a device lacks mmap support, which the devices
#: rsplan models (CUDA, ROCm, MUSA, SYCL, RPC, the CPU) all have).
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
MAPPED_MODES = ("auto", "mmap", "mmap+mlock")


@dataclass(frozen=True)
class HostOptions:
    """How llama.cpp lays out host weights: the CPU it repacks for (``--cpu-repack``; ``none`` = ``--no-repack``)
    and whether it maps the file (``--load-mode``: auto / mmap / mmap+mlock map it).

    ``load_mode``: the ``--load-mode`` asked for, printed with the command (None: ``auto`` with mmap, ``none``
    without); it must agree with ``use_mmap``. ``no_host``: ``--no-host`` (common/arg.cpp:2433 no_host): the GPUs'
    host buffer type is left out of the host weights' buffer list (src/llama-model.cpp:1078 make_cpu_buft_list), so
    without mmap they go to ``CPU_REPACK`` / ``CPU`` as on a CPU-only build instead of ``CUDA_Host``; the host
    compute and output buffers keep it.
    """

    repack: Target = dataclasses.field(default_factory=lambda: parse_target(DEFAULT_TARGET))
    use_mmap: bool = True
    load_mode: str | None = None
    no_host: bool = False

    def __post_init__(self) -> None:
        if self.load_mode is not None and (self.load_mode not in LOAD_MODES
                                           or (self.load_mode in MAPPED_MODES) != self.use_mmap):
            raise ValueError(f"load mode {self.load_mode!r} with use_mmap={self.use_mmap}")

    @property
    def mode(self) -> str:
        """The ``--load-mode`` a started llama.cpp runs with."""
        return self.load_mode or ("auto" if self.use_mmap else "none")

    def flags(self) -> list[str]:
        """The llama.cpp 0c1e57098 flags that reproduce these options: ``--no-repack`` (common/arg.cpp:2423
        no_extra_bufts) for target ``none``, ``--load-mode MODE`` (common/arg.cpp:2700 load_mode) for a mode other
        than ``auto``. The target CPU is the build's, not a flag."""
        out = [] if self.repack.repacks else ["--no-repack"]
        out += ["--no-host"] if self.no_host else []
        return out + ([] if self.mode == "auto" else [f"--load-mode {self.mode}"])

    def weights_host_buffer(self, gpu_host: str | None) -> str | None:
        """The GPUs' host buffer type ``gpu_host`` as the host weights' buffer list has it: None with
        ``--no-host``."""
        return None if self.no_host else gpu_host

    def describe(self) -> str:
        """``--load-mode MODE, --cpu-repack TARGET`` in words, for notes."""
        return f"--load-mode {self.mode}, --cpu-repack {self.repack.name}" + (", --no-host" if self.no_host else "")


def gguf_table(index: Any) -> WeightTable:
    """The table of a scanned GGUF (hparams.gguf_file.GGUFIndex): its file order and data alignment."""
    return WeightTable(index.tensors, index.tensor_rows, index.tensor_shapes, index.alignment)


def table_tensors(table: WeightTable) -> list[HostTensor]:
    """Every tensor of ``table`` with its data offset (file order, each padded to the file's alignment)."""
    offsets = file_offsets([n for _, n in table.tensors], table.alignment)
    return [HostTensor(name, n_bytes, type_, tuple(shape), off)
            for (name, n_bytes), (type_, _), shape, off in zip(table.tensors, table.rows, table.shapes, offsets,
                                                                strict=True)]


def file_offsets(sizes: Sequence[int], alignment: int = ALIGNMENT) -> list[int]:
    """Each tensor's offset in the data section: tensors in file order, each padded to ``alignment``."""
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += -(-n // alignment) * alignment
    return out


def _pad(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def host_buffer_type(t: HostTensor, target: Target, gpu_host: str | None, use_mmap: bool,
                     loader: LoaderCheck | None = None) -> str:
    """The buffer type weight ``t`` lands in on the host (before mapping: ``CPU``, ``CPU_REPACK``, ``CUDA_Host``).

    ``gpu_host``: the host buffer type of the first GPU (``CUDA_Host``), None without a GPU or with --no-host.
    ``loader``: the GPUs' op test of the loader (planner.backends.loader_ops): a weight they refuse skips their host
    buffer type, and the CPU's extra types, which run matrix products only, to ``CPU``.
    """
    if gpu_host is not None:
        if loader is not None and loader.refuses_name(t.name, t.shape, t.type):
            return "CPU"
        return "CPU" if use_mmap else gpu_host
    if "amx" in target.features and amx_bytes(t.name, t.type, t.shape, t.n_bytes) is not None:
        return "AMX"
    return "CPU_REPACK" if repacked(t.name, t.type, t.shape, target) else "CPU"


def buffer_bytes(t: HostTensor, buft: str) -> int:
    """The bytes weight ``t`` takes in host buffer type ``buft``: its ggml_nbytes (the AMX layout's in ``AMX``,
    planner.backends.cpu_amx), padded to 32."""
    if buft == "AMX":
        n = amx_bytes(t.name, t.type, t.shape, t.n_bytes)
        assert n is not None  # host_buffer_type chose AMX for it
        return _pad(n)
    return _pad(t.n_bytes)


def host_buffers(tensors: Sequence[HostTensor], target: Target, *, gpu_host: str | None = None,
                 use_mmap: bool = True, tied_output_on_host: bool = False,
                 loader: LoaderCheck | None = None) -> dict[str, int]:
    """Bytes per host buffer type name (``CPU_Mapped``, ``CPU``, ``CPU_REPACK``, ``AMX``, ``CUDA_Host``) of the weights
    ``tensors`` (the ones on the host, loaded, with their file offsets), as llama.cpp's memory breakdown reports
    them: a ``CPU_Mapped`` span with mmap, padded tensors otherwise.

    Args:
        tied_output_on_host: the model has no ``output.weight`` and its output layer is on the host: the token
            embedding is also the output matrix (MUL_MAT), copied where that lands in another buffer type.
        loader: the GPUs' op test of the loader (``host_buffer_type``).
    """
    out: dict[str, int] = {}
    mapped: list[HostTensor] = []
    for t in tensors:
        buft = host_buffer_type(t, target, gpu_host, use_mmap, loader)
        if buft == "CPU" and use_mmap:
            mapped.append(t)
        else:
            out[buft] = out.get(buft, 0) + buffer_bytes(t, buft)
        if tied_output_on_host and t.name == "token_embd.weight":
            # the copy is tested as the output matrix (MUL_MAT); the mapped CPU copy is the same tensor
            as_output = HostTensor("output.weight", t.n_bytes, t.type, t.shape, t.offset)
            dup = host_buffer_type(as_output, target, gpu_host, use_mmap)
            if dup != buft:
                out[dup] = out.get(dup, 0) + buffer_bytes(as_output, dup)
    if mapped:
        first = min(t.offset for t in mapped)
        last = max(t.offset + t.n_bytes for t in mapped)
        out["CPU_Mapped"] = last - first
    return out
