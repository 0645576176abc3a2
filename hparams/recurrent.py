"""One recurrent layer's state dimensions, derived once per model (llama.cpp 0c1e57098 src/llama-hparams.cpp).

Every reader of a recurrent state's shape takes it from ``RecurrentDims``: the cache row widths (hparams.layout's
``n_embd_r`` / ``n_embd_s``), the serving engines' per-rank state shapes (planner.engines.states applies their
tensor-parallel split), the compute-buffer graphs (planner.compute.graphs) and the profiler's kernel pools
(profiler.families, with each op's dims from kernels.registry). ``recurrent_dims(spec)`` calls the builder of the
arch's family in ``BUILDERS``; a new family is one builder, its line there and its ops in ``FAMILY_OPS``
(docs/adding-a-recurrent-family.md).

Shapes, in elements, with the legend of rsplan.kernels:
    conv state:      ``W - 1`` past inputs of ``D`` channels, pool row ``[D, W - 1]``: ``n_embd_r = (W - 1) * D``
    recurrent state: ``H`` heads of ``P x S``, pool row ``[H, P, S]``: ``n_embd_s = H * P * S``
``n_embd_s`` is computed as llama.cpp computes it (``inner_size * S``, ``inner_size = H * P``), so that a model whose
state does not split into whole heads is still sized exactly; only the per-head views (``state_row``, the engines'
shapes, the kernels) need whole heads and groups, and ``require_heads`` refuses the others with one error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rsplan.errors import RecurrentDimsError
from rsplan.hparams.archs import Family
from rsplan.hparams.model import ModelSpec


@dataclass(frozen=True)
class StateOp:
    """One ggml op llama.cpp's graph runs on a recurrent layer's states, named by its rsplan.kernels package.

    Attributes:
        op: the kernel package (``conv_state``, ``ssm_scan``, ``gated_delta``, ...).
        pool: the state it reads and writes: ``r`` (conv state, ``cache_r_l*``) or ``s`` (``cache_s_l*``).
        planes: it writes the ``n_rs_seq`` rollback planes (takes ``n_planes``).
        clamp: planes beyond the ubatch's tokens get the window from before it (the delta nets' conv rule).
        token_shift: RWKV's token shift: a conv whose output is the previous token (weights ``[1, 0]``).
        modes: the op's variant switches, each passed to the kernel as a dim of 1 (``mamba1``: per-element
            decays; ``kda``: per-key gates).
    """

    op: str
    pool: Literal["r", "s"]
    planes: bool
    clamp: bool = False
    token_shift: bool = False
    modes: tuple[str, ...] = ()


_CONV = StateOp("conv_state", "r", planes=True)
_DELTA_CONV = StateOp("conv_state", "r", planes=True, clamp=True)
_TOKEN_SHIFT = StateOp("conv_state", "r", planes=False, token_shift=True)

#: The ops of each family's recurrent layer, in graph order (src/models/*.cpp). RWKV's time-mixing op depends on
#: the arch (RWKV_OPS) and follows its token shift.
FAMILY_OPS: dict[Family, tuple[StateOp, ...]] = {
    "mamba": (_CONV, StateOp("ssm_scan", "s", planes=False, modes=("mamba1",))),
    "mamba2": (_CONV, StateOp("ssm_scan", "s", planes=True)),
    "gated_delta_net": (_DELTA_CONV, StateOp("gated_delta", "s", planes=True)),
    "kda": (_DELTA_CONV, StateOp("gated_delta", "s", planes=True, modes=("kda",))),
    "rwkv": (_TOKEN_SHIFT,),
    "shortconv": (StateOp("shortconv", "r", planes=True),),
    "lightning": (StateOp("lightning", "s", planes=False),),
}

#: The time-mixing op of each RWKV arch (RWKV6-Qwen2 has no time_mix_first, so src/models/rwkv6-base.cpp:50
#: is_qrwkv and the graph calls ggml_gated_linear_attn; src/models/rwkv7-base.cpp:107 ggml_rwkv_wkv7 for both
#: RWKV-7s).
RWKV_OPS: dict[str, str] = {"rwkv6": "rwkv6", "rwkv6qwen2": "gla", "rwkv7": "rwkv7", "arwkv7": "rwkv7"}


@dataclass(frozen=True)
class RecurrentDims:
    """The state dimensions of ``spec``'s recurrent layers (all alike), in elements.

    Attributes:
        family: the arch's family (hparams.archs); ``name``: how reports name it (RWKV: its time-mixing op).
        conv_width: W, the conv kernel width; the conv state keeps ``W - 1`` inputs (0: no conv state).
        conv_channels: D, the conv state's channels (Mamba-2: ``d_inner + 2 * n_group * d_state``).
        n_groups: G, groups of B / C (Mamba-2; Mamba-1's one group) or key heads (delta nets).
        n_heads: H, state heads (value heads; Mamba-1: one per channel).
        head_dim: P, value elements per head (``inner_size // n_heads``; whole only without ``split_error``).
        inner_size: ``H * P`` as the model gives it (Mamba's d_inner, RWKV's n_embd).
        state_size: S, state elements per value element (d_state, the key head dim).
        ops: the ops llama.cpp runs on these states.
        split_error: why the state does not split into whole heads and groups (None: it does).
        dt_rank: Mamba-1's time-step rank (``ssm.time_step_rank``, the width of its dt projection; Mamba-2 and
            the delta nets read that key as their head count, ``n_heads``); 0 for the other families.
    """

    family: Family
    name: str
    conv_width: int
    conv_channels: int
    n_groups: int
    n_heads: int
    head_dim: int
    inner_size: int
    state_size: int
    ops: tuple[StateOp, ...]
    split_error: str | None = None
    dt_rank: int = 0

    @property
    def n_embd_r(self) -> int:
        """llama_hparams::n_embd_r: the conv state's row width."""
        return max(self.conv_width - 1, 0) * self.conv_channels

    @property
    def n_embd_s(self) -> int:
        """llama_hparams::n_embd_s: the recurrent state's row width."""
        return self.inner_size * self.state_size

    @property
    def has_state(self) -> bool:
        """Whether a layer keeps an S state its ops read (short convolutions keep only the conv state)."""
        return any(op.pool == "s" for op in self.ops)

    def require_heads(self) -> RecurrentDims:
        """``self``, or a RecurrentDimsError when the state does not split into whole heads and groups."""
        if self.split_error is not None:
            raise RecurrentDimsError(self.split_error)
        return self

    @property
    def conv_row(self) -> tuple[int, int]:
        """One conv-state pool row, ``[D, W - 1]``."""
        return (self.conv_channels, self.conv_width - 1)

    @property
    def state_row(self) -> tuple[int, int, int]:
        """One recurrent-state pool row, ``[H, P, S]`` (call ``require_heads`` first)."""
        return (self.n_heads, self.head_dim, self.state_size)


def _ssm(spec: ModelSpec) -> tuple[int, int, int, int, int]:
    """(d_conv, d_inner, d_state, n_group, dt_rank) as llama.cpp reads them: 0 where the GGUF has no key."""
    ssm = spec.ssm
    if ssm is None:
        return 0, 0, 0, 0, 0
    return (ssm.conv_kernel or 0, ssm.inner_size or 0, ssm.state_size or 0, ssm.group_count or 0,
            ssm.time_step_rank or 0)


def _mamba_conv(spec: ModelSpec) -> tuple[int, int]:
    """(W, D) of Mamba's conv over ``x | B | C``, also the gated delta nets' over ``q | k | v``
    (src/llama-hparams.cpp:229 n_conv)."""
    d_conv, d_inner, d_state, n_group, _ = _ssm(spec)
    return d_conv, d_inner + 2 * n_group * d_state


def _mamba1(spec: ModelSpec) -> RecurrentDims:
    """Mamba-1 (and Jamba): every channel is its own head of one element; B and C form one group; dt projected
    from ``time_step_rank`` (src/models/mamba-base.cpp:23 dt_rank); S rows src/llama-hparams.cpp:257 ssm_d_state."""
    _, d_inner, d_state, _, dt_rank = _ssm(spec)
    width, channels = _mamba_conv(spec)
    return RecurrentDims("mamba", "mamba", width, channels, 1, d_inner, 1, d_inner, d_state, FAMILY_OPS["mamba"],
                         dt_rank=dt_rank)


#: Mamba-2 archs whose GGUF says ``ssm.group_count`` 0 and whose scan reads one B / C per token: PLaMo-2 asserts
#: the 0 (src/models/plamo2.cpp:281 GGML_ASSERT) and views B and C as one group (src/models/plamo2.cpp:372 B). The
#: conv state then holds x only (``d_inner`` channels, llama.cpp's n_embd_r with n_group 0).
ONE_GROUP_SCAN: frozenset[str] = frozenset({"plamo2"})


def _mamba2(spec: ModelSpec) -> RecurrentDims:
    """Mamba-2: ``time_step_rank`` heads of ``d_inner / heads`` x ``d_state``, ``group_count`` groups of B / C
    (src/models/mamba-base.cpp:166 n_head, whole heads and groups asserted at src/models/mamba-base.cpp:177
    GGML_ASSERT); ONE_GROUP_SCAN archs scan with one group."""
    _, d_inner, d_state, n_group, n_head = _ssm(spec)
    width, channels = _mamba_conv(spec)
    if spec.arch in ONE_GROUP_SCAN and n_group == 0:
        n_group = 1
    error = None
    if not n_head or d_inner % n_head or not n_group or n_head % n_group:
        error = (f"ssm: inner_size {d_inner} / time_step_rank {n_head} / group_count {n_group} do not make whole "
                 "heads and groups")
    return RecurrentDims("mamba2", "mamba2", width, channels, n_group, n_head, d_inner // max(n_head, 1), d_inner,
                         d_state, FAMILY_OPS["mamba2"], error)


def _gated_delta_net(spec: ModelSpec) -> RecurrentDims:
    """Gated delta nets (Qwen3-Next, Qwen3.5): ``group_count`` key heads of ``state_size``, ``time_step_rank``
    value heads of ``inner_size / value heads`` (src/models/qwen35.cpp:343 head_k_dim, src/models/qwen35.cpp:346
    head_v_dim)."""
    _, d_inner, d_state, n_k_heads, n_v_heads = _ssm(spec)
    width, channels = _mamba_conv(spec)
    error = None
    if not n_v_heads or not n_k_heads or d_inner % n_v_heads or n_v_heads % n_k_heads:
        error = (f"ssm: time_step_rank {n_v_heads} (value heads) must divide inner_size {d_inner} and be a multiple "
                 f"of group_count {n_k_heads} (key heads)")
    return RecurrentDims("gated_delta_net", "gated_delta_net", width, channels, n_k_heads, n_v_heads,
                         d_inner // max(n_v_heads, 1), d_inner, d_state, FAMILY_OPS["gated_delta_net"], error)


def _kda(spec: ModelSpec) -> RecurrentDims:
    """Kimi Delta Attention: ``attention.head_count`` heads of ``kda.head_dim`` (keys and values alike); the conv
    runs over ``q | k | v`` (llama.cpp: ``3 * (d_conv - 1 or 3) * heads * head_dim``, src/llama-hparams.cpp:219
    n_embd_head_kda; S rows src/llama-hparams.cpp:242 n_embd_head_kda)."""
    if spec.kda is None or spec.kda.head_dim is None:  # required for the kda family (archs.py): a validated spec has it
        raise RecurrentDimsError(f"{spec.name}: the kda family needs kda.head_dim, which the model does not give")
    d_conv = _ssm(spec)[0]
    n_head, head_dim = spec.head_count(0), spec.kda.head_dim
    return RecurrentDims("kda", "kda", d_conv if d_conv > 0 else 4, 3 * n_head * head_dim, n_head, n_head, head_dim,
                         n_head * head_dim, head_dim, FAMILY_OPS["kda"])


def _rwkv(spec: ModelSpec) -> RecurrentDims:
    """RWKV-6/7: ``embedding_length / head_size`` heads of ``head_size`` x ``head_size``; the token shift keeps
    ``token_shift_count`` rows of ``n_embd`` (one W = 2 conv state): src/llama-hparams.cpp:209 wkv_head_size,
    src/llama-hparams.cpp:237 wkv_head_size."""
    assert spec.wkv is not None and spec.wkv.head_size is not None  # required for the rwkv family (archs.py)
    n_embd, head_size = spec.embedding_length, spec.wkv.head_size
    op = RWKV_OPS[spec.arch]
    error = None
    if n_embd % head_size:
        error = f"wkv.head_size {head_size} does not divide embedding_length {n_embd}"
    ops = (*FAMILY_OPS["rwkv"], StateOp(op, "s", planes=False))
    return RecurrentDims("rwkv", op, 2, spec.wkv.token_shift_count * n_embd, 0, n_embd // head_size, head_size,
                         n_embd, head_size, ops, error)


def _shortconv(spec: ModelSpec) -> RecurrentDims:
    """LFM2's short convolution over ``n_embd`` channels, width ``l_cache``; no S state (its row width is 0):
    src/llama-hparams.cpp:214 n_shortconv_l_cache."""
    assert spec.shortconv is not None and spec.shortconv.l_cache is not None  # required for shortconv (archs.py)
    return RecurrentDims("shortconv", "shortconv", spec.shortconv.l_cache, spec.embedding_length, 0, 0, 0, 0, 0,
                         FAMILY_OPS["shortconv"])


def _lightning(spec: ModelSpec) -> RecurrentDims:
    """MiniMax-01's lightning attention: ``head_count`` heads of the attention key head dim squared
    (``n_embd_head_la = n_embd_head_k_full``: src/models/minimax-01.cpp:9 n_embd_head_la, S rows
    src/llama-hparams.cpp:249 n_embd_head_la); no conv state."""
    n_head = spec.head_count(0)  # > 0: a hybrid arch (model.check_consistency)
    head_dim = spec.attention.key_length or spec.embedding_length // n_head
    width, channels = _mamba_conv(spec)  # llama.cpp's Mamba branch of n_embd_r: 0 without ssm keys
    return RecurrentDims("lightning", "lightning", width, channels, 0, n_head, head_dim, n_head * head_dim, head_dim,
                         FAMILY_OPS["lightning"])


#: family -> the builder of its RecurrentDims.
BUILDERS: dict[Family, Callable[[ModelSpec], RecurrentDims]] = {
    "mamba": _mamba1,
    "mamba2": _mamba2,
    "gated_delta_net": _gated_delta_net,
    "kda": _kda,
    "rwkv": _rwkv,
    "shortconv": _shortconv,
    "lightning": _lightning,
}


def recurrent_dims(spec: ModelSpec) -> RecurrentDims:
    """The recurrent state dimensions of ``spec`` (its arch's family builder)."""
    return BUILDERS[spec.info.family](spec)
