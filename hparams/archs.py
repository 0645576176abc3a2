"""The llama.cpp architectures rsplan sizes, as a table of facts (llama.cpp 0c1e57098).

For each arch string (``general.architecture``): whether its memory is purely recurrent or hybrid, how its
loader marks recurrent layers (``layer_rule``), which layers its KV filter keeps, which hyper-parameter sections
its loader reads (``sections``) and which of their keys it requires, whether it supports recurrent rollback
(``llm_arch_supports_rs_rollback``), and its default ``full_attention_interval``.
Sources: src/llama-arch.cpp, src/models/<arch>.cpp ``load_arch_hparams``, src/llama-model.cpp ``create_memory``;
``memory`` follows src/llama-arch.cpp:1071 llm_arch_is_recurrent and src/llama-arch.cpp:1085 llm_arch_is_hybrid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rsplan.errors import UnsupportedArchError, excerpt

#: How the loader marks layer il (< n_layer, the trunk) as recurrent.
#: all: every trunk layer (pure recurrent archs and Falcon-H1's parallel hybrid);
#: kv_zero: ``head_count_kv[il] == 0``; nemotron: ``head_count_kv[il] == 0 and feed_forward_length[il] == 0``;
#: interval: ``attention.recurrent_layers`` if present, else ``(il + 1) % full_attention_interval != 0``.
LayerRule = Literal["all", "kv_zero", "nemotron", "interval"]

#: Which layers carry a KV cache. none: pure recurrent; all: every layer incl. MTP (Falcon-H1);
#: not_recurrent: ``not is_recr(il)`` over all layers incl. MTP (the default hybrid filter);
#: nemotron: ``not is_recr(il) and feed_forward_length[il] == 0`` over all layers;
#: trunk_not_recurrent: ``il < n_layer and not is_recr(il)`` (Qwen3-Next, Qwen3.5, MiniMax-01).
KVFilter = Literal["none", "all", "not_recurrent", "nemotron", "trunk_not_recurrent"]

#: The recurrent families, named by the hparams branch llama.cpp takes for n_embd_r / n_embd_s.
Family = Literal["mamba", "mamba2", "gated_delta_net", "rwkv", "shortconv", "kda", "lightning"]


@dataclass(frozen=True)
class ArchInfo:
    name: str
    family: Family
    memory: Literal["recurrent", "hybrid"]
    layer_rule: LayerRule
    kv_filter: KVFilter
    #: hyper-parameter sections the loader reads; each maps to the keys it requires
    sections: dict[str, tuple[str, ...]]
    full_attention_interval: int | None = None
    #: the loader reads attention.sliding_window (LFM2 only among these archs)
    reads_sliding_window: bool = False
    #: the attention layers are MLA (K-only cache): attention.key_length_mla / value_length_mla required
    mla: bool = False
    #: the loader reads attention.key_length / value_length even when layer 0 has no heads (plamo2.cpp)
    head_dims_without_heads: bool = False
    #: further attention.* keys the loader reads (weight shapes and the graph), each -> whether it is required
    attention_keys: tuple[tuple[str, bool], ...] = ()
    #: ssm.* head and group counts the loader or the graph divides by (``d_inner / n_head``,
    #: ``d_inner / n_group``): 0 is an integer division by zero there (SIGFPE), so they must be >= 1
    ssm_divisors: tuple[str, ...] = ()
    #: ssm.* keys the graph asserts are 0 (src/models/plamo2.cpp:281 GGML_ASSERT(n_group == 0))
    ssm_zero: tuple[str, ...] = ()

    @property
    def rollback(self) -> bool:
        """Whether llama.cpp keeps n_rs_seq rollback planes for this arch (else it clamps n_rs_seq to 0)."""
        return self.name in ROLLBACK_ARCHS


_SSM_MAMBA1 = ("conv_kernel", "inner_size", "state_size", "time_step_rank")
_SSM_MAMBA2 = (*_SSM_MAMBA1, "group_count")
#: the Mamba-2 mixer (src/models/mamba-base.cpp:167 head_dim = d_inner / n_head, src/models/mamba2.cpp:78 ssm_norm
#: {d_inner / n_group, n_group}) and the gated delta net (src/models/qwen3next.cpp:322 d_inner / num_v_heads, :340
#: num_v_heads / num_k_heads) divide by both
_HEADS_AND_GROUPS = ("time_step_rank", "group_count")
#: RWKV-7's LoRA ranks (src/models/rwkv7.cpp:7 n_lora_decay, the same lines in src/models/arwkv7.cpp): the gate's
#: is optional (ARWKV-7 files without an output gate)
_RWKV7_LORA = (("decay_lora_rank", True), ("iclr_lora_rank", True), ("value_residual_mix_lora_rank", True),
               ("gate_lora_rank", False))

ARCHS: dict[str, ArchInfo] = {
    a.name: a
    for a in (
        ArchInfo("mamba", "mamba", "recurrent", "all", "none", {"ssm": _SSM_MAMBA1}),
        ArchInfo("mamba2", "mamba2", "recurrent", "all", "none", {"ssm": _SSM_MAMBA2},
                 ssm_divisors=_HEADS_AND_GROUPS),
        ArchInfo("rwkv6", "rwkv", "recurrent", "all", "none", {"wkv": ("head_size",)}),
        ArchInfo("rwkv6qwen2", "rwkv", "recurrent", "all", "none", {"wkv": ("head_size",)}),
        ArchInfo("rwkv7", "rwkv", "recurrent", "all", "none", {"wkv": ("head_size",)}, attention_keys=_RWKV7_LORA),
        ArchInfo("arwkv7", "rwkv", "recurrent", "all", "none", {"wkv": ("head_size",)}, attention_keys=_RWKV7_LORA),
        ArchInfo("jamba", "mamba", "hybrid", "kv_zero", "not_recurrent", {"ssm": _SSM_MAMBA1}),
        ArchInfo("falcon-h1", "mamba2", "hybrid", "all", "all", {"ssm": _SSM_MAMBA2}, ssm_divisors=_HEADS_AND_GROUPS),
        ArchInfo("plamo2", "mamba2", "hybrid", "kv_zero", "not_recurrent", {"ssm": _SSM_MAMBA2},
                 head_dims_without_heads=True, ssm_divisors=("time_step_rank",), ssm_zero=("group_count",)),
        ArchInfo("granitehybrid", "mamba2", "hybrid", "kv_zero", "not_recurrent", {"ssm": _SSM_MAMBA2},
                 ssm_divisors=_HEADS_AND_GROUPS),
        ArchInfo("nemotron_h", "mamba2", "hybrid", "nemotron", "nemotron", {"ssm": _SSM_MAMBA2},
                 ssm_divisors=_HEADS_AND_GROUPS),
        ArchInfo("nemotron_h_moe", "mamba2", "hybrid", "nemotron", "nemotron", {"ssm": _SSM_MAMBA2},
                 ssm_divisors=_HEADS_AND_GROUPS),
        ArchInfo(
            "lfm2", "shortconv", "hybrid", "kv_zero", "not_recurrent", {"shortconv": ("l_cache",)},
            reads_sliding_window=True,
        ),
        ArchInfo("lfm2moe", "shortconv", "hybrid", "kv_zero", "not_recurrent", {"shortconv": ("l_cache",)}),
        ArchInfo(
            "qwen3next", "gated_delta_net", "hybrid", "interval", "trunk_not_recurrent",
            {"ssm": _SSM_MAMBA2}, full_attention_interval=4,
            ssm_divisors=_HEADS_AND_GROUPS,
        ),
        ArchInfo(
            "qwen35", "gated_delta_net", "hybrid", "interval", "trunk_not_recurrent",
            {"ssm": _SSM_MAMBA2}, full_attention_interval=4,
            ssm_divisors=_HEADS_AND_GROUPS,
        ),
        ArchInfo(
            "qwen35moe", "gated_delta_net", "hybrid", "interval", "trunk_not_recurrent",
            {"ssm": _SSM_MAMBA2}, full_attention_interval=4,
            ssm_divisors=_HEADS_AND_GROUPS,
        ),
        ArchInfo(
            "kimi-linear", "kda", "hybrid", "kv_zero", "not_recurrent",
            {"ssm": ("conv_kernel",), "kda": ("head_dim",)}, mla=True,
        ),
        ArchInfo(
            "minimax-01", "lightning", "hybrid", "interval", "trunk_not_recurrent", {},
            full_attention_interval=8,
        ),
    )
}

#: Architectures llama.cpp lets keep rollback snapshots (src/llama-arch.cpp:1123 llm_arch_supports_rs_rollback).
#: Only the ones in ARCHS can be sized by rsplan; the rest are listed so the clamp rule reads like its source.
ROLLBACK_ARCHS: frozenset[str] = frozenset(
    {
        "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next",
        "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
    }
)


#: Architectures with a tensor llama.cpp may read on demand instead of loading (``--lazy-mode``, default auto: the
#: tensors so marked and over 4 GiB): only the per-layer token embeddings of these two
#: (src/models/qwen4exp.cpp:192 TENSOR_READ_LAZY, src/models/gemma4.cpp:59 TENSOR_READ_LAZY). None is in ARCHS, so
#: ``--lazy-mode`` changes no byte of a model rsplan sizes; kept to say so (tests/hparams/test_archs_lazy.py).
LAZY_READ_ARCHS: frozenset[str] = frozenset({"qwen4exp", "gemma4"})


def arch_info(name: str) -> ArchInfo:
    """The facts for arch ``name``; an UnsupportedArchError naming it when rsplan cannot size it exactly."""
    try:
        return ARCHS[name]
    except KeyError:
        raise UnsupportedArchError(
            f"architecture '{excerpt(name)}' is not supported "
            f"(supported: {', '.join(sorted(ARCHS))})"
        ) from None
