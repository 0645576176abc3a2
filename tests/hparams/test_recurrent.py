"""RecurrentDims: one derivation of a recurrent layer's state dimensions, read by the row widths, the serving
engines and the profiler alike. Expected numbers are worked out by hand from the presets' config values."""

from __future__ import annotations

from typing import get_args

import pytest

from rsplan.errors import RecurrentDimsError
from rsplan.hparams.archs import ARCHS, Family
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.recurrent import BUILDERS, FAMILY_OPS, RWKV_OPS, recurrent_dims
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.planner.engines.states import recurrent_shapes
from rsplan.profiler.families import family_of
from rsplan_testing import make_spec


def test_every_family_has_a_builder_and_ops():
    assert set(BUILDERS) == set(FAMILY_OPS) == set(get_args(Family)) == {a.family for a in ARCHS.values()}
    assert {a.name for a in ARCHS.values() if a.family == "rwkv"} == set(RWKV_OPS)


@pytest.mark.parametrize("name", builtin_preset_names())
def test_head_views_multiply_back_to_the_row_widths(name):
    """The per-head rows the kernels and engines use hold exactly llama.cpp's n_embd_r / n_embd_s elements."""
    dims = recurrent_dims(load_builtin_preset(name)).require_heads()
    pools = {op.pool for op in dims.ops}
    if "r" in pools:
        d, w = dims.conv_row
        assert d * w == dims.n_embd_r
    if "s" in pools:
        h, p, s = dims.state_row
        assert h * p * s == dims.n_embd_s
    else:
        assert dims.n_embd_s == 0


@pytest.mark.parametrize(("preset", "expected"), [
    # Qwen3-Next: conv over q|k|v = 16 key heads x 128 x 2 + 32 value heads x 128; state 32 x 128 x 128
    ("qwen3-next-80b-a3b", dict(conv_width=4, conv_channels=2 * 16 * 128 + 4096, n_groups=16, n_heads=32,
                                head_dim=128, state_size=128, n_embd_r=3 * 8192, n_embd_s=4096 * 128)),
    # Nemotron-H 8B: 128 heads of 64 (d_inner 8192), 8 groups, d_state 128
    ("nemotron-h-8b-base-8k", dict(conv_width=4, conv_channels=8192 + 2 * 8 * 128, n_groups=8, n_heads=128,
                                   head_dim=64, state_size=128, n_embd_r=3 * 10240, n_embd_s=8192 * 128)),
    # Kimi Linear: 32 KDA heads of 128, conv width 4 over q|k|v
    ("kimi-linear-48b-a3b", dict(conv_width=4, conv_channels=3 * 32 * 128, n_groups=32, n_heads=32, head_dim=128,
                                 state_size=128, n_embd_r=3 * 12288, n_embd_s=128 * 128 * 32)),
    # RWKV-7 0.4B: n_embd 1024, 16 heads of 64; two token-shift rows of n_embd
    ("rwkv7-0.4b-world", dict(name="rwkv7", conv_width=2, conv_channels=2 * 1024, n_heads=16, head_dim=64,
                              state_size=64, n_embd_r=2048, n_embd_s=1024 * 64)),
    # LFM2-1.2B: L_cache 3 over n_embd 2048; no S state
    ("lfm2-1.2b", dict(conv_width=3, conv_channels=2048, n_embd_r=2 * 2048, n_embd_s=0)),
    # MiniMax-Text-01: 64 heads of key_length 128 (not 6144 / 64 = 96); no conv state
    ("minimax-text-01", dict(conv_width=0, n_heads=64, head_dim=128, state_size=128, n_embd_r=0,
                             n_embd_s=128 * 128 * 64)),
    # Mamba-1 130m: d_inner 1536 channels, each a head of one element; one group of B / C; d_state 16; the dt
    # projection's rank ceil(768 / 16) = 48
    ("mamba-130m", dict(conv_width=4, conv_channels=1536, n_groups=1, n_heads=1536, head_dim=1, state_size=16,
                        dt_rank=48, n_embd_r=3 * 1536, n_embd_s=1536 * 16)),
])
def test_dims_of_each_family(preset, expected):
    spec = load_builtin_preset(preset)
    dims = recurrent_dims(spec)
    assert {key: getattr(dims, key) for key in expected} == expected
    if dims.family != "mamba":
        assert dims.dt_rank == 0  # only Mamba-1 reads time_step_rank as a projection rank
    layout = cache_layout(spec)
    assert layout.recurrent == dims
    assert (layout.n_embd_r, layout.n_embd_s) == (expected["n_embd_r"], expected["n_embd_s"])


MAMBA2_ODD = dict(arch="mamba2", context_length=1, embedding_length=64, block_count=2,
                  ssm={"conv_kernel": 4, "inner_size": 100, "state_size": 16, "time_step_rank": 3, "group_count": 1})
GDN_ODD_KEY_HEADS = dict(
    arch="qwen3next", context_length=1, embedding_length=64, block_count=4,
    attention={"head_count": 2, "head_count_kv": 1, "key_length": 16, "value_length": 16},
    ssm={"conv_kernel": 4, "inner_size": 48, "state_size": 8, "time_step_rank": 6, "group_count": 4},
)
RWKV_ODD = dict(arch="rwkv6", context_length=1, embedding_length=40, block_count=2, wkv={"head_size": 16})


@pytest.mark.parametrize(("fields", "message", "n_embd_s"), [
    (MAMBA2_ODD, "ssm: inner_size 100 / time_step_rank 3 / group_count 1 do not make whole heads and groups",
     100 * 16),
    (GDN_ODD_KEY_HEADS, "ssm: time_step_rank 6 (value heads) must divide inner_size 48 and be a multiple of "
                        "group_count 4 (key heads)", 48 * 8),
    (RWKV_ODD, "wkv.head_size 16 does not divide embedding_length 40", 40 * 16),
], ids=["mamba2-heads", "gdn-key-heads", "rwkv-head-size"])
def test_a_state_without_whole_heads_is_sized_and_refused_once(fields, message, n_embd_s):
    """llama.cpp sizes the rows all the same (n_embd_s is a plain product); the engines and the profiler, which
    work per head, refuse the model with the same error."""
    spec = make_spec(**fields)
    layout = cache_layout(spec)
    assert layout.n_embd_s == n_embd_s
    with pytest.raises(RecurrentDimsError, match=message.replace("(", r"\(").replace(")", r"\)")) as profiler:
        family_of(layout)
    if spec.arch == "rwkv6":
        return  # no engine serves RWKV
    with pytest.raises(RecurrentDimsError) as engines:
        recurrent_shapes(layout.recurrent, 1, engine="test")
    assert str(engines.value) == str(profiler.value)


def test_plamo2_scans_one_group_and_convolves_x_only():
    """PLaMo-2 writes ssm.group_count 0 (llama.cpp asserts it) and views B / C as one group of d_state per token:
    plamo-2-1b's d_inner 4096 in 32 heads of 128, d_state 64, conv width 4 over the 4096 x channels only."""
    dims = recurrent_dims(load_builtin_preset("plamo-2-1b")).require_heads()
    assert (dims.n_groups, dims.n_heads, dims.head_dim, dims.state_size) == (1, 32, 128, 64)
    assert dims.conv_row == (4096, 3) and dims.n_embd_r == 3 * 4096
    assert dims.state_row == (32, 128, 64) and dims.n_embd_s == 64 * 4096
