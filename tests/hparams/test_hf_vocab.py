"""The converter's token count (llama.cpp's n_vocab) read from config.json (hparams/hf_vocab.py).

Every expected count is derived here from the config's own numbers with the rule of the converter class
(llama.cpp 0c1e57098 conversion/): Mamba-1 rounds vocab_size up to pad_vocab_size_multiple (8 by default),
Mamba-2 to 16, Nemotron-H and Granite-4.0-H to 8 whatever the config says; the gpt2 / sentencepiece / world
vocabularies are padded to vocab_size exactly; where the count depends on a tokenizer file rsplan does not read,
the spec has no vocab_size and the reason names the file. The golden breakdowns (tests/golden/llamacpp-breakdown,
llama.cpp's own ``n_vocab`` under ``resolved``) and the presets then confirm the config-derived count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rsplan.errors import ModelFileError
from rsplan.hparams.hf_architectures import CONVERTER_CLASSES
from rsplan.hparams.hf_config import read_hf_config
from rsplan.hparams.hf_vocab import NEOX_BUILTIN_TOKENS, VOCAB_RULES
from rsplan.hparams.sources import load_builtin_preset

REAL = Path(__file__).resolve().parent / "real_configs"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp-breakdown"

#: real config folder -> n_vocab derived by hand (None: not given by config.json alone, with a word of the reason)
REAL_COUNTS: dict[str, tuple[int | None, str]] = {
    # state-spaces/mamba-130m: vocab_size 50277, pad_vocab_size_multiple 8 -> 6285 * 8
    "mamba-130m": (50280, "rounded up to a multiple of pad_vocab_size_multiple 8"),
    "mamba-2.8b-arthurz": (50280, "vocab_size 50280 rounded up"),  # already 6285 * 8
    "mamba-2.8b-hf-ikhou-3b": (50280, "vocab_size 50279 rounded up"),  # 50279 -> 6285 * 8
    # state-spaces/mamba2-130m / -2.7b: 50277, pad_vocab_size_multiple 16 -> 3143 * 16
    "mamba2-130m": (50288, "multiple of pad_vocab_size_multiple 16"),
    "mamba2-2.7b": (50288, "multiple of pad_vocab_size_multiple 16"),
    # Mamba-Codestral: 32768 = 2048 * 16, Mamba2Model's default multiple (the config has none)
    "mamba-codestral-7b-hf-molbap": (32768, "16 (default pad_vocab_size_multiple)"),
    "mamba-codestral-7b-mlx-8bit": (32768, "16 (default pad_vocab_size_multiple)"),
    # falcon-mamba: 65024 = 8128 * 8 is above the built-in GPT-NeoX list's 50432, so it needs tokenizer.json
    "falcon-mamba-7b-pre-decay": (None, f"cut to {NEOX_BUILTIN_TOKENS} tokens"),
    # RWKV: the converter asserts the world vocabulary file (only config.json is kept here; see
    # test_rwkv_world_vocabulary_file_decides for the counts with it)
    "rwkv7-0.4b-world": (None, "without rwkv_vocab_v20230424.txt next to config.json the converter stops"),
    "rwkv7-1.5b-world": (None, "without rwkv_vocab_v20230424.txt next to config.json the converter stops"),
    "rwkv7-goose-1.4b-pile-hf": (None, "without rwkv_vocab_v20230424.txt next to config.json the converter stops"),
    # LFM2 (gpt2 vocabulary padded to vocab_size, no rounding: 93083 stays odd)
    "lfm2-1.2b-p-vector": (65536, "_set_vocab_gpt2"),
    "lfm2-700m": (65536, "_set_vocab_gpt2"),
    "lfm2-350m-lfm-tts-malayalam": (93083, "_set_vocab_gpt2"),
    "lfm2-8b-a1b-augment-multi-ft2": (65536, "_set_vocab_gpt2"),
    # Jamba without tokenizer.model: _set_vocab_llama_hf counts tokenizer.json
    "jamba-v0.1": (None, "without tokenizer.model next to config.json"),
    "jamba-v0.1-rev-871ab2b": (None, "without tokenizer.model next to config.json"),
    "jamba-550m-trained": (None, "without tokenizer.model next to config.json"),
}
#: real config folder -> (golden breakdown of the same model, llama.cpp's n_vocab there), tokenizer file to add
GOLDEN_TWINS: dict[str, tuple[str, str | None]] = {
    "mamba-130m": ("mamba-130m-bf16", None),
    "mamba2-130m": ("mamba2-130m-bf16", None),
    "mamba-codestral-7b-hf-molbap": ("mamba-codestral-7b-bf16", None),
    "rwkv7-0.4b-world": ("rwkv7-0.4b-world-bf16", "rwkv_vocab_v20230424.txt"),  # the world repos ship it
    "lfm2-1.2b-p-vector": ("lfm2-1.2b-bf16", None),
    "lfm2-8b-a1b-augment-multi-ft2": ("lfm2-8b-a1b-bf16", None),
    "jamba-v0.1": ("jamba-v0.1-bf16", "tokenizer.model"),  # ai21labs/Jamba-v0.1 ships tokenizer.model
}


def _with_files(tmp_path: Path, folder: str, files: tuple[str, ...]) -> Path:
    d = tmp_path / folder
    d.mkdir()
    shutil.copy(REAL / folder / "config.json", d / "config.json")
    for name in files:
        (d / name).write_bytes(b"")  # only the file's presence matters to the count
    return d


def _dir(tmp_path: Path, config: dict[str, Any], name: str = "model") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_every_converter_class_rsplan_reads_has_a_rule():
    assert set(VOCAB_RULES) == {c.converter for c in CONVERTER_CLASSES if c.unread is None}


def test_every_real_config_has_a_count():
    folders = {p.name for p in REAL.iterdir() if p.is_dir()}
    assert folders - set(REAL_COUNTS) == {"bamba-9b-rev-43f2151"}  # refused for its context keys (test_real_configs)


@pytest.mark.parametrize("folder", sorted(REAL_COUNTS))
def test_real_config_token_count(folder):
    expected, said = REAL_COUNTS[folder]
    h = read_hf_config(REAL / folder)
    assert h.spec.vocab_size == expected
    if expected is None:
        assert h.vocab_unknown is not None and said in h.vocab_unknown
        assert "vocab_size" not in h.loaded.sources
    else:
        assert h.vocab_unknown is None
        assert said in h.loaded.sources["vocab_size"]


@pytest.mark.parametrize("folder", sorted(GOLDEN_TWINS))
def test_config_count_equals_llama_cpp_n_vocab(folder, tmp_path):
    golden, tokenizer = GOLDEN_TWINS[folder]
    data = json.loads((GOLDEN / f"{golden}.json").read_text())
    n_vocab = {case["resolved"]["n_vocab"] for case in data["cases"] if case["resolved"]}
    assert len(n_vocab) == 1
    path = _with_files(tmp_path, folder, (tokenizer,) if tokenizer else ())
    assert read_hf_config(path).spec.vocab_size == n_vocab.pop()
    assert load_builtin_preset(data["model"]["preset"]).vocab_size == read_hf_config(path).spec.vocab_size


def test_tokenizer_files_decide_the_count(tmp_path):
    # Jamba with tokenizer.model: _set_vocab_sentencepiece pads to vocab_size 65536
    assert read_hf_config(_with_files(tmp_path, "jamba-v0.1", ("tokenizer.model",))).spec.vocab_size == 65536
    # falcon-mamba with its tokenizer.json: 65024 = 8128 * 8, not the built-in list's 50432
    h = read_hf_config(_with_files(tmp_path, "falcon-mamba-7b-pre-decay", ("tokenizer.json",)))
    assert h.spec.vocab_size == 65024
    # a hub repository's file list says the same as a directory
    config = REAL / "falcon-mamba-7b-pre-decay" / "config.json"
    assert read_hf_config(config, repo_files=["config.json", "tokenizer.json"]).spec.vocab_size == 65024
    assert read_hf_config(config, repo_files=["config.json"]).spec.vocab_size is None


GRANITE = {
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_d_conv": 4,
    "mamba_n_groups": 1, "mamba_expand": 2, "intermediate_size": 128, "max_position_embeddings": 131072,
}
NEMOTRON = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 4, "hybrid_override_pattern": "M*-M", "num_attention_heads": 4, "num_key_value_heads": 2,
    "attention_head_dim": 32, "intermediate_size": 256, "mamba_num_heads": 8, "mamba_head_dim": 16,
    "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4, "expand": 2, "max_position_embeddings": 8192,
}


@pytest.mark.parametrize(("config", "expected"), [
    # GraniteHybridModel sets the multiple to 8 over the config's 16: 100 -> 13 * 8 (16 would give 112)
    ({**GRANITE, "vocab_size": 100, "pad_vocab_size_multiple": 16}, 104),
    ({**GRANITE, "vocab_size": 100352}, None),  # above 50432 without tokenizer files
    ({**NEMOTRON, "vocab_size": 131073, "pad_vocab_size_multiple": 16}, 131080),  # 16385 * 8
    ({**NEMOTRON, "vocab_size": 131072}, 131072),
    # Mamba-1 with its own multiple; Mamba-2 with its default 16
    ({"architectures": ["MambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1001,
      "pad_vocab_size_multiple": 64}, 1024),
    ({"architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1001}, 1008),
    # gpt2 vocabularies: vocab_size as it is
    ({"architectures": ["FalconH1ForCausalLM"], "vocab_size": 32784}, 32784),
], ids=["granite-forced-8", "granite-above-builtin", "nemotron-forced-8", "nemotron-multiple", "mamba1-own-multiple",
        "mamba2-default-16", "falcon-h1"])
def test_padding_rules(tmp_path, config, expected):
    from rsplan.hparams.hf_base import HFParams
    from rsplan.hparams.hf_config import _converter
    from rsplan.hparams.hf_vocab import vocab_count

    _, family = _converter(config, "config.json")
    arch = {"granite.py GraniteHybridModel": "granitehybrid"}.get(family.converter, "")
    count = vocab_count(HFParams(config, "config.json", _dir(tmp_path, config)), family.converter, arch)
    assert count.n_vocab == expected
    if expected is None:
        assert "tokenizer.model or tokenizer.json" in count.origin


@pytest.mark.parametrize(("config", "reason"), [
    ({"architectures": ["Qwen3NextForCausalLM"]}, "config.json has no vocab_size: the converter then takes the "
     "tokenizer's own token count"),
    ({"architectures": ["MambaForCausalLM"]}, "config.json has no vocab_size: the converter requires it"),
    ({"architectures": ["Lfm2ForCausalLM"], "vocab_size": None}, "vocab_size is null"),
    ({"architectures": ["Lfm25AudioTokenizer"], "vocab_size": 2049}, "writes no token list"),
    ({"architectures": ["Mamba2ForCausalLM"], "vocab_size": 1000, "vocab_size_per_layer_input": 262144},
     "vocab_size_per_layer_input"),
    ({"architectures": ["MambaForCausalLM"], "vocab_size": 1000, "pad_vocab_size_multiple": None},
     "pad_vocab_size_multiple is null"),
], ids=["gpt2-no-vocab-size", "mamba-no-vocab-size", "null", "audio-tokenizer", "per-layer-input", "null-multiple"])
def test_count_not_given_says_why(tmp_path, config, reason):
    from rsplan.hparams.hf_base import HFParams
    from rsplan.hparams.hf_config import _converter
    from rsplan.hparams.hf_vocab import vocab_count

    _, family = _converter(config, "config.json")
    count = vocab_count(HFParams(config, "config.json", _dir(tmp_path, config)), family.converter, "")
    assert count.n_vocab is None and reason in count.origin


def test_rwkv_without_vocab_size_takes_the_world_default(tmp_path):
    from rsplan.hparams.hf_base import HFParams
    from rsplan.hparams.hf_vocab import vocab_count

    folder = _dir(tmp_path, {})
    (folder / "rwkv_vocab_v20230424.txt").write_bytes(b"")
    count = vocab_count(HFParams({}, "config.json", folder), "rwkv.py Rwkv6Model", "rwkv6")
    assert (count.n_vocab, count.origin.split(" (")[0]) == (65536, "default 65536")
    # a hub repository's file list says the same
    assert vocab_count(HFParams({}, "config.json", None), "rwkv.py Rwkv7Model", "rwkv7",
                       repo_files={"config.json", "rwkv_vocab_v20230424.txt"}).n_vocab == 65536
    assert vocab_count(HFParams({}, "config.json", None), "rwkv.py Rwkv7Model", "rwkv7",
                       repo_files={"config.json", "tokenizer.json"}).n_vocab is None


@pytest.mark.parametrize(("folder", "expected"), [
    ("rwkv7-0.4b-world", 65536), ("rwkv7-1.5b-world", 65536),
    # the Pile model's vocab_size is kept as given when the file is there (the converter's later assert that the
    # world tokens fit is not checked: rsplan does not read the file)
    ("rwkv7-goose-1.4b-pile-hf", 50304),
])
def test_rwkv_world_vocabulary_file_decides(folder, expected, tmp_path):
    h = read_hf_config(_with_files(tmp_path, folder, ("rwkv_vocab_v20230424.txt",)))
    assert h.spec.vocab_size == expected and "_set_vocab_rwkv_world" in h.loaded.sources["vocab_size"]


@pytest.mark.parametrize(("extra", "message"), [
    ({"vocab_size": "50277"}, 'vocab_size: expected a non-negative integer, got "50277"'),
    ({"vocab_size": -1}, "vocab_size: must be >= 0, got -1"),
    ({"vocab_size": 50277, "pad_vocab_size_multiple": 0},
     "pad_vocab_size_multiple: must be > 0 (the converter rounds vocab_size up to it)"),
])
def test_malformed_counts_are_refused(tmp_path, extra, message):
    config = {"architectures": ["MambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, **extra}
    path = _dir(tmp_path, config)
    with pytest.raises(ModelFileError) as err:
        read_hf_config(path)
    assert str(err.value) == f"{path / 'config.json'}: {message}"


def test_presets_without_a_golden_twin_take_the_config_count():
    """Presets whose real config is kept here but that have no golden breakdown: the preset's token rows are the
    ones rsplan reads from that config (mamba2-2.7b: 50277 rounded up to a multiple of 16). Its untied output
    is mamba2-130m's (same converter class and checkpoint layout, golden-checked)."""
    preset = load_builtin_preset("mamba2-2.7b")
    assert preset.vocab_size == read_hf_config(REAL / "mamba2-2.7b").spec.vocab_size == 3143 * 16
    assert preset.tie_word_embeddings is load_builtin_preset("mamba2-130m").tie_word_embeddings is False
