"""Real published config.json files, stored verbatim in tests/hparams/real_configs/<name>/config.json (where each
one was read: real_configs/README.md), read by ``load_hf_config``.

For every stored config: it loads; its plan's total equals a total written out by hand below from the config's own
numbers with docs/sizing.md's rules; and, where rsplan ships a preset for the model, the config plans exactly like
the preset (total and every tensor's name, shape and bytes).

All plans at ``-c 32768 -np 4``: 4 streams of pad(32768 / 4, 256) = 8192 cells, i.e. 32768 KV cells in all; f16 K/V
(2 B per element) with flash attention on (V not transposed); f32 R/S (4 B), one row per sequence and no rollback
planes, so each recurrent layer holds ``4 * 4 * (n_embd_r + n_embd_s)`` bytes. Row widths (docs/sizing.md section 3):
Mamba-1/2 ``n_embd_r = (d_conv - 1) * (d_inner + 2 * n_group * d_state)`` (Mamba-1 and Jamba: n_group 0),
``n_embd_s = d_state * d_inner``; RWKV ``n_embd_r = 2 * n_embd`` (token_shift_count 2), ``n_embd_s = n_embd *
head_size``; LFM2 ``n_embd_r = n_embd * (conv_L_cache - 1)``, ``n_embd_s = 0``. KV rows: ``head_count_kv * head_dim``,
head_dim = hidden_size / num_attention_heads (integer division) where the converter writes no key_length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from rsplan.errors import ModelFileError
from rsplan.hparams.hf_config import load_hf_config
from rsplan.hparams.model import GRAPH_SHAPE_KEYS, WEIGHT_SHAPE_ATTENTION_KEYS, WEIGHT_SHAPE_KEYS
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan

REAL = Path(__file__).resolve().parent / "real_configs"
CELLS = 32768  # KV cells in all streams
SEQS = 4  # recurrent rows per tensor
F16 = 2
F32 = 4


@dataclass(frozen=True)
class RealConfig:
    folder: str  # real_configs/<folder>/config.json
    preset: str | None  # the built-in preset for the same model, if any
    total: int  # written out by hand from the config's numbers


CASES = (
    # ai21labs/Jamba-v0.1: 32 layers, attention where (i - attn_layer_offset 4) % attn_layer_period 8 == 0 -> 4, 12,
    # 20, 28 (8 KV heads of 4096 / 32 = 128); 28 Mamba-1 layers, d_inner = mamba_expand 2 * 4096, mamba_d_conv 4,
    # mamba_d_state 16.
    RealConfig(
        "jamba-v0.1", "jamba-v0.1",
        4 * 2 * (8 * 128 * F16) * CELLS + 28 * SEQS * F32 * ((4 - 1) * 8192 + 16 * 8192),
    ),
    # the first published revision: the same numbers, the context under "n_ctx" (no max_position_embeddings)
    RealConfig(
        "jamba-v0.1-rev-871ab2b", "jamba-v0.1",
        4 * 2 * (8 * 128 * F16) * CELLS + 28 * SEQS * F32 * ((4 - 1) * 8192 + 16 * 8192),
    ),
    # 22 layers, attn_layer_offset 5 = attn_layer_period 5 -> attention at 5, 10, 15, 20 with 10 KV heads of
    # 736 // 10 = 73; 18 Mamba-1 layers, d_inner 2 * 736 = 1472, d_conv 4, d_state 64.
    RealConfig(
        "jamba-550m-trained", None,
        4 * 2 * (10 * 73 * F16) * CELLS + 18 * SEQS * F32 * ((4 - 1) * 1472 + 64 * 1472),
    ),
    # raw mamba_ssm config (d_model 768, n_layer 24, ssm_cfg {}): the converter's defaults d_conv 4,
    # d_inner 2 * 768, d_state 16.
    RealConfig("mamba-130m", "mamba-130m", 24 * SEQS * F32 * ((4 - 1) * 1536 + 16 * 1536)),
    # raw mamba_ssm Mamba2 configs: defaults d_conv 4, expand 2, n_groups 1, d_state 128.
    RealConfig("mamba2-130m", "mamba2-130m", 24 * SEQS * F32 * ((4 - 1) * (2 * 768 + 2 * 1 * 128) + 128 * 2 * 768)),
    RealConfig(
        "mamba2-2.7b", "mamba2-2.7b", 64 * SEQS * F32 * ((4 - 1) * (2 * 2560 + 2 * 1 * 128) + 128 * 2 * 2560)
    ),
    # Mamba-Codestral-7B in the transformers layout: 64 layers, intermediate_size 8192, n_groups 8, state_size 128,
    # conv_kernel 4.
    RealConfig(
        "mamba-codestral-7b-hf-molbap", "mamba-codestral-7b",
        64 * SEQS * F32 * ((4 - 1) * (8192 + 2 * 8 * 128) + 128 * 8192),
    ),
    RealConfig(
        "mamba-codestral-7b-mlx-8bit", "mamba-codestral-7b",
        64 * SEQS * F32 * ((4 - 1) * (8192 + 2 * 8 * 128) + 128 * 8192),
    ),
    # transformers MambaConfig without intermediate_size: d_inner = 2 * hidden_size 2560; conv 4, state_size 16
    RealConfig("mamba-2.8b-arthurz", None, 64 * SEQS * F32 * ((4 - 1) * 5120 + 16 * 5120)),
    RealConfig("mamba-2.8b-hf-ikhou-3b", None, 64 * SEQS * F32 * ((4 - 1) * 5120 + 16 * 5120)),
    # falcon_mamba: intermediate_size 8192 (= 2 * 4096; the converter ignores "expand": 16), state_size 16
    RealConfig("falcon-mamba-7b-pre-decay", None, 64 * SEQS * F32 * ((4 - 1) * 8192 + 16 * 8192)),
    # RWKV-7, fla-hub layout (head_dim): 24 layers of hidden 1024 / 2048, head size 64
    RealConfig("rwkv7-0.4b-world", "rwkv7-0.4b-world", 24 * SEQS * F32 * (2 * 1024 + 1024 * 64)),
    RealConfig("rwkv7-1.5b-world", None, 24 * SEQS * F32 * (2 * 2048 + 2048 * 64)),
    # RWKV-7, Rwkv7ForCausalLM layout (head_size, layer_norm_epsilon; intermediate_size null)
    RealConfig("rwkv7-goose-1.4b-pile-hf", None, 24 * SEQS * F32 * (2 * 2048 + 2048 * 64)),
    # LFM2: 16 layers, attention at 2, 5, 8, 10, 12, 14 (8 KV heads, head dim hidden / heads = 64), 10 short-conv
    # layers with conv_L_cache 3.
    RealConfig(
        "lfm2-1.2b-p-vector", "lfm2-1.2b",  # hidden 2048, 32 heads; layer_types
        6 * 2 * (8 * 64 * F16) * CELLS + 10 * SEQS * F32 * (2048 * (3 - 1)),
    ),
    RealConfig(
        "lfm2-700m", None,  # hidden 1536, 24 heads; full_attn_idxs [2, 5, 8, 10, 12, 14], no layer_types
        6 * 2 * (8 * 64 * F16) * CELLS + 10 * SEQS * F32 * (1536 * (3 - 1)),
    ),
    RealConfig(
        "lfm2-350m-lfm-tts-malayalam", None,  # hidden 1024, 16 heads; layer_types
        6 * 2 * (8 * 64 * F16) * CELLS + 10 * SEQS * F32 * (1024 * (3 - 1)),
    ),
    # LFM2-MoE (lfm2_moe): 24 layers, full_attention at 2, 6, 10, 14, 18, 21 (8 KV heads of 2048 / 32 = 64),
    # 18 short-conv layers of hidden 2048, conv_L_cache 3
    RealConfig(
        "lfm2-8b-a1b-augment-multi-ft2", "lfm2-8b-a1b",
        6 * 2 * (8 * 64 * F16) * CELLS + 18 * SEQS * F32 * (2048 * (3 - 1)),
    ),
)
BY_FOLDER = {case.folder: case for case in CASES}

#: Real configs llama.cpp's converter cannot turn into a loadable GGUF, and the error rsplan gives for them.
REFUSED = {
    # GraniteHybridModel reads config.json as it is (no transformers defaults); this revision has no context key, so
    # the GGUF gets no granitehybrid.context_length (Bamba keeps RoPE, so no 2**20 either), which llama.cpp's
    # loader requires. IBM later added one to the config (ibm-ai-platform/Bamba-9B-v1 PR #6).
    "bamba-9b-rev-43f2151": (
        "max_position_embeddings, n_ctx, n_positions, max_length, max_sequence_length, model_max_length "
        "(GGUF granitehybrid.context_length): required key not found"
    ),
}

#: Keys no cache depends on outside nemotron_h* (docs/preset-schema.md): presets omit them, the converter writes them.
NOT_CACHE_KEYS = {
    **dict.fromkeys(
        {"name", "source", "description", "weights_bytes", "feed_forward_length", "serving", *WEIGHT_SHAPE_KEYS,
         *GRAPH_SHAPE_KEYS},
        True,
    ),
    "attention": dict.fromkeys(WEIGHT_SHAPE_ATTENTION_KEYS, True),
}


def _plan(spec):
    return build_plan(spec, ContextParams(n_ctx=CELLS, n_seq_max=SEQS))


def _tensors(plan) -> list[tuple[str, tuple[int, ...], int]]:
    return [(t.name, t.shape, t.bytes) for t in plan.tensors]


def _config(folder: str) -> Path:
    return REAL / folder / "config.json"


def test_every_stored_config_has_a_case():
    folders = sorted(p.name for p in REAL.iterdir() if p.is_dir())
    assert folders == sorted([*BY_FOLDER, *REFUSED])
    assert all(_config(f).is_file() for f in folders)


def test_readme_names_the_source_of_every_stored_config():
    readme = (REAL / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^## `([\w.\-]+)/config\.json`", readme, re.M))
    assert listed == {*BY_FOLDER, *REFUSED}
    for section in re.split(r"^## ", readme, flags=re.M)[1:]:
        assert "https://huggingface.co/" in section, section.splitlines()[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.folder)
def test_real_config_loads_and_sizes_as_derived_by_hand(case):
    plan = _plan(load_hf_config(_config(case.folder)))
    assert plan.total_bytes == case.total


@pytest.mark.parametrize("case", [c for c in CASES if c.preset], ids=lambda c: c.folder)
def test_real_config_plans_exactly_like_its_preset(case):
    spec = load_hf_config(_config(case.folder))
    preset = load_builtin_preset(case.preset)
    plan, preset_plan = _plan(spec), _plan(preset)
    assert plan.total_bytes == preset_plan.total_bytes
    assert _tensors(plan) == _tensors(preset_plan)
    # beyond the plan: every cache-relevant key (context_length included, which -c 0 would use) is the same
    assert spec.model_dump(exclude=NOT_CACHE_KEYS) == preset.model_dump(exclude=NOT_CACHE_KEYS)
    # every serving fact the config states (dtypes, vLLM's derived max_model_len) is the preset's
    stated = {k: v for k, v in spec.serving.model_dump().items() if v is not None} if spec.serving else {}
    assert stated == {k: v for k, v in (preset.serving.model_dump() if preset.serving else {}).items() if k in stated}


@pytest.mark.parametrize("folder", sorted(REFUSED))
def test_real_config_the_converter_cannot_convert_is_refused(folder):
    with pytest.raises(ModelFileError) as err:
        load_hf_config(_config(folder))
    assert str(err.value) == f"{_config(folder)}: {REFUSED[folder]}"
