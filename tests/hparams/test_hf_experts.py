"""The expert keys llama.cpp's converter writes for a MoE config.json, read back as the spec's expert fields.

For every MoE converter class rsplan reads, a config.json with the real model's numbers (the real copy in
real_configs/ where one is stored, else the numbers the built-in preset's ``source`` names) must give the expert
fields of that preset (each preset is checked against real llama.cpp by tests/golden/) and the same tensor list
(names and shapes) as the preset. The expected values below are the config's own numbers, mapped the way the
converter maps them (llama.cpp 0c1e57098 conversion/):

* TextModel.set_gguf_parameters (base.py:1517, :1520): expert_count from num_local_experts / num_experts /
  n_routed_experts, expert_used_count from num_experts_per_tok / num_experts_per_token / top_k_experts (the first
  key present; nothing when it is null or absent);
* LFM2MoeModel (lfm2.py:111-112): expert_feed_forward_length = moe_intermediate_size, leading_dense_block_count =
  num_dense_layers;
* KimiLinearModel (kimi_linear.py:136-140): moe_intermediate_size, num_shared_experts, first_k_dense_replace;
* MiniMaxText01Model: the base keys only (each expert is intermediate_size wide: feed_forward_length);
* Qwen2MoeModel (qwen.py:83-87; Qwen3NextModel and the Qwen3.5 text models derive from it):
  moe_intermediate_size, shared_expert_intermediate_size;
* NemotronHModel with num_experts_per_tok (nemotron.py:347-351): num_experts_per_tok, moe_intermediate_size,
  moe_shared_expert_intermediate_size, n_routed_experts, n_shared_experts;
* GraniteHybridModel (granite.py:190, GraniteMoeModel): shared_intermediate_size;
* JambaModel (jamba.py:53-54): its own expert count lookups; the expert layers from expert_layer_offset /
  expert_layer_period (jamba.py:64-67), which the GGUF records only through its tensor table.

Where config.json does not decide a weight key, the test takes the preset's (tie_word_embeddings: the converter
writes output.weight when the checkpoint has lm_head.weight, which config.json does not say).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rsplan.errors import ModelFileError, UnsupportedArchError
from rsplan.hparams.hf_config import HFModel, read_hf_config
from rsplan.hparams.sources import load_builtin_preset
from rsplan.hparams.tensors import tensor_list
from rsplan_testing import KIMI_LINEAR_48B

REAL = Path(__file__).resolve().parent / "real_configs"
EXPERT_FIELDS = ("expert_count", "expert_used_count", "expert_feed_forward_length",
                 "expert_shared_feed_forward_length", "expert_shared_count", "leading_dense_block_count",
                 "expert_layers")
L = "linear_attention"
F = "full_attention"

#: Qwen/Qwen3-Next-80B-A3B-Instruct's relevant keys (a faithful copy of the published config.json's)
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "max_position_embeddings": 262144, "vocab_size": 151936, "intermediate_size": 5120, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
#: its checkpoint's MTP layer, as the converter counts it (mtp.layers.N tensors of model.safetensors.index.json)
QWEN3_NEXT_INDEX = {"weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00041.safetensors",
    "mtp.fc.weight": "model-00041-of-00041.safetensors",
    "mtp.layers.0.input_layernorm.weight": "model-00041-of-00041.safetensors",
    "mtp.layers.0.mlp.gate.weight": "model-00041-of-00041.safetensors",
}}
#: Qwen/Qwen3.5-35B-A3B: the numbers preset qwen3.5-35b-a3b's source names (text_config qwen3_5_moe_text)
QWEN35_MOE = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
        "layer_types": [L, L, L, F] * 10, "full_attention_interval": 4, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 262144, "num_experts": 256, "num_experts_per_tok": 8,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "mtp_num_hidden_layers": 1,
        "vocab_size": 248320, "dtype": "bfloat16", "mamba_ssm_dtype": "float32",
    },
}
#: moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (shared with test_hf_config.py)
KIMI_LINEAR = KIMI_LINEAR_48B
#: MiniMaxAI/MiniMax-Text-01: the numbers preset minimax-text-01's source and comments name
MINIMAX_TEXT_01 = {
    "architectures": ["MiniMaxText01ForCausalLM"], "model_type": "minimax_text_01", "hidden_size": 6144,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 10240000, "attn_type_list": ([0] * 7 + [1]) * 10, "intermediate_size": 9216,
    "num_local_experts": 32, "num_experts_per_tok": 2, "vocab_size": 200064, "tie_word_embeddings": False,
    "rotary_dim": 64, "torch_dtype": "bfloat16",
}
#: nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: the numbers preset nemotron-3-nano-30b-a3b's source names
NEMOTRON_3_NANO = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688,
    "num_hidden_layers": 52, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "mamba_num_heads": 64,
    "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "n_routed_experts": 128,
    "num_experts_per_tok": 6, "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712,
    "n_shared_experts": 1, "n_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "vocab_size": 131072, "tie_word_embeddings": False, "use_conv_bias": True, "attention_bias": False,
    "mlp_bias": False, "mamba_proj_bias": False, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
    "mamba_ssm_cache_dtype": "float32",
}
#: ibm-granite/granite-4.0-h-tiny: the numbers preset granite-4.0-h-tiny's source and comments name
GRANITE_4_H_TINY = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 1536,
    "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4,
    "layer_types": ["attention" if il in (5, 15, 25, 35) else "mamba" for il in range(40)],
    "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "max_position_embeddings": 131072, "vocab_size": 100352, "tie_word_embeddings": True,
    "intermediate_size": 512, "shared_intermediate_size": 1024, "num_local_experts": 64, "num_experts_per_tok": 6,
    "torch_dtype": "bfloat16",
}


@dataclass(frozen=True)
class Case:
    preset: str
    config: dict[str, Any] | str  # the config.json, or a real_configs/ folder
    expected: dict[str, Any]  # the expert fields, from the config's numbers
    #: files next to config.json (a dict: JSON; None: an empty file, only its presence matters)
    files: dict[str, Any] = field(default_factory=dict)
    vocab: int | None = None  # the token count config.json gives (None: it does not; the preset's is used)


def _experts(count: int, used: int, ff_exp: int = 0, ff_shexp: int = 0, shared: int = 0, dense_lead: int = 0,
             layers: list[bool] | None = None) -> dict[str, Any]:
    return dict(zip(EXPERT_FIELDS, (count, used, ff_exp, ff_shexp, shared, dense_lead, layers), strict=True))


CASES = {
    # lfm2.py LFM2MoeModel: num_experts 32, num_experts_per_tok 4, moe_intermediate_size 1792, num_dense_layers 2
    "lfm2moe": Case("lfm2-8b-a1b", "lfm2-8b-a1b-augment-multi-ft2", _experts(32, 4, 1792, dense_lead=2), vocab=65536),
    # kimi_linear.py KimiLinearModel: num_experts 256, num_experts_per_token 8, moe_intermediate_size 1024,
    # num_shared_experts 1, first_k_dense_replace 1
    "kimi-linear": Case("kimi-linear-48b-a3b", KIMI_LINEAR, _experts(256, 8, 1024, shared=1, dense_lead=1),
                        vocab=163840),
    # minimax.py MiniMaxText01Model: num_local_experts 32, num_experts_per_tok 2 (experts intermediate_size wide)
    "minimax-01": Case("minimax-text-01", MINIMAX_TEXT_01, _experts(32, 2), vocab=200064),
    # nemotron.py NemotronHModel (MoE): n_routed_experts 128, num_experts_per_tok 6, moe_intermediate_size 1856,
    # moe_shared_expert_intermediate_size 3712, n_shared_experts 1; vocab_size 131072 is a multiple of 8
    "nemotron_h_moe": Case("nemotron-3-nano-30b-a3b", NEMOTRON_3_NANO, _experts(128, 6, 1856, 3712, shared=1),
                           vocab=131072),
    # qwen.py Qwen3NextModel: num_experts 512, num_experts_per_tok 10, moe_intermediate_size 512,
    # shared_expert_intermediate_size 512; the MTP layer counted from the index (block_count 48 + 1)
    "qwen3next": Case("qwen3-next-80b-a3b", QWEN3_NEXT, _experts(512, 10, 512, 512),
                      files={"model.safetensors.index.json": QWEN3_NEXT_INDEX}, vocab=151936),
    # qwen.py Qwen3_5MoeTextModel: num_experts 256, num_experts_per_tok 8, moe_intermediate_size 512,
    # shared_expert_intermediate_size 512; mtp_num_hidden_layers 1
    "qwen35moe": Case("qwen3.5-35b-a3b", QWEN35_MOE, _experts(256, 8, 512, 512), vocab=248320),
    # jamba.py JambaModel: num_experts 16, num_experts_per_tok 2, expert_layer_offset 1 / expert_layer_period 2 (the
    # odd layers); with tokenizer.model (ai21labs/Jamba-v0.1 ships it) the token list is vocab_size 65536 long
    "jamba": Case("jamba-v0.1", "jamba-v0.1", _experts(16, 2, layers=[il % 2 == 1 for il in range(32)]),
                  files={"tokenizer.model": None}, vocab=65536),
    # granite.py GraniteHybridModel: num_local_experts 64, num_experts_per_tok 6, shared_intermediate_size 1024
    # (every expert intermediate_size 512 wide); vocab_size 100352 is a multiple of 8, and with tokenizer.json (the
    # Granite-4.0 repositories ship it) the converter pads the tokenizer's tokens to it
    "granitehybrid": Case("granite-4.0-h-tiny", GRANITE_4_H_TINY, _experts(64, 6, ff_shexp=1024),
                          files={"tokenizer.json": None}, vocab=100352),
}


def _model_dir(tmp_path: Path, config: dict[str, Any] | str, files: dict[str, Any] | None = None,
               name: str = "model") -> Path:
    d = tmp_path / name
    d.mkdir()
    if isinstance(config, str):
        shutil.copy(REAL / config / "config.json", d / "config.json")
    else:
        (d / "config.json").write_text(json.dumps(config))
    for fname, content in (files or {}).items():
        (d / fname).write_text("" if content is None else json.dumps(content))
    return d


def _read(tmp_path: Path, case: Case) -> HFModel:
    return read_hf_config(_model_dir(tmp_path, case.config, case.files))


def _tensors(spec) -> list[tuple[str, tuple[int, ...], bool]]:
    return [(t.name, t.shape, t.loaded) for t in tensor_list(spec)]


def test_every_moe_arch_has_a_case():
    from rsplan.hparams.hf_architectures import CONVERTER_CLASSES

    moe_archs = {"lfm2moe", "kimi-linear", "minimax-01", "nemotron_h_moe", "qwen3next", "qwen35moe", "jamba",
                 "granitehybrid"}
    read = {arch for c in CONVERTER_CLASSES if c.unread is None for arch in c.archs}
    assert moe_archs <= read
    assert set(CASES) == moe_archs


@pytest.mark.parametrize("arch", list(CASES))
def test_config_gives_the_presets_expert_fields(arch, tmp_path):
    case = CASES[arch]
    spec = _read(tmp_path, case).spec
    preset = load_builtin_preset(case.preset)
    assert spec.arch == preset.arch == arch
    got = {k: getattr(spec, k) for k in EXPERT_FIELDS}
    assert got == case.expected
    assert got == {k: getattr(preset, k) for k in EXPERT_FIELDS}


@pytest.mark.parametrize("arch", list(CASES))
def test_config_gives_the_presets_tensor_list(arch, tmp_path):
    case = CASES[arch]
    spec = _read(tmp_path, case).spec
    preset = load_builtin_preset(case.preset)
    assert spec.vocab_size == case.vocab
    assert spec.block_count == preset.block_count
    update: dict[str, Any] = {"tie_word_embeddings": preset.tie_word_embeddings}
    if case.vocab is None:
        update["vocab_size"] = preset.vocab_size
    else:
        assert case.vocab == preset.vocab_size
    assert _tensors(spec.model_copy(update=update)) == _tensors(preset)


def test_sources_name_the_config_keys(tmp_path):
    sources = _read(tmp_path, CASES["lfm2moe"]).loaded.sources
    assert sources["expert_count"] == "num_experts (GGUF lfm2moe.expert_count)"
    assert sources["expert_used_count"] == "num_experts_per_tok (GGUF lfm2moe.expert_used_count)"
    assert sources["expert_feed_forward_length"] == "moe_intermediate_size (GGUF lfm2moe.expert_feed_forward_length)"
    assert sources["leading_dense_block_count"] == "num_dense_layers (GGUF lfm2moe.leading_dense_block_count)"
    kimi = read_hf_config(_model_dir(tmp_path, KIMI_LINEAR, name="kimi")).loaded.sources
    assert kimi["expert_used_count"] == "num_experts_per_token (GGUF kimi-linear.expert_used_count)"
    assert kimi["expert_shared_count"] == "num_shared_experts (GGUF kimi-linear.expert_shared_count)"
    assert kimi["leading_dense_block_count"] == "first_k_dense_replace (GGUF kimi-linear.leading_dense_block_count)"
    nemotron = read_hf_config(_model_dir(tmp_path, NEMOTRON_3_NANO, name="nemotron")).loaded.sources
    assert nemotron["expert_count"] == "n_routed_experts (GGUF nemotron_h_moe.expert_count)"
    assert nemotron["expert_shared_feed_forward_length"] == (
        "moe_shared_expert_intermediate_size (GGUF nemotron_h_moe.expert_shared_feed_forward_length)"
    )
    granite = read_hf_config(_model_dir(tmp_path, GRANITE_4_H_TINY, name="granite")).loaded.sources
    assert granite["expert_count"] == "num_local_experts (GGUF granitehybrid.expert_count)"
    assert granite["expert_shared_feed_forward_length"] == (
        "shared_intermediate_size (GGUF granitehybrid.expert_shared_feed_forward_length)"
    )
    jamba = read_hf_config(_model_dir(tmp_path, "jamba-v0.1", name="jamba")).loaded.sources
    assert jamba["expert_count"] == "num_experts (GGUF jamba.expert_count)"
    assert jamba["expert_layers"] == "expert_layer_offset / expert_layer_period"
    qwen = read_hf_config(_model_dir(tmp_path, QWEN3_NEXT, name="qwen")).loaded.sources
    assert qwen["expert_shared_feed_forward_length"] == (
        "shared_expert_intermediate_size (GGUF qwen3next.expert_shared_feed_forward_length)"
    )


def test_the_reported_command_quantizes_the_lfm2_moe_config(rsplan):
    """The report: ``rsplan estimate -m real_configs/lfm2-8b-a1b-augment-multi-ft2 --quant Q4_K_M -c 4096`` failed
    with "expert_count is needed for the tensor list of arch 'lfm2moe'"."""
    r = rsplan("estimate", "-m", str(REAL / "lfm2-8b-a1b-augment-multi-ft2"), "--quant", "Q4_K_M", "-c", "4096")
    assert r.exit_code == 0, r.output
    assert "llama-quantize Q4_K_M of the converter's bf16 GGUF" in r.output


def test_real_jamba_550m_expert_layers(tmp_path):
    """LaferriereJC/jamba_550M_trained (no preset): num_experts 8, num_experts_per_tok 2, expert_layer_offset 1,
    expert_layer_period 2 over 22 layers: experts on 1, 3, ..., 21."""
    spec = read_hf_config(_model_dir(tmp_path, "jamba-550m-trained")).spec
    assert {k: getattr(spec, k) for k in EXPERT_FIELDS} == _experts(8, 2, layers=[il % 2 == 1 for il in range(22)])


def _without(config: dict[str, Any], *keys: str, **extra: Any) -> dict[str, Any]:
    return {**{k: v for k, v in config.items() if k not in keys}, **extra}


def _real(folder: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((REAL / folder / "config.json").read_text())
    return config


JAMBA = _real("jamba-v0.1")
LFM2_MOE = _real("lfm2-8b-a1b-augment-multi-ft2")


#: configs without a key the converter reads with ``self.hparams[...]`` (it stops there), and rsplan's error
MISSING = {
    "lfm2moe moe_intermediate_size": (
        _without(LFM2_MOE, "moe_intermediate_size"),
        "moe_intermediate_size: required key not found",
    ),
    "lfm2moe num_dense_layers": (
        _without(LFM2_MOE, "num_dense_layers"),
        "num_dense_layers: required key not found",
    ),
    "kimi num_shared_experts": (_without(KIMI_LINEAR, "num_shared_experts"),
                                "num_shared_experts: required key not found"),
    "kimi first_k_dense_replace": (_without(KIMI_LINEAR, "first_k_dense_replace"),
                                   "first_k_dense_replace: required key not found"),
    "kimi moe_intermediate_size null": (_without(KIMI_LINEAR, moe_intermediate_size=None),
                                        "moe_intermediate_size: is null; an integer is required"),
    "nemotron n_routed_experts": (_without(NEMOTRON_3_NANO, "n_routed_experts"),
                                  "n_routed_experts: required key not found"),
    # the converter reads it without the "mamba_" prefix its other lookups add
    "nemotron n_shared_experts (a prefixed key is not read)": (
        _without(NEMOTRON_3_NANO, "n_shared_experts", mamba_n_shared_experts=1),
        "n_shared_experts: required key not found",
    ),
    "nemotron moe_shared_expert_intermediate_size": (
        _without(NEMOTRON_3_NANO, "moe_shared_expert_intermediate_size"),
        "moe_shared_expert_intermediate_size: required key not found",
    ),
    "jamba num_experts": (_without(JAMBA, "num_experts"), "num_local_experts / num_experts: required key not found"),
    "jamba num_experts_per_tok": (_without(JAMBA, "num_experts_per_tok"),
                                  "num_experts_per_tok / num_experts_per_token: required key not found"),
    "jamba expert_layer_offset": (_without(JAMBA, "expert_layer_offset"),
                                  "expert_layer_offset: required key not found"),
    "jamba expert_layer_period": (_without(JAMBA, "expert_layer_period"),
                                  "expert_layer_period: required key not found"),
    "jamba expert_layer_period 0": (_without(JAMBA, expert_layer_period=0), "expert_layer_period: must be > 0"),
    "jamba expert_layer_offset >= period": (
        _without(JAMBA, expert_layer_offset=2),
        "expert_layer_offset: 2 is not below expert_layer_period (2): transformers' JambaConfig refuses it, so "
        "which layers of the checkpoint hold experts is not known",
    ),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_a_key_the_converter_requires_is_named(case, tmp_path):
    config, message = MISSING[case]
    model = _model_dir(tmp_path, config)
    with pytest.raises(ModelFileError) as err:
        read_hf_config(model)
    assert str(err.value) == f"{model / 'config.json'}: {message}"


def test_without_expert_keys_the_tensor_list_names_the_field(tmp_path):
    """The converter writes no expert_count when the config has none of its keys (TextModel reads them with
    optional=True): no default is made up, and the tensor list names the missing field."""
    spec = read_hf_config(_model_dir(tmp_path, _without(QWEN3_NEXT, "num_experts"))).spec
    assert spec.expert_count == 0
    with pytest.raises(UnsupportedArchError, match=r"^model: expert_count is needed for the tensor list of arch "
                                                   r"'qwen3next'$"):
        tensor_list(spec)


def test_a_dense_jamba_has_no_expert_layers(tmp_path):
    """num_experts 1: transformers' Jamba builds a JambaMLP on every layer (experts need num_experts > 1), so the
    checkpoint, and the GGUF, has no ffn_gate_inp anywhere."""
    spec = read_hf_config(_model_dir(tmp_path, _without(JAMBA, num_experts=1, num_experts_per_tok=1))).spec
    assert spec.expert_layers == [False] * 32
    assert spec.expert_count == 1


def test_a_field_the_loader_does_not_read_is_validated_as_it_validates(tmp_path):
    """expert_shared_count is set from the written key after the loader (hf_config.LOADER_UNREAD_KEYS), checked
    against the same bound (MAX_HEADS, 16384) and named by its config key."""
    model = _model_dir(tmp_path, {**KIMI_LINEAR, "num_shared_experts": 1 << 20})
    with pytest.raises(ModelFileError) as err:
        read_hf_config(model)
    assert str(err.value) == (f"{model / 'config.json'}: num_shared_experts (GGUF kimi-linear.expert_shared_count): "
                              "Input should be less than or equal to 16384")
