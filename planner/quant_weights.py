"""The weight tensors of a model after ``llama-quantize`` to one ftype, and the bytes they take in a buffer.

The input is the GGUF ``convert_hf_to_gguf.py --outtype bf16`` writes (hparams.tensors: every tensor of the
arch with the converter's type: bf16 matrices, f32 norms / conv kernels / routers), quantized as
``llama-quantize IN OUT QUANT`` does (planner.quant: the per-tensor mixture, fallbacks, imatrix refusal). The
plan covers every tensor of the file, MTP (nextn) layers included, because llama-quantize's counters see them;
the weights llama.cpp loads are the tensors a plain context loads (MTP only with ``--spec-type mtp``), each
padded as its buffer type pads it (planner.buffers: 32 B on the CPU; 128 B and rows padded to 512 elements for
quantized tensors on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.hparams.model import ModelSpec
from rsplan.hparams.tensors import tensor_list, tensor_type
from rsplan.planner.buffers import BufferRule
from rsplan.planner.quant import QuantPlan, WeightTensor, quant_model, quantize_plan

#: The converter's output type the plan starts from (llama-quantize's usual input).
SOURCE_OUTTYPE = "bf16"


@dataclass(frozen=True)
class QuantWeights:
    """A model's weights after llama-quantize.

    Attributes:
        plan: llama-quantize's plan over every tensor of the file.
        loaded: names of the tensors a plain context loads (MTP layers' tensors excluded).
    """

    plan: QuantPlan
    loaded: frozenset[str]

    @property
    def ftype(self) -> str:
        """The ftype name llama-quantize prints (aliases resolved: ``Q4_K`` is ``Q4_K_M``)."""
        return self.plan.ftype.name

    @property
    def table(self) -> tuple[tuple[str, int], ...]:
        """(name, bytes) of every tensor in the file, bytes = ggml_nbytes (planner.breakdown's tensor table)."""
        return tuple((t.name, t.n_bytes) for t in self.plan.tensors)

    @property
    def rows(self) -> tuple[tuple[str, int], ...]:
        """(ggml type, ``ne[0]``) of every tensor, in ``table``'s order (a device buffer's row padding)."""
        return tuple((t.type, t.ne[0]) for t in self.plan.tensors)

    def buffer_bytes(self, rule: BufferRule, load_mtp: bool = False) -> int:
        """Bytes of the loaded tensors in one buffer of ``rule``, each padded as that buffer type pads it."""
        return sum(rule.alloc_nbytes(t.n_bytes, t.type, t.ne[0]) for t in self.plan.tensors
                   if load_mtp or t.name in self.loaded)


def quantized_weights(spec: ModelSpec, quant: str) -> QuantWeights:
    """``llama-quantize`` of the model's bf16 GGUF to ``quant`` (an ftype name llama-quantize accepts).

    Raises:
        UnsupportedArchError: no tensor list for the arch, or a key it needs (vocab_size, ...) missing.
        ContextError: an unknown ftype (the message lists the valid names), or one that needs an imatrix.
    """
    from rsplan.planner.quant import parse_ftype

    ftype = parse_ftype(quant)  # the name is checked before the model's tensor list
    infos = tensor_list(spec)
    source = [WeightTensor(t.name, t.shape, tensor_type(t, SOURCE_OUTTYPE)) for t in infos]
    plan = quantize_plan(source, quant_model(spec, spec.expert_count), ftype)
    return QuantWeights(plan, frozenset(t.name for t in infos if t.loaded))
