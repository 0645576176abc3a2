"""GGUF files built with gguf.GGUFWriter for every supported arch and every layer-pattern rule, read back through
``rsplan estimate --format json`` and checked against hand-derived row widths and bytes; llama.cpp's key and type
rules; keys llama.cpp ignores; the tensor table; and a cross-check of the scanner against gguf.GGUFReader.

Every case runs at ``-c 4096 -np 2``: two KV streams of 2048 cells (4096 cells in all), two recurrent rows per
recurrent tensor. K/V are f16 (2 bytes), R/S f32 (4 bytes).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from rsplan.errors import UnsupportedArchError
from rsplan.hparams.gguf_file import load_gguf, read_gguf
from rsplan.hparams.gguf_scan import scan_gguf
from rsplan.hparams.sources import load_model
from rsplan_testing import MEASURED_DIR

FLAGS = ("-c", "4096", "-np", "2")
CELLS = 4096  # KV cells over both streams
ROWS = 2  # rows of each R/S tensor: n_seq_max * (1 + n_rs_seq)
SWA_CELLS = 2 * 768  # per stream pad(min(2048, n_swa 128 + n_ubatch 512), 256) = 768, two streams


@dataclass(frozen=True)
class Expect:
    """Hand-derived layout: R/S row widths, which layers carry R/S, and the K/V row of each KV layer."""

    n_embd_r: int
    n_embd_s: int
    recurrent: list[int]
    kv: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> (K row, V row); V 0 = no V
    swa: frozenset[int] = frozenset()


MAMBA2_KV: dict[str, Any] = {
    "context_length": 1 << 20, "embedding_length": 64, "block_count": 2, "feed_forward_length": 0,
    "attention.head_count": 0, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
    "ssm.time_step_rank": 8, "ssm.group_count": 2,
}
# attention models below: embedding 64 and 4 heads, so the default head dim is 16
#: the LoRA ranks llama.cpp's rwkv7 / arwkv7 loaders require (src/models/rwkv7.cpp:7); the gate's is optional
RWKV7_LORA = {"attention.decay_lora_rank": 8, "attention.iclr_lora_rank": 8,
              "attention.value_residual_mix_lora_rank": 4}

CASES: dict[str, tuple[str, dict[str, Any], Expect]] = {
    "mamba": (
        "mamba",
        {**{k: v for k, v in MAMBA2_KV.items() if k != "ssm.group_count"}, "ssm.time_step_rank": 4},
        # n_embd_r = (4 - 1) * (128 + 2 * 0 * 16); n_embd_s = 16 * 128
        Expect(3 * 128, 16 * 128, [0, 1]),
    ),
    "mamba2": ("mamba2", MAMBA2_KV, Expect(3 * (128 + 2 * 2 * 16), 16 * 128, [0, 1])),
    "rwkv6": (
        "rwkv6",
        {"context_length": 1048576, "embedding_length": 64, "block_count": 2, "attention.head_count": 0,
         "wkv.head_size": 16, "time_mix_extra_dim": 32, "time_decay_extra_dim": 64},
        # n_embd_r = token_shift_count (default 2) * 64; n_embd_s = 64 * 16
        Expect(2 * 64, 64 * 16, [0, 1]),
    ),
    "rwkv6qwen2": (
        "rwkv6qwen2",
        {"context_length": 1048576, "embedding_length": 64, "block_count": 2, "attention.head_count": 0,
         "attention.head_count_kv": 4, "wkv.head_size": 16, "token_shift_count": 1},
        Expect(1 * 64, 64 * 16, [0, 1]),  # head_count_kv does not make a pure recurrent arch keep a KV cache
    ),
    "rwkv7": (
        "rwkv7",
        {"context_length": 1048576, "embedding_length": 64, "block_count": 3, "attention.head_count": 0,
         "wkv.head_size": 32, **RWKV7_LORA},
        Expect(2 * 64, 64 * 32, [0, 1, 2]),
    ),
    "arwkv7": (
        "arwkv7",
        {"context_length": 1048576, "embedding_length": 64, "block_count": 2, "attention.head_count": 0,
         "wkv.head_size": 16, "token_shift_count": 1, **RWKV7_LORA},
        Expect(64, 64 * 16, [0, 1]),
    ),
    "jamba (kv_zero)": (
        "jamba",
        {"context_length": 4096, "embedding_length": 64, "block_count": 4, "feed_forward_length": 256,
         "attention.head_count": 4, "attention.head_count_kv": [0, 4, 0, 0], "ssm.conv_kernel": 4,
         "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 4},
        Expect(3 * 128, 16 * 128, [0, 2, 3], {1: (4 * 16, 4 * 16)}),
    ),
    "falcon-h1 (all layers both)": (
        "falcon-h1",
        {"context_length": 4096, "embedding_length": 64, "block_count": 2, "feed_forward_length": 256,
         "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 32,
         "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
         "ssm.time_step_rank": 8, "ssm.group_count": 1},
        Expect(3 * (128 + 2 * 16), 16 * 128, [0, 1], {0: (64, 64), 1: (64, 64)}),
    ),
    "granitehybrid (kv_zero)": (
        "granitehybrid",
        {"context_length": 1 << 20, "embedding_length": 64, "block_count": 4, "feed_forward_length": 256,
         "attention.head_count": 4, "attention.head_count_kv": [0, 0, 0, 2], "ssm.conv_kernel": 4,
         "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 2, "ssm.group_count": 1},
        Expect(3 * (128 + 2 * 16), 16 * 128, [0, 1, 2], {3: (2 * 16, 2 * 16)}),
    ),
    "nemotron_h (M * - M)": (
        "nemotron_h",
        {"context_length": 1 << 20, "embedding_length": 64, "block_count": 4,
         "feed_forward_length": [0, 0, 256, 0], "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 0],
         "attention.key_length": 32, "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.inner_size": 128,
         "ssm.state_size": 16, "ssm.time_step_rank": 2, "ssm.group_count": 2},
        # layer 2 (MLP: kv 0, ff 256) carries nothing
        Expect(3 * (128 + 2 * 2 * 16), 16 * 128, [0, 3], {1: (64, 64)}),
    ),
    "nemotron_h_moe with an MTP layer": (
        "nemotron_h_moe",
        {"context_length": 1 << 20, "embedding_length": 64, "block_count": 5, "nextn_predict_layers": 1,
         "feed_forward_length": [0, 0, 256, 0, 256], "attention.head_count": 4,
         "attention.head_count_kv": [0, 2, 0, 0, 2], "attention.key_length": 32, "attention.value_length": 32,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 2,
         "ssm.group_count": 2},
        # the MTP block (layer 4) has attention and MoE: ff != 0, so no KV; not a trunk layer, so no R/S
        Expect(3 * (128 + 2 * 2 * 16), 16 * 128, [0, 3], {1: (64, 64)}),
    ),
    "lfm2 with a sliding window": (
        "lfm2",
        {"context_length": 128000, "embedding_length": 64, "block_count": 3, "feed_forward_length": 256,
         "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3,
         "attention.sliding_window": 128},
        # n_embd_r = 64 * (3 - 1), n_embd_s 0; the attention layer is a sliding-window layer
        Expect(64 * 2, 0, [0, 2], {1: (32, 32)}, frozenset({1})),
    ),
    "lfm2moe (ignores sliding_window)": (
        "lfm2moe",
        {"context_length": 128000, "embedding_length": 64, "block_count": 3, "feed_forward_length": 256,
         "attention.head_count": 4, "attention.head_count_kv": [2, 0, 0], "shortconv.l_cache": 4,
         "attention.sliding_window": 128},
        Expect(64 * 3, 0, [1, 2], {0: (32, 32)}),
    ),
    "qwen3next (default interval 4)": (
        "qwen3next",
        {"context_length": 262144, "embedding_length": 64, "block_count": 4, "attention.head_count": 4,
         "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
         "ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16, "ssm.time_step_rank": 4,
         "ssm.group_count": 2},
        Expect(3 * (64 + 2 * 2 * 16), 16 * 64, [0, 1, 2], {3: (64, 64)}),
    ),
    "qwen35 (recurrent_layers array, MTP)": (
        "qwen35",
        {"context_length": 262144, "embedding_length": 64, "block_count": 5, "nextn_predict_layers": 1,
         "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 32,
         "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16,
         "ssm.time_step_rank": 4, "ssm.group_count": 2,
         "attention.recurrent_layers": [True, False, True, True, False], "full_attention_interval": 4},
        # recurrent_layers wins over full_attention_interval; the MTP layer 4 has neither cache
        Expect(3 * (64 + 2 * 2 * 16), 16 * 64, [0, 2, 3], {1: (64, 64)}),
    ),
    "qwen35moe (full_attention_interval 2)": (
        "qwen35moe",
        {"context_length": 262144, "embedding_length": 64, "block_count": 4, "attention.head_count": 4,
         "attention.head_count_kv": 1, "attention.key_length": 32, "attention.value_length": 32,
         "ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16, "ssm.time_step_rank": 4,
         "ssm.group_count": 2, "full_attention_interval": 2},
        Expect(3 * (64 + 2 * 2 * 16), 16 * 64, [0, 2], {1: (32, 32), 3: (32, 32)}),
    ),
    "kimi-linear (MLA, K only)": (
        "kimi-linear",
        {"context_length": 1048576, "embedding_length": 64, "block_count": 4, "attention.head_count": 4,
         "attention.head_count_kv": [0, 0, 0, 1], "attention.key_length": 48, "attention.value_length": 16,
         "attention.key_length_mla": 24, "attention.value_length_mla": 16, "attention.kv_lora_rank": 32,
         "ssm.conv_kernel": 4, "kda.head_dim": 16},
        # n_embd_r = 3 * (4 - 1) * 4 heads * 16; n_embd_s = 16^2 * 4; K row = key_length 48 * 1 KV head
        Expect(3 * 3 * 4 * 16, 16 * 16 * 4, [0, 1, 2], {3: (48, 0)}),
    ),
    "minimax-01 (default interval 8)": (
        "minimax-01",
        {"context_length": 10240000, "embedding_length": 64, "block_count": 8, "attention.head_count": 4,
         "attention.head_count_kv": 2, "attention.key_length": 16, "attention.value_length": 16},
        # lightning attention: no conv state, n_embd_s = key_length^2 * heads
        Expect(0, 16 * 16 * 4, [0, 1, 2, 3, 4, 5, 6], {7: (32, 32)}),
    ),
}


def expected_bytes(e: Expect) -> dict[str, int]:
    def cells(il: int) -> int:
        return SWA_CELLS if il in e.swa else CELLS

    return {
        "k_bytes": sum(k * 2 * cells(il) for il, (k, _) in e.kv.items()),
        "v_bytes": sum(v * 2 * cells(il) for il, (_, v) in e.kv.items()),
        "r_bytes": len(e.recurrent) * e.n_embd_r * 4 * ROWS,
        "s_bytes": len(e.recurrent) * e.n_embd_s * 4 * ROWS,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_every_arch_through_the_cli(case, gguf_file, estimate_json):
    arch, kv, e = CASES[case]
    plan = estimate_json(gguf_file(arch, kv), *FLAGS)
    assert plan["arch"] == arch
    assert plan["recurrent"]["n_embd_r"] == e.n_embd_r
    assert plan["recurrent"]["n_embd_s"] == e.n_embd_s
    got = {
        "k_bytes": plan["kv"]["k_bytes"], "v_bytes": plan["kv"]["v_bytes"],
        "r_bytes": plan["recurrent"]["r_bytes"], "s_bytes": plan["recurrent"]["s_bytes"],
    }
    assert got == expected_bytes(e)
    names = sorted(t["name"] for t in plan["tensors"])
    want = [f"cache_k_l{il}" for il in e.kv] + [f"cache_v_l{il}" for il, (_, v) in e.kv.items() if v]
    want += [f"cache_{k}_l{il}" for il in e.recurrent for k in "rs"]
    assert names == sorted(want)
    assert {t["layer"] for t in plan["tensors"] if t["cache"] == "kv_swa"} == set(e.swa)


def test_plamo2_head_dims_without_heads_on_layer_0(gguf_file, rsplan):
    """PLaMo-2 GGUFs write ssm.group_count 0 and no heads on layer 0 (a Mamba layer); plamo2.cpp still reads
    attention.key_length / value_length, so its attention layers get 2 KV heads x 32."""
    path = gguf_file("plamo2", {
        "context_length": 2048, "embedding_length": 64, "block_count": 2,
        "attention.head_count": [0, 4], "attention.head_count_kv": [0, 2], "attention.key_length": 32,
        "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
        "ssm.time_step_rank": 4, "ssm.group_count": 0,
    })
    r = rsplan("estimate", "--model", str(path), "-c", "4096", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["recurrent"]["n_embd_r"], d["recurrent"]["n_embd_s"]) == (3 * (128 + 0), 16 * 128)
    assert [t["name"] for t in d["tensors"]] == ["cache_k_l1", "cache_v_l1", "cache_r_l0", "cache_s_l0"]
    # K and V: 2 heads x 32 f16 x 4096 cells each; R and S: one row of 384 and 2048 f32
    assert d["total_bytes"] == 2 * (64 * 2 * 4096) + 4 * (384 + 2048)


def test_recurrent_layers_as_a_u32_applies_to_every_layer(gguf_file, estimate_json):
    """get_key_or_arr: a scalar fills every layer; 0 makes every layer an attention layer."""
    kv = {k: v for k, v in CASES["qwen3next (default interval 4)"][1].items()}
    plan = estimate_json(gguf_file("qwen3next", {**kv, "attention.recurrent_layers": 0}), *FLAGS)
    assert plan["kv"]["layers"] == 4 and plan["recurrent"]["recurrent_layers"] == 0


def test_weights_bytes_come_from_the_tensor_table(gguf_file):
    g = read_gguf(gguf_file("mamba2", MAMBA2_KV))
    # q8_0 [64 x 32]: 32 rows * 2 blocks * 34 B; two f32 [64]: 2 * 256 B; q4_k [256 x 32]: 32 * 144 B
    assert g.index.tensor_bytes == {"q8_0": 32 * 2 * 34, "f32": 2 * 64 * 4, "q4_k": 32 * 144}
    assert g.spec.weights_bytes == 2176 + 512 + 4608
    assert g.index.n_tensors == 4


def test_name_falls_back_to_the_file_name(gguf_file):
    assert load_gguf(gguf_file("mamba2", MAMBA2_KV, filename="tiny-mamba.gguf", name=None)).name == "tiny-mamba"
    assert load_gguf(gguf_file("mamba2", MAMBA2_KV, name="Tiny\nMamba")).name == "Tiny\\nMamba"
    assert load_gguf(gguf_file("mamba2", MAMBA2_KV, name="x" * 100_000)).name == "x" * 200  # ModelSpec's limit
    assert load_gguf(gguf_file("mamba2", MAMBA2_KV, filename="unnamed.gguf", name="")).name == "unnamed"


def test_metadata_only_file_without_tensors(gguf_file):
    spec = load_gguf(gguf_file("mamba2", MAMBA2_KV, tensors=[]))
    assert spec.weights_bytes == 0 and spec.block_count == 2


def test_custom_alignment(gguf_file):
    g = read_gguf(gguf_file("mamba2", MAMBA2_KV, alignment=64))
    assert g.index.alignment == 64 and g.index.data_offset % 64 == 0


def test_dispatch_by_magic_without_suffix(gguf_file):
    assert load_model(str(gguf_file("mamba2", MAMBA2_KV, filename="model.bin"))).arch == "mamba2"


# -- keys llama.cpp does not read must not change anything -------------------------------------------------


IGNORED = {
    "head dims without heads": ("mamba2", {"attention.key_length": ("str", "bogus")}),
    "sliding_window on lfm2moe": ("lfm2moe", {"attention.sliding_window": 4}),
    "recurrent_layers on jamba": ("jamba", {"attention.recurrent_layers": [True, True, True, True]}),
    "full_attention_interval when recurrent_layers is present": ("qwen35", {"full_attention_interval": ("str", "x")}),
    "unrelated keys": ("mamba2", {"rope.freq_base": 1e6, "tokenizer.ggml.tokens": ["a", "b"], "vocab_size": 7}),
}


@pytest.mark.parametrize("case", list(IGNORED))
def test_a_key_llamacpp_ignores_changes_nothing(case, gguf_file, estimate_json):
    arch, extra = IGNORED[case]
    base_case = next(k for k, v in CASES.items() if v[0] == arch)
    kv = CASES[base_case][1]
    with_key = estimate_json(gguf_file(arch, {**kv, **extra}, filename="with.gguf"), *FLAGS)
    without = estimate_json(gguf_file(arch, kv, filename="without.gguf"), *FLAGS)
    assert with_key["tensors"] == without["tensors"]


# -- llama.cpp's key and type rules ------------------------------------------------------------------------


RULES = {
    "scalar not u32": ({"block_count": ("i32", 2)}, "mamba2.block_count: wrong type i32, expected u32"),
    "u64 scalar": ({"context_length": ("u64", 4096)}, "mamba2.context_length: wrong type u64, expected u32"),
    "array length": (
        {"attention.head_count": [0, 0, 0]},
        "mamba2.attention.head_count: wrong array length; expected 2 (block_count), got 3",
    ),
    "array element type": (
        {"feed_forward_length": ("f32", [0.0, 0.0])},
        "mamba2.feed_forward_length: wrong array element type f32, expected u32, i32 or bool",
    ),
    "unsupported array": (
        {"feed_forward_length": ("u8", [0, 0])},
        "mamba2.feed_forward_length: array of u8 is not a string/float32/uint32/int32/uint64 array",
    ),
    "missing required key": ({"ssm.state_size": None}, "mamba2.ssm.state_size: required key not found"),
    "block_count 0": ({"block_count": 0}, "mamba2.block_count: must be in 1..512 (LLAMA_MAX_LAYERS), got 0"),
    "block_count 513": ({"block_count": 513}, "mamba2.block_count: must be in 1..512 (LLAMA_MAX_LAYERS), got 513"),
    "nextn > block_count": ({"nextn_predict_layers": 3}, "mamba2.nextn_predict_layers: 3 exceeds block_count (2)"),
    "zero width": ({"embedding_length": 0}, "mamba2.embedding_length: Input should be greater than or equal to 1"),
    "negative i32 entry": (
        {"attention.head_count": ("i32", [-1, 0])},
        "mamba2.attention.head_count: entry 0 is 4294967295, more than 16384",
    ),
}


@pytest.mark.parametrize("case", list(RULES))
def test_llamacpp_key_rules_give_one_line_errors(case, gguf_file, rsplan):
    changes, message = RULES[case]
    kv = {**MAMBA2_KV, **changes}
    path = gguf_file("mamba2", {k: v for k, v in kv.items() if v is not None})
    r = rsplan("estimate", "--model", str(path))
    assert r.exit_code == 1
    assert r.output == f"Error: {path}: {message}\n"


def test_unknown_and_unsupported_architectures(gguf_file, rsplan):
    for arch in ("llama", "no-such-arch"):
        path = gguf_file(arch, {"context_length": 4096, "embedding_length": 64, "block_count": 2},
                         filename=f"{arch}.gguf")
        r = rsplan("estimate", "--model", str(path))
        assert r.exit_code == 1
        assert r.output.startswith(f"Error: {path}: general.architecture: architecture '{arch}' is not supported")
        with pytest.raises(UnsupportedArchError):
            load_gguf(path)


def test_architecture_must_be_a_string(gguf_file, rsplan):
    path = gguf_file("mamba2", {**MAMBA2_KV, "general.architecture": ("u32", 7)})
    r = rsplan("estimate", "--model", str(path))
    assert r.output == f"Error: {path}: general.architecture: wrong type u32, expected str\n"


def test_split_models_sum_every_part(gguf_file, rsplan):
    """A model in parts: the first part holds the metadata; weights_bytes counts the tensors of every part."""
    first = gguf_file("mamba2", MAMBA2_KV, split_max_tensors=2)
    assert first.name == "model-00001-of-00002.gguf"
    g = read_gguf(first)
    assert g.index.n_tensors == 2  # this part's table
    assert g.spec.weights_bytes == 2176 + 512 + 4608  # both parts
    assert len(g.files) == 2
    second = first.with_name("model-00002-of-00002.gguf")
    r = rsplan("estimate", "--model", str(second))
    assert r.output == f"Error: {second}: split.no: this is part 2 of 2; give the first part of the model\n"
    second.unlink()
    r = rsplan("estimate", "--model", str(first))
    assert r.output == (
        f"Error: {first}: split.count: part model-00002-of-00002.gguf of this 2-part model is missing\n"
    )
    os.mkfifo(second)  # never opened: a FIFO would block the scan
    r = rsplan("estimate", "--model", str(first))
    assert r.output == (
        f"Error: {first}: split.count: part model-00002-of-00002.gguf of this 2-part model is not a regular file\n"
    )


GOLDEN = MEASURED_DIR


@pytest.mark.parametrize("model", ["mamba2", "lfm2", "qwen35"])
def test_scanner_agrees_with_gguf_reader(model):
    """The bounded scanner reads what gguf.GGUFReader reads from real llama.cpp-made files."""
    from gguf import GGUFReader, GGUFValueType

    path = GOLDEN / f"{model}.gguf"
    reader = GGUFReader(path)
    index = scan_gguf(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(index.entries) == set(fields)
    g = read_gguf(path)
    from rsplan.hparams.gguf_file import _GGUFMetadata  # the decoder behind load_gguf

    with open(path, "rb") as fh:
        meta = _GGUFMetadata(fh.read(), index, str(path))
    for key, f in fields.items():
        if f.types[0] == GGUFValueType.ARRAY:
            assert index.entries[key].info.count == len(f.data)
            if f.types[1] not in (GGUFValueType.STRING,) and len(f.data) <= 16:
                assert meta.value(key) == f.contents()
        else:
            assert meta.value(key) == pytest.approx(f.contents())
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        by_type[t.tensor_type.name.lower()] = by_type.get(t.tensor_type.name.lower(), 0) + int(t.n_bytes)
    assert index.tensor_bytes == by_type
    assert index.data_offset == reader.data_offset
    assert g.spec.weights_bytes == sum(by_type.values())
    assert json.loads(g.spec.model_dump_json())["arch"] == model


def test_every_key_the_loader_reads_is_in_the_key_table():
    """The loader names each arch's section keys from archs.py; each must be a key of gguf_keys (one spelling)."""
    from rsplan.hparams.archs import ARCHS
    from rsplan.hparams.gguf_keys import ARCH_KEYS, field_key, gguf_key

    for info in ARCHS.values():
        for section, keys in info.sections.items():
            for key in keys:
                assert field_key(f"{section}.{key}") == f"{section}.{key}" in ARCH_KEYS
    assert gguf_key("rwkv7", "wkv.token_shift_count") == "rwkv7.token_shift_count"
    assert gguf_key("mamba2", "ssm.state_size") == "mamba2.ssm.state_size"
    assert gguf_key("mamba2", "arch") == "general.architecture"
    with pytest.raises(KeyError, match=r"ssm\.state_sizes: no GGUF key"):
        field_key("ssm.state_sizes")



def _falcon_h1_file(gguf_file, norm_layers):
    """The 2-layer falcon-h1 case's GGUF, with the grouped Mamba-2 norm (f32 [128 / 1 group, 1 group]) in
    ``norm_layers`` only."""
    norms = [(f"blk.{il}.ssm_norm.weight", (128, 1), "f32") for il in norm_layers]
    layers = [(f"blk.{il}.attn_norm.weight", (64,), "f32") for il in (0, 1)]  # 256 B each
    embd = ("token_embd.weight", (32, 64), "q8_0")  # 32 rows * 2 blocks * 34 B = 2176
    return gguf_file("falcon-h1", CASES["falcon-h1 (all layers both)"][1], tensors=[embd, *layers, *norms])


@pytest.mark.parametrize(("layers", "expected"), [((0, 1), True), ((), False)])
def test_falcon_h1_mamba_rms_norm_is_read_off_the_tensor_table(gguf_file, layers, expected):
    g = read_gguf(_falcon_h1_file(gguf_file, layers))
    assert g.spec.mamba_rms_norm is expected
    assert g.loaded.sources["mamba_rms_norm"].startswith("tensor table (blk.N.ssm_norm.weight")
    # the norm adds 128 f32 per layer that has it
    assert g.spec.weights_bytes == 2176 + 2 * 256 + 512 * len(layers)


def test_falcon_h1_ssm_norm_on_some_layers_only_is_refused(gguf_file, rsplan):
    r = rsplan("estimate", "--model", str(_falcon_h1_file(gguf_file, (1,))))
    assert r.exit_code != 0
    assert "blk.N.ssm_norm.weight: present in 1 of 2 layers" in r.output and "Traceback" not in r.output


def test_a_falcon_h1_without_layer_tensors_leaves_mamba_rms_norm_unset(gguf_file):
    kv = CASES["falcon-h1 (all layers both)"][1]
    assert load_gguf(gguf_file("falcon-h1", kv, tensors=[])).mamba_rms_norm is None
    assert load_gguf(gguf_file("falcon-h1", kv)).mamba_rms_norm is None  # layer 0 only has tensors


@pytest.mark.parametrize("arch", ["rwkv7", "arwkv7"])
def test_rwkv7_lora_ranks_are_read_and_required(arch, gguf_file, rsplan):
    kv = dict(CASES[arch][1])
    spec = load_gguf(gguf_file(arch, {**kv, "attention.gate_lora_rank": 16}))
    a = spec.attention
    assert (a.decay_lora_rank, a.iclr_lora_rank, a.value_residual_mix_lora_rank, a.gate_lora_rank) == (8, 8, 4, 16)
    assert load_gguf(gguf_file(arch, kv, filename="nogate.gguf")).attention.gate_lora_rank is None  # optional
    del kv["attention.iclr_lora_rank"]
    r = rsplan("estimate", "--model", str(gguf_file(arch, kv, filename="bad.gguf")))
    assert r.exit_code != 0 and f"{arch}.attention.iclr_lora_rank: required key not found" in r.output


@pytest.mark.parametrize(("with_norm", "expected"), [(True, True), (False, False)])
def test_arwkv7_group_norm_is_read_off_the_tensor_table(gguf_file, with_norm, expected):
    """ARWKV-7's time-mix group norm (blk.N.time_mix_ln, created only when the file has it) sets wkv_group_norm."""
    kv = CASES["arwkv7"][1]
    layers = [(f"blk.{il}.attn_norm.weight", (64,), "f32") for il in (0, 1)]
    norms = [(f"blk.{il}.time_mix_ln.weight", (64,), "f32") for il in (0, 1)] if with_norm else []
    g = read_gguf(gguf_file("arwkv7", kv, tensors=[*layers, *norms]))
    assert g.spec.wkv_group_norm is expected
    assert g.loaded.sources["wkv_group_norm"].startswith("tensor table (blk.N.time_mix_ln.weight")


def test_jamba_expert_layers_are_read_off_the_tensor_table(gguf_file, estimate_json):
    """Jamba's expert layers are those whose router (blk.N.ffn_gate_inp, created only when the file has it) the
    file holds (src/models/jamba.cpp:88 ffn_gate_inp): jamba-v0.1 written as its converter's GGUF (the preset's keys and
    tensor list) has experts on every other layer from layer 1, and its compute buffer is the one llama.cpp's dry
    run printed for the bf16 skeleton at -c 256 (tests/golden/llamacpp-breakdown/jamba-v0.1-bf16.json)."""
    from rsplan.hparams.gguf_keys import spec_metadata
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.hparams.tensors import tensor_list

    preset = load_builtin_preset("jamba-v0.1")
    tensors = [(t.name, t.shape, "bf16") for t in tensor_list(preset) if t.loaded]
    assert sum(t[0].endswith("ffn_gate_inp.weight") for t in tensors) == 16
    # the keys the converter writes besides the twin's (conversion/jamba.py add_expert_count / add_expert_used_count)
    # and the tokenizer whose length is n_vocab
    kv = {**spec_metadata(preset), "expert_count": preset.expert_count, "expert_used_count": preset.expert_used_count,
          "tokenizer.ggml.tokens": [f"t{i}" for i in range(preset.vocab_size)]}
    path = gguf_file("jamba", kv, tensors=tensors, filename="jamba.gguf")
    g = read_gguf(path)
    assert g.spec.vocab_size == 65536
    assert g.spec.expert_layers == [il % 2 == 1 for il in range(32)]
    assert g.loaded.sources["expert_layers"] == "tensor table (blk.N.ffn_gate_inp.weight in 16 of 32 layers)"
    plan = estimate_json(path, "-c", "256", "--tool", "cli")  # the dry run's n_outputs_max: n_batch
    assert plan["compute"]["bytes"] == 100_835_360
    assert not any("expert_layers" in note for note in plan["notes"])


def test_a_jamba_file_without_layer_tensors_leaves_expert_layers_unset(gguf_file):
    # a metadata-only file (a test twin) says nothing of the layers: the compute buffer then asks for them
    kv = CASES["jamba (kv_zero)"][1]
    assert load_gguf(gguf_file("jamba", kv, tensors=[])).expert_layers is None
