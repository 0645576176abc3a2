"""What ``llama-quantize`` writes for every weight tensor: the type it picks and the exact bytes.

Rules of llama.cpp 0c1e57098 (each module names the functions it follows):
- the ftype names and their default types: ``quant_ftypes``;
- the tensors and hyper-parameters the rules read, and the loader's order: ``quant_inputs``;
- which tensors keep their type (``tensor_allows_quantization``): ``quant_allowed``;
- the per-tensor mixture (``llama_tensor_get_type_impl``): ``quant_mixture``;
- here: src/llama-quant.cpp ``tensor_type_fallback``: a row length that is not a whole number of blocks of the
  chosen type demotes it (and ``llama-quantize`` prints a warning, reproduced in ``QuantTensor.fallback``);
  ``tensor_requires_imatrix``: the very-low-bit types ``llama-quantize`` refuses to write without ``--imatrix``
  (its ``--dry-run`` only warns); ``llama_model_quantize_impl`` (``--dry-run``): the size of a quantized tensor
  is ``ggml_nrows * ggml_row_size(new_type, ne[0])``, of a copied one ``ggml_nbytes``.

Bytes are exact integers. ``--pure``, ``--leave-output-tensor``, ``--tensor-type``, ``--output-tensor-type``,
``--token-embedding-type`` and ``--prune-layers`` are not modelled: the result is the plain
``llama-quantize IN OUT TYPE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.errors import ContextError, printable
from rsplan.hparams.ggml_types import GGMLType
from rsplan.planner.weights.quant_allowed import allows_quantization
from rsplan.planner.weights.quant_ftypes import FType, parse_ftype, resolve_alias
from rsplan.planner.weights.quant_inputs import QuantModel, WeightTensor, loader_order, weight_type
from rsplan.planner.weights.quant_mixture import QuantizeState, mixture_type, tensor_category

#: tensor_type_fallback: the smaller-block type a 256-block type falls back to.
FALLBACK_TYPES: dict[str, str] = {
    "iq1_s": "iq4_nl", "iq1_m": "iq4_nl", "iq2_xxs": "iq4_nl", "iq2_xs": "iq4_nl", "iq2_s": "iq4_nl",
    "iq3_xxs": "iq4_nl", "iq3_s": "iq4_nl", "iq4_xs": "iq4_nl",
    "q2_0": "q4_0", "q2_K": "q4_0", "q3_K": "q4_0", "tq1_0": "q4_0", "tq2_0": "q4_0",
    "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0",
}  # fmt: skip
#: tensor_requires_imatrix: types llama-quantize will not write without an importance matrix (q2_K only in Q2_K_S).
IMATRIX_TYPES = frozenset({"iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_m", "iq1_s"})


@dataclass(frozen=True)
class QuantTensor:
    """One tensor as ``llama-quantize`` writes it.

    Attributes:
        name, ne, source_type: the input tensor.
        type: the ggml type written.
        n_bytes: bytes of its data (``ggml_nrows * ggml_row_size(type, ne[0])``), alignment padding excluded.
        quantized: whether the tensor is converted (type differs from the source type).
        fallback: llama-quantize's warning line when the row length forced a fallback type, else None.
        requires_imatrix: llama-quantize refuses this tensor's type without ``--imatrix``.
    """

    name: str
    ne: tuple[int, ...]
    source_type: str
    type: str
    n_bytes: int
    quantized: bool
    fallback: str | None = None
    requires_imatrix: bool = False


@dataclass(frozen=True)
class QuantPlan:
    """The whole model after ``llama-quantize``: tensors in the order it processes (and prints) them."""

    ftype: FType
    tensors: tuple[QuantTensor, ...]

    @property
    def n_bytes(self) -> int:
        """Bytes of all tensor data (llama-quantize's "quant size"; GGUF alignment padding excluded)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_fallback(self) -> int:
        return sum(t.fallback is not None for t in self.tensors)

    @property
    def requires_imatrix(self) -> bool:
        return any(t.requires_imatrix for t in self.tensors)

    def warnings(self) -> list[str]:
        """llama-quantize's warning lines for this plan (fallbacks, then the totals it prints at the end)."""
        lines = [t.fallback for t in self.tensors if t.fallback]
        if self.requires_imatrix:
            lines.append(
                "llama_model_quantize_impl: WARNING: dry run completed successfully, but actually completing this "
                "quantization will require an imatrix!"
            )
        if self.n_fallback:
            lines.append(
                f"llama_model_quantize_impl: WARNING: {self.n_fallback} of {len(self.tensors)} tensor(s) "
                "required fallback quantization"
            )
        return lines


def _fallback(tensor: WeightTensor, target: str) -> tuple[str, str | None]:
    """``tensor_type_fallback``: a type whose block divides ``ne[0]``, and llama-quantize's warning if it changed."""
    ncols = tensor.ne[0]
    qk = weight_type(target).block_size
    if ncols % qk == 0:
        return target, None
    msg = (
        f"warning: {tensor.name:<36} - ncols {ncols:6d} not divisible by {qk:3d} (required for type {target:>7}) "
    )
    if target in FALLBACK_TYPES:
        new = FALLBACK_TYPES[target]
    elif qk <= 32:
        new = target
    else:
        raise ContextError(f"llama-quantize: no tensor type fallback is defined for type {target} ({tensor.name})")
    if ncols % weight_type(new).block_size:
        msg += "(WARNING: must use F16 due to unusual shape) "
        new = "f16"
    return new, msg + f"-> falling back to {new:>7}"


def _requires_imatrix(name: str, type_: str, ftype: str) -> bool:
    """``tensor_requires_imatrix``."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return type_ in IMATRIX_TYPES or (type_ == "q2_K" and ftype == "Q2_K_S")


def quantize_plan(
    tensors: list[WeightTensor] | tuple[WeightTensor, ...],
    model: QuantModel,
    quant: str | FType,
    *,
    has_imatrix: bool = False,
    dry_run: bool = False,
) -> QuantPlan:
    """What ``llama-quantize IN.gguf OUT.gguf QUANT`` writes for a GGUF holding ``tensors``.

    Args:
        tensors: every tensor of the input GGUF (any order; they are processed in the loader's order).
        model: the hyper-parameters the rules read.
        quant: an ftype name (``Q4_K_M``, ``q8_0``, ...) or a parsed ``FType``.
        has_imatrix: an importance matrix is given (changes a few choices and lifts the imatrix refusal).
        dry_run: like ``--dry-run``: tensors that need an imatrix are flagged instead of refused.

    Returns:
        The plan, tensors in the order llama-quantize processes and prints them.

    Raises:
        ContextError: unknown quant or tensor type; a tensor whose type needs an imatrix when ``has_imatrix`` and
            ``dry_run`` are both false (llama-quantize stops there); a rule llama-quantize fails on (an expert
            ffn tensor without a layer index, a q1_0 row that is not a whole number of blocks).
    """
    ftype = resolve_alias(quant) if isinstance(quant, FType) else parse_ftype(quant)
    ordered = loader_order(tensors)
    for t in ordered:
        if not 1 <= len(t.ne) <= 4 or any(d < 1 for d in t.ne):
            raise ContextError(f"tensor {printable(t.name)}: bad shape {t.ne} (1 to 4 dimensions, each >= 1)")
        _row_bytes(weight_type(t.type), t.ne[0], t.name)  # the stored tensor itself must be whole blocks
    qs = QuantizeState(model, ordered, has_imatrix)
    default = ftype.default_type
    copy_only = ftype.name == "COPY"
    out: list[QuantTensor] = []
    for t in ordered:
        new_type, note = t.type, None
        allowed = not copy_only and allows_quantization(t, model.arch)
        if allowed:
            new_type = default
            if weight_type(default).is_quantized:
                new_type = mixture_type(qs, default, t, ftype.name, tensor_category(t.name))
                new_type, note = _fallback(t, new_type)
        needs_imatrix = allowed and _requires_imatrix(t.name, new_type, ftype.name)
        if needs_imatrix and not has_imatrix and not dry_run:
            raise ContextError(
                f"{ftype.name} requires an importance matrix: llama-quantize refuses tensor {printable(t.name)} as "
                f"{new_type} without --imatrix"
            )
        n_bytes = t.n_rows * _row_bytes(weight_type(new_type), t.ne[0], t.name)
        out.append(QuantTensor(t.name, t.ne, t.type, new_type, n_bytes, new_type != t.type, note, needs_imatrix))
    return QuantPlan(ftype, tuple(out))


def _row_bytes(type_: GGMLType, n: int, name: str) -> int:
    if n % type_.block_size:
        raise ContextError(
            f"tensor {printable(name)}: a row of {n} elements is not a whole number of {type_.name} blocks "
            f"({type_.block_size} elements each)"
        )
    return n // type_.block_size * type_.type_size
