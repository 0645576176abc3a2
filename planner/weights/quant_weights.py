"""The weight tensors of a model after ``llama-quantize`` to one ftype, and the bytes they take in a buffer.

The input is the GGUF ``convert_hf_to_gguf.py --outtype bf16`` writes (hparams.tensors: every tensor of the
arch with the converter's type: bf16 matrices, f32 norms / conv kernels / routers), quantized as
``llama-quantize IN OUT QUANT`` does (planner.weights.quant: the per-tensor mixture, fallbacks, imatrix refusal). The
plan covers every tensor of the file, MTP (nextn) layers included, because llama-quantize's counters see them;
the weights llama.cpp loads are the tensors a plain context loads (MTP only with ``--spec-type mtp``), each
padded as its buffer type pads it (planner.backends.buffers: 32 B on the CPU; 128 B and rows padded to 512 elements for
quantized tensors on CUDA). ``quantized_model`` answers ``--quant TYPE`` (estimate, capacity, report) for one
model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rsplan.errors import RsplanError, UnsupportedArchError
from rsplan.hparams.converter_types import tensor_type
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import resolve_model
from rsplan.hparams.tensors import MissingFieldError, tensor_list
from rsplan.planner.backends.buffers import CPU_RULE, BufferRule
from rsplan.planner.weights.host_weights import WeightTable
from rsplan.planner.weights.quant import QuantPlan, quantize_plan
from rsplan.planner.weights.quant_ftypes import parse_ftype
from rsplan.planner.weights.quant_inputs import WeightTensor, quant_model

if TYPE_CHECKING:
    from rsplan.planner.weights.layer_tensors import LayerTensors

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
        """(name, bytes) of every tensor in the file, bytes = ggml_nbytes (planner.estimate.breakdown's tensor
        table)."""
        return tuple((t.name, t.n_bytes) for t in self.plan.tensors)

    def layer_tensors(self) -> LayerTensors:
        """The loaded tensors' names, shapes and types as the scheduler model reads them
        (planner.weights.layer_tensors.LayerTensors: which GGUF tensor a graph weight is, and the type of its copy on a
        device)."""
        # deferred: the scheduler model's tensor view, which a CPU estimate does not load
        from rsplan.planner.weights.layer_tensors import LayerTensors

        loaded = [t for t in self.plan.tensors if t.name in self.loaded]
        return LayerTensors.of(((t.name, t.ne) for t in loaded), {t.name: t.type for t in loaded})

    @property
    def rows(self) -> tuple[tuple[str, int], ...]:
        """(ggml type, ``ne[0]``) of every tensor, in ``table``'s order (a device buffer's row padding)."""
        return tuple((t.type, t.ne[0]) for t in self.plan.tensors)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape (ne0 first) of every tensor, in ``table``'s order (which ones the CPU repacks)."""
        return tuple(t.ne for t in self.plan.tensors)

    @property
    def weight_table(self) -> WeightTable:
        """The tensor table in the order llama-quantize writes the file (src/llama-quant.cpp:1056 weights_map: by
        layer, then name) at the default 32-byte data alignment (planner.estimate.breakdown's exact host buffers)."""
        return WeightTable(self.table, self.rows, self.shapes, 32)

    def buffer_bytes(self, rule: BufferRule, load_mtp: bool = False) -> int:
        """Bytes of the loaded tensors in one buffer of ``rule``, each padded as that buffer type pads it."""
        return sum(rule.alloc_nbytes(t.n_bytes, t.type, t.ne[0]) for t in self.plan.tensors
                   if load_mtp or t.name in self.loaded)


#: A built-in preset that sets each field a tensor list may need (the hint of that error; others: mamba-130m).
_PRESET_SETTING = {
    "expert_count": "qwen3-next-80b-a3b", "expert_used_count": "qwen3-next-80b-a3b",
    "expert_feed_forward_length": "qwen3-next-80b-a3b", "expert_shared_feed_forward_length": "qwen3-next-80b-a3b",
    "expert_shared_count": "kimi-linear-48b-a3b", "leading_dense_block_count": "kimi-linear-48b-a3b",
    "expert_layers": "jamba-v0.1",
}

def quantized_weights(spec: ModelSpec, quant: str) -> QuantWeights:
    """``llama-quantize`` of the model's bf16 GGUF to ``quant`` (an ftype name llama-quantize accepts).

    Raises:
        UnsupportedArchError: no tensor list for the arch, or a key it needs (vocab_size, ...) missing.
        ContextError: an unknown ftype (the message lists the valid names), or one that needs an imatrix.
    """

    ftype = parse_ftype(quant)  # the name is checked before the model's tensor list
    infos = tensor_list(spec)
    source = [WeightTensor(t.name, t.shape, tensor_type(t, SOURCE_OUTTYPE)) for t in infos]
    plan = quantize_plan(source, quant_model(spec, spec.expert_count), ftype)
    return QuantWeights(plan, frozenset(t.name for t in infos if t.loaded))


@dataclass(frozen=True)
class QuantizedModel:
    """``quantized_model``'s answer.

    Attributes:
        spec: the spec with ``weights_bytes`` set to the loaded tensors' bytes, each padded as the backend's
            buffer type pads it (``CPU``: 32 B; a GPU: CUDA's 128 B and 512-element rows).
        table: (name, ggml_nbytes) of every tensor in the file (exact model bytes on the CPU backend).
        note: where the weights come from, in one line.
        weights: the quantization itself (each tensor's type, rows and shape: exact device bytes).
    """

    spec: ModelSpec
    table: tuple[tuple[str, int], ...]
    note: str
    weights: QuantWeights


def quantized_model(ref: str, spec: ModelSpec, quant: str, rule: BufferRule = CPU_RULE, *,
                    vocab_unknown: str | None = None) -> QuantizedModel:
    """``--quant TYPE`` (estimate, capacity, report) for one model given as ``ref``.

    A config.json's spec has the converter's token count where config.json alone decides it (hparams.hf_vocab);
    otherwise it gets the error naming vocab_size, with ``vocab_unknown`` (why the config does not give it) when
    known. A GGUF is refused: its own tensor table already gives its weights exactly, and what llama-quantize
    makes of it depends on the types it holds (a quantized input needs ``--allow-requantize`` and its result
    differs from the bf16-sourced one modelled here), so an estimate from it would claim an exactness it does not
    have.

    Returns:
        The quantized model (QuantizedModel), its tensors sized as a buffer of ``rule`` pads them (the CPU's, or
        a device's: planner.backends.buffers.DEVICE_RULES).

    Raises:
        RsplanError: a GGUF input; an arch without a tensor list or a spec missing a key it needs (named); an
            unknown TYPE (the valid names listed); a TYPE that needs an importance matrix.
    """
    if is_gguf(ref):
        raise RsplanError(f"--quant: {ref} is a GGUF: its tensor table gives its weights exactly; --quant applies "
                          "to presets (quantize the file with llama-quantize, then give the result)")
    try:
        weights = quantized_weights(spec, quant)
    except UnsupportedArchError as exc:
        hint = ""
        if vocab_unknown is not None and spec.vocab_size is None:
            hint = f" (config.json does not give it: {vocab_unknown}; give it in a preset YAML)"
        elif isinstance(exc, MissingFieldError):
            example = _PRESET_SETTING.get(exc.field, "mamba-130m")
            hint = f" (give it in a preset YAML, as `rsplan presets show {example}` does)"
        raise RsplanError(f"--quant {quant}: {exc}{hint}") from None
    n_fallback = weights.plan.n_fallback
    note = (f"llama-quantize {weights.ftype} of the converter's {SOURCE_OUTTYPE} GGUF ({len(weights.plan.tensors)} "
            "tensors" + (f", {n_fallback} with a fallback type" if n_fallback else "") + ")")
    if spec.tie_word_embeddings is None:
        note += ("; output.weight counted as a tensor of its own: the converter writes it when the checkpoint has "
                 "lm_head.weight, which nothing read here says (give tie_word_embeddings in a preset YAML, or the "
                 "model directory with model.safetensors.index.json)")
    n_bytes = weights.buffer_bytes(rule)
    return QuantizedModel(spec.model_copy(update={"weights_bytes": n_bytes}), weights.table, note, weights)


def is_gguf(ref: str) -> bool:
    """A local or remote GGUF reference (a GGUF file by its magic, or a ``.gguf`` name / URL)."""


    if ref.split("?", 1)[0].lower().endswith(".gguf"):
        return True
    return Path(ref).exists() and resolve_model(ref)[0] == "gguf"
