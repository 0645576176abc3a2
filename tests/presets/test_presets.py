"""The built-in presets: each one loads, and sizes exactly as derived by hand from its config.json.

Every expected number below is written from the model's published hyper-parameters (see the preset's
``source``) with llama.cpp's rules (docs/sizing.md), never computed by the code under test:
- conv-state row ``n_embd_r``: Mamba-1/2 and gated delta nets ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)``,
  RWKV ``token_shift_count * n_embd``, LFM2 ``n_embd * (l_cache - 1)``, KDA ``3 * (d_conv - 1) * n_head * head_dim``,
  MiniMax-01 0;
- state row ``n_embd_s``: ``d_state * d_inner``, RWKV ``n_embd * head_size``, LFM2 0, KDA ``head_dim**2 * n_head``,
  MiniMax-01 ``head_dim**2 * n_head``.

All sizes are at the same settings, ``-c 32768 -np 4`` (4 streams of 8192 cells, 32768 KV cells in all),
f16 K/V with flash attention on (V not transposed), f32 R/S, no rollback planes: each recurrent tensor has
4 rows, so a recurrent layer holds ``4 * 4 * (n_embd_r + n_embd_s)`` bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.hparams.yaml_preset import load_preset_text
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan

REPO = Path(__file__).resolve().parents[2]
PRESET_DIR = REPO / "presets"

#: The presets the project promises to ship (one per family llama.cpp sizes).
REQUIRED = (
    "article-example-48l",
    "falcon-h1-0.5b-instruct",
    "granite-4.0-h-tiny",
    "jamba-v0.1",
    "kimi-linear-48b-a3b",
    "lfm2-1.2b",
    "lfm2-2.6b",
    "lfm2-8b-a1b",
    "mamba-130m",
    "mamba-codestral-7b",
    "mamba2-130m",
    "mamba2-2.7b",
    "minimax-text-01",
    "nemotron-3-nano-30b-a3b",
    "nemotron-h-8b-base-8k",
    "qwen3-next-80b-a3b",
    "qwen3.5-0.8b",
    "qwen3.5-9b",
    "qwen3.5-27b",
    "qwen3.5-35b-a3b",
    "qrwkv6-32b-instruct-preview",
    "rwkv6-1.6b-world",
    "rwkv7-0.4b-world",
)

CELLS = 32768  # -c 32768 -np 4: pad(32768 // 4, 256) = 8192 cells per stream, 4 streams
SEQS = 4
F16 = 2
F32 = 4


def _per_recurrent_layer(n_embd_r: int, n_embd_s: int, rows: int = SEQS) -> int:
    """Bytes of one recurrent layer: an f32 R row and an f32 S row per sequence."""
    return rows * F32 * (n_embd_r + n_embd_s)


@dataclass(frozen=True)
class Expected:
    preset: str
    n_embd_r: int
    n_embd_s: int
    recurrent: tuple[int, ...]
    kv: tuple[int, ...]
    kv_bytes: int  # K + V at CELLS cells
    recurrent_bytes: int  # R + S at SEQS sequences, no rollback planes


# Nemotron-H-8B's hybrid_override_pattern (config.json): M = Mamba-2, * = attention, - = MLP.
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
# Nemotron-3-Nano-30B-A3B's: E = the MoE layers (no cache).
NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

EXPECTED = (
    Expected(
        "mamba-130m",
        n_embd_r=(4 - 1) * 1536,  # d_conv 4, d_inner 2 * 768; Mamba-1 has no groups
        n_embd_s=16 * 1536,  # d_state 16
        recurrent=tuple(range(24)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=24 * 4 * 4 * (4608 + 24576),
    ),
    Expected(
        "mamba2-130m",
        n_embd_r=(4 - 1) * (1536 + 2 * 1 * 128),  # d_inner 2 * 768, n_groups 1, d_state 128
        n_embd_s=128 * 1536,
        recurrent=tuple(range(24)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=24 * 4 * 4 * (5376 + 196608),
    ),
    Expected(
        "mamba2-2.7b",
        n_embd_r=(4 - 1) * (5120 + 2 * 1 * 128),  # d_inner 2 * 2560
        n_embd_s=128 * 5120,
        recurrent=tuple(range(64)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=64 * 4 * 4 * (16128 + 655360),
    ),
    Expected(
        "mamba-codestral-7b",
        n_embd_r=(4 - 1) * (8192 + 2 * 8 * 128),  # intermediate 8192, n_groups 8, state 128
        n_embd_s=128 * 8192,
        recurrent=tuple(range(64)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=64 * 4 * 4 * (30720 + 1048576),
    ),
    Expected(
        "qrwkv6-32b-instruct-preview",
        n_embd_r=1 * 5120,  # token_shift_count 1 (the converter writes it) * hidden 5120
        n_embd_s=5120 * 128,  # hidden * head_size (5120 / 40 heads)
        recurrent=tuple(range(64)),
        kv=(),  # head_count_kv 8 sizes K / V weights, not a KV cache
        kv_bytes=0,
        recurrent_bytes=64 * 4 * 4 * (5120 + 655360),
    ),
    Expected(
        "rwkv6-1.6b-world",
        n_embd_r=2 * 2048,  # token_shift_count 2 * hidden 2048
        n_embd_s=2048 * 64,  # hidden * head_size (32 heads of 64 x 64)
        recurrent=tuple(range(24)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=24 * 4 * 4 * (4096 + 131072),
    ),
    Expected(
        "rwkv7-0.4b-world",
        n_embd_r=2 * 1024,  # token_shift_count 2 * hidden 1024
        n_embd_s=1024 * 64,  # hidden * head_size (16 heads of 64 x 64)
        recurrent=tuple(range(24)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=24 * 4 * 4 * (2048 + 65536),
    ),
    Expected(
        "lfm2-1.2b",
        n_embd_r=2048 * (3 - 1),  # hidden 2048, conv_L_cache 3
        n_embd_s=0,
        recurrent=(0, 1, 3, 4, 6, 7, 9, 11, 13, 15),
        kv=(2, 5, 8, 10, 12, 14),
        kv_bytes=6 * 2 * (8 * 64 * F16) * CELLS,  # layers * (K, V) * 8 KV heads of 2048/32 = 64
        recurrent_bytes=10 * 4 * 4 * 4096,
    ),
    Expected(
        "lfm2-2.6b",
        n_embd_r=2048 * (3 - 1),
        n_embd_s=0,
        recurrent=(0, 1, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16, 18, 19, 20, 22, 23, 25, 26, 28, 29),
        kv=(2, 5, 9, 13, 17, 21, 24, 27),
        kv_bytes=8 * 2 * (8 * 64 * F16) * CELLS,
        recurrent_bytes=22 * 4 * 4 * 4096,
    ),
    Expected(
        "lfm2-8b-a1b",
        n_embd_r=2048 * (3 - 1),
        n_embd_s=0,
        recurrent=(0, 1, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 19, 20, 22, 23),
        kv=(2, 6, 10, 14, 18, 21),
        kv_bytes=6 * 2 * (8 * 64 * F16) * CELLS,
        recurrent_bytes=18 * 4 * 4 * 4096,
    ),
    Expected(
        "kimi-linear-48b-a3b",
        n_embd_r=3 * (4 - 1) * 32 * 128,  # q, k, v short convs: kernel 4, 32 KDA heads of 128
        n_embd_s=128 * 128 * 32,
        # full_attn_layers (1-based) 4, 8, 12, 16, 20, 24, 27
        recurrent=tuple(i for i in range(27) if i + 1 not in (4, 8, 12, 16, 20, 24, 27)),
        kv=(3, 7, 11, 15, 19, 23, 26),
        kv_bytes=7 * (512 + 64) * F16 * CELLS,  # MLA caches K only: one latent row kv_lora_rank + rope dim
        recurrent_bytes=20 * 4 * 4 * (36864 + 524288),
    ),
    Expected(
        "minimax-text-01",
        n_embd_r=0,  # lightning attention has no conv state
        n_embd_s=128 * 128 * 64,  # head_dim 128, 64 heads
        recurrent=tuple(i for i in range(80) if (i + 1) % 8 != 0),  # attn_type_list: 1 every 8th layer
        kv=(7, 15, 23, 31, 39, 47, 55, 63, 71, 79),
        kv_bytes=10 * 2 * (8 * 128 * F16) * CELLS,
        recurrent_bytes=70 * 4 * 4 * (0 + 1048576),
    ),
    Expected(
        "qwen3-next-80b-a3b",
        n_embd_r=(4 - 1) * (32 * 128 + 2 * 16 * 128),  # d_inner = 32 V heads * 128, 16 QK heads, dk 128
        n_embd_s=128 * (32 * 128),
        recurrent=tuple(i for i in range(48) if i % 4 != 3),  # the MTP layer 48 is neither
        kv=tuple(range(3, 48, 4)),
        kv_bytes=12 * 2 * (2 * 256 * F16) * CELLS,
        recurrent_bytes=36 * 4 * 4 * (24576 + 524288),
    ),
    Expected(
        "qwen3.5-35b-a3b",
        n_embd_r=(4 - 1) * (32 * 128 + 2 * 16 * 128),
        n_embd_s=128 * (32 * 128),
        recurrent=tuple(i for i in range(40) if i % 4 != 3),
        kv=tuple(range(3, 40, 4)),
        kv_bytes=10 * 2 * (2 * 256 * F16) * CELLS,
        recurrent_bytes=30 * 4 * 4 * (24576 + 524288),
    ),
    # the dense Qwen3.5 models: (d_conv - 1) * (V heads * 128 + 2 * 16 QK heads * 128), d_state 128 x d_inner
    Expected(
        "qwen3.5-0.8b",
        n_embd_r=(4 - 1) * (16 * 128 + 2 * 16 * 128),
        n_embd_s=128 * (16 * 128),
        recurrent=tuple(i for i in range(24) if i % 4 != 3),
        kv=tuple(range(3, 24, 4)),
        kv_bytes=6 * 2 * (2 * 256 * F16) * CELLS,
        recurrent_bytes=18 * 4 * 4 * (18432 + 262144),
    ),
    Expected(
        "qwen3.5-9b",
        n_embd_r=(4 - 1) * (32 * 128 + 2 * 16 * 128),
        n_embd_s=128 * (32 * 128),
        recurrent=tuple(i for i in range(32) if i % 4 != 3),  # the MTP layer 32 is neither
        kv=tuple(range(3, 32, 4)),
        kv_bytes=8 * 2 * (4 * 256 * F16) * CELLS,
        recurrent_bytes=24 * 4 * 4 * (24576 + 524288),
    ),
    Expected(
        "qwen3.5-27b",
        n_embd_r=(4 - 1) * (48 * 128 + 2 * 16 * 128),
        n_embd_s=128 * (48 * 128),
        recurrent=tuple(i for i in range(64) if i % 4 != 3),  # the MTP layer 64 is neither
        kv=tuple(range(3, 64, 4)),
        kv_bytes=16 * 2 * (4 * 256 * F16) * CELLS,
        recurrent_bytes=48 * 4 * 4 * (30720 + 786432),
    ),
    Expected(
        "jamba-v0.1",
        n_embd_r=(4 - 1) * 8192,  # d_inner = mamba_expand 2 * 4096; Jamba's Mamba-1 has no groups
        n_embd_s=16 * 8192,
        recurrent=tuple(i for i in range(32) if i % 8 != 4),  # attn_layer_offset 4, period 8
        kv=(4, 12, 20, 28),
        kv_bytes=4 * 2 * (8 * 128 * F16) * CELLS,
        recurrent_bytes=28 * 4 * 4 * (24576 + 131072),
    ),
    Expected(
        "falcon-h1-0.5b-instruct",
        n_embd_r=(4 - 1) * (1536 + 2 * 1 * 128),  # mamba_d_ssm 1536, n_groups 1, d_state 128
        n_embd_s=128 * 1536,
        recurrent=tuple(range(36)),  # parallel hybrid: every layer has both caches
        kv=tuple(range(36)),
        kv_bytes=36 * 2 * (2 * 64 * F16) * CELLS,
        recurrent_bytes=36 * 4 * 4 * (5376 + 196608),
    ),
    Expected(
        "nemotron-h-8b-base-8k",
        n_embd_r=(4 - 1) * (128 * 64 + 2 * 8 * 128),  # 128 Mamba heads of 64, n_groups 8, d_state 128
        n_embd_s=128 * (128 * 64),
        recurrent=tuple(i for i, c in enumerate(NEMOTRON_H_8B_PATTERN) if c == "M"),
        kv=(7, 18, 29, 40),  # the '*' positions; the 24 '-' MLP layers carry no cache
        kv_bytes=4 * 2 * (8 * 128 * F16) * CELLS,
        recurrent_bytes=24 * 4 * 4 * (30720 + 1048576),
    ),
    Expected(
        "nemotron-3-nano-30b-a3b",
        n_embd_r=(4 - 1) * (64 * 64 + 2 * 8 * 128),  # 64 Mamba heads of 64, n_groups 8, d_state 128
        n_embd_s=128 * (64 * 64),
        recurrent=tuple(i for i, c in enumerate(NEMOTRON_3_NANO_PATTERN) if c == "M"),
        kv=(5, 12, 19, 26, 33, 42),  # the '*' positions; the 23 'E' expert layers carry no cache
        kv_bytes=6 * 2 * (2 * 128 * F16) * CELLS,
        recurrent_bytes=23 * 4 * 4 * (18432 + 524288),
    ),
    Expected(
        "granite-4.0-h-tiny",
        n_embd_r=(4 - 1) * (2 * 1536 + 2 * 1 * 128),  # d_inner = mamba_expand 2 * 1536, n_groups 1
        n_embd_s=128 * (2 * 1536),
        recurrent=tuple(i for i in range(40) if i not in (5, 15, 25, 35)),
        kv=(5, 15, 25, 35),
        kv_bytes=4 * 2 * (4 * 128 * F16) * CELLS,  # 4 KV heads of 1536 / 12 = 128
        recurrent_bytes=36 * 4 * 4 * (9984 + 393216),
    ),
    Expected(
        "granite-4.0-h-1b",  # the Mamba and attention dims of the tiny one; a dense FFN instead of experts
        n_embd_r=(4 - 1) * (2 * 1536 + 2 * 1 * 128),
        n_embd_s=128 * (2 * 1536),
        recurrent=tuple(i for i in range(40) if i not in (5, 15, 25, 35)),
        kv=(5, 15, 25, 35),
        kv_bytes=4 * 2 * (4 * 128 * F16) * CELLS,
        recurrent_bytes=36 * 4 * 4 * (9984 + 393216),
    ),
    Expected(
        "arwkv-1.5b",
        n_embd_r=1 * 1536,  # token_shift_count 1: only the time mix's shift
        n_embd_s=1536 * 64,  # n_embd x head_size
        recurrent=tuple(range(28)),
        kv=(),
        kv_bytes=0,
        recurrent_bytes=28 * 4 * 4 * (1536 + 98304),
    ),
    Expected(
        "plamo-2-1b",
        n_embd_r=(4 - 1) * (4096 + 2 * 0 * 64),  # d_inner 32 heads * 128, group_count 0: no B / C channels
        n_embd_s=64 * 4096,  # d_state 64
        recurrent=tuple(range(0, 16, 2)),  # mamba_step 2: the even layers
        kv=tuple(range(1, 16, 2)),
        kv_bytes=8 * 2 * (1 * 128 * F16) * CELLS,  # 1 KV head of 128
        recurrent_bytes=8 * 4 * 4 * (12288 + 262144),
    ),
    Expected(
        "article-example-48l",
        n_embd_r=(4 - 1) * (2048 + 2 * 16 * 128),
        n_embd_s=128 * 2048,
        recurrent=tuple(i for i in range(48) if (i + 1) % 4 != 0),
        kv=tuple(range(3, 48, 4)),
        kv_bytes=12 * 2 * (4 * 128 * F16) * CELLS,
        recurrent_bytes=36 * 4 * 4 * (18432 + 262144),
    ),
)
BY_NAME = {e.preset: e for e in EXPECTED}


def _plan(name: str, **kw):
    return build_plan(load_builtin_preset(name), ContextParams(n_ctx=CELLS, n_seq_max=SEQS, **kw))


# -- catalogue -------------------------------------------------------------------------------------------


def test_every_required_preset_is_shipped():
    names = builtin_preset_names()
    assert set(REQUIRED) <= set(names)
    assert names == sorted(names)


def test_every_shipped_preset_has_a_hand_derived_check():
    assert set(builtin_preset_names()) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
def test_preset_file_loads_and_is_named_after_its_file(name):
    spec = load_builtin_preset(name)
    assert spec.name == name
    assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), "preset names are lowercase with dashes"
    assert "checked 2026-" in spec.source.lower() or "written 2026-" in spec.source.lower()
    assert "https://" in spec.source
    # a released model's source names its model card or config.json; only a worked example has none
    assert ("huggingface.co/" in spec.source or "github.com/" in spec.source) != spec.example, spec.source


def test_worked_examples_are_listed_apart_from_released_models():
    from click.testing import CliRunner

    from rsplan.cli import cli

    out = CliRunner().invoke(cli, ["presets", "list"]).output
    models, examples = out.split("Worked examples (not released models; docs/sizing.md):")
    assert {n for n in builtin_preset_names() if load_builtin_preset(n).example} == {"article-example-48l"}
    assert "article-example-48l" in examples and "article-example-48l" not in models
    assert "qwen3-next-80b-a3b" in models and "qwen3-next-80b-a3b" not in examples


def test_preset_folder_holds_yaml_data_only():
    # presets/ is a package only so that the installed rsplan finds its data; it ships no code
    files = sorted(p.name for p in PRESET_DIR.iterdir() if p.is_file())
    assert [f for f in files if not f.endswith(".yaml")] == ["__init__.py"]


def _duplicate_keys(node: yaml.Node) -> list[str]:
    if isinstance(node, yaml.MappingNode):
        keys = [k.value for k, _ in node.value]
        dups = sorted({k for k in keys if keys.count(k) > 1})
        return dups + [d for _, v in node.value for d in _duplicate_keys(v)]
    if isinstance(node, yaml.SequenceNode):
        return [d for item in node.value for d in _duplicate_keys(item)]
    return []


@pytest.mark.parametrize("path", sorted(PRESET_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_preset_file_has_no_duplicate_keys(path):
    # PyYAML keeps the last of two equal keys without a word, so a duplicate would silently win
    assert _duplicate_keys(yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)) == []


# -- per-preset exact sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize("exp", EXPECTED, ids=lambda e: e.preset)
def test_row_widths(exp):
    layout = cache_layout(load_builtin_preset(exp.preset))
    assert (layout.n_embd_r, layout.n_embd_s) == (exp.n_embd_r, exp.n_embd_s)


@pytest.mark.parametrize("exp", EXPECTED, ids=lambda e: e.preset)
def test_which_layers_carry_which_cache(exp):
    layout = cache_layout(load_builtin_preset(exp.preset))
    assert layout.recurrent_layers == exp.recurrent
    assert tuple(layer.il for layer in layout.kv_layers) == exp.kv


@pytest.mark.parametrize("exp", EXPECTED, ids=lambda e: e.preset)
def test_exact_bytes_at_32k_cells_4_sequences(exp):
    plan = _plan(exp.preset)
    assert plan.kv.k_bytes + plan.kv.v_bytes == exp.kv_bytes
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == exp.recurrent_bytes
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == len(exp.recurrent) * _per_recurrent_layer(
        exp.n_embd_r, exp.n_embd_s
    )
    assert plan.total_bytes == exp.kv_bytes + exp.recurrent_bytes


# -- the sizing doc's worked example (section 6) ---------------------------------------------------------


def test_article_example_matches_the_worked_example():
    plan = _plan("article-example-48l")
    assert plan.kv.k_bytes + plan.kv.v_bytes == 805_306_368  # 12 x 2 x (512 x 2 B) x 32768 = 768.00 MiB
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 161_611_776  # 36 x 4 x 4 x 280576 = 154.125 MiB
    assert plan.context.n_ctx_seq * plan.context.n_stream == 32768


def test_article_example_keeps_rollback_planes():
    plan = _plan("article-example-48l", n_rs_seq=3)
    assert plan.context.n_rs_seq == 3
    assert plan.recurrent.rows == 4 * (1 + 3)
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 646_447_104  # 36 x 16 x 4 x 280576 = 616.5 MiB


def test_qwen3_next_clamps_rollback_to_zero():
    plan = _plan("qwen3-next-80b-a3b", n_rs_seq=3)
    assert (plan.context.n_rs_seq_requested, plan.context.n_rs_seq) == (3, 0)
    assert plan.context.n_rs_seq_clamp_reason is not None
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 316_145_664  # 36 x 4 x 4 x (24576 + 524288)


# -- converter facts the presets encode ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "block_count", "n_layer"),
    [
        ("qwen3-next-80b-a3b", 49, 48),  # the converter keeps Qwen3-Next's one MTP layer
        ("qwen3.5-35b-a3b", 41, 40),  # mtp_num_hidden_layers 1
        ("qwen3.5-9b", 33, 32),
        ("qwen3.5-27b", 65, 64),
    ],
)
def test_mtp_layers_are_blocks_but_carry_no_cache(name, block_count, n_layer):
    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    assert (spec.block_count, spec.nextn_predict_layers, spec.n_layer) == (block_count, 1, n_layer)
    assert n_layer not in layout.recurrent_layers
    assert n_layer not in {layer.il for layer in layout.kv_layers}


@pytest.mark.parametrize(
    ("name", "context_length"),
    [
        ("mamba-130m", 1 << 20),  # conversion/mamba.py: 2**20 for every Mamba model
        ("mamba-codestral-7b", 1 << 20),
        ("rwkv7-0.4b-world", 1 << 20),  # conversion/rwkv.py: "RWKV isn't context limited"
        ("rwkv6-1.6b-world", 1 << 20),
        ("qrwkv6-32b-instruct-preview", 1 << 20),
        ("arwkv-1.5b", 1 << 20),
        ("plamo-2-1b", 10485760),  # max_position_embeddings
        ("nemotron-h-8b-base-8k", 1 << 20),  # GraniteHybridModel overwrites it for hybrids without RoPE
        ("granite-4.0-h-tiny", 1 << 20),
        ("granite-4.0-h-1b", 1 << 20),
        ("nemotron-3-nano-30b-a3b", 1 << 20),
        ("kimi-linear-48b-a3b", 1048576),  # model_max_length; the config has no max_position_embeddings
        ("lfm2-1.2b", 128000),  # max_position_embeddings
        ("minimax-text-01", 10240000),
    ],
)
def test_context_length_is_what_the_converter_writes(name, context_length):
    assert load_builtin_preset(name).context_length == context_length


# -- the schema doc's annotated example ------------------------------------------------------------------


def test_schema_doc_example_is_a_valid_preset_equal_to_the_shipped_one():
    doc = (REPO / "docs" / "preset-schema.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- example: (?P<name>[\w.\-]+) -->\n```yaml\n(?P<yaml>.*?)```", doc, re.S)
    assert block is not None, "docs/preset-schema.md lost its marked example"
    spec = load_preset_text(block["yaml"], "docs/preset-schema.md")
    assert spec == load_builtin_preset(block["name"])


# -- built-in presets are read without the validation schema -------------------------------------------------------


def _fields_sets(spec) -> dict[str, set[str]]:
    sections = {k: getattr(spec, k).model_fields_set for k in ("attention", "ssm", "wkv", "shortconv", "kda",
                                                               "serving") if getattr(spec, k) is not None}
    return {"": spec.model_fields_set, **sections}


@pytest.mark.parametrize("name", builtin_preset_names())
def test_trusted_reading_of_a_builtin_preset_equals_validation(name):
    # load_builtin_preset skips the pydantic schema (ModelSpec.from_trusted); this is what makes that safe: every
    # shipped preset validates, to the same values and the same given keys
    trusted = load_builtin_preset(name)
    text = (REPO / "presets" / f"{name}.yaml").read_text(encoding="utf-8")
    validated = load_preset_text(text, f"preset {name}")
    assert trusted == validated
    assert _fields_sets(trusted) == _fields_sets(validated)
    assert type(trusted.attention) is type(validated.attention)


def test_estimate_of_a_builtin_preset_imports_no_pydantic():
    import subprocess
    import sys

    code = ("import sys; from rsplan.cli import main\n"
            "sys.argv = ['rsplan', 'estimate', '--model', 'qwen3-next-80b-a3b', '-c', '8192']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('PYDANTIC', sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "PYDANTIC []"


def test_trusted_reading_still_checks_consistency():
    from rsplan.errors import ModelFileError
    from rsplan.hparams.yaml_preset import load_trusted_preset_text

    text = (REPO / "presets" / "mamba2-2.7b.yaml").read_text(encoding="utf-8").replace("  group_count: 1\n", "")
    with pytest.raises(ModelFileError, match=r"^preset x: ssm\.group_count is required for arch 'mamba2'$"):
        load_trusted_preset_text(text, "preset x")
