"""Every weight tensor llama.cpp's loader creates for a model, with its GGUF name and shape.

``tensor_list(spec)`` returns the tensors of a GGUF file that the converter (convert_hf_to_gguf.py) writes and
llama.cpp's ``load_arch_tensors`` (src/models/<arch>.cpp, commit 0c1e57098) reads, in the loader's order:
names as the GGUF holds them (``blk.3.ssm_in.weight``), shapes in GGUF/ggml order (ne0, ne1, ...), and whether a
plain context loads them (``loaded``: MTP / nextn tensors are in the file but skipped with TENSOR_SKIP unless
the MTP draft is loaded).

Each arch maps a layer index to a tuple of kind names (``ARCH_TENSORS``); each kind is a table of tensor templates
(``tensor_kinds.KINDS``). The tables are data; the per-arch rules are small functions. The stored type of each
tensor is ``converter_types.tensor_type``, its bytes ``tensor_bytes.tensor_nbytes``.

Archs with a table: mamba, mamba2, rwkv6, rwkv6qwen2, rwkv7, arwkv7, plamo2, jamba, nemotron_h, nemotron_h_moe,
falcon-h1, granitehybrid, lfm2, lfm2moe, qwen35, qwen35moe, qwen3next, kimi-linear, minimax-01. Shapes need the
weight-only ModelSpec keys (vocab_size, expert_*, ...); a missing one is an UnsupportedArchError naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rsplan.errors import UnsupportedArchError
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.tensor_kinds import KINDS, Dims


class MissingFieldError(UnsupportedArchError):
    """A ModelSpec field the tensor list of an arch needs is not set: ``field`` names it (``vocab_size``,
    ``attention.decay_lora_rank``, ...)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field



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

