"""The backend scheduler's setting for one context (devices, placement, -ot, -nkvo, op offload), what one graph
through it gives, and the scheduler's constants (ggml/src/ggml-backend.cpp, src/llama-context.cpp at llama.cpp
0c1e57098)."""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.errors import RsplanError
from rsplan.planner.backends.devices import DeviceKind
from rsplan.planner.backends.loader_ops import LoaderCheck
from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.planner.weights.placement import Placement
from rsplan.planner.weights.weight_placement import (
    TensorOverride,
)

#: ggml_is_view_op: nodes the expansion passes and the split skip.
VIEW_OPS = frozenset({"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"})


#: Ops whose weight source does not choose the backend (pass 1 skips them).
NO_WEIGHT_RULE_OPS = frozenset({"ROPE", "FLASH_ATTN_EXT"})


#: The matrix products, whose first source is the weight (ggml_mul_mat, ggml_mul_mat_id).
MATMUL_OPS = frozenset({"MUL_MAT", "MUL_MAT_ID"})


#: GGML_SCHED_MAX_COPIES: input copies with pipeline parallelism.
MAX_COPIES = 4


#: llama_context::graph_get_cb pins ``norm`` nodes below this many ubatch tokens (or with every layer offloaded).
NORM_PIN_TOKENS = 32


#: CPU buffer type alignment (TENSOR_ALIGNMENT).
CPU_ALIGNMENT = 32


class SchedModelError(RsplanError):
    """The scheduler model cannot place this graph (a tensor whose buffer is unknown, a device kind without a
    model)."""


@dataclass(frozen=True)
class SchedSetup:
    """The scheduler's setting for one context.

    Attributes:
        kind: the devices' kind.
        placement: planner.weights.placement's layer split (``n_devices`` backends before the CPU).
        overrides: ``-ot`` entries (``--n-cpu-moe`` expanded) in order.
        offload_kqv: False with ``-nkvo``.
        op_offload: llama.cpp's ``op_offload`` (on unless ``--no-op-offload``).
        tensors: the model's layer tensors by shape (``LayerTensors``): with ``overrides``, which GGUF tensor an
            unnamed graph weight is. None: an unnamed weight is matched as ``blk.N.unnamed.weight`` (only patterns
            naming a whole layer, or nothing of it, place it right).
        loader: the loader's op test of the devices (planner.backends.loader_ops.loader_check): a weight of a
            device layer that they refuse is in host memory. None: every weight is where its layer is (devices
            that run every op, or a caller that does not model it).
    """

    kind: DeviceKind
    placement: Placement
    overrides: tuple[TensorOverride, ...] = ()
    offload_kqv: bool = True
    op_offload: bool = True
    tensors: LayerTensors | None = None
    loader: LoaderCheck | None = None

    @property
    def n_backends(self) -> int:
        return self.placement.n_devices + 1

    @property
    def cpu(self) -> int:
        return self.placement.n_devices

    @property
    def full_offload(self) -> bool:
        return self.placement.n_gpu_layers > self.placement.n_layer_all

    @property
    def n_copies(self) -> int:
        """GGML_SCHED_MAX_COPIES with pipeline parallelism, else 1."""
        parallel = (self.placement.n_devices > 1 and self.full_offload and self.offload_kqv
                    and not self.overrides and self.kind.pipeline)
        return MAX_COPIES if parallel else 1


@dataclass(frozen=True)
class SchedResult:
    """One reserve graph through the scheduler: bytes per backend (devices in order, then the CPU), the number of
    splits and of input copies, and the ops the devices do not run (``SplitGraph.host_ops``)."""

    bytes: tuple[int, ...]
    n_splits: int
    n_copies: int
    host_ops: tuple[tuple[str, int], ...] = ()
