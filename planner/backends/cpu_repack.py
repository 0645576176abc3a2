"""Which weight tensors llama.cpp's CPU backend repacks into its ``CPU_REPACK`` buffer type, for a target CPU.

llama.cpp 0c1e57098:

- src/llama-model.cpp:1078 make_cpu_buft_list: host weights try, in order, the ACCEL devices' buffer types, the
  host buffer type of the first GPU (``CUDA_Host``; skipped with ``--no-host``), the CPU backend's extra buffer
  types (``use_extra_bufts``, off with ``--no-repack``) and ``CPU``; the loader takes the first one whose device
  supports the tensor's op (src/llama-model-loader.cpp:1067 select_weight_buft).
- ggml/src/ggml-cpu/ggml-cpu.cpp:42 ggml_backend_cpu_get_extra_buffer_types: AMX (x86 builds with AMX-INT8 and
  AVX512-VNNI), KleidiAI (ARM builds with GGML_CPU_KLEIDIAI), then ``CPU_REPACK`` (GGML_CPU_REPACK, on by
  default). CPU_REPACK is modelled here, AMX in planner.backends.cpu_amx (the ``x86-amx`` target), KleidiAI not.
- ggml/src/ggml-cpu/repack.cpp:5191 supports_op: CPU_REPACK takes a ``MUL_MAT`` weight of 2 dims or a
  ``MUL_MAT_ID`` weight (experts) of 3 dims, with F32 activations, when ggml/src/ggml-cpu/repack.cpp:4925
  ggml_repack_get_optimal_repack_type finds a layout for its type and ``ne[1]`` (``RULES`` below). The features
  are the ones the CPU backend was compiled for (``ggml_cpu_has_avx2()`` is ``#if defined(__AVX2__)``,
  ggml/src/ggml-cpu/ggml-cpu.c:3651 ggml_cpu_has_avx2): the target machine's with GGML_NATIVE or the runtime-
  chosen variant of GGML_CPU_ALL_VARIANTS.
- A repacked tensor keeps its size: the buffer type has no ``get_alloc_size`` (ggml_nbytes) and the CPU's
  32-byte alignment (ggml/src/ggml-cpu/repack.cpp:5183
  ggml_backend_cpu_repack_buffer_type_get_alignment); it is read from the file
  into an allocated buffer, never mapped.

Measured (scripts/llamacpp-truth/probe.cpp, builds for AVX2 and for AVX2 + AVX512, tests/golden/llamacpp-breakdown/
buffer-types and buffer-types-avx512): Q4_0, Q4_K and IQ4_NL matrices land in CPU_REPACK, Q6_K / Q8_0 / F32 stay
in CPU; the bytes per buffer type are the padded ``ggml_nbytes`` either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsplan.errors import RsplanError

#: Target CPUs: the ggml_cpu_has_* features a CPU backend build for them reports. ``sve256`` is SVE with
#: ``ggml_cpu_get_sve_cnt() == QK8_0`` (32-byte vectors); ``rvv256`` is RISC-V V with zvfh and VLEN 256.
TARGETS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "x86-avx2": frozenset({"avx2"}),
    "x86-avx512": frozenset({"avx2", "avx512"}),
    "x86-amx": frozenset({"avx2", "avx512", "amx"}),
    "arm-neon": frozenset({"neon"}),
    "arm-dotprod": frozenset({"neon", "dotprod"}),
    "arm-i8mm": frozenset({"neon", "dotprod", "i8mm"}),
    "arm-sve256": frozenset({"neon", "dotprod", "i8mm", "sve256"}),
    "s390x-vxe": frozenset({"vxe"}),
    "riscv-rvv256": frozenset({"rvv256"}),
}
#: The target rsplan assumes unless told: an x86-64 server with AVX2 (no AVX512), the machine the golden data was
#: measured on.
DEFAULT_TARGET = "x86-avx2"

#: repack.cpp:4925 ggml_repack_get_optimal_repack_type: per ggml type, the branches in order, each (feature sets
#: any of which enables it, the ``ne[1]`` multiple it needs). A branch whose features hold but whose multiple
#: does not falls through to the next one, as the C code does. Type names in lower case (GGUF readers differ).
_AVX2 = frozenset({"avx2"})
_I8MM = frozenset({"neon", "i8mm"})
_DOT = frozenset({"neon", "dotprod"})
_RVV = frozenset({"rvv256"})
RULES: dict[str, tuple[tuple[tuple[frozenset[str], ...], int], ...]] = {
    "q4_0": (((_AVX2, frozenset({"sve256", "i8mm"})), 8), ((_I8MM,), 4), ((_DOT,), 4),
             ((frozenset({"vxe"}),), 4), ((_RVV,), 16)),
    "q4_k": (((_AVX2,), 8), ((_I8MM,), 8), ((_DOT,), 8), ((_RVV,), 16)),
    "q2_k": (((frozenset({"avx512"}),), 8), ((_RVV,), 16)),
    "q5_k": (((_I8MM,), 8), ((_DOT,), 8)),
    "q6_k": (((_I8MM,), 8), ((_DOT,), 8)),
    "iq4_nl": (((_AVX2,), 8), ((_DOT,), 4), ((_RVV,), 16)),
    "mxfp4": (((_AVX2,), 8), ((_DOT,), 4)),
    "q8_0": (((_I8MM,), 4), ((_DOT,), 4), ((_RVV,), 16)),
    "q1_0": (((_I8MM,), 4), ((_DOT,), 4)),
}

#: The op llama.cpp tests a weight's buffer type with (src/llama-arch.cpp:727 LLM_TENSOR_INFOS), by the name
#: after ``blk.N.`` without ``.weight``, for every tensor of the archs rsplan lists (hparams.tensors). A ``.bias``
#: is always an ADD (src/llama-model-loader.cpp:1192 op). Only MUL_MAT and MUL_MAT_ID weights can be repacked.
OPS: dict[str, str] = {
    **dict.fromkeys((
        "attn_gate", "attn_k", "attn_k_b", "attn_kv_a_mqa", "attn_output", "attn_q", "attn_qkv", "attn_v",
        "attn_v_b", "channel_mix_key", "channel_mix_receptance", "channel_mix_value", "ffn_down", "ffn_down_shexp",
        "ffn_gate", "ffn_gate_inp", "ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up", "ffn_up_shexp",
        "nextn.eh_proj", "output", "shortconv.in_proj", "shortconv.out_proj", "ssm_alpha", "ssm_ba", "ssm_beta",
        "ssm_dt", "ssm_f_a", "ssm_f_b", "ssm_g_a", "ssm_g_b", "ssm_in", "ssm_out", "ssm_x", "time_mix_a1",
        "time_mix_a2", "time_mix_decay_w1", "time_mix_decay_w2", "time_mix_g1", "time_mix_g2", "time_mix_gate",
        "time_mix_key", "time_mix_output", "time_mix_receptance", "time_mix_v1", "time_mix_v2", "time_mix_value",
        "time_mix_w1", "time_mix_w2"
    ), "MUL_MAT"),
    **dict.fromkeys((
        "ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"
    ), "MUL_MAT_ID"),
    **dict.fromkeys((
        "attn_k_norm", "attn_kv_a_norm", "attn_norm", "attn_norm_2", "attn_q_norm", "channel_mix_lerp_k",
        "channel_mix_lerp_r", "ffn_norm", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm", "output_norm",
        "post_attention_norm", "ssm_b_norm", "ssm_c_norm", "ssm_conv1d_k", "ssm_conv1d_q", "ssm_conv1d_v", "ssm_d",
        "ssm_dt_norm", "ssm_norm", "time_mix_k_a", "time_mix_k_k", "time_mix_lerp_x", "time_mix_ln", "time_mix_r_k",
        "token_embd_norm"
    ), "MUL"),
    **dict.fromkeys((
        "exp_probs_b", "time_mix_a0", "time_mix_decay", "time_mix_lerp_fused", "time_mix_v0", "time_mix_w0"
    ), "ADD"),
    **dict.fromkeys((
        "shortconv.conv", "ssm_conv1d"
    ), "SSM_CONV"),
    "ssm_a": "SSM_SCAN",  # Mamba's; the other archs' ssm_a (SSM_A_NOSCAN) is a MUL: F32 either way
    "time_mix_first": "RWKV_WKV6",
    "token_embd": "GET_ROWS",
}

_BLOCK = re.compile(r"^blk\.\d+\.")


class RepackError(RsplanError):
    """An unknown target, or a tensor whose op llama.cpp's loader would look up and rsplan does not know."""


@dataclass(frozen=True)
class Target:
    """One ``--cpu-repack`` target: its name and the CPU features its build reports."""

    name: str
    features: frozenset[str]

    @property
    def repacks(self) -> bool:
        """Whether the extra buffer types are used at all (``none``: llama.cpp's ``--no-repack``)."""
        return self.name != "none"


def target_of_features(features: set[str] | frozenset[str]) -> str:
    """The target of a native build on an x86 machine with these /proc/cpuinfo flags (``amx_int8``, ``avx512f``,
    ``avx2``): the golden data's machines record them."""
    if "amx_int8" in features:
        return "x86-amx"
    return "x86-avx512" if "avx512f" in features else "x86-avx2" if "avx2" in features else "none"


def parse_target(name: str) -> Target:
    """A ``--cpu-repack`` value; an unknown one names the valid ones."""
    if name not in TARGETS:
        raise RepackError(f"--cpu-repack '{name}': unknown target (have: {', '.join(TARGETS)})")
    return Target(name, TARGETS[name])


def weight_op(name: str) -> str:
    """The op the loader tests weight ``name``'s buffer type with (``blk.3.ffn_up_exps.weight``: MUL_MAT_ID)."""
    stem = _BLOCK.sub("", name)
    stem, _, suffix = stem.rpartition(".") if stem.endswith((".weight", ".bias")) else (stem, "", "")
    if suffix == "bias":
        return "ADD"
    op = OPS.get(stem)
    if op is None:
        raise RepackError(f"tensor {name}: no llama.cpp op known for it (planner/backends/cpu_repack.py OPS)")
    return op


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dims up to the last one that is not 1 (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def repacked(name: str, type_: str, shape: tuple[int, ...], target: Target) -> bool:
    """Whether the CPU backend built for ``target`` puts weight ``name`` (ggml ``type_``, ``shape`` ne0 first)
    in CPU_REPACK rather than CPU."""
    rules = RULES.get(type_.lower())
    if not target.repacks or rules is None:
        return False
    op = weight_op(name)
    dims = n_dims(shape)
    if not ((op == "MUL_MAT" and dims == 2) or (op == "MUL_MAT_ID" and dims == 3)):
        return False
    ne1 = shape[1] if len(shape) > 1 else 1
    return any(any(need <= target.features for need in alternatives) and ne1 % multiple == 0
               for alternatives, multiple in rules)
