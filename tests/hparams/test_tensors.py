"""hparams/tensors.py, tensor_kinds.py, converter_types.py and tensor_bytes.py: the weight tensor list, the
converter's type rule and buffer bytes.

Expected numbers are derived by hand here or come from outside rsplan (the tiny real GGUFs' tensor tables,
published parameter counts). The end-to-end check against llama.cpp's loader is tests/golden/.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsplan.errors import UnsupportedArchError
from rsplan.hparams.converter_types import converter_type, tensor_type
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.gguf_scan import scan_gguf
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import load_builtin_preset, load_model
from rsplan.hparams.tensor_bytes import buffer_bytes, tensor_nbytes
from rsplan.hparams.tensors import ARCH_TENSORS, TensorInfo, tensor_list
from rsplan_testing import MEASURED_DIR

REPO = Path(__file__).resolve().parents[2]
MEASURED = MEASURED_DIR
#: An ARWKV-7 preset without the keys its tensor list needs (the low-rank widths; whether the time mix has its
#: group norm): every size rsplan gives for it comes from the cache rules alone.
INCOMPLETE_PRESET = """name: arwkv-test
source: test
arch: arwkv7
context_length: 4096
embedding_length: 1024
block_count: 4
wkv:
  head_size: 64
  token_shift_count: 1
vocab_size: 1000
feed_forward_length: 4096
"""


@pytest.mark.parametrize(
    ("name", "n_dims", "outtype", "expected"),
    [
        ("blk.0.ffn_up.weight", 2, "bf16", "bf16"),
        ("token_embd.weight", 2, "f16", "f16"),
        ("output.weight", 2, "f32", "f32"),
        ("blk.0.ffn_down_exps.weight", 3, "bf16", "bf16"),
        ("blk.0.attn_norm.weight", 1, "bf16", "f32"),  # 1-D
        ("blk.0.ssm_norm.weight", 2, "bf16", "f32"),  # Mamba-2's grouped norm is 2-D but a *_norm.weight
        ("token_embd_norm.weight", 1, "f16", "f32"),
        ("blk.0.ssm_a", 2, "bf16", "f32"),  # no .weight suffix
        ("blk.0.ssm_conv1d.bias", 1, "bf16", "f32"),
        ("blk.0.exp_probs_b.bias", 1, "bf16", "f32"),
        ("blk.0.ffn_gate_inp.weight", 2, "bf16", "f32"),  # router
        ("blk.0.ssm_conv1d.weight", 2, "f16", "f32"),
        ("blk.0.shortconv.conv.weight", 2, "bf16", "f32"),
        ("blk.0.ffn_gate_shexp.weight", 2, "bf16", "bf16"),  # only the shared router stays f32, not the expert
    ],
)
def test_converter_type(name, n_dims, outtype, expected):
    assert converter_type(name, n_dims, outtype) == expected


def test_converter_type_refuses_an_unknown_outtype():
    with pytest.raises(ValueError, match="outtype"):
        converter_type("output.weight", 2, "q4_k")


def test_q8_0_falls_back_to_f16_for_rows_that_are_not_whole_blocks():
    assert converter_type("blk.0.ffn_up.weight", 2, "q8_0", 4096) == "q8_0"
    assert converter_type("blk.0.ssm_x.weight", 2, "q8_0", 1536 + 8) == "f16"  # 1544 = 48 blocks + 8
    assert converter_type("blk.0.attn_norm.weight", 1, "q8_0", 4096) == "f32"
    # a Q8_0 row of 4096 elements: 128 blocks of 34 bytes
    assert tensor_nbytes(TensorInfo("blk.0.ffn_up.weight", (4096, 3)), "q8_0") == 3 * 128 * 34


def test_nbytes_and_alignment_by_hand():
    t = TensorInfo("blk.0.x.weight", (3, 5))
    assert tensor_nbytes(t, "f32") == 60 and tensor_nbytes(t, "bf16") == 30
    # each tensor is padded to the CPU buffer's 32 bytes: 60 -> 64, 30 -> 32
    assert buffer_bytes([(t, "f32"), (t, "bf16")]) == 96


def _tiny(name: str, **weights) -> ModelSpec:
    path = MEASURED / f"{name}.gguf"
    return ModelSpec.model_validate({**load_gguf(path).model_dump(), **weights})


@pytest.mark.parametrize(
    ("name", "weights"),
    [
        ("mamba2", {"vocab_size": 320, "tie_word_embeddings": False}),
        ("lfm2", {"vocab_size": 320, "tie_word_embeddings": True}),
        ("qwen35", {"vocab_size": 320, "tie_word_embeddings": False}),
    ],
)
def test_tensor_list_is_the_tiny_ggufs_tensor_table(name, weights):
    """Names and shapes equal those of three real (tiny, converter-written) GGUFs, tensor for tensor."""
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf-py not installed")
    from gguf import GGUFReader

    spec = _tiny(name, **weights)
    real = {t.name: tuple(int(x) for x in t.shape) for t in GGUFReader(MEASURED / f"{name}.gguf").tensors}
    mine = {t.name: t.shape for t in tensor_list(spec)}
    assert mine == real


def test_qwen3_next_parameter_count_is_the_published_one():
    """79,674,391,296 parameters (the Qwen3-Coder-Next config page, the same backbone) without the MTP layer;
    the MTP layer holds one attention block, one 512-expert MoE and the nextn projection."""
    tensors = tensor_list(load_builtin_preset("qwen3-next-80b-a3b"))
    trunk = sum(t.n_elements for t in tensors if t.loaded)
    mtp = sum(t.n_elements for t in tensors if not t.loaded)
    assert trunk == 79_674_391_296
    e, v = 2048, 151936
    attn = e * 256 * 16 * 2 + 2 * e * 256 * 2 + 256 * 16 * e + 2 * 256  # gated Q, K, V, out, q/k norms
    moe = e * 512 + 3 * 512 * e * 512 + e + 3 * e * 512  # router, 512 experts x 3, shared router, shared expert
    nextn = 2 * e * e + 3 * e  # eh_proj, enorm, hnorm, shared_head_norm
    assert mtp == 2 * e + attn + moe + nextn  # + attn_norm, post_attention_norm
    assert any(t.name == "output.weight" and t.shape == (e, v) for t in tensors)


@pytest.mark.parametrize(
    ("preset", "params"),
    [
        # MiniMax-01 model card: "456B total"; the count is exact when rounded to 1e9
        ("minimax-text-01", 456),
        # LFM2-8B-A1B: "8.3B total" (transformers docs)
        ("lfm2-8b-a1b", 8.3),
        # Jamba-v0.1: the model card's "52B total parameters"
        ("jamba-v0.1", 52),
        # LFM2-1.2B, LFM2-2.6B (the names), RWKV-7 0.4B (llama.cpp types it LLM_TYPE_450M)
        ("lfm2-1.2b", 1.2),
        ("lfm2-2.6b", 2.6),
        ("rwkv7-0.4b-world", 0.45),
        # RWKV-6 Finch 1.6B (the model card's "1.6B"; llama.cpp types it LLM_TYPE_1_6B)
        ("rwkv6-1.6b-world", 1.6),
        # Falcon-H1-0.5B: models derived from it name 521M (the "0.5B" rounds the same count)
        ("falcon-h1-0.5b-instruct", 0.521),
    ],
)
def test_parameter_counts_round_to_the_published_ones(preset, params):
    n = sum(t.n_elements for t in tensor_list(load_builtin_preset(preset)) if t.loaded)
    digits = len(str(params).split(".")[1]) if "." in str(params) else 0
    assert round(n / 1e9, digits) == params


def test_qwen3_next_layer_kinds():
    tensors = {t.name: t for t in tensor_list(load_builtin_preset("qwen3-next-80b-a3b"))}
    # layer 0 is a gated delta net: QKV of 2 * 16 * 128 + 32 * 128, gate of 32 * 128, beta/alpha fused
    assert tensors["blk.0.attn_qkv.weight"].shape == (2048, 8192)
    assert tensors["blk.0.attn_gate.weight"].shape == (2048, 4096)
    assert tensors["blk.0.ssm_ba.weight"].shape == (2048, 64)
    assert tensors["blk.0.ssm_conv1d.weight"].shape == (4, 8192)
    assert "blk.0.attn_q.weight" not in tensors
    # layer 3 is attention with a gated Q (2 x 16 heads x 256)
    assert tensors["blk.3.attn_q.weight"].shape == (2048, 8192)
    assert "blk.3.ssm_out.weight" not in tensors
    # the MTP layer is in the file but not loaded by a plain context
    assert not tensors["blk.48.nextn.eh_proj.weight"].loaded and tensors["blk.47.ffn_up_exps.weight"].loaded
    assert tensors["blk.48.ffn_up_exps.weight"].shape == (2048, 512, 512)


def test_every_tensor_list_arch_is_a_builtin_preset_and_loads_without_error():
    archs = set()
    for name in ("mamba-130m", "mamba2-130m", "mamba-codestral-7b", "rwkv6-1.6b-world", "rwkv7-0.4b-world",
                 "lfm2-1.2b", "lfm2-2.6b",
                 "lfm2-8b-a1b",
                 "nemotron-h-8b-base-8k", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b",
                 "minimax-text-01", "jamba-v0.1", "granite-4.0-h-tiny", "falcon-h1-0.5b-instruct",
                 "qrwkv6-32b-instruct-preview", "nemotron-3-nano-30b-a3b", "granite-4.0-h-1b", "arwkv-1.5b",
                 "plamo-2-1b", "mamba2-2.7b"):
        spec = load_builtin_preset(name)
        assert tensor_list(spec)
        archs.add(spec.arch)
    assert archs | {"qwen35"} == set(ARCH_TENSORS)


def test_missing_vocab_or_unknown_arch_is_a_clear_error(tmp_path, monkeypatch):
    no_vocab = load_builtin_preset("mamba2-2.7b").model_copy(update={"vocab_size": None})
    with pytest.raises(UnsupportedArchError, match=r"mamba2-2\.7b: vocab_size is needed"):
        tensor_list(no_vocab)
    (tmp_path / "arwkv.yaml").write_text(INCOMPLETE_PRESET)
    incomplete = load_model(str(tmp_path / "arwkv.yaml"))
    with pytest.raises(UnsupportedArchError, match=r"arwkv-test: attention\.decay_lora_rank is needed for the "
                                                   r"tensor list of arch 'arwkv7'"):
        tensor_list(incomplete)
    ranks = {"decay_lora_rank": 64, "iclr_lora_rank": 64, "value_residual_mix_lora_rank": 32}
    ranked = incomplete.model_copy(update={"attention": incomplete.attention.model_copy(update=ranks)})
    with pytest.raises(UnsupportedArchError, match="wkv_group_norm is needed"):  # no GGUF key carries it
        tensor_list(ranked)
    assert tensor_list(ranked.model_copy(update={"wkv_group_norm": False}))
    # an arch without a table (every arch rsplan sizes has one now): the error names the arch
    monkeypatch.delitem(ARCH_TENSORS, "arwkv7")
    with pytest.raises(UnsupportedArchError, match="no tensor list for architecture 'arwkv7'"):
        tensor_list(ranked)
    # Falcon-H1's ssm_norm tensors exist only with mamba_rms_norm, which no GGUF key carries
    falcon = load_builtin_preset("falcon-h1-0.5b-instruct").model_copy(update={"mamba_rms_norm": None})
    with pytest.raises(UnsupportedArchError, match="mamba_rms_norm"):
        tensor_list(falcon)


def test_skeleton_is_sparse_full_size_and_reads_back(tmp_path):
    """make_skeleton.py: the file has the full data size, takes almost no disk, and its tensor table is the list."""
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf-py not installed")
    out = tmp_path / "q3n.gguf"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "llamacpp-truth" / "make_skeleton.py"), "qwen3-next-80b-a3b",
         "--outtype", "bf16", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    spec = load_builtin_preset("qwen3-next-80b-a3b")
    tensors = tensor_list(spec)
    index = scan_gguf(out)
    assert index.n_tensors == len(tensors)
    by_type: dict[str, int] = {}
    for t in tensors:
        ty = tensor_type(t, "bf16")
        by_type[ty] = by_type.get(ty, 0) + tensor_nbytes(t, ty)
    assert index.tensor_bytes == by_type
    assert out.stat().st_size == index.data_offset + index.data_bytes > 160 * 10**9
    assert out.stat().st_blocks * 512 < 64 << 20  # a hole, not 160 GB of zeros
    assert load_gguf(out).block_count == 49
    assert not list(tmp_path.glob("*.part"))


def test_skeleton_refuses_a_preset_its_tensor_list_cannot_size(tmp_path):
    preset = tmp_path / "in" / "arwkv.yaml"
    preset.parent.mkdir()
    preset.write_text(INCOMPLETE_PRESET)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "llamacpp-truth" / "make_skeleton.py"), str(preset), "-o", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: arwkv-test: attention.decay_lora_rank is needed for the tensor list of "
                                  "arch 'arwkv7'")
    assert not out.exists() and not list(out.parent.iterdir())


def test_rwkv6_tensor_list_counts_llama_cpps_parameters():
    """RWKV-6 1.6B (hidden 2048, FFN 7168, 24 layers, LoRA ranks 32 / 64, head size 64, vocabulary 65536): per
    layer 16 vectors of n_embd (4 norm weights/biases, lerp_x, 5 fused lerps, time_mix_first's 32 x 64, decay,
    ln weight/bias, 2 channel-mix lerps), the token-shift LoRA (w1 + w2: 2 x 5 x 32 x 2048), the decay LoRA
    (2 x 64 x 2048), six n_embd x n_embd matrices (key, value, receptance, gate, output, channel receptance) and
    the channel-mix key/value; embeddings and head untied, plus the embedding and output layer norms. The total
    is llama_model_n_params of the skeleton (tests/golden/llamacpp-breakdown/rwkv6-1.6b-world-bf16.json)."""
    e, ff, v = 2048, 7168, 65536
    layer = 16 * e + 10 * e * 32 + 2 * e * 64 + 6 * e * e + 2 * e * ff
    tensors = tensor_list(load_builtin_preset("rwkv6-1.6b-world"))
    assert sum(t.n_elements for t in tensors) == 24 * layer + 2 * e * v + 4 * e == 1_599_873_024
    shapes = {t.name: t.shape for t in tensors}
    assert shapes["blk.0.time_mix_w2.weight"] == (32, 2048, 5)
    assert shapes["blk.0.time_mix_lerp_fused.weight"] == (2048, 1, 1, 5)
    assert shapes["blk.0.time_mix_first.weight"] == (64, 32)
    assert shapes["blk.23.time_mix_decay_w2.weight"] == (64, 2048)
    # the converter keeps the LoRA, decay-LoRA, lerp and bonus tensors in F32 for every output type
    assert {tensor_type(t, "bf16") for t in tensors if ".time_mix_w" in t.name or "decay_w" in t.name
            or "first" in t.name or "lerp_fused" in t.name} == {"f32"}


def test_falcon_h1_tensor_list_counts_llama_cpps_parameters():
    """Falcon-H1-0.5B (hidden 1024, 36 layers, 8 heads / 2 KV heads of 64, Mamba-2 d_inner 1536 in 24 heads,
    1 group, d_state 128, conv 4, FFN 2048, vocabulary 32784, untied, no grouped norm): per layer the Mamba-2
    in-projection (z, x, B, C, dt: 2 x 1536 + 2 x 128 + 24 rows), its conv kernel and bias over x, B and C
    (1792 channels), dt bias, A and D per head, out-projection, Q / K / V / O, the two norms and the SwiGLU FFN.
    The total is llama_model_n_params of the skeleton (tests/golden/llamacpp-breakdown/
    falcon-h1-0.5b-instruct-bf16.json)."""
    e, ff, v, di, conv, nh = 1024, 2048, 32784, 1536, 1792, 24
    mamba = e * (2 * di + 2 * 128 + nh) + 4 * conv + conv + 3 * nh + di * e
    attn = e * 512 + 2 * e * 128 + 512 * e
    layer = mamba + attn + 2 * e + 3 * e * ff
    tensors = tensor_list(load_builtin_preset("falcon-h1-0.5b-instruct"))
    assert sum(t.n_elements for t in tensors) == 36 * layer + 2 * e * v + e == 521_411_104
    names = {t.name for t in tensors}
    # the FFN norm is stored without ".weight" (gguf-py's FFN_PRE_NORM), and llama.cpp asks for it so
    assert "blk.0.ffn_norm" in names and "blk.0.ffn_norm.weight" not in names
    assert "blk.0.ssm_norm.weight" not in names  # mamba_rms_norm false
    with_norm = tensor_list(load_builtin_preset("falcon-h1-0.5b-instruct").model_copy(update={"mamba_rms_norm": True}))
    assert {t.shape for t in with_norm if t.name == "blk.35.ssm_norm.weight"} == {(1536, 1)}
    assert tensor_type(next(t for t in tensors if t.name == "blk.0.ffn_norm"), "bf16") == "f32"


def test_rwkv6qwen2_tensor_list_counts_llama_cpps_parameters():
    """QRWKV6-32B (hidden 5120, 64 layers, 40 heads of 128 with 8 KV heads, FFN 27648, LoRA ranks 64 / 128,
    vocabulary 152064, untied): per layer ten vectors of n_embd (the two norms, lerp_x, the 5 fused lerps, the
    decay, the receptance bias), the token-shift LoRA (2 x 5 x 64 x 5120), the decay LoRA (2 x 128 x 5120),
    receptance / gate / output (3 x 5120^2), K and V as wide as 8 heads (2 x 5120 x 1024) with their biases, and
    the SwiGLU FFN; no time_mix_first, group norm or output-norm bias. The total is llama_model_n_params of the
    skeleton
    (tests/golden/llamacpp-breakdown/qrwkv6-32b-instruct-preview-bf16.json)."""
    e, ff, v, kv = 5120, 27648, 152064, 8 * 128
    vectors = e * (1 + 1 + 5 + 1 + 1 + 1)  # attn_norm, lerp_x, lerp_fused, decay, receptance bias, ffn_norm
    layer = vectors + 10 * e * 64 + 2 * e * 128 + 3 * e * e + 2 * e * kv + 2 * kv + 3 * e * ff
    tensors = tensor_list(load_builtin_preset("qrwkv6-32b-instruct-preview"))
    assert sum(t.n_elements for t in tensors) == 64 * layer + 2 * e * v + e == 34_737_492_992
    shapes = {t.name: t.shape for t in tensors}
    assert shapes["blk.0.time_mix_key.weight"] == (5120, 1024) and shapes["blk.0.time_mix_key.bias"] == (1024,)
    assert "blk.0.time_mix_first.weight" not in shapes and "output_norm.bias" not in shapes


def test_nemotron_h_moe_tensor_list_counts_llama_cpps_parameters():
    """Nemotron-3-Nano-30B-A3B (hidden 2688, 52 layers: 23 Mamba-2, 6 attention, 23 MoE; vocabulary 131072,
    untied): a Mamba-2 layer has the in-projection (z, x: 2 x 4096, B, C: 2 x 8 x 128, dt: 64 heads), the conv
    kernel and bias over 4096 + 2048 channels, dt bias / A / D per head, the grouped norm (4096) and the
    out-projection; an attention layer Q / O of 32 heads of 128 and K / V of 2; an expert layer the router and
    selection bias over 128 experts, 128 x (up + down) of 1856 and the shared expert's up + down of 3712; every
    layer its pre-norm. The total is llama_model_n_params of the skeleton (31.6B: NVIDIA's "31.6B total")."""
    e, v, di, conv = 2688, 131072, 4096, 4096 + 2 * 8 * 128
    mamba = e * (2 * di + 2 * 8 * 128 + 64) + 4 * conv + conv + 3 * 64 + di + di * e
    attn = 2 * e * 32 * 128 + 2 * e * 2 * 128
    moe = e * 128 + 128 + 128 * 2 * e * 1856 + 2 * e * 3712
    tensors = tensor_list(load_builtin_preset("nemotron-3-nano-30b-a3b"))
    total = 23 * mamba + 6 * attn + 23 * moe + 52 * e + 2 * e * v + e
    assert sum(t.n_elements for t in tensors) == total == 31_577_940_288
    shapes = {t.name: t.shape for t in tensors}
    assert shapes["blk.1.ffn_up_exps.weight"] == (2688, 1856, 128) and shapes["blk.1.exp_probs_b.bias"] == (128,)
    assert shapes["blk.5.attn_k.weight"] == (2688, 256) and "blk.5.ffn_up_exps.weight" not in shapes
