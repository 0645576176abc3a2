"""The weights a plan counts when none are given: no GGUF (whose tensor table sizes them), no ``--weights``, no
``--quant``. Weights are never left out of a budget: a model whose tensor list rsplan knows (a preset, a config.json
of a supported architecture) is sized at a stated default type, and one with no tensor list is refused in one line
that asks for ``--weights SIZE`` (or a GGUF, for ``rsplan fit``).

- llama.cpp: the model's bf16 GGUF quantized by ``llama-quantize`` to DEFAULT_QUANT (Q4_K_M), exactly as
  ``--quant Q4_K_M`` sizes it (planner.weights.quant_weights). Q4_K_M is the type people most run with llama.cpp: the
  4-bit K-quant mixture most published GGUF files and Ollama's default model tags use.
- vLLM and SGLang load the checkpoint itself, every parameter in the model's dtype (``--dtype auto``: config.json's
  ``torch_dtype`` / ``dtype``, a float32 or unnamed one run as bfloat16 by vLLM and float16 by SGLang), so the
  weights are the tensors a plain context loads (the MTP layers' only with a draft) at that dtype's size, with the
  vocabulary rows of the embedding and of an untied output head padded as their VocabParallelEmbedding pads them
  (DEFAULT_VOCAB_PADDING_SIZE = 64; SGLang pads to 64 x TP where the padded count does not divide by the TP size:
  python/sglang/srt/layers/vocab_parallel_embedding.py). The engines then split the total over the tensor-parallel
  GPUs (planner.engines: ``cdiv(weights, tp)``). A checkpoint that config.json marks as quantized
  (``quantization_config``) does not hold its dtype's bytes and is refused here: give its directory with the
  safetensors (their headers size it) or ``--weights``.
"""

from __future__ import annotations

from typing import Any

from rsplan.errors import RsplanError, UnsupportedArchError
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.tensors import tensor_list

#: The llama-quantize type a model without a GGUF, --weights or --quant is sized at for llama.cpp.
DEFAULT_QUANT = "Q4_K_M"
#: What the weights' source line adds for DEFAULT_QUANT.
DEFAULT_QUANT_NOTE = "rsplan's default type for llama.cpp; --quant TYPE for yours"
#: The vocabulary multiple of vLLM's and SGLang's VocabParallelEmbedding / ParallelLMHead.
VOCAB_PADDING = 64
#: What a serving engine's answer asks for where the weights cannot be sized (--quant is llama.cpp's).
_SERVING_ASK = "give --weights SIZE"
#: The GGUF names of the tensors with one row per vocabulary entry (the embedding and the output head).
_VOCAB_TENSORS = frozenset({"token_embd.weight", "output.weight"})


def llama_cpp_spec(read: Any) -> ModelSpec:
    """The spec llama.cpp's plans size (a ``hparams.sources.ReadModel``): a Hugging Face model's checkpoint bytes
    (its safetensors headers) are what vLLM and SGLang load, not what llama.cpp loads (a GGUF converted from it), so
    where the config has a tensor list its size is dropped and the plans size it at DEFAULT_QUANT like a bare
    config.json's; without a tensor list the checkpoint's bytes stay, named as the model file's size."""
    spec: ModelSpec = read.spec
    if read.kind != "hf" or spec.weights_bytes is None:
        return spec

    try:
        tensor_list(spec)
    except UnsupportedArchError:
        return spec
    return spec.model_copy(update={"weights_bytes": None})


def weights_needed(ref: str, why: str, ask: str) -> RsplanError:
    """The one-line error of a model whose weights rsplan cannot size (``why``), asking for them (``ask``)."""
    return RsplanError(f"{ref}: the weights' size is not known ({why}): {ask}")


def padded_vocab(n_vocab: int, tp: int) -> int:
    """The rows of a VocabParallelEmbedding over ``tp`` GPUs: ``n_vocab`` rounded up to VOCAB_PADDING, or to
    VOCAB_PADDING x ``tp`` where that count does not divide by ``tp`` (SGLang's rule; vLLM's divide() requires it)."""
    pad = VOCAB_PADDING

    def up(n: int, m: int) -> int:
        return -(-n // m) * m

    if up(n_vocab, pad) % tp:
        pad *= tp
    return up(n_vocab, pad)


def serving_model_dtype(engine: str, spec: ModelSpec, dtype_flag: str = "auto") -> str:
    """The dtype vLLM / SGLang create the model's parameters in: vLLM's ``--dtype`` (``dtype_flag``; auto: the
    config's torch_dtype, float32 or none downcast to bfloat16: planner.engines.vllm.rules); SGLang's auto (the
    config's bfloat16 / float16, else float16, as planner.engines.sglang.rules resolves its model dtype)."""
    if engine == "vllm":
        # deferred: the serving engines' rules (planner.engines), loaded only for --engine vllm / sglang
        from rsplan.planner.engines.vllm.rules import _resolve_auto_dtype

        return _resolve_auto_dtype(spec, dtype_flag)
    config = spec.serving.torch_dtype if spec.serving else None
    return config if config in ("bfloat16", "float16") else "float16"


def checkpoint_weights(spec: ModelSpec, ref: str, dtype: str, tp: int = 1, quant_method: str | None = None,
                       tied: bool | None = None) -> tuple[int, str]:
    """(bytes, where they come from) of the whole checkpoint as vLLM / SGLang load it (module docstring) with its
    parameters in ``dtype`` (``serving_model_dtype``), over all ``tp`` GPUs together. ``tied``: config.json's
    tie_word_embeddings, by which the engines reuse the embedding as the output head (None: the spec's
    tie_word_embeddings; unknown there too, the output head is counted, and the source says so).

    Raises:
        RsplanError: a quantized checkpoint (``quant_method``), or no tensor list.
    """
    if quant_method is not None:
        raise weights_needed(ref, f"config.json's quantization_config ({quant_method}): a quantized checkpoint, "
                             "which its model directory with the safetensors also sizes", _SERVING_ASK)

    tied = spec.tie_word_embeddings if tied is None else tied
    try:
        tensors = [t for t in tensor_list(spec.model_copy(update={"tie_word_embeddings": tied})) if t.loaded]
    except UnsupportedArchError as exc:
        raise weights_needed(ref, f"no tensor list: {exc}", _SERVING_ASK) from None
    n_elements = 0
    for t in tensors:
        if t.name in _VOCAB_TENSORS:  # shape (n_embd, n_vocab): ne0 first
            n_elements += t.shape[0] * padded_vocab(t.shape[1], tp)
        else:
            n_elements += t.n_elements
    # deferred: the serving engines' rules (planner.engines), loaded only for --engine vllm / sglang
    from rsplan.planner.engines.base import dtype_bytes

    n_bytes = n_elements * dtype_bytes(dtype, "the model dtype")
    head = "" if tied is not None else " (the output head counted: the config does not say it is tied)"
    return n_bytes, f"the checkpoint's {len(tensors)} tensors of {ref} in {dtype}, vocabulary padded as loaded{head}"
