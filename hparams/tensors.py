"""Every weight tensor llama.cpp's loader creates for a model, with its GGUF name, shape and type.

``tensor_list(spec)`` returns the tensors of a GGUF file that the converter (convert_hf_to_gguf.py) writes and
llama.cpp's ``load_arch_tensors`` (src/models/<arch>.cpp, commit 0c1e57098) reads, in the loader's order:
names as the GGUF holds them (``blk.3.ssm_in.weight``), shapes in GGUF/ggml order (ne0, ne1, ...), and whether a
plain context loads them (``loaded``: MTP / nextn tensors are in the file but skipped with TENSOR_SKIP unless
the MTP draft is loaded).

Which tensors a layer has depends on its kind: each arch maps a layer index to a tuple of kind names (for
example ``("gdn", "moe")`` or ``("attn", "moe", "nextn")``), and each kind is a table of tensor templates
(name suffix, shape from the model's dimensions). The tables are data; the per-arch rules are small functions.

``converter_type(name, n_dims, outtype)`` is conversion/base.py's rule for the stored type of each tensor:
1-D tensors, ``*_norm.weight``, names not ending in ``.weight`` and a fixed list (router, conv kernels, RWKV
decay ...) stay F32; the rest take the output type (f32 / f16 / bf16 / q8_0, q8_0 falling back to F16 for rows that
are not whole blocks). ``tensor_nbytes`` is ggml's row size times
the rows; ``buffer_bytes`` adds the buffer's per-tensor alignment, as ``ggml_backend_alloc_ctx_tensors_from_buft_size``
does, and ``model_buffer_bytes`` is the model bytes llama.cpp reports for a CPU-only run (tests/golden checks it
against llama.cpp in every measured case).

Archs with a table: mamba, mamba2, rwkv6, rwkv6qwen2, rwkv7, arwkv7, plamo2, jamba, nemotron_h, nemotron_h_moe,
falcon-h1, granitehybrid, lfm2, lfm2moe, qwen35, qwen35moe, qwen3next, kimi-linear, minimax-01. Shapes need the
weight-only ModelSpec keys (vocab_size, expert_*, ...); a missing one is an UnsupportedArchError naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rsplan.errors import UnsupportedArchError
from rsplan.hparams.ggml_types import GGML_TYPES, TENSOR_ALIGNMENT, row_nbytes
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec

#: the CPU buffer type's alignment (ggml_types.TENSOR_ALIGNMENT)
CPU_ALIGNMENT = TENSOR_ALIGNMENT

#: The output types of ``convert_hf_to_gguf.py --outtype`` rsplan knows (q8_0: the converter's own quantizer).
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


class MissingFieldError(UnsupportedArchError):
    """A ModelSpec field the tensor list of an arch needs is not set: ``field`` names it (``vocab_size``,
    ``attention.decay_lora_rank``, ...)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Dims:
    """The model dimensions the shape formulas read (llama_hparams names)."""

    n_embd: int
    n_vocab: int
    n_layer: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int  # n_embd_head_k
    head_v: int  # n_embd_head_v
    n_ff: tuple[int, ...]
    d_conv: int
    d_inner: int
    d_state: int
    n_group: int
    dt_rank: int
    l_cache: int
    n_expert: int
    n_ff_exp: int
    n_ff_shexp: int
    lora: tuple[int, int, int, int]  # RWKV-7: decay, iclr, value_residual_mix, gate ranks
    kda: int  # Kimi: KDA head dim
    kv_lora: int  # MLA latent rank
    rope: int  # MLA rope dims: key_length - kv_lora_rank (the cached latent row is kv_lora + rope)
    head_k_mla: int
    head_v_mla: int
    n_expert_shared: int
    rwkv6_extra: tuple[int, int]  # RWKV-6: time_mix_extra_dim (token-shift LoRA), time_decay_extra_dim (decay LoRA)
    wkv_head: int  # RWKV: wkv.head_size


@dataclass(frozen=True)
class TensorInfo:
    """One weight tensor: GGUF name, ggml shape (ne0 first), and whether a plain context loads it."""

    name: str
    shape: tuple[int, ...]
    loaded: bool = True

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


Shape = Callable[[Dims, int], tuple[int, ...]]
#: One tensor of a kind: the name after ``blk.{il}.`` and its shape from (dims, il).
Template = tuple[str, Shape]


_NORM: Shape = lambda d, il: (d.n_embd,)  # noqa: E731


def _plamo2_dt_dim(d: Dims) -> int:
    """PLaMo-2's dt projection width: max(64, n_embd / 16) (src/models/plamo2.cpp:43 dt_dim)."""
    return max(64, d.n_embd // 16)


def _qrwkv_kv(d: Dims, il: int) -> int:
    """RWKV6-Qwen2's K / V width: n_embd, or n_head_kv heads of wkv.head_size when the KV heads are fewer."""
    n_kv = d.n_head_kv[il]
    return d.n_embd if n_kv == 0 or d.n_embd // d.wkv_head == n_kv else n_kv * d.wkv_head


#: RWKV-7's time-mix tensors that ARWKV-7 shares, in the loader's order: the decay (w) and in-context learning
#: rate (a) LoRAs, the output gate's LoRA (g), and the key / value / receptance group after the fused lerp.
_RWKV7_DECAY_A: list[Template] = [
    ("time_mix_w0.weight", _NORM),
    ("time_mix_w1.weight", lambda d, il: (d.n_embd, d.lora[0])),
    ("time_mix_w2.weight", lambda d, il: (d.lora[0], d.n_embd)),
    ("time_mix_a0.weight", _NORM),
    ("time_mix_a1.weight", lambda d, il: (d.n_embd, d.lora[1])),
    ("time_mix_a2.weight", lambda d, il: (d.lora[1], d.n_embd)),
]
_RWKV7_GATE: list[Template] = [
    ("time_mix_g1.weight", lambda d, il: (d.n_embd, d.lora[3])),
    ("time_mix_g2.weight", lambda d, il: (d.lora[3], d.n_embd)),
]
_RWKV7_KEYS: list[Template] = [
    ("time_mix_k_k.weight", _NORM),
    ("time_mix_k_a.weight", _NORM),
    ("time_mix_r_k.weight", _NORM),
    ("time_mix_key.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ("time_mix_value.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ("time_mix_receptance.weight", lambda d, il: (d.n_embd, d.n_embd)),
]

#: Layer kinds: the tensors each adds to a block, in the loader's order.
KINDS: dict[str, list[Template]] = {
    # RWKV-7 (src/models/rwkv7.cpp, conversion/rwkv.py): the converter squeezes every tensor but the fused lerp,
    # so the 1-element dims llama.cpp's shapes carry ({n_embd, 1, 1}) are not in the file; layer 0's v0/v1/v2 are
    # copies of a0/a1/a2 (iclr rank) written by the converter
    "rwkv7_0": [
        ("time_mix_v0.weight", _NORM),
        ("time_mix_v1.weight", lambda d, il: (d.n_embd, d.lora[1])),
        ("time_mix_v2.weight", lambda d, il: (d.lora[1], d.n_embd)),
    ],
    "rwkv7_v": [
        ("time_mix_v0.weight", _NORM),
        ("time_mix_v1.weight", lambda d, il: (d.n_embd, d.lora[2])),
        ("time_mix_v2.weight", lambda d, il: (d.lora[2], d.n_embd)),
    ],
    "rwkv7": [
        ("attn_norm.weight", _NORM),
        ("attn_norm.bias", _NORM),
        ("attn_norm_2.weight", _NORM),
        ("attn_norm_2.bias", _NORM),
        *_RWKV7_DECAY_A,
        *_RWKV7_GATE,
        ("time_mix_lerp_fused.weight", lambda d, il: (d.n_embd, 1, 1, 6)),
        *_RWKV7_KEYS,
        ("time_mix_ln.weight", _NORM),
        ("time_mix_ln.bias", _NORM),
        ("time_mix_output.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("channel_mix_lerp_k.weight", _NORM),
        ("channel_mix_key.weight", lambda d, il: (d.n_embd, d.n_ff[0])),
        ("channel_mix_value.weight", lambda d, il: (d.n_ff[0], d.n_embd)),
    ],
    # ARWKV-7 (src/models/arwkv7.cpp, conversion/rwkv.py ARwkv7Model): RWKV-7's time mix without the token-embedding
    # norm, RMS norms without biases, the output gate (g1/g2) only with gate_lora_rank (wkv_has_gate: 6 lerps,
    # else 5), the group norm (time_mix_ln) only with wkv_group_norm, and Qwen-2's gated FFN ("ffn")
    "arwkv7": [
        ("attn_norm.weight", _NORM),
        *_RWKV7_DECAY_A,
    ],
    "arwkv7_gate": [
        *_RWKV7_GATE,
    ],
    "arwkv7_mix": [
        ("time_mix_lerp_fused.weight", lambda d, il: (d.n_embd, 1, 1, 6 if d.lora[3] else 5)),
        *_RWKV7_KEYS,
    ],
    "arwkv7_ln": [("time_mix_ln.weight", _NORM), ("time_mix_ln.bias", _NORM)],
    "arwkv7_out": [("time_mix_output.weight", lambda d, il: (d.n_embd, d.n_embd)), ("ffn_norm.weight", _NORM)],
    # RWKV-6 (src/models/rwkv6.cpp, conversion/rwkv.py Rwkv6Model): the converter squeezes time_mix_decay and the
    # lerps ({n_embd, 1, 1} in llama.cpp, {n_embd} in the file) and stacks the five time-mix lerps (w, k, v, r, g)
    # into time_mix_lerp_fused; the attention width is n_embd
    "rwkv6": [
        ("attn_norm.weight", _NORM),
        ("attn_norm.bias", _NORM),
        ("attn_norm_2.weight", _NORM),
        ("attn_norm_2.bias", _NORM),
        ("time_mix_w1.weight", lambda d, il: (d.n_embd, 5 * d.rwkv6_extra[0])),
        ("time_mix_w2.weight", lambda d, il: (d.rwkv6_extra[0], d.n_embd, 5)),
        ("time_mix_lerp_x.weight", _NORM),
        ("time_mix_lerp_fused.weight", lambda d, il: (d.n_embd, 1, 1, 5)),
        ("time_mix_first.weight", lambda d, il: (d.wkv_head, d.n_embd // d.wkv_head)),
        ("time_mix_decay.weight", _NORM),
        ("time_mix_decay_w1.weight", lambda d, il: (d.n_embd, d.rwkv6_extra[1])),
        ("time_mix_decay_w2.weight", lambda d, il: (d.rwkv6_extra[1], d.n_embd)),
        ("time_mix_key.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_value.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_receptance.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_gate.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_ln.weight", _NORM),
        ("time_mix_ln.bias", _NORM),
        ("time_mix_output.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("channel_mix_lerp_k.weight", _NORM),
        ("channel_mix_lerp_r.weight", _NORM),
        ("channel_mix_key.weight", lambda d, il: (d.n_embd, d.n_ff[0])),
        ("channel_mix_value.weight", lambda d, il: (d.n_ff[0], d.n_embd)),
        ("channel_mix_receptance.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ],
    # Falcon-H1 (src/models/falcon-h1.cpp, conversion/falcon_h1.py): every layer has a Mamba-2 mixer (the grouped
    # norm only with mamba_rms_norm), GQA attention and a SwiGLU FFN; one pre-norm (attn_norm) feeds both mixers;
    # gguf-py maps pre_ff_layernorm.weight to FFN_PRE_NORM by its full name, so the FFN norm has no ".weight"
    "falcon_h1_mamba": [
        ("ssm_in.weight", lambda d, il: (d.n_embd, 2 * d.d_inner + 2 * d.n_group * d.d_state + d.dt_rank)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, d.d_inner + 2 * d.n_group * d.d_state)),
        ("ssm_conv1d.bias", lambda d, il: (d.d_inner + 2 * d.n_group * d.d_state,)),
        ("ssm_dt.bias", lambda d, il: (d.dt_rank,)),
        ("ssm_a", lambda d, il: (1, d.dt_rank)),
        ("ssm_d", lambda d, il: (1, d.dt_rank)),
    ],
    "falcon_h1_ssm_norm": [("ssm_norm.weight", lambda d, il: (d.d_inner // d.n_group, d.n_group))],
    "falcon_h1_block": [
        ("ssm_out.weight", lambda d, il: (d.d_inner, d.n_embd)),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
        ("attn_norm.weight", _NORM),
        ("ffn_norm", _NORM),  # no ".weight": src/models/falcon-h1.cpp:96 tn(LLM_TENSOR_FFN_NORM, i)
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ],
    # RWKV6-Qwen2 (src/models/rwkv6qwen2.cpp; conversion/rwkv.py RWKV6Qwen2Model): the RWKV-6 time mix without
    # time_mix_first and the group norm, K / V as wide as the KV heads (GQA), the Qwen-2 attention biases on
    # receptance / key / value, RMS norms and a SwiGLU FFN
    "rwkv6qwen2": [
        ("attn_norm.weight", _NORM),
        ("time_mix_w1.weight", lambda d, il: (d.n_embd, 5 * d.rwkv6_extra[0])),
        ("time_mix_w2.weight", lambda d, il: (d.rwkv6_extra[0], d.n_embd, 5)),
        ("time_mix_lerp_x.weight", _NORM),
        ("time_mix_lerp_fused.weight", lambda d, il: (d.n_embd, 1, 1, 5)),
        ("time_mix_decay.weight", _NORM),
        ("time_mix_decay_w1.weight", lambda d, il: (d.n_embd, d.rwkv6_extra[1])),
        ("time_mix_decay_w2.weight", lambda d, il: (d.rwkv6_extra[1], d.n_embd)),
        ("time_mix_key.weight", lambda d, il: (d.n_embd, _qrwkv_kv(d, il))),
        ("time_mix_value.weight", lambda d, il: (d.n_embd, _qrwkv_kv(d, il))),
        ("time_mix_receptance.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_gate.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("time_mix_key.bias", lambda d, il: (_qrwkv_kv(d, il),)),
        ("time_mix_value.bias", lambda d, il: (_qrwkv_kv(d, il),)),
        ("time_mix_receptance.bias", _NORM),
        ("time_mix_output.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("ffn_norm.weight", _NORM),
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[0])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[0], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[0])),
    ],
    # PLaMo-2 (src/models/plamo2.cpp, conversion/plamo.py Plamo2Model): every layer has a pre-mixer norm, then a
    # Mamba layer (no groups: ssm_x projects to dt_dim = max(64, n_embd / 16) plus B and C, each RMS-normed; A, D,
    # the dt/B/C norms without a ".weight" suffix, as llama.cpp names them) or an attention layer (fused QKV,
    # per-head Q/K norms), then the post-mixer norm and a SwiGLU FFN whose up projection holds gate and up
    "plamo2_mamba": [
        ("attn_norm.weight", _NORM),
        ("ssm_in.weight", lambda d, il: (d.n_embd, 2 * d.d_inner)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, d.d_inner)),
        ("ssm_x.weight", lambda d, il: (d.d_inner, _plamo2_dt_dim(d) + 2 * d.d_state)),
        ("ssm_dt.weight", lambda d, il: (_plamo2_dt_dim(d), d.dt_rank)),
        ("ssm_dt.bias", lambda d, il: (d.dt_rank,)),
        ("ssm_a", lambda d, il: (d.dt_rank,)),
        ("ssm_d", lambda d, il: (d.dt_rank,)),
        ("ssm_out.weight", lambda d, il: (d.d_inner, d.n_embd)),
        ("ssm_dt_norm", lambda d, il: (_plamo2_dt_dim(d),)),
        ("ssm_b_norm", lambda d, il: (d.d_state,)),
        ("ssm_c_norm", lambda d, il: (d.d_state,)),
    ],
    "plamo2_attn": [
        ("attn_norm.weight", _NORM),
        ("attn_qkv.weight", lambda d, il: (d.n_embd, (d.n_head[il] + d.n_head_kv[il]) * d.head_k
                                           + d.n_head_kv[il] * d.head_v)),
        ("attn_q_norm.weight", lambda d, il: (d.head_k, d.n_head[il])),
        ("attn_k_norm.weight", lambda d, il: (d.head_k, d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.n_head[il] * d.head_v, d.n_embd)),
    ],
    "plamo2_ffn": [
        ("post_attention_norm", _NORM),
        ("ffn_norm.weight", _NORM),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, 2 * d.n_ff[il])),
        ("post_ffw_norm", _NORM),
    ],
    # Mamba-1 block (src/models/mamba.cpp; the loader requires d_inner = 2 * n_embd)
    "mamba": [
        ("attn_norm.weight", _NORM),
        ("ssm_in.weight", lambda d, il: (d.n_embd, 2 * d.d_inner)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, d.d_inner)),
        ("ssm_conv1d.bias", lambda d, il: (d.d_inner,)),
        ("ssm_x.weight", lambda d, il: (d.d_inner, d.dt_rank + 2 * d.d_state)),
        ("ssm_dt.weight", lambda d, il: (d.dt_rank, d.d_inner)),
        ("ssm_dt.bias", lambda d, il: (d.d_inner,)),
        ("ssm_a", lambda d, il: (d.d_state, d.d_inner)),
        ("ssm_d", lambda d, il: (d.d_inner,)),
        ("ssm_out.weight", lambda d, il: (d.d_inner, d.n_embd)),
    ],
    # Jamba (src/models/jamba.cpp): a Mamba-1 mixer with dt / B / C norms, or GQA attention; then a dense FFN or,
    # on the expert layers, a MoE (detected by the loader from ffn_gate_inp)
    "jamba_mamba": [
        ("attn_norm.weight", _NORM),
        ("ssm_in.weight", lambda d, il: (d.n_embd, 2 * d.d_inner)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, d.d_inner)),
        ("ssm_conv1d.bias", lambda d, il: (d.d_inner,)),
        ("ssm_x.weight", lambda d, il: (d.d_inner, d.dt_rank + 2 * d.d_state)),
        ("ssm_dt_norm.weight", lambda d, il: (d.dt_rank,)),
        ("ssm_dt.weight", lambda d, il: (d.dt_rank, d.d_inner)),
        ("ssm_dt.bias", lambda d, il: (d.d_inner,)),
        ("ssm_b_norm.weight", lambda d, il: (d.d_state,)),
        ("ssm_c_norm.weight", lambda d, il: (d.d_state,)),
        ("ssm_a", lambda d, il: (d.d_state, d.d_inner)),
        ("ssm_d", lambda d, il: (d.d_inner,)),
        ("ssm_out.weight", lambda d, il: (d.d_inner, d.n_embd)),
    ],
    "jamba_attn": [
        ("attn_norm.weight", _NORM),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ],
    "jamba_moe": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff[il], d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
    ],
    "jamba_ffn": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ],
    # Mamba-2 block (src/models/mamba2.cpp)
    "mamba2": [
        ("attn_norm.weight", _NORM),
        ("ssm_in.weight", lambda d, il: (d.n_embd, 2 * d.d_inner + 2 * d.n_group * d.d_state + d.dt_rank)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, d.d_inner + 2 * d.n_group * d.d_state)),
        ("ssm_conv1d.bias", lambda d, il: (d.d_inner + 2 * d.n_group * d.d_state,)),
        ("ssm_dt.bias", lambda d, il: (d.dt_rank,)),
        ("ssm_a", lambda d, il: (1, d.dt_rank)),
        ("ssm_d", lambda d, il: (1, d.dt_rank)),
        ("ssm_norm.weight", lambda d, il: (d.d_inner // d.n_group, d.n_group)),
        ("ssm_out.weight", lambda d, il: (d.d_inner, d.n_embd)),
    ],
    # Granite-4.0-H (src/models/granite-hybrid.cpp, conversion/granite.py GraniteHybridModel): Mamba-2 layers are
    # the "mamba2" kind, attention layers separate Q/K/V without biases; every layer then has experts as wide as
    # feed_forward_length and, when expert_shared_feed_forward_length is set, a shared expert; a dense model
    # (no experts: Granite-4.0-H-1B / 350M) has the gated FFN of "granite_dense" instead (the converter writes
    # the shared MLP as ffn_gate / ffn_up / ffn_down, no biases)
    "granite_attn": [
        ("attn_norm.weight", _NORM),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
    ],
    "granite_moe": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff[il], d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
    ],
    "granite_shexp": [
        ("ffn_gate_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_up_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_down_shexp.weight", lambda d, il: (d.n_ff_shexp, d.n_embd)),
    ],
    # Nemotron-H (src/models/nemotron-h.cpp): Mamba-2 layers are the "mamba2" kind; '*' layers attention only,
    # '-' layers a squared-ReLU MLP only (no gate); the converter writes no attention / MLP biases
    "nemotron_attn": [
        ("attn_norm.weight", _NORM),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
    ],
    "nemotron_mlp": [
        ("attn_norm.weight", _NORM),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ],
    # Nemotron-H MoE (src/models/nemotron-h.cpp, arch nemotron_h_moe): the 'E' layers hold sigmoid-routed experts
    # without a gate (relu^2) and a shared expert; no latent projections (moe_latent_size unset)
    "nemotron_moe": [
        ("attn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("exp_probs_b.bias", lambda d, il: (d.n_expert,)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff_exp, d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("ffn_down_shexp.weight", lambda d, il: (d.n_ff_shexp, d.n_embd)),
        ("ffn_up_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
    ],
    # MiniMax-01 (src/models/minimax-01.cpp): softmax attention or lightning attention, then a MoE over n_ff
    "minimax_softmax": [
        ("attn_norm.weight", _NORM),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
    ],
    "minimax_lightning": [
        ("attn_norm.weight", _NORM),
        ("attn_norm_2.weight", lambda d, il: (d.head_k * d.n_head[il],)),
        ("attn_qkv.weight", lambda d, il: (d.n_embd, 3 * d.head_k * d.n_head[il])),
        ("attn_gate.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
    ],
    "minimax_moe": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff[il], d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
    ],
    # Kimi Linear (src/models/kimi-linear.cpp, conversion/kimi_linear.py): KDA layers (conv kernels written 4-D,
    # A as {1, n_head, 1, 1}) or MLA layers (no q LoRA; kv_b split into k_b / v_b), then a dense FFN on the
    # leading layers or a MoE with shared experts of n_expert_shared x the expert width
    "kda": [
        ("attn_norm.weight", _NORM),
        ("ssm_conv1d_q.weight", lambda d, il: (d.d_conv, 1, d.kda * d.n_head[il], 1)),
        ("ssm_conv1d_k.weight", lambda d, il: (d.d_conv, 1, d.kda * d.n_head[il], 1)),
        ("ssm_conv1d_v.weight", lambda d, il: (d.d_conv, 1, d.kda * d.n_head[il], 1)),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.kda * d.n_head[il])),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.kda * d.n_head[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.kda * d.n_head[il])),
        ("ssm_f_a.weight", lambda d, il: (d.n_embd, d.kda)),
        ("ssm_f_b.weight", lambda d, il: (d.kda, d.kda * d.n_head[il])),
        ("ssm_beta.weight", lambda d, il: (d.n_embd, d.n_head[il])),
        ("ssm_a", lambda d, il: (1, d.n_head[il], 1, 1)),
        ("ssm_dt.bias", lambda d, il: (d.kda * d.n_head[il],)),
        ("ssm_g_a.weight", lambda d, il: (d.n_embd, d.kda)),
        ("ssm_g_b.weight", lambda d, il: (d.kda, d.kda * d.n_head[il])),
        ("ssm_norm.weight", lambda d, il: (d.kda,)),
        ("attn_output.weight", lambda d, il: (d.kda * d.n_head[il], d.n_embd)),
    ],
    "kimi_mla": [
        ("attn_norm.weight", _NORM),
        ("attn_kv_a_norm.weight", lambda d, il: (d.kv_lora,)),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.n_head[il] * d.head_k_mla)),
        ("attn_kv_a_mqa.weight", lambda d, il: (d.n_embd, d.kv_lora + d.rope)),
        ("attn_k_b.weight", lambda d, il: (d.head_k_mla - d.rope, d.kv_lora, d.n_head[il])),
        ("attn_v_b.weight", lambda d, il: (d.kv_lora, d.head_v_mla, d.n_head[il])),
        ("attn_output.weight", lambda d, il: (d.n_head[il] * d.head_v_mla, d.n_embd)),
    ],
    "kimi_dense": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ],
    "kimi_moe": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff_exp, d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("ffn_gate_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_exp * max(d.n_expert_shared, 1))),
        ("ffn_down_shexp.weight", lambda d, il: (d.n_ff_exp * max(d.n_expert_shared, 1), d.n_embd)),
        ("ffn_up_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_exp * max(d.n_expert_shared, 1))),
        ("exp_probs_b.bias", lambda d, il: (d.n_expert,)),
    ],
    # LFM2: the FFN comes first in the loader, then the operator norm and the operator
    "lfm2_ffn": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("attn_norm.weight", _NORM),
    ],
    "lfm2_moe": [
        ("ffn_norm.weight", _NORM),
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff_exp, d.n_embd, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("exp_probs_b.bias", lambda d, il: (d.n_expert,)),
        ("attn_norm.weight", _NORM),
    ],
    "lfm2_attn": [
        ("attn_q_norm.weight", lambda d, il: (d.head_k,)),
        ("attn_k_norm.weight", lambda d, il: (d.head_k,)),
        ("attn_q.weight", lambda d, il: (d.n_embd, d.n_embd)),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ],
    "shortconv": [
        ("shortconv.conv.weight", lambda d, il: (d.l_cache, d.n_embd)),
        ("shortconv.in_proj.weight", lambda d, il: (d.n_embd, 3 * d.n_embd)),
        ("shortconv.out_proj.weight", lambda d, il: (d.n_embd, d.n_embd)),
    ],
    # Qwen3-Next / Qwen3.5 (src/models/qwen3next.cpp, qwen35moe.cpp): norms, then the mixer, then the MoE
    "qwen_norms": [
        ("attn_norm.weight", _NORM),
        ("post_attention_norm.weight", _NORM),
    ],
    "qwen_attn": [
        ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il] * 2)),
        ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
        ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
        ("attn_q_norm.weight", lambda d, il: (d.head_k,)),
        ("attn_k_norm.weight", lambda d, il: (d.head_k,)),
    ],
    # gated delta net: key dim = d_state * n_group (QK heads), value dim = d_state * dt_rank (V heads)
    "gdn_qkv": [
        ("attn_qkv.weight", lambda d, il: (d.n_embd, 2 * d.d_state * d.n_group + d.d_state * d.dt_rank)),
        ("attn_gate.weight", lambda d, il: (d.n_embd, d.d_state * d.dt_rank)),
        ("ssm_conv1d.weight", lambda d, il: (d.d_conv, 2 * d.d_state * d.n_group + d.d_state * d.dt_rank)),
        ("ssm_dt.bias", lambda d, il: (d.dt_rank,)),
        ("ssm_a", lambda d, il: (d.dt_rank,)),
    ],
    "gdn_ba_fused": [("ssm_ba.weight", lambda d, il: (d.n_embd, 2 * d.dt_rank))],
    "gdn_ba_split": [
        ("ssm_beta.weight", lambda d, il: (d.n_embd, d.dt_rank)),
        ("ssm_alpha.weight", lambda d, il: (d.n_embd, d.dt_rank)),
    ],
    "gdn_out": [
        ("ssm_norm.weight", lambda d, il: (d.d_state,)),
        ("ssm_out.weight", lambda d, il: (d.d_state * d.dt_rank, d.n_embd)),
    ],
    "qwen_moe": [
        ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
        ("ffn_down_exps.weight", lambda d, il: (d.n_ff_exp, d.n_embd, d.n_expert)),
        ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff_exp, d.n_expert)),
        # nn.Linear(n_embd, 1): the converter writes it 2-D, {n_embd, 1} (llama.cpp reads {n_embd}: the same)
        ("ffn_gate_inp_shexp.weight", lambda d, il: (d.n_embd, 1)),
        ("ffn_gate_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_up_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_down_shexp.weight", lambda d, il: (d.n_ff_shexp, d.n_embd)),
    ],
    "granite_dense": [("ffn_norm.weight", _NORM)],
    "ffn": [
        ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
        ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
        ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ],
    # the MTP block's own tensors (the converter writes no nextn.embed_tokens / shared_head_head for Qwen)
    "qwen_nextn": [
        ("nextn.eh_proj.weight", lambda d, il: (2 * d.n_embd, d.n_embd)),
        ("nextn.enorm.weight", _NORM),
        ("nextn.hnorm.weight", _NORM),
        ("nextn.shared_head_norm.weight", _NORM),
    ],
}


def _lfm2_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    dense = il < (spec.leading_dense_block_count if spec.arch == "lfm2moe" else spec.n_layer)
    return ("lfm2_ffn" if dense else "lfm2_moe", "shortconv" if recr else "lfm2_attn")


def _jamba_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    expert_layers = spec.expert_layers
    assert expert_layers is not None, "jamba's ArchTensors needs expert_layers"
    return ("jamba_mamba" if recr else "jamba_attn", "jamba_moe" if expert_layers[il] else "jamba_ffn")


def _nemotron_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    if recr:
        return ("mamba2",)
    if spec.feed_forward(il) == 0:
        return ("nemotron_attn",)
    return ("nemotron_moe",) if spec.arch == "nemotron_h_moe" else ("nemotron_mlp",)


def _falcon_h1_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    if spec.mamba_rms_norm is None:
        raise MissingFieldError(
            f"{spec.name}: mamba_rms_norm is needed for the tensor list of arch 'falcon-h1' (whether the Mamba-2 "
            "mixer has its ssm_norm tensors: config.json mamba_rms_norm)", "mamba_rms_norm"
        )
    norm = ("falcon_h1_ssm_norm",) if spec.mamba_rms_norm else ()
    return ("falcon_h1_mamba", *norm, "falcon_h1_block")


def _granite_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    """granite-hybrid.cpp load_arch_tensors: the mixer, then experts (+ the shared expert when
    n_ff_shexp > 0) if n_expert > 0, else the dense gated FFN."""
    mixer = "mamba2" if recr else "granite_attn"
    if not spec.expert_count:
        return (mixer, "granite_dense", "ffn")
    return (mixer, "granite_moe", *(("granite_shexp",) if spec.expert_shared_feed_forward_length else ()))


def _arwkv7_kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
    """arwkv7.cpp load_arch_tensors, in its order: layer 0's v0/v1/v2 take the iclr rank (the converter writes
    copies of a0/a1/a2), the gate and the group norm only when the model has them."""
    if spec.wkv_group_norm is None:
        raise MissingFieldError(
            f"{spec.name}: wkv_group_norm is needed for the tensor list of arch 'arwkv7' (whether the time mix has "
            "its time_mix_ln tensors: config.json wkv_has_group_norm)", "wkv_group_norm"
        )
    gate = ("arwkv7_gate",) if spec.attention.gate_lora_rank else ()
    norm = ("arwkv7_ln",) if spec.wkv_group_norm else ()
    return ("arwkv7", "rwkv7_0" if il == 0 else "rwkv7_v", *gate, "arwkv7_mix", *norm, "arwkv7_out", "ffn")


def _qwen_kinds(ba: str, ffn: str) -> Callable[[ModelSpec, int, bool], tuple[str, ...]]:
    def kinds(spec: ModelSpec, il: int, recr: bool) -> tuple[str, ...]:
        mixer = ("gdn_qkv", ba, "gdn_out") if recr else ("qwen_attn",)
        nextn = ("qwen_nextn",) if il >= spec.n_layer else ()
        return ("qwen_norms", *mixer, ffn, *nextn)

    return kinds


@dataclass(frozen=True)
class ArchTensors:
    """How one arch lays out its tensors: the output norm's name and the kinds of each layer."""

    output_norm: str
    layer_kinds: Callable[[ModelSpec, int, bool], tuple[str, ...]]
    #: required keys of ModelSpec beyond the cache ones (a clear error instead of a zero-sized tensor)
    needs: tuple[str, ...] = ("vocab_size",)
    #: tensors outside the blocks besides token_embd, the output norm and output (RWKV's norm biases)
    extra_global: tuple[tuple[str, str], ...] = ()


ARCH_TENSORS: dict[str, ArchTensors] = {
    "mamba": ArchTensors("output_norm", lambda spec, il, recr: ("mamba",)),
    "rwkv7": ArchTensors(
        "output_norm", lambda spec, il, recr: ("rwkv7", "rwkv7_0" if il == 0 else "rwkv7_v"),
        ("vocab_size", "feed_forward_length", "attention.decay_lora_rank", "attention.iclr_lora_rank",
         "attention.value_residual_mix_lora_rank", "attention.gate_lora_rank"),
        extra_global=(("token_embd_norm.weight", "after_embd"), ("token_embd_norm.bias", "after_embd"),
                      ("output_norm.bias", "after_norm")),
    ),
    "arwkv7": ArchTensors(
        "output_norm", _arwkv7_kinds,
        ("vocab_size", "feed_forward_length", "attention.decay_lora_rank", "attention.iclr_lora_rank",
         "attention.value_residual_mix_lora_rank"),
    ),
    "plamo2": ArchTensors(
        "output_norm", lambda spec, il, recr: ("plamo2_mamba" if recr else "plamo2_attn", "plamo2_ffn"),
        ("vocab_size", "feed_forward_length"),
    ),
    "rwkv6": ArchTensors(
        "output_norm", lambda spec, il, recr: ("rwkv6",),
        ("vocab_size", "feed_forward_length", "time_mix_extra_dim", "time_decay_extra_dim"),
        extra_global=(("token_embd_norm.weight", "after_embd"), ("token_embd_norm.bias", "after_embd"),
                      ("output_norm.bias", "after_norm")),
    ),
    "rwkv6qwen2": ArchTensors(
        "output_norm", lambda spec, il, recr: ("rwkv6qwen2",),
        ("vocab_size", "feed_forward_length", "time_mix_extra_dim", "time_decay_extra_dim"),
    ),
    "mamba2": ArchTensors("output_norm", lambda spec, il, recr: ("mamba2",)),
    "jamba": ArchTensors(
        "output_norm",
        _jamba_kinds,
        ("vocab_size", "feed_forward_length", "expert_count", "expert_layers"),
    ),
    "kimi-linear": ArchTensors(
        "output_norm",
        lambda spec, il, recr: (
            "kda" if recr else "kimi_mla", "kimi_dense" if il < spec.leading_dense_block_count else "kimi_moe"
        ),
        ("vocab_size", "feed_forward_length", "expert_count", "expert_feed_forward_length", "expert_shared_count"),
    ),
    "minimax-01": ArchTensors(
        "output_norm",
        lambda spec, il, recr: ("minimax_lightning" if recr else "minimax_softmax", "minimax_moe"),
        ("vocab_size", "feed_forward_length", "expert_count"),
    ),
    "nemotron_h": ArchTensors("output_norm", _nemotron_kinds, ("vocab_size", "feed_forward_length")),
    "nemotron_h_moe": ArchTensors(
        "output_norm", _nemotron_kinds,
        ("vocab_size", "feed_forward_length", "expert_count", "expert_feed_forward_length",
         "expert_shared_feed_forward_length"),
    ),
    "falcon-h1": ArchTensors("output_norm", _falcon_h1_kinds, ("vocab_size", "feed_forward_length")),
    # the MoE Granite-4.0-H models (tiny, small) and the dense ones (h-1b, h-350m)
    "granitehybrid": ArchTensors("output_norm", _granite_kinds, ("vocab_size", "feed_forward_length")),
    "lfm2": ArchTensors("token_embd_norm", _lfm2_kinds, ("vocab_size", "feed_forward_length")),
    "lfm2moe": ArchTensors(
        "token_embd_norm", _lfm2_kinds,
        ("vocab_size", "feed_forward_length", "expert_count", "expert_feed_forward_length"),
    ),
    "qwen3next": ArchTensors(
        "output_norm", _qwen_kinds("gdn_ba_fused", "qwen_moe"),
        ("vocab_size", "expert_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"),
    ),
    "qwen35": ArchTensors("output_norm", _qwen_kinds("gdn_ba_split", "ffn"), ("vocab_size", "feed_forward_length")),
    "qwen35moe": ArchTensors(
        "output_norm", _qwen_kinds("gdn_ba_split", "qwen_moe"),
        ("vocab_size", "expert_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"),
    ),
}


def _arch(spec: ModelSpec) -> ArchTensors:
    try:
        at = ARCH_TENSORS[spec.arch]
    except KeyError:
        raise UnsupportedArchError(
            f"no tensor list for architecture '{spec.arch}' (have: {', '.join(sorted(ARCH_TENSORS))})"
        ) from None
    for key in at.needs:
        section, _, field = key.rpartition(".")
        if not getattr(getattr(spec, section) if section else spec, field):
            raise MissingFieldError(f"{spec.name}: {key} is needed for the tensor list of arch '{spec.arch}'", key)
    return at


def dims(spec: ModelSpec) -> Dims:
    """The dimensions of ``spec`` that the shape formulas read."""
    n = spec.block_count
    n_head = tuple(spec.head_count(il) for il in range(n))
    head0 = n_head[0]
    att = spec.attention
    head_k = att.key_length or (spec.embedding_length // head0 if head0 else 0)
    head_v = att.value_length or (spec.embedding_length // head0 if head0 else 0)
    ssm = spec.ssm
    return Dims(
        n_embd=spec.embedding_length,
        n_vocab=spec.vocab_size or 0,
        n_layer=spec.n_layer,
        n_head=n_head,
        n_head_kv=tuple(spec.head_count_kv(il) for il in range(n)),
        head_k=head_k,
        head_v=head_v,
        n_ff=tuple(spec.feed_forward(il) for il in range(n)),
        d_conv=(ssm.conv_kernel or 0) if ssm else 0,
        d_inner=(ssm.inner_size or 0) if ssm else 0,
        d_state=(ssm.state_size or 0) if ssm else 0,
        n_group=(ssm.group_count or 0) if ssm else 0,
        dt_rank=(ssm.time_step_rank or 0) if ssm else 0,
        l_cache=(spec.shortconv.l_cache or 0) if spec.shortconv else 0,
        n_expert=spec.expert_count,
        n_ff_exp=spec.expert_feed_forward_length,
        n_ff_shexp=spec.expert_shared_feed_forward_length or spec.feed_forward(0),
        lora=(att.decay_lora_rank or 0, att.iclr_lora_rank or 0, att.value_residual_mix_lora_rank or 0,
              att.gate_lora_rank or 0),
        kda=(spec.kda.head_dim or 0) if spec.kda else 0,
        kv_lora=att.kv_lora_rank or 0,
        rope=(att.key_length or 0) - (att.kv_lora_rank or 0) if att.kv_lora_rank else 0,
        head_k_mla=att.key_length_mla or 0,
        head_v_mla=att.value_length_mla or 0,
        n_expert_shared=spec.expert_shared_count,
        rwkv6_extra=(spec.time_mix_extra_dim, spec.time_decay_extra_dim),
        wkv_head=(spec.wkv.head_size or 0) if spec.wkv else 0,
    )


def tensor_list(spec: ModelSpec) -> list[TensorInfo]:
    """Every tensor of the model's GGUF, in llama.cpp's load order (the converter's order may differ)."""
    at = _arch(spec)
    d = dims(spec)
    recurrent = set(cache_layout(spec).recurrent_layers)
    extra = {where: [TensorInfo(name, (d.n_embd,)) for name, w in at.extra_global if w == where]
             for where in ("after_embd", "after_norm")}
    out = [
        TensorInfo("token_embd.weight", (d.n_embd, d.n_vocab)),
        *extra["after_embd"],
        TensorInfo(f"{at.output_norm}.weight", (d.n_embd,)),
        *extra["after_norm"],
    ]
    if not spec.tie_word_embeddings:
        out.append(TensorInfo("output.weight", (d.n_embd, d.n_vocab)))
    for il in range(spec.block_count):
        loaded = il < spec.n_layer
        for kind in at.layer_kinds(spec, il, il in recurrent):
            for suffix, shape in KINDS[kind]:
                out.append(TensorInfo(f"blk.{il}.{suffix}", shape(d, il), loaded))
    return out


#: conversion/base.py: tensors the converter always stores in F32, by the name after ``blk.N.``/ before
#: ``.weight`` (router, shared-expert router, conv kernels, RWKV decay / mix tensors, position embeddings).
_F32_STEMS = (
    "ffn_gate_inp", "ffn_gate_inp_shexp", "position_embd", "token_types", "ssm_conv1d", "shortconv.conv",
    "time_mix_first", "time_mix_w1", "time_mix_w2", "time_mix_decay_w1", "time_mix_decay_w2",
    "time_mix_lerp_fused", "ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v",
)


def converter_type(name: str, n_dims: int, outtype: str, ne0: int = 0) -> str:
    """The type convert_hf_to_gguf.py stores tensor ``name`` (of ``n_dims`` torch dims) in for ``--outtype``.

    For a quantized outtype, ``ne0`` (the row length) decides: gguf-py cannot quantize a row that is not a whole
    number of blocks, and the converter then falls back to F16 (conversion/base.py, ``QuantError``).
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, not '{outtype}'")
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return "f32"
    stem = name.removesuffix(".weight")
    stem = stem.split(".", 2)[2] if stem.startswith("blk.") else stem
    if stem in _F32_STEMS:
        return "f32"
    block = GGML_TYPES[outtype].block_size
    if block > 1 and (ne0 <= 0 or ne0 % block):
        return "f16"
    return outtype


def tensor_type(t: TensorInfo, outtype: str) -> str:
    """``converter_type`` of one listed tensor."""
    return converter_type(t.name, torch_n_dims(t), outtype, t.shape[0])


def torch_n_dims(t: TensorInfo) -> int:
    """The number of dims of the tensor the converter saw: ggml drops no dims, so it is len(shape)."""
    return len(t.shape)


def tensor_nbytes(t: TensorInfo, type_name: str) -> int:
    """ggml_nbytes of ``t`` stored as ``type_name``: rows of ne0 elements times the other dims."""
    rows = t.n_elements // t.shape[0]
    return row_nbytes(GGML_TYPES[type_name], t.shape[0]) * rows


def buffer_bytes(tensors: list[tuple[TensorInfo, str]], alignment: int = CPU_ALIGNMENT) -> int:
    """Bytes of a buffer holding these (tensor, type) pairs: each tensor padded to ``alignment``."""
    return sum(-(-tensor_nbytes(t, ty) // alignment) * alignment for t, ty in tensors)


def model_buffer_bytes(spec: ModelSpec, outtype: str, load_mtp: bool = False, alignment: int = CPU_ALIGNMENT) -> int:
    """The weights' bytes in one buffer of ``alignment`` (llama.cpp's per-buffer-type ``model`` bytes when every
    weight lands in it, as on a CPU-only run): the converter's type per tensor, MTP tensors only if ``load_mtp``."""
    return buffer_bytes([(t, tensor_type(t, outtype)) for t in tensor_list(spec) if t.loaded or load_mtp], alignment)

