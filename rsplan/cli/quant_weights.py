"""``--quant TYPE`` (estimate, capacity, report): a preset's weights as llama-quantize writes them.

A config.json's spec has no vocab_size (hparams.hf_config does not read the tokenizer), so it gets the error
naming it.

A GGUF is refused: its own tensor table already gives its weights exactly, and what llama-quantize makes of it
depends on the types it holds (a quantized input needs ``--allow-requantize`` and its result differs from the
bf16-sourced one modelled here), so an estimate from it would claim an exactness it does not have.
"""

from __future__ import annotations

from typing import Any

from rsplan.errors import RsplanError, UnsupportedArchError


def quantized_model(ref: str, spec: Any, quant: str, backend: str = "CPU", *, with_rows: bool = False) -> Any:
    """``--quant TYPE`` for one model.

    Returns:
        The spec with ``weights_bytes`` set to the loaded tensors' bytes, each padded as ``backend``'s buffer type
        pads it (``CPU``: 32 B; a GPU: CUDA's 128 B and 512-element rows), the tensor table (name, ggml_nbytes)
        of every tensor in the file (exact model bytes on the CPU backend), and a line saying where the weights
        come from; with ``with_rows`` also each tensor's (type, ne0) in the table's order (exact device bytes).

    Raises:
        RsplanError: a GGUF input; an arch without a tensor list or a spec missing a key it needs (named); an
            unknown TYPE (the valid names listed); a TYPE that needs an importance matrix.
    """
    from rsplan.planner.buffers import CPU_RULE, CUDA_RULE
    from rsplan.planner.quant_weights import SOURCE_OUTTYPE, quantized_weights

    if is_gguf(ref):
        raise RsplanError(f"--quant: {ref} is a GGUF: its tensor table gives its weights exactly; --quant applies "
                          "to presets (quantize the file with llama-quantize, then give the result)")
    try:
        weights = quantized_weights(spec, quant)
    except UnsupportedArchError as exc:
        hint = ""
        if " is needed for the tensor list" in str(exc):
            # a config.json gives no token count (the converter takes it from the tokenizer): a preset says it
            hint = " (give it in a preset YAML, as `rsplan presets show mamba-130m` does)"
        raise RsplanError(f"--quant {quant}: {exc}{hint}") from None
    n_fallback = weights.plan.n_fallback
    note = (f"llama-quantize {weights.ftype} of the converter's {SOURCE_OUTTYPE} GGUF ({len(weights.plan.tensors)} "
            "tensors" + (f", {n_fallback} with a fallback type" if n_fallback else "") + ")")
    n_bytes = weights.buffer_bytes(CPU_RULE if backend == "CPU" else CUDA_RULE)
    out = spec.model_copy(update={"weights_bytes": n_bytes}), weights.table, note
    return (*out, weights.rows) if with_rows else out


def is_gguf(ref: str) -> bool:
    """A local or remote GGUF reference (a GGUF file by its magic, or a ``.gguf`` name / URL)."""
    from pathlib import Path

    from rsplan.hparams.sources import resolve_model

    if ref.split("?", 1)[0].lower().endswith(".gguf"):
        return True
    return Path(ref).exists() and resolve_model(ref)[0] == "gguf"
