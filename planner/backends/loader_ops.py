"""Which weights a device's buffer refuses when llama.cpp loads the model, so that they land in host memory.

llama.cpp 0c1e57098, src/llama-model-loader.cpp ``create_tensor`` / ``select_weight_buft``: each weight goes to
the first buffer type of its layer's list whose device runs the weight's op (src/llama-model-loader.cpp:927
weight_buft_supported builds a test node of that op over the weight). The op is the tensor's ``LLM_TENSOR_INFOS``
entry (src/llama-arch.cpp:844 LLM_TENSOR_SSM_CONV1D, :845 LLM_TENSOR_SSM_A, :955 LLM_TENSOR_SHORTCONV_CONV); a
``.bias`` tensor's is ADD. A GPU layer's list is the device's buffer type (src/llama-model.cpp:1545
make_gpu_buft_list), then the host's list: the devices' host buffer type (``CUDA_Host``, tested on the same
device, so refused too), the CPU's extra types (CPU_REPACK, AMX: matrix products only) and ``CPU``. A refused
weight of a GPU layer is therefore in host memory, in ``CPU`` (``CPU_Mapped`` with mmap); one of a host layer is
in ``CPU`` instead of ``CUDA_Host`` (without mmap). An ``-ot`` entry naming a device's buffer type is taken as
it is (no test); one naming ``CPU`` walks the host's list.

The ops a device refuses matter (planner.backends.cuda_ops): ``MUL_MAT`` / ``MUL_MAT_ID`` of a matrix whose file type
the device's products do not take (CUDA: the ternary ``tq1_0`` / ``tq2_0``; the token embedding's GET_ROWS likewise,
which decides between ``CUDA_Host`` and ``CPU`` for it), and ``SSM_SCAN`` / ``SSM_CONV`` by their shapes. The
test nodes (src/llama-model-loader.cpp:1010 GGML_OP_SSM_SCAN, :1001
GGML_OP_SSM_CONV), with 512 tokens and 3 sequences:

- ``SSM_CONV`` over kernel ``w`` ``[d_conv, channels]``: ``conv_x [d_conv - 1 + 512, channels, 3]``;
- ``SSM_SCAN`` over ``A = w`` (Mamba-2's ``[1, n_head]``, Mamba's ``[d_state, d_inner]``, PLaMo-2's
  ``[n_head]``): ``d_state = ssm.state_size`` where ``w.ne[0] == 1``, else ``w.ne[0]``; ``n_head = w.ne[1]``;
  ``head_dim = ssm.inner_size / n_head``; ``n_group = ssm.group_count`` or 1; ``s [d_state, head_dim, n_head,
  3]``, ``x [head_dim, n_head, 512, 3]``, ``dt [n_head, 512, 3]``, ``B`` and ``C [d_state, n_group, 512, 3]``,
  ``ids [3]``, one state plane (K = 1).

So PLaMo-2's ``ssm_a`` (``[32]``: read as Mamba's A with a state size of 32) has no CUDA kernel and is loaded on
the host, though the model's scan is Mamba-2's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rsplan.hparams.ggml_types import weight_type
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.ggml import ops as g

if TYPE_CHECKING:  # the graph modules are imported where a test node is built: estimate's CPU path needs none
    from rsplan.planner.backends.devices import DeviceKind
    from rsplan.planner.ggml.alloc import Tensor

#: The loader's test tokens and sequences (src/llama-model-loader.cpp:1002 n_seq_tokens, n_seqs).
TEST_TOKENS = 512
TEST_SEQS = 3

#: The op a weight's stem (its name between ``blk.N.`` and the suffix) is tested with, where a device may refuse
#: it by its shape (src/llama-arch.cpp LLM_TENSOR_INFOS). ``ssm_a`` is SSM_SCAN's only in SCAN_A_ARCHS.
TEST_OPS = {"ssm_a": "SSM_SCAN", "ssm_conv1d": "SSM_CONV", "shortconv.conv": "SSM_CONV"}

#: The archs whose loader creates ``ssm_a`` as LLM_TENSOR_SSM_A (tested with SSM_SCAN: src/models/mamba.cpp:75
#: LLM_TENSOR_SSM_A, and likewise mamba2.cpp, jamba.cpp, falcon-h1.cpp, granite-hybrid.cpp, nemotron-h.cpp and
#: plamo2.cpp); the others' (Qwen3-Next, Qwen3.5, Kimi-Linear) is LLM_TENSOR_SSM_A_NOSCAN, tested with MUL
#: (src/llama-arch.cpp:846 LLM_TENSOR_SSM_A_NOSCAN).
SCAN_A_ARCHS = frozenset({"mamba", "mamba2", "jamba", "falcon-h1", "granitehybrid", "nemotron_h", "nemotron_h_moe",
                          "plamo2"})


@dataclass(frozen=True)
class LoaderCheck:
    """The loader's op test for one model on devices whose ``supports_op`` is given.

    Attributes:
        supports_op: the devices' node predicate (planner.backends.cuda_ops.cuda_supports_op).
        d_inner / d_state / n_group: ``ssm.inner_size``, ``ssm.state_size``, ``ssm.group_count`` (0: 1), which
            the SSM_SCAN test reads (0 where the model has none).
        scan_a: the arch's ``ssm_a`` is tested with SSM_SCAN (SCAN_A_ARCHS); else with MUL, which devices run.
        takes_weight: whether the devices' matrix product (or GET_ROWS) takes a file type with rows of some length
            (planner.backends.cuda_ops.cuda_takes_weight); None: every type.
    """

    supports_op: Callable[[Tensor], bool] | None
    d_inner: int
    d_state: int
    n_group: int
    scan_a: bool = True
    takes_weight: Callable[[str, int, bool], bool] | None = None
    _memo: dict[tuple[str, int, str, int], bool] = field(default_factory=dict, compare=False, hash=False,
                                                         repr=False)

    def refuses(self, stem: str, ne: Sequence[int], type_name: str | None = None) -> bool:
        """Whether the devices refuse a weight of stem ``stem`` (``ssm_a``, ``ssm_conv1d``, ``token_embd``,
        ``output``; a ``.bias`` tensor's stem with ``.bias``), shape ``ne`` (ne0 first) and file type
        ``type_name`` (None: unknown, only its shape is tested)."""
        # the token embedding is tested with GET_ROWS, any other weight of a type with a product
        if (type_name is not None and self.takes_weight is not None
                and not self.takes_weight(type_name, ne[0], stem == "token_embd")):
            return True
        if self.supports_op is None:
            return False
        node = self._test_node(stem, (*ne, 1, 1, 1, 1)[:4])
        return node is not None and not self.supports_op(node)

    def refuses_name(self, name: str, ne: Sequence[int], type_name: str | None = None) -> bool:
        """``refuses`` for a GGUF tensor name (``blk.N.STEM.weight``, ``token_embd.weight``, ...); a ``.bias`` is
        tested with ADD, which devices run."""
        parts = name.split(".", 2)
        rest = parts[2] if len(parts) == 3 and parts[0] == "blk" else name
        if rest.endswith(".bias"):
            return False
        return self.refuses(rest[:-len(".weight")] if rest.endswith(".weight") else rest, ne, type_name)

    def refuses_weight(self, name: str, n_bytes: int, type_name: str, ne0: int) -> bool:
        """``refuses_name`` for a weight of at most two dimensions given by its bytes, type and row length
        (``weight_shape``), remembered by those in this check: a fit places the same weights hundreds of times."""
        key = (name, n_bytes, type_name, ne0)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self.refuses_name(name, weight_shape(n_bytes, type_name, ne0), type_name)
        return hit

    def _test_node(self, stem: str, ne: tuple[int, ...]) -> Tensor | None:

        op = TEST_OPS.get(stem)
        if op is None or (stem == "ssm_a" and not self.scan_a):
            return None
        w = g.weight(*ne, name=stem, layer=None)  # the loader's test op, outside any graph
        if op == "SSM_CONV":
            if ne[1] == 1 and ne[2] == 1:  # the 1-D ``ssm_conv1d`` of a graph is the bias (ADD)
                return None
            conv_x = g.new_tensor(g.F32, ne[0] - 1 + TEST_TOKENS, ne[1], TEST_SEQS)
            return g.ssm_conv(conv_x, w)
        if op == "SSM_SCAN":
            d_state = self.d_state if ne[0] == 1 else ne[0]
            n_head = ne[1]
            if n_head < 1:  # an empty A: the model is refused where its shapes are read
                return None
            head_dim = self.d_inner // n_head
            f32 = g.F32
            s = g.new_tensor(f32, d_state, head_dim, n_head, TEST_SEQS)
            x = g.new_tensor(f32, head_dim, n_head, TEST_TOKENS, TEST_SEQS)
            dt = g.new_tensor(f32, n_head, TEST_TOKENS, TEST_SEQS)
            b = g.new_tensor(f32, d_state, self.n_group, TEST_TOKENS, TEST_SEQS)
            c = g.new_tensor(f32, d_state, self.n_group, TEST_TOKENS, TEST_SEQS)
            ids = g.new_tensor(g.I32, TEST_SEQS)
            return g.ssm_scan(s, x, dt, w, b, c, ids, 1)
        return None


def loader_check(supports_op: Callable[[Tensor], bool] | None, spec: ModelSpec,
                 takes_weight: Callable[[str, int, bool], bool] | None = None) -> LoaderCheck | None:
    """The loader's op test for ``spec`` on devices with ``supports_op`` and ``takes_weight`` (planner.compute.sched
    DeviceKind's; None where they run every op on every type: no weight is refused)."""
    if supports_op is None and takes_weight is None:
        return None
    ssm = spec.ssm
    return LoaderCheck(supports_op, (ssm.inner_size or 0) if ssm else 0, (ssm.state_size or 0) if ssm else 0,
                       (ssm.group_count or 1) if ssm else 1, spec.arch in SCAN_A_ARCHS, takes_weight)


def weight_shape(n_bytes: int, type_name: str, ne0: int) -> tuple[int, int]:
    """(ne0, ne1) of a weight of at most two dimensions from its bytes, type and row length (the tensors the test
    reads are 1-D or 2-D)."""
    t = weight_type(type_name)
    if t is None or not ne0:
        return (ne0, 1)
    return (ne0, n_bytes // t.type_size * t.block_size // ne0)


def device_loader_check(device_kind: str | None, spec: ModelSpec) -> LoaderCheck | None:
    """``loader_check`` for the devices of rsplan's kind ``device_kind`` (planner.backends.devices.DEVICE_KINDS); None
    for None (no devices) and for a kind without a scheduler model, whose devices are taken to take every weight."""

    kind = DEVICE_KINDS.get(device_kind) if device_kind else None
    return kind_loader_check(kind, spec) if kind is not None else None


def kind_loader_check(kind: DeviceKind, spec: ModelSpec) -> LoaderCheck | None:
    """``loader_check`` for devices of ``kind``."""
    return loader_check(kind.supports_op, spec, kind.takes_weight)
