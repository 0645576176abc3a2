"""The host weight buffers a started llama.cpp holds for one layer placement (``rsplan capacity`` / ``report``).

llama.cpp's dry run (what ``--fit`` measures: common/fit.cpp:58 mparams_copy.load_mode is
``LLAMA_LOAD_MODE_NONE``) reads every host weight into a buffer, padded to 32 bytes; a real run lays them out by
``--load-mode`` and the CPU backend's repacking (planner.weights.host_weights):

- which weights stay on the host: the loaded tensors planner.weights.weight_placement puts nowhere else (the token
  embedding, layers not offloaded);
- their buffers: with mmap (``--load-mode auto``, the default) the ``CPU`` weights are one ``CPU_Mapped`` span of
  the file, from the first of them to the end of the last, whatever lies between (tensors repacked or offloaded,
  padding); ``CPU_REPACK`` weights are read into their own buffer ON TOP of that span; without mmap the weights
  are read into ``CPU`` / ``CPU_REPACK`` buffers, or into the GPUs' pinned host buffer type (``CUDA_Host``);
- the devices' host buffer type decides whether the CPU repacks at all: a device kind with one (CUDA, ROCm,
  MUSA, SYCL) comes first in src/llama-model.cpp:1078 make_cpu_buft_list and takes every host weight (then, with
  mmap, src/llama-model-loader.cpp:1269 buft_dev swaps it for ``CPU``: mapped); RPC devices have none
  (ggml/src/ggml-rpc/ggml-rpc.cpp:2258 get_host_buffer_type NULL), so host weights are repacked as on a CPU-only
  build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsplan.planner.weights.host_weights import HostOptions, WeightTable, host_buffer_type, host_buffers, table_tensors
from rsplan.planner.weights.weight_placement import TensorOverride, Weight, layer_of, override_matcher, where_weight

if TYPE_CHECKING:
    from rsplan.planner.backends.loader_ops import LoaderCheck
    from rsplan.planner.weights.placement import Placement

#: Each device kind's host buffer type name (ggml_backend_dev_host_buffer_type of the first device:
#: ggml/src/ggml-cuda/ggml-cuda.cu:1258 GGML_CUDA_NAME + "_Host", which is ROCm / MUSA in those builds;
#: ggml/src/ggml-sycl/ggml-sycl.cpp:1565 GGML_SYCL_NAME + "_Host"; ggml/src/ggml-vulkan/ggml-vulkan.cpp:13060
#: ggml_backend_vk_host_buffer_type_name); None: the kind has none (RPC; Metal, ggml/src/ggml-metal/ggml-metal.cpp:822
#: get_host_buffer_type NULL).
HOST_BUFFER_TYPES: dict[str, str | None] = {"CUDA": "CUDA_Host", "ROCm": "ROCm_Host", "MUSA": "MUSA_Host",
                                            "SYCL": "SYCL_Host", "RPC": None, "Vulkan": "Vulkan_Host",
                                            "Metal": None}


@dataclass(frozen=True)
class HostWeights:
    """The host weight buffers of one start.

    Attributes:
        buffers: bytes per host buffer type name (``CPU_Mapped``, ``CPU``, ``CPU_REPACK``, ``CUDA_Host``, ...).
        mapped_elsewhere: bytes of the ``CPU_Mapped`` span that are no weight used from the mapping (tensors
            repacked or offloaded, padding): page cache read once at load, which the OS may reclaim (0 without
            mmap).
        options: the options they were laid out with.
        gpu_host: the devices' host buffer type (``CUDA_Host``, ...), which comes before CPU_REPACK, so that nothing
            is repacked; None for a kind without one (RPC).
    """

    buffers: dict[str, int]
    mapped_elsewhere: int
    options: HostOptions
    gpu_host: str | None = None

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def describe(self) -> str:
        """``CPU_Mapped 1,234 B + CPU_REPACK 567 B`` (bytes by buffer type, largest first), or ``none``."""
        parts = [f"{name} {n:,} B" for name, n in sorted(self.buffers.items(), key=lambda kv: (-kv[1], kv[0]))]
        return " + ".join(parts) or "none"


def gpu_host_buffer(device_kind: str | None) -> str | None:
    """The host buffer type of the devices of ``device_kind`` (HOST_BUFFER_TYPES; another name counts as CUDA, as
    the devices' buffer rule does: planner.capacity.charges); None: no device (a CPU-only start) or RPC."""
    return None if device_kind is None else HOST_BUFFER_TYPES.get(device_kind, "CUDA_Host")


def host_weights(table: WeightTable, weights: Sequence[Weight], placement: Placement, options: HostOptions,
                 gpu_host: str | None, overrides: Sequence[TensorOverride] = (), *, arch: str,
                 loader: LoaderCheck | None = None) -> HostWeights:
    """The host buffers of ``weights`` (the tensors the context loads) that ``placement`` and ``overrides``
    (``-ot``, first match wins) leave on the host.

    Args:
        table: the model file's whole tensor table (file order: where each tensor lies).
        gpu_host: the devices' host buffer type (``gpu_host_buffer``), None without one (``--no-host`` in
            ``options`` leaves it out).
        arch: the model's arch (which layer its global tensors belong to: planner.weights.weight_placement.layer_of).
        loader: the devices' op test of the loader (planner.backends.loader_ops): weights they refuse are on the host,
            in ``CPU``.
    """
    gpu_host = options.weights_host_buffer(gpu_host)
    matcher = override_matcher(tuple(overrides))
    tensors = table_tensors(table)
    refused = {t.name for t in tensors if loader is not None and loader.refuses_name(t.name, t.shape, t.type)}
    on_host = {w.name for w in weights
               if where_weight(w.name, layer_of(w.name, placement.n_layer_all, arch=arch), placement,
                               matcher, w.name in refused) is None}
    tensors = [t for t in tensors if t.name in on_host]
    names = {w.name for w in weights}
    tied_on_host = ("token_embd.weight" in names and "output.weight" not in names
                    and placement.unit_device[placement.n_layer_all] is None)
    buffers = host_buffers(tensors, options.repack, gpu_host=gpu_host, use_mmap=options.use_mmap,
                           tied_output_on_host=tied_on_host, loader=loader)
    used = sum(t.n_bytes for t in tensors
               if host_buffer_type(t, options.repack, gpu_host, options.use_mmap, loader) == "CPU")
    elsewhere = buffers["CPU_Mapped"] - used if "CPU_Mapped" in buffers else 0
    return HostWeights(buffers, elsewhere, options, gpu_host)
