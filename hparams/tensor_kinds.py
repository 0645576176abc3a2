"""The tensor templates of each kind of layer llama.cpp's loader builds, as data.

Which tensors a layer has depends on its kind: each arch (``tensors.ARCH_TENSORS``) maps a layer index to a tuple
of kind names (for example ``("gdn", "moe")`` or ``("attn", "moe", "nextn")``), and each kind here is a list of
tensor templates: the name after ``blk.{il}.`` and the shape in GGUF/ggml order (ne0, ne1, ...) as a formula of
the model's dimensions (``Dims``, llama_hparams names) and the layer index. The tables follow llama.cpp's
``load_arch_tensors`` (src/models/<arch>.cpp, commit 0c1e57098) and the converter (convert_hf_to_gguf.py), in the
loader's order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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

#: Layouts several archs' loaders create alike: separate Q / K / V without biases (Granite-4.0-H, Nemotron-H,
#: MiniMax-01's softmax layers), routed experts as wide as n_ff (Jamba, Granite-4.0-H, MiniMax-01) and a gated FFN
#: (Jamba's dense layers, Kimi Linear's dense FFN).
_GQA_ATTN: list[Template] = [
    ("attn_norm.weight", _NORM),
    ("attn_q.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
    ("attn_k.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head_kv[il])),
    ("attn_v.weight", lambda d, il: (d.n_embd, d.head_v * d.n_head_kv[il])),
    ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
]
_EXPERTS: list[Template] = [
    ("ffn_norm.weight", _NORM),
    ("ffn_gate_inp.weight", lambda d, il: (d.n_embd, d.n_expert)),
    ("ffn_gate_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
    ("ffn_down_exps.weight", lambda d, il: (d.n_ff[il], d.n_embd, d.n_expert)),
    ("ffn_up_exps.weight", lambda d, il: (d.n_embd, d.n_ff[il], d.n_expert)),
]
_GATED_FFN: list[Template] = [
    ("ffn_norm.weight", _NORM),
    ("ffn_gate.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
    ("ffn_down.weight", lambda d, il: (d.n_ff[il], d.n_embd)),
    ("ffn_up.weight", lambda d, il: (d.n_embd, d.n_ff[il])),
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
    "jamba_moe": _EXPERTS,
    "jamba_ffn": _GATED_FFN,
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
    "granite_attn": _GQA_ATTN,
    "granite_moe": _EXPERTS,
    "granite_shexp": [
        ("ffn_gate_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_up_shexp.weight", lambda d, il: (d.n_embd, d.n_ff_shexp)),
        ("ffn_down_shexp.weight", lambda d, il: (d.n_ff_shexp, d.n_embd)),
    ],
    # Nemotron-H (src/models/nemotron-h.cpp): Mamba-2 layers are the "mamba2" kind; '*' layers attention only,
    # '-' layers a squared-ReLU MLP only (no gate); the converter writes no attention / MLP biases
    "nemotron_attn": _GQA_ATTN,
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
    "minimax_softmax": _GQA_ATTN,
    "minimax_lightning": [
        ("attn_norm.weight", _NORM),
        ("attn_norm_2.weight", lambda d, il: (d.head_k * d.n_head[il],)),
        ("attn_qkv.weight", lambda d, il: (d.n_embd, 3 * d.head_k * d.n_head[il])),
        ("attn_gate.weight", lambda d, il: (d.n_embd, d.head_k * d.n_head[il])),
        ("attn_output.weight", lambda d, il: (d.head_k * d.n_head[il], d.n_embd)),
    ],
    "minimax_moe": _EXPERTS,
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
    "kimi_dense": _GATED_FFN,
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

