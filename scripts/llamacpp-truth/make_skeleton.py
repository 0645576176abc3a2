"""Write a skeleton GGUF of a model at real size: real metadata and tensor table, the data region a sparse hole.

From a preset (a built-in name like ``qwen3-next-80b-a3b``, or a YAML path) and an output type as
convert_hf_to_gguf.py writes it (``f32``, ``f16``, ``bf16``, ``q8_0``: hparams/converter_types.py ``converter_type``
decides which tensors stay F32 and which rows q8_0 cannot hold), it writes:

- the GGUF keys llama.cpp's loader reads for the arch (from the ModelSpec, plus the few keys the loader requires
  that do not change any size, in ``EXTRA_KEYS``), and ``general.file_type``;
- a minimal valid GPT-2 style tokenizer with exactly ``vocab_size`` tokens (the 256 byte tokens, filler tokens and
  an end-of-text token), so that llama.cpp's n_vocab is the real model's;
- the full tensor table of ``hparams.tensors.tensor_list`` (every tensor, MTP ones included), with the offsets a
  real file would have;
- no tensor data: the file is extended to its full size with ``os.truncate``, which leaves a hole that takes no
  disk. llama.cpp's no_alloc dry run reads only the header, so an 80B model's skeleton loads in seconds; it
  refuses a missing, extra or mis-shaped tensor, which makes loading the skeleton the test of the tensor list.

Usage::

    .venv/bin/python scripts/llamacpp-truth/make_skeleton.py qwen3-next-80b-a3b --outtype bf16 -o /tmp/q3n.gguf

Prints the path, the tensor count and the data bytes. Exit 0 on success, 1 with ``Error: ...`` on a bad preset,
an arch without a tensor list or an unwritable output (no partial file is left behind).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from rsplan.errors import RsplanError
from rsplan.hparams.converter_types import OUTTYPES, tensor_type
from rsplan.hparams.gguf_keys import LLM, Attention, Rope, arch_key, spec_metadata
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import load_model
from rsplan.hparams.tensor_bytes import tensor_nbytes
from rsplan.hparams.tensors import tensor_list

#: general.file_type (llama_ftype) per --outtype.
_FTYPE = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
          "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}

#: Keys some loaders require that change no size (values as the converter writes them for the family).
#: qwen35 / qwen35moe: rope.dimension_sections is required (get_key_or_arr(..., required=true)):
#: Qwen3.5's mrope_section.
EXTRA_KEYS: dict[str, dict[str, object]] = {
    "qwen35": {Rope.DIMENSION_SECTIONS: [11, 11, 10, 0]},
    "qwen35moe": {Rope.DIMENSION_SECTIONS: [11, 11, 10, 0]},
    # lfm2moe: expert_gating_func is required; conversion/lfm2.py writes SIGMOID (2)
    "lfm2moe": {LLM.EXPERT_GATING_FUNC: 2},
    # minimax-01: residual_scale is required; conversion/minimax.py writes layernorm_full_attention_alpha
    # (its value changes no size)
    "minimax-01": {LLM.RESIDUAL_SCALE: 1.0},
    # kimi-linear: expert_gating_func is required (Kimi routes with a sigmoid: 2); conversion/kimi_linear.py always
    # writes expert_weights_scale = routed_scaling_factor (2.446), which adds one SCALE node per MoE layer
    "kimi-linear": {LLM.EXPERT_GATING_FUNC: 2, "expert_weights_scale": 2.446},
    # granitehybrid: conversion/granite.py writes rope.scaling.finetuned = false for a hybrid with Mamba layers (no
    # RoPE, no inp_pos) and the four muP multipliers of the config; only their presence shapes the graph (one SCALE
    # each for the embeddings, the logits and twice per layer the residual branch); the values are those of the
    # transformers granitemoehybrid example config
    # nemotron_h_moe: conversion/nemotron.py writes norm_topk_prob, routed_scaling_factor (2.5: one SCALE per MoE
    # layer) and n_group (1: no expert groups)
    "nemotron_h_moe": {"expert_weights_norm": True, "expert_weights_scale": 2.5, "expert_group_count": 1},
    "granitehybrid": {"rope.scaling.finetuned": False, "attention.scale": 0.015625, "embedding_scale": 12.0,
                      "residual_scale": 0.22, "logit_scale": 2.0},
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value (the 256 byte tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


def _tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    if n_vocab < 257:
        raise RsplanError(f"vocab_size {n_vocab} is too small for a byte-level tokenizer (at least 257)")
    tokens = _bytes_to_unicode() + [f"<|skeleton_{i}|>" for i in range(n_vocab - 257)] + ["<|endoftext|>"]
    types = [gguf.TokenType.NORMAL] * (n_vocab - 1) + [gguf.TokenType.CONTROL]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(n_vocab - 1)
    w.add_eos_token_id(n_vocab - 1)


def _metadata(w: gguf.GGUFWriter, spec: ModelSpec, file_type: gguf.LlamaFileType) -> None:
    a = spec.arch
    att = spec.attention
    kv: dict[str, Any] = {
        **spec_metadata(spec),
        Attention.LAYERNORM_RMS_EPS: 1e-6,
        Attention.LAYERNORM_EPS: 1e-5,
    }
    optional = {
        LLM.VOCAB_SIZE: spec.vocab_size if a in ("lfm2", "lfm2moe") else None,
        LLM.EXPERT_COUNT: spec.expert_count or None,
        LLM.EXPERT_USED_COUNT: spec.expert_used_count or None,
        LLM.EXPERT_FEED_FORWARD_LENGTH: spec.expert_feed_forward_length or None,
        LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: spec.expert_shared_feed_forward_length or None,
        LLM.EXPERT_SHARED_COUNT: spec.expert_shared_count or None,
        LLM.LEADING_DENSE_BLOCK_COUNT: spec.leading_dense_block_count or None,
        LLM.TIME_MIX_EXTRA_DIM: spec.time_mix_extra_dim or None,
        LLM.TIME_DECAY_EXTRA_DIM: spec.time_decay_extra_dim or None,
        LLM.RESCALE_EVERY_N_LAYERS: spec.rescale_every_n_layers or None,
        # MLA: the rope part of the cached latent row (conversion/kimi_linear.py writes qk_rope_head_dim)
        Rope.DIMENSION_COUNT: (att.key_length - att.kv_lora_rank) if att.kv_lora_rank and att.key_length else None,
    }
    kv.update({k: v for k, v in optional.items() if v is not None})
    kv.update(EXTRA_KEYS.get(a, {}))
    for key, value in kv.items():
        full = arch_key(a, key)
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, list):
            w.add_array(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_uint32(full, int(value))
    w.add_name(spec.name)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_skeleton(spec: ModelSpec, outtype: str, path: Path, quant: str | None = None) -> tuple[int, int]:
    """Write the skeleton of ``spec`` to ``path``; returns (tensor count, data bytes incl. alignment).

    With ``quant`` (an ftype name llama-quantize accepts: Q4_0, Q4_K_M, IQ4_NL, ...) the tensors take the types
    ``llama-quantize`` gives them from the converter's bf16 file (planner.weights.quant_weights, checked against
    llama-quantize --dry-run in tests/golden/llamacpp-quantize), in the same file order, and general.file_type is
    that ftype; ``outtype`` is then ignored."""
    tensors = tensor_list(spec)
    types = {t.name: tensor_type(t, outtype) for t in tensors}
    sizes = {t.name: tensor_nbytes(t, types[t.name]) for t in tensors}
    file_type = _FTYPE[outtype] if quant is None else None
    if quant is not None:
        from rsplan.planner.weights.quant_weights import quantized_weights

        plan = quantized_weights(spec, quant).plan
        types = {t.name: t.type for t in plan.tensors}
        sizes = {t.name: t.n_bytes for t in plan.tensors}
        file_type = gguf.LlamaFileType(plan.ftype.value)
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(tmp, spec.arch)
    try:
        _metadata(w, spec, file_type)
        _tokenizer(w, spec.vocab_size or 0)
        data = 0
        for t in tensors:
            ty = types[t.name]
            nbytes = sizes[t.name]
            w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[ty.upper()])
            data += -(-nbytes // w.data_alignment) * w.data_alignment
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        end = fout.tell()
        data_offset = -(-end // w.data_alignment) * w.data_alignment
        w.close()
        os.truncate(tmp, data_offset + data)
        tmp.replace(path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return len(tensors), data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="built-in preset name or preset YAML path")
    ap.add_argument("--outtype", choices=OUTTYPES, default="bf16", help="the converter's --outtype")
    ap.add_argument("--quant", metavar="FTYPE", default=None,
                    help="tensor types as llama-quantize FTYPE writes them from the bf16 file (Q4_0, Q4_K_M, ...)")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the GGUF to write")
    args = ap.parse_args(argv)
    try:
        spec = load_model(args.model)
        n, data = write_skeleton(spec, args.outtype, args.output, args.quant)
    except (RsplanError, OSError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(f"{args.output}: {n} tensors, {data} data bytes ({spec.arch}, {args.quant or args.outtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
