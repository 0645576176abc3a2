"""vLLM 0.33.0's rules (planner.engines.vllm: rules, answers) against numbers derived by hand from the presets' config
values and vLLM's source (docs/engine-vllm.md).

Conventions of the derivations: bf16 = 2 B, fp32 = 4 B. A Mamba-2 conv state is ``(d_conv - 1 + num_spec) x
(d_inner + 2 * n_groups * d_state) / TP``, its SSM state ``heads / TP x head_dim x d_state``; a gated delta net's conv
``(d_conv - 1) x (2 * k_heads * k_dim + v_heads * v_dim)``, SSM ``v_heads x v_dim x k_dim``. An attention token costs
``2 * kv_heads * head_dim * 2 B`` per layer (MLA: ``576 * 2 B``). The block is ``A * ceil(page / (A * token))``
with A = 16 (64 for Qwen gated delta nets with prefix caching, 128 for MLA).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.engines.base import EngineError, ServingBudget
from rsplan.planner.engines.vllm.answers import capacity, estimate_max_model_len, plan
from rsplan.planner.engines.vllm.rules import VllmSettings, derive

GIB = 1 << 30
BF16, FP32 = 2, 4


def lay(preset: str, **settings):
    return derive(load_builtin_preset(preset), VllmSettings(**settings))


def block_for(page: int, token: int, a: int) -> int:
    return a * -(-page // (a * token))


# -- Qwen3-Next-80B-A3B: 12 attention layers (2 KV heads x 256), 36 gated delta nets (16 k heads x 128, 32 v heads x
#    128, conv 4), bf16, no SSM-dtype hook (SSM auto = conv dtype bf16)
QWEN3_NEXT_CONV = 3 * (2 * 16 * 128 + 32 * 128) * BF16  # 49,152
QWEN3_NEXT_SSM = 32 * 128 * 128 * BF16  # 1,048,576
QWEN3_NEXT_PAGE = QWEN3_NEXT_CONV + QWEN3_NEXT_SSM  # 1,097,728
QWEN_TOKEN = 2 * 2 * 256 * BF16  # 2,048


def test_qwen3_next_align_mode_block_page_groups_and_blocks():
    out = lay("qwen3-next-80b-a3b", max_model_len=32768)
    assert out.mode == "align" and out.prefix_caching
    assert out.mamba_page == QWEN3_NEXT_PAGE == 1_097_728
    assert out.attn_bytes_per_token == QWEN_TOKEN
    assert out.block_size == block_for(QWEN3_NEXT_PAGE, QWEN_TOKEN, 64) == 576  # lcm(16, 64) = 64
    assert out.page_bytes == 576 * 2048
    assert out.groups == (("attention", 12), ("gated_delta_net", 12), ("gated_delta_net", 12),
                          ("gated_delta_net", 12))
    assert out.bytes_per_block == 12 * 576 * 2048
    # ceil(32768 / 576) = 57 attention blocks + 3 GDN groups x (2 + 1 prefill checkpoint)
    assert out.blocks_per_request == 57 + 3 * 3 == 66
    assert out.log_lines == (
        "Mamba cache mode is set to 'align' for Qwen3NextForCausalLM by default when prefix caching is enabled",
        "Setting attention block size to 576 tokens to ensure that attention page size is >= mamba page size.",
        "Padding mamba page size by 7.46% to ensure that mamba page size and attention page size are exactly equal.",
    )


def test_qwen3_next_without_prefix_caching():
    out = lay("qwen3-next-80b-a3b", max_model_len=32768, enable_prefix_caching=False)
    assert out.mode == "none"
    assert out.block_size == block_for(QWEN3_NEXT_PAGE, QWEN_TOKEN, 16) == 544
    assert f"{100 * (544 * 2048 - QWEN3_NEXT_PAGE) / QWEN3_NEXT_PAGE:.2f}" == "1.49"
    assert out.blocks_per_request == math.ceil(32768 / 544) + 3 * 1 == 64


def test_qwen3_next_kv_memory_gives_vllms_capacity_line():
    p = plan(load_builtin_preset("qwen3-next-80b-a3b"),
             VllmSettings(max_model_len=32768, kv_cache_memory_bytes=30 * GIB))
    num_blocks = 30 * GIB // (12 * 576 * 2048)
    assert num_blocks == 2275
    tokens = int(num_blocks / 66 * 32768)
    assert p.log_lines[-1] == (f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for 32,768 tokens per "
                               f"request: {num_blocks / 66:.2f}x")
    assert tokens == 1_129_503
    facts = {f.label: f.value for f in p.facts}
    assert facts["num_blocks"] == 2275
    assert facts["max_num_seqs without preemption at max_model_len"] == (2275 - 1) // 66 == 34


def test_qwen3_next_reproduces_the_line_of_a_real_vllm_run():
    """A line printed by vLLM 0.33's own planning functions: "GPU KV cache size:
    822,272 tokens, Maximum concurrency for 32,768 tokens per request: 25.09x". It is Qwen3-Next without prefix
    caching on 20 GiB of KV memory: 20 GiB // (12 x 544 x 2,048 B) = 1,606 blocks, 61 + 3 blocks per request,
    1,606 / 64 = 25.09375, x 32,768 = 822,272 tokens."""
    p = plan(load_builtin_preset("qwen3-next-80b-a3b"),
             VllmSettings(max_model_len=32768, enable_prefix_caching=False, kv_cache_memory_bytes=20 * GIB))
    assert 20 * GIB // (12 * 544 * 2048) == 1606
    assert p.log_lines[-1] == ("GPU KV cache size: 822,272 tokens, Maximum concurrency for 32,768 tokens per "
                               "request: 25.09x")


def test_qwen3_next_mtp_adds_an_attention_layer_and_spec_blocks():
    # num_spec 2: conv length 3 + 2; MTP layer joins the attention bucket: 13 vs 36 -> group 13, 3 GDN groups
    out = lay("qwen3-next-80b-a3b", max_model_len=32768, num_speculative_tokens=2)
    page = 5 * (2 * 16 * 128 + 32 * 128) * BF16 + QWEN3_NEXT_SSM
    assert out.mamba_page == page
    assert out.n_attention == 13
    assert out.group_size == 13
    assert out.groups == (("attention", 13), ("gated_delta_net", 12), ("gated_delta_net", 12),
                          ("gated_delta_net", 12))
    assert "Add 3 padding layers, may waste at most 8.33% KV cache memory" in out.log_lines
    assert out.mamba_blocks_per_request == 2 + 2 + 1


def test_qwen35_ssm_state_is_float32_from_its_config():
    out = lay("qwen3.5-35b-a3b", max_model_len=65536)
    page = 3 * 8192 * BF16 + 32 * 128 * 128 * FP32  # 2,146,304
    assert out.ssm_dtype == "float32"
    assert out.mamba_page == page == 2_146_304
    assert out.block_size == block_for(page, QWEN_TOKEN, 64) == 1088
    assert out.groups[0] == ("attention", 10) and len(out.groups) == 4
    assert out.blocks_per_request == math.ceil(65536 / 1088) + 3 * 3
    # an explicit flag wins over the config
    assert lay("qwen3.5-35b-a3b", mamba_ssm_cache_dtype="bfloat16").ssm_dtype == "bfloat16"


# -- Nemotron-H-8B: 4 attention layers (8 KV heads x 128), 24 Mamba-2 layers (d_inner 8192, 128 heads x 64,
#    d_state 128, 8 groups, conv 4); vLLM forces the SSM state to float32
NEMOTRON_PAGE = 3 * (8192 + 2 * 8 * 128) * BF16 + 128 * 64 * 128 * FP32  # 4,255,744
NEMOTRON_TOKEN = 2 * 8 * 128 * BF16  # 4,096


def test_nemotron_h():
    out = lay("nemotron-h-8b-base-8k")
    assert out.max_model_len == 8192  # the config's max_position_embeddings, not the GGUF's 2**20
    assert out.mamba_page == NEMOTRON_PAGE == 4_255_744
    assert out.block_size == block_for(NEMOTRON_PAGE, NEMOTRON_TOKEN, 16) == 1040
    assert out.group_size == 4 and len(out.groups) == 1 + 6
    assert out.bytes_per_block == 4 * 1040 * 4096
    # Mamba-2 mixers add a prefill-checkpoint block with prefix caching: 2 + 1 per Mamba group
    assert out.blocks_per_request == math.ceil(8192 / 1040) + 6 * 3 == 26
    assert "Padding mamba page size by 0.10% to ensure that mamba page size and attention page size are exactly " \
           "equal." in out.log_lines


def test_nemotron_h_capacity_on_80_gib():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    budget = ServingBudget(80 * GIB, "test", 16_000_000_000, "test", 4 * GIB)
    cap = capacity(spec, VllmSettings(), budget)
    kv = math.ceil(80 * GIB * 0.92) - 16_000_000_000 - 4 * GIB
    num_blocks = kv // (4 * 1040 * 4096)
    assert cap.cache_bytes == kv
    per_request = 26
    seqs = (num_blocks - 1) // per_request
    assert cap.flags == f"--max-model-len 8192 --max-num-seqs {seqs}"
    assert seqs <= num_blocks  # the CUDA-graph start-up check holds


# -- Falcon-H1-0.5B: every layer holds attention (2 KV heads x 64) and a Mamba-2 state (d_inner 1536, 24 heads x 64,
#    d_state 128, 1 group, conv 4)

def test_falcon_h1_and_tensor_parallel_group_replication():
    out = lay("falcon-h1-0.5b-instruct")
    page = 3 * (1536 + 2 * 1 * 128) * BF16 + 24 * 64 * 128 * BF16  # 403,968
    assert out.mamba_page == page
    assert out.block_size == block_for(page, 2 * 2 * 64 * BF16, 16) == 800
    assert out.groups == (("attention", 36), ("mamba2", 36))
    # TP 2: n_groups 1 is raised to 2; KV heads 2 // 2 = 1 per rank
    tp2 = lay("falcon-h1-0.5b-instruct", tensor_parallel_size=2)
    assert tp2.rec.conv == (3, (1536 + 2 * 2 * 128) // 2)
    assert tp2.rec.ssm == (12, 64, 128)
    assert tp2.attn_bytes_per_token == 2 * 1 * 64 * BF16
    assert tp2.mamba_page == 3 * 1024 * BF16 + 12 * 64 * 128 * BF16


def test_lfm2_small_conv_state_is_padded_to_one_attention_block():
    out = lay("lfm2-1.2b")
    assert out.mamba_page == 2 * 2048 * BF16 == 8192  # (L_cache 3 - 1) x hidden 2048
    assert out.attn_bytes_per_token == 2 * 8 * 64 * BF16 == 2048
    assert out.block_size == 16  # never lowered: 16 x 2048 B already holds the 8 KiB state
    assert out.page_bytes == 32768
    # 6 attention vs 10 conv layers: 10 >= 1.5 x 6, so groups of 6: the conv bucket splits 5 + 5 (2 padding layers)
    assert out.groups == (("attention", 6), ("shortconv", 5), ("shortconv", 5))
    assert out.log_lines[-2:] == (
        "Padding mamba page size by 300.00% to ensure that mamba page size and attention page size are exactly equal.",
        "Add 2 padding layers, may waste at most 20.00% KV cache memory",
    )
    assert out.blocks_per_request == 128000 // 16 + 2 * 2  # short conv: no checkpoint block


def test_lfm2_drafts_widen_the_layer_state_past_the_padded_page():
    # the alignment reads LFM2's class shapes, (3 - 1) x 2048 without drafts = 8 KiB, padded to 16 x 2048 B = 32 KiB;
    # the layers allocate (2 + drafts) x 2048 x 2 B: 6 drafts = 32 KiB still fits, 7 = 36 KiB does not
    assert lay("lfm2-1.2b", num_speculative_tokens=6).mamba_page == 8 * 2048 * BF16 == 32768
    with pytest.raises(EngineError, match=r"allocate a 36,864 B state page .* padded it to 32,768 B"):
        lay("lfm2-1.2b", num_speculative_tokens=7)


# -- Kimi-Linear-48B-A3B: 7 MLA layers (latent 512 + rope 64), 20 KDA layers (32 heads x 128, conv 4), KDA state fp32

KIMI_PAGE = 3 * (3 * 32 * 128) * BF16 + 32 * 128 * 128 * FP32  # 2,170,880


def test_kimi_linear_mla_block_is_a_multiple_of_128():
    out = lay("kimi-linear-48b-a3b")
    assert out.attn.mla and out.attn_bytes_per_token == 576 * BF16
    assert out.mamba_page == KIMI_PAGE
    assert out.block_size == block_for(KIMI_PAGE, 576 * BF16, 128) == 1920
    assert out.groups == (("attention", 7), ("kda", 7), ("kda", 7), ("kda", 6))
    assert "Add 1 padding layers, may waste at most 5.00% KV cache memory" in out.log_lines
    assert out.blocks_per_request == math.ceil(1048576 / 1920) + 3 * 2  # KDA: no checkpoint block
    # TP 2 halves the KDA state but not the MLA latent
    tp2 = lay("kimi-linear-48b-a3b", tensor_parallel_size=2)
    assert tp2.attn_bytes_per_token == 576 * BF16
    assert tp2.mamba_page == KIMI_PAGE // 2
    assert tp2.block_size == block_for(KIMI_PAGE // 2, 576 * BF16, 128) == 1024


def test_kimi_bf16_ssm_flag_makes_vllm_fail_at_start_up():
    # the alignment reads a bf16 state (1,122,304 B) and pads to 1024 x 1152 B, but the KDA layer keeps float32
    with pytest.raises(EngineError, match=r"fails at start-up.*Kimi's KDA layer keeps float32"):
        lay("kimi-linear-48b-a3b", mamba_ssm_cache_dtype="bfloat16")
    with pytest.raises(EngineError, match="KDA recurrent state supports only auto, float32, and bfloat16; got float16"):
        lay("kimi-linear-48b-a3b", mamba_ssm_cache_dtype="float16")


def test_pure_mamba2_is_one_group_without_alignment():
    out = lay("mamba2-2.7b")
    page = 3 * (5120 + 2 * 128) * BF16 + 80 * 64 * 128 * BF16  # no torch_dtype: float32 config -> bfloat16
    assert out.model_dtype == "bfloat16"
    assert out.mamba_page == out.page_bytes == page == 1_342_976
    assert out.mode == "none" and not out.prefix_caching
    assert out.groups == (("mamba2", 64),)
    assert out.bytes_per_block == 64 * page
    assert out.blocks_per_request == 1
    assert out.max_model_len == 2048  # the config names no context length
    assert out.log_lines == ()


def _without_class(preset: str):
    spec = load_builtin_preset(preset)
    return spec.model_copy(update={"serving": spec.serving.model_copy(update={"architecture": None})})


@pytest.mark.parametrize(("preset", "name"), [
    ("qwen3-next-80b-a3b", "Qwen3NextForCausalLM"), ("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration"),
    ("granite-4.0-h-tiny", "GraniteMoeHybridForCausalLM"), ("lfm2-1.2b", "Lfm2ForCausalLM"),
])
def test_align_log_line_names_the_hugging_face_class(preset, name):
    # vLLM's config.py logs model_config.architecture, the class in config.json's architectures
    out = lay(preset, max_model_len=4096)
    assert out.log_lines[0] == (f"Mamba cache mode is set to 'align' for {name} by default when prefix caching is "
                                "enabled")


def test_align_log_line_class_without_a_recorded_one():
    # qwen3next is made only from Qwen3NextForCausalLM; lfm2 from five registered names, so it stays unknown
    out = derive(_without_class("qwen3-next-80b-a3b"), VllmSettings(max_model_len=4096))
    assert out.log_lines[0].startswith("Mamba cache mode is set to 'align' for Qwen3NextForCausalLM by default")
    assert "the model records no Hugging Face class: Qwen3NextForCausalLM, the only one" in " ".join(out.notes)
    out = derive(_without_class("lfm2-1.2b"), VllmSettings(max_model_len=4096))
    assert out.log_lines[0].startswith("Mamba cache mode is set to 'align' for <unknown architecture> by default")
    assert ("llama.cpp's converter makes 'lfm2' from Lfm2ForCausalLM, LFM2ForCausalLM, Lfm2Model, "
            "Lfm2BidirectionalModel, Lfm25AudioTokenizer): vLLM's log lines name") in " ".join(out.notes)


@pytest.mark.parametrize("flag", [1024, 2049, 32768, 1 << 20])
def test_config_without_context_length_takes_the_flag_as_given(flag):
    # vLLM 0.33.0 _get_and_verify_max_len: when no context key is found (derived length inf), a given
    # --max-model-len is returned unchecked; the 2048 default applies only without the flag
    out = lay("mamba2-2.7b", max_model_len=flag)
    assert out.max_model_len == flag
    assert f"vLLM takes --max-model-len {flag} as given" in " ".join(out.notes)
    assert not any("assumes 2048" in note for note in out.notes)


def test_estimate_max_model_len_is_the_largest_fitting_length():
    out = lay("nemotron-h-8b-base-8k")
    kv = out.bytes_per_block * 20  # 19 usable blocks: 6 x 3 Mamba blocks leave 1 attention block
    assert estimate_max_model_len(out, kv) == 1040
    assert estimate_max_model_len(out, out.bytes_per_block * 19) == 0


def test_too_little_kv_memory_is_vllms_start_up_error():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    with pytest.raises(EngineError, match=r"estimated maximum model length is 1040\."):
        plan(spec, VllmSettings(kv_cache_memory_bytes=derive(spec, VllmSettings()).bytes_per_block * 20))


def test_max_num_seqs_above_the_mamba_blocks_is_predicted():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    bpb = derive(spec, VllmSettings()).bytes_per_block
    p = plan(spec, VllmSettings(max_num_seqs=100, kv_cache_memory_bytes=bpb * 50))
    assert ("max_num_seqs (100) exceeds available Mamba cache blocks (50). Each decode sequence requires one Mamba "
            "cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most 50 or increase "
            "gpu_memory_utilization.") in p.log_lines
    eager = plan(spec, VllmSettings(max_num_seqs=100, kv_cache_memory_bytes=bpb * 50, enforce_eager=True))
    assert not any("exceeds available Mamba" in line for line in eager.log_lines)


def test_mamba2_groups_tp_must_divide_unless_one_group():
    # Nemotron-H has 8 groups: -tp 16 neither divides them nor meets n_groups == 1 (MambaMixer2 asserts)
    with pytest.raises(EngineError, match="refuses -tp 16: if tensor parallel world size does not divide "
                                          r"num_groups \(8\), then num_groups must equal 1"):
        lay("nemotron-h-8b-base-8k", tensor_parallel_size=16)


@pytest.mark.parametrize(("settings", "message"), [
    ({"tensor_parallel_size": 3}, "is not divisible by the tensor-parallel size 3"),
    ({"max_model_len": 300000}, "--max-model-len 300000 is greater than the derived max_model_len (262144)"),
    ({"max_num_seqs": 9000}, "max_num_batched_tokens (8192"),
    ({"block_size": 24}, "--block-size 24: FLASH_ATTN supports multiples of 16 only"),
    ({"speculative_method": "mtp"}, "--speculative-method needs --num-speculative-tokens"),
])
def test_settings_vllm_refuses(settings, message):
    with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lay("qwen3-next-80b-a3b", **settings)


def test_unserved_models_are_refused_with_vllms_reason():
    with pytest.raises(EngineError, match=r"supported in vLLM until v0\.23\.0"):
        lay("minimax-text-01")
    with pytest.raises(EngineError, match="does not serve arch 'rwkv7'"):
        lay("rwkv7-0.4b-world")


@pytest.mark.parametrize("preset", ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-h-8b-base-8k",
                                    "falcon-h1-0.5b-instruct", "lfm2-1.2b", "lfm2-8b-a1b", "kimi-linear-48b-a3b",
                                    "granite-4.0-h-tiny", "jamba-v0.1", "mamba2-2.7b", "mamba-codestral-7b"])
def test_capacity_flags_pass_vllms_start_up_checks(preset):
    """Re-run the start-up checks with the flags capacity prints: one request fits, max_num_seqs <= blocks."""
    spec = load_builtin_preset(preset)
    budget = ServingBudget(80 * GIB, "test", 20 * GIB, "test", 4 * GIB)
    cap = capacity(spec, VllmSettings(), budget)
    words = cap.flags.split()
    max_model_len, max_num_seqs = int(words[1]), int(words[3])
    chosen = derive(spec, replace(VllmSettings(), max_model_len=max_model_len, max_num_seqs=max_num_seqs),
                    80 * GIB)
    num_blocks = cap.cache_bytes // chosen.bytes_per_block
    assert chosen.bytes_per_block * chosen.blocks_per_request <= cap.cache_bytes - chosen.bytes_per_block
    assert 1 <= max_num_seqs <= num_blocks
    plan(spec, replace(VllmSettings(), max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       kv_cache_memory_bytes=cap.cache_bytes))  # raises if vLLM would refuse


def test_printed_flags_name_the_draft_method():
    spec = load_builtin_preset("qwen3-next-80b-a3b")
    budget = ServingBudget(141 * GIB, "test", 80 * GIB, "test", 4 * GIB)
    mtp = capacity(spec, VllmSettings(num_speculative_tokens=2), budget)
    assert mtp.flags.endswith("""--speculative-config '{"method": "mtp", "num_speculative_tokens": 2}'""")
    ngram = capacity(spec, VllmSettings(num_speculative_tokens=2, speculative_method="ngram"), budget)
    assert ngram.flags.endswith("""--speculative-config '{"method": "ngram", "num_speculative_tokens": 2}'""")
    assert "--speculative-config" not in capacity(spec, VllmSettings(), budget).flags
