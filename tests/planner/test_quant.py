"""planner.weights.quant and the rules it applies (quant_ftypes, quant_inputs, quant_allowed, quant_mixture):
hand-derived cases for the rules and for bad input (the golden file covers whole models)."""

from __future__ import annotations

import pytest

from rsplan.errors import ContextError
from rsplan.planner.weights.quant import quantize_plan
from rsplan.planner.weights.quant_allowed import allows_quantization
from rsplan.planner.weights.quant_ftypes import FTYPE_NAMES, parse_ftype
from rsplan.planner.weights.quant_inputs import QuantModel, WeightTensor, loader_order, quant_model
from rsplan.planner.weights.quant_mixture import tensor_category

DENSE = QuantModel(arch="llama", n_layer_all=32, n_head=32, n_head_kv=8)


def dense_model(n_layer: int, n_embd: int = 256) -> list[WeightTensor]:
    out = [WeightTensor("token_embd.weight", (n_embd, 1000)), WeightTensor("output.weight", (n_embd, 1000))]
    for il in range(n_layer):
        out += [
            WeightTensor(f"blk.{il}.attn_norm.weight", (n_embd,), "f32"),
            WeightTensor(f"blk.{il}.attn_v.weight", (n_embd, n_embd)),
            WeightTensor(f"blk.{il}.ffn_down.weight", (n_embd, n_embd)),
        ]
    return out


def types_of(plan, suffix: str) -> dict[int, str]:
    return {int(t.name.split(".")[1]): t.type for t in plan.tensors if t.name.endswith(suffix)}


# --- names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Q4_K_M", "Q4_K_M"),
        ("q4_k_m", "Q4_K_M"),
        ("Q4_K", "Q4_K_M"),  # alias
        ("q5_k", "Q5_K_M"),
        ("15", "Q4_K_M"),  # the enum value
        (" 7", "Q8_0"),  # std::stoi skips leading spaces
        ("7x", "Q8_0"),  # ... and ignores what follows the digits
        ("0", "F32"),  # F32 comes before COPY
        ("mxfp4_moe", "MXFP4_MOE"),
        ("copy", "COPY"),
    ],
)
def test_parse_ftype_reads_names_as_llama_quantize(text, name):
    assert parse_ftype(text).name == name


@pytest.mark.parametrize("text", ["Q9_K", "", "99", "q4_k_ſ", "NVFP4", "Q4_K_M "])
def test_unknown_quant_names_the_valid_ones_on_one_line(text):
    with pytest.raises(ContextError) as err:
        parse_ftype(text)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("unknown --quant '")
    assert msg.endswith("(llama-quantize accepts: " + ", ".join(FTYPE_NAMES) + ")")
    assert "Q4_K_M, Q5_K, Q5_K_S" in msg


# --- which tensors are quantized --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ne", "arch", "allowed"),
    [
        ("blk.0.attn_q.weight", (256, 256), "llama", True),
        ("blk.0.attn_q.bias", (256, 256), "llama", False),  # must end in "weight"
        ("blk.0.attn_norm.weight", (256, 256), "llama", False),  # norms never
        ("blk.0.ffn_up.weight", (256, 1), "llama", False),  # ggml_n_dims 1
        ("blk.0.ssm_a", (1, 80), "mamba2", False),  # 2-D, but no ".weight"
        ("blk.0.ssm_conv1d.weight", (4, 5376), "mamba2", False),
        ("blk.0.shortconv.conv.weight", (3, 2048), "lfm2", False),
        ("blk.0.shortconv.in_proj.weight", (2048, 6144), "lfm2", True),
        ("blk.0.time_mix_w1.weight", (1024, 64), "rwkv7", False),
        ("blk.0.time_mix_key.weight", (1024, 1024), "rwkv7", True),
        ("blk.0.ffn_gate_inp.weight", (2048, 512), "qwen3next", False),
        ("position_embd.weight", (256, 256), "llama", False),
        ("blk.0.hc_attn_fn.weight", (256, 256), "glm5-next", False),
        ("blk.0.hc_attn_fn.weight", (256, 256), "llama", True),  # only glm5-next excludes hc_
    ],
)
def test_allows_quantization(name, ne, arch, allowed):
    assert allows_quantization(WeightTensor(name, ne), arch) is allowed


def test_categories_take_the_first_match():
    assert tensor_category("blk.0.attn_qkv.weight") == "attn_qkv"
    assert tensor_category("blk.0.attn_v_b.weight") == "other"  # not "attn_v.weight"
    assert tensor_category("blk.0.ffn_down_shexp.weight") == "ffn_down"
    assert tensor_category("per_layer_token_embd.weight") == "token_embd"


def test_loader_order_is_layer_then_name():
    names = ["blk.10.a.weight", "output.weight", "blk.2.b.weight", "blk.2.a.weight", "token_embd.weight"]
    got = [t.name for t in loader_order([WeightTensor(n, (32, 32)) for n in names])]
    assert got == ["output.weight", "token_embd.weight", "blk.2.a.weight", "blk.2.b.weight", "blk.10.a.weight"]


# --- the mixture ------------------------------------------------------------------------------------------


def test_q4_k_m_gives_q6_k_to_the_use_more_bits_layers():
    # 32 layers: n/8 = 4, 7n/8 = 28; more bits for i < 4, i >= 28 and (i - 4) % 3 == 2 (i = 6, 9, ..., 27).
    expected = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    plan = quantize_plan(dense_model(32), DENSE, "Q4_K_M")
    want = {i: ("q6_K" if i in expected else "q4_K") for i in range(32)}
    assert types_of(plan, "ffn_down.weight") == want
    assert types_of(plan, "attn_v.weight") == want
    by_name = {t.name: t.type for t in plan.tensors}
    assert by_name["output.weight"] == "q6_K"
    assert by_name["token_embd.weight"] == "q4_K"  # not tied: the default type
    assert by_name["blk.0.attn_norm.weight"] == "f32"


def test_without_experts_ffn_down_counts_tensors_not_layers():
    """A hybrid with ffn_down on the odd layers only: the rule sees counters 0..7 against n_layer = 16."""
    tensors = [WeightTensor("output.weight", (256, 1000))]
    tensors += [WeightTensor(f"blk.{il}.ffn_down.weight", (256, 256)) for il in range(1, 16, 2)]
    plan = quantize_plan(tensors, QuantModel(arch="lfm2", n_layer_all=16), "Q4_K_M")
    # use_more_bits(i, 16): i < 2, i >= 14 or (i - 2) % 3 == 2 -> counters 0, 1, 4, 7 -> layers 1, 3, 9, 15
    got = types_of(plan, "ffn_down.weight")
    assert got == {il: ("q6_K" if il in (1, 3, 9, 15) else "q4_K") for il in range(1, 16, 2)}


def test_with_experts_ffn_down_reads_the_layer_from_the_name():
    tensors = [WeightTensor(f"blk.{il}.ffn_down_exps.weight", (256, 256, 4)) for il in (1, 3, 9, 15)]
    plan = quantize_plan(tensors, QuantModel(arch="lfm2moe", n_layer_all=16, n_expert=4), "Q4_K_M")
    # use_more_bits(layer, 16) for layers 1, 3, 9, 15: 1 (< 2) yes, 3 (3-2=1) no, 9 (7 % 3 = 1) no, 15 yes
    assert types_of(plan, "ffn_down_exps.weight") == {1: "q6_K", 3: "q4_K", 9: "q4_K", 15: "q6_K"}


def test_an_expert_ffn_tensor_without_a_layer_fails_as_llama_quantize():
    tensors = [WeightTensor("ffn_down_exps.weight", (256, 256, 4))]
    with pytest.raises(ContextError, match=r"Failed to determine layer for tensor ffn_down_exps\.weight"):
        quantize_plan(tensors, QuantModel(arch="lfm2moe", n_layer_all=16, n_expert=4), "Q8_0")
    tensors = [WeightTensor("blk.16.ffn_down_exps.weight", (256, 256, 4))]
    with pytest.raises(ContextError, match=r"Bad layer 16 for tensor blk\.16\.ffn_down_exps\.weight"):
        quantize_plan(tensors, QuantModel(arch="lfm2moe", n_layer_all=16, n_expert=4), "Q8_0")


def test_tied_embeddings_are_quantized_like_the_output():
    n_embd, n_vocab = 2560, 50288
    tensors = [WeightTensor("token_embd.weight", (n_embd, n_vocab)), WeightTensor("blk.0.ssm_in.weight", (n_embd, 64))]
    plan = quantize_plan(tensors, QuantModel(arch="mamba2", n_layer_all=1), "Q4_K_M")
    embd = plan.tensors[0]
    assert embd.type == "q6_K"
    # q6_K: 256-element blocks of 210 bytes -> 2560 / 256 * 210 = 2100 bytes a row
    assert embd.n_bytes == n_vocab * 2100 == 105_604_800


def test_mxfp4_moe_puts_3d_tensors_in_mxfp4_and_the_rest_in_q8_0():
    tensors = [
        WeightTensor("output.weight", (256, 1000)),
        WeightTensor("blk.0.ffn_up_exps.weight", (256, 512, 8)),
        WeightTensor("blk.0.attn_q.weight", (256, 256)),
    ]
    plan = quantize_plan(tensors, QuantModel(arch="qwen3next", n_layer_all=1, n_expert=8), "MXFP4_MOE")
    assert [(t.name, t.type) for t in plan.tensors] == [
        ("output.weight", "q8_0"),
        ("blk.0.attn_q.weight", "q8_0"),
        ("blk.0.ffn_up_exps.weight", "mxfp4"),
    ]
    # mxfp4: 32-element blocks of 17 bytes -> 256 / 32 * 17 = 136 bytes a row, 512 * 8 rows
    assert plan.tensors[2].n_bytes == 136 * 512 * 8


def test_n_expert_8_bumps_attn_v_and_attn_k_to_q8_0():
    tensors = [WeightTensor("blk.0.attn_v.weight", (256, 64)), WeightTensor("blk.0.attn_k.weight", (256, 64))]
    model = QuantModel(arch="llama", n_layer_all=32, n_expert=8, n_head=32, n_head_kv=8)
    assert [t.type for t in quantize_plan(tensors, model, "Q4_K_S").tensors] == ["q8_0", "q8_0"]


@pytest.mark.parametrize(
    ("model", "is_70b"),
    [
        (QuantModel(arch="llama", n_layer_all=80, n_head=64, n_head_kv=8), True),
        (QuantModel(arch="llama", n_layer_all=80, n_head=64, n_head_kv=64), False),  # LLM_TYPE_65B
        (QuantModel(arch="llama", n_layer_all=80, n_head=64, n_head_kv=8, n_expert=8), False),
        (QuantModel(arch="llama", n_layer_all=81, n_layer_nextn=1, n_head=64, n_head_kv=8), True),
        (QuantModel(arch="qwen2", n_layer_all=80, n_head=64, n_head_kv=64), True),
        (QuantModel(arch="jais2", n_layer_all=68), True),
        (QuantModel(arch="mistral3", n_layer_all=80, n_head=64, n_head_kv=8), False),
    ],
)
def test_70b_model_type(model, is_70b):
    assert model.is_70b is is_70b
    plan = quantize_plan([WeightTensor("blk.0.attn_v.weight", (256, 256))], model, "Q3_K_S")
    # the 70B bump (q3_K -> q5_K) comes first, then n_expert == 8 overrides every attn_v with q8_0
    assert plan.tensors[0].type == ("q8_0" if model.n_expert == 8 else "q5_K" if is_70b else "q3_K")


def test_quant_model_from_a_preset():
    from rsplan.hparams.sources import load_builtin_preset

    m = quant_model(load_builtin_preset("qwen3-next-80b-a3b"), n_expert=512)
    assert (m.arch, m.n_layer_all, m.n_layer_nextn, m.n_expert, m.n_head, m.n_head_kv) == (
        "qwen3next", 49, 1, 512, 16, 2,
    )
    m = quant_model(load_builtin_preset("nemotron-h-8b-base-8k"))
    assert (m.n_head, m.n_head_kv, m.n_gqa) == (32, 0, 0)  # layer 0 is a Mamba layer
    assert quant_model(load_builtin_preset("mamba2-2.7b")).n_gqa == 0


def test_n_gqa_is_layer_0s():
    assert QuantModel(arch="nemotron_h", n_layer_all=52, n_head=32, n_head_kv=0).n_gqa == 0
    assert QuantModel(arch="qwen3next", n_layer_all=49, n_head=16, n_head_kv=2).n_gqa == 8


# --- fallbacks and refusals -------------------------------------------------------------------------------


def test_fallback_to_a_32_block_type_and_its_warning():
    tensors = [WeightTensor("blk.0.ssm_f_b.weight", (128, 4096))]
    plan = quantize_plan(tensors, QuantModel(arch="kimi-linear", n_layer_all=1), "Q4_K_M")
    t = plan.tensors[0]
    assert t.type == "q5_0"  # 128 is no multiple of 256; q4_K falls back to q5_0 (32-element blocks)
    assert t.n_bytes == 4096 * (128 // 32 * 22)
    assert t.fallback == (
        "warning: blk.0.ssm_f_b.weight                 - ncols    128 not divisible by 256 "
        "(required for type    q4_K) -> falling back to    q5_0"
    )
    assert plan.warnings()[-1] == "llama_model_quantize_impl: WARNING: 1 of 1 tensor(s) required fallback quantization"


def test_a_row_no_32_block_fits_becomes_f16():
    plan = quantize_plan([WeightTensor("blk.0.x.weight", (48, 16))], DENSE, "Q8_0")
    assert plan.tensors[0].type == "f16"
    assert plan.tensors[0].n_bytes == 48 * 16 * 2
    assert "(WARNING: must use F16 due to unusual shape) -> falling back to     f16" in plan.tensors[0].fallback


def test_q1_0_has_no_fallback():
    with pytest.raises(ContextError, match="no tensor type fallback is defined for type q1_0"):
        quantize_plan([WeightTensor("blk.0.x.weight", (48, 16))], DENSE, "Q1_0")


def test_imatrix_types_are_refused_without_an_imatrix():
    tensors = dense_model(8)
    with pytest.raises(ContextError) as err:
        quantize_plan(tensors, DENSE, "IQ2_XXS")
    # attn_v goes to q4_K (n_gqa 4) and the first n_layer / 8 = 4 ffn_down to q2_K: neither needs an imatrix;
    # blk.4.ffn_down.weight is the first iq2_xxs tensor, where llama-quantize stops.
    assert str(err.value) == (
        "IQ2_XXS requires an importance matrix: llama-quantize refuses tensor blk.4.ffn_down.weight as iq2_xxs "
        "without --imatrix"
    )
    flagged = quantize_plan(tensors, DENSE, "IQ2_XXS", dry_run=True)
    assert flagged.requires_imatrix
    assert next(t.name for t in flagged.tensors if t.requires_imatrix) == "blk.4.ffn_down.weight"
    assert "will require an imatrix" in flagged.warnings()[0]
    with_imatrix = quantize_plan(tensors, DENSE, "IQ2_XXS", has_imatrix=True)
    assert [t.type for t in with_imatrix.tensors] == [t.type for t in flagged.tensors]
    assert not quantize_plan(tensors, DENSE, "Q4_K_M").requires_imatrix


def test_q2_k_needs_an_imatrix_only_in_q2_k_s():
    tensors = [WeightTensor("blk.0.attn_q.weight", (256, 256))]
    assert not quantize_plan(tensors, DENSE, "Q2_K").requires_imatrix
    assert quantize_plan(tensors, DENSE, "Q2_K_S", dry_run=True).requires_imatrix


def test_copy_and_float_ftypes():
    tensors = [WeightTensor("blk.0.attn_q.weight", (256, 256), "bf16"), WeightTensor("blk.0.n", (256,), "f32")]
    assert [t.type for t in quantize_plan(tensors, DENSE, "COPY").tensors] == ["bf16", "f32"]
    assert [t.type for t in quantize_plan(tensors, DENSE, "F16").tensors] == ["f16", "f32"]
    assert [t.n_bytes for t in quantize_plan(tensors, DENSE, "F32").tensors] == [256 * 256 * 4, 256 * 4]


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        (WeightTensor("a.weight", (256, 256), "q4_k_m"), "unknown ggml type 'q4_k_m'"),
        (WeightTensor("a.weight", (256, 0)), r"tensor a\.weight: bad shape \(256, 0\)"),
        (WeightTensor("a.weight", ()), r"bad shape \(\)"),
        (WeightTensor("a.weight", (1, 2, 3, 4, 5)), "bad shape"),
        (WeightTensor("a.weight", (100, 2), "q8_0"), "not a whole number of q8_0 blocks"),
    ],
)
def test_bad_tensors_are_refused(tensor, match):
    with pytest.raises(ContextError, match=match):
        quantize_plan([tensor], DENSE, "F32")
