"""The GGUF's token count for a config.json (llama.cpp's n_vocab: the rows of token_embd and output), as llama.cpp's
converter decides it, per converter class as data (``VOCAB_RULES``).

Every converter class writes a token list (``tokenizer.ggml.tokens``), and llama.cpp's n_vocab is that list's
length. How long the converter makes it (llama.cpp 0c1e57098):

* ``_set_vocab_gpt2`` (conversion/base.py:1403 set_vocab, the TextModel default; conversion/base.py:1587
  vocab_size in get_vocab_base): config ``vocab_size``, the tokenizer's tokens padded up to it with ``[PAD<i>]``;
  without ``vocab_size`` the tokenizer's own count.
* Mamba-1 / Mamba-2 (conversion/mamba.py:29 set_vocab, conversion/mamba.py:123 set_vocab): ``vocab_size``
  (required) rounded up to ``pad_vocab_size_multiple`` (8 / 16 when the config has none), then the tokenizer padded
  to it; without tokenizer.json / tokenizer.model the built-in GPT-NeoX list (models/ggml-vocab-gpt-neox.gguf,
  50432 tokens) cut to that many (conversion/base.py:2266 vocab_size), so a count above 50432 depends on the
  tokenizer files. GraniteHybridModel forces the multiple to 8 (conversion/granite.py:530 pad_vocab_size_multiple,
  models with SSM layers, the only ones rsplan reads), NemotronHModel too (conversion/nemotron.py:379
  pad_vocab_size_multiple).
* RWKV-6 / RWKV-7 (``_set_vocab_rwkv_world``, conversion/base.py:2207 vocab_size): ``vocab_size`` (65536 when
  absent), the world vocabulary file (rwkv_vocab_v20230424.txt) padded up to it. The converter asserts the file
  is there (conversion/base.py:2206 rwkv_vocab_v20230424), so without it (an RWKV model with another tokenizer,
  e.g. the Pile models' GPT-NeoX one) there is no count; it also asserts the file's tokens fit in vocab_size
  (conversion/base.py:2225 remainder), which rsplan does not check (it does not read the file).
* Jamba (conversion/jamba.py:18 set_vocab): with tokenizer.model, ``_set_vocab_sentencepiece``: ``vocab_size``
  (conversion/base.py:2104 vocab_size); without, ``_set_vocab_llama_hf``: tokenizer.json's own count, which rsplan
  does not read.
* LFM2.5's audio tokenizer (conversion/lfm2.py:250 set_vocab, ``_set_vocab_none``) writes no token list.

Where the count depends on files rsplan does not read, ``vocab_count`` gives no count and says why (never a guess).
The presence of tokenizer files is checked next to config.json (in a local directory, or in a hub repository's
file list).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from rsplan.errors import ModelFileError
from rsplan.files import path_kind
from rsplan.hparams.hf_base import I32_MAX, HFParams

#: tokenizer.ggml.tokens of llama.cpp's models/ggml-vocab-gpt-neox.gguf (the Mamba converters' built-in tokenizer,
#: cut to the count at conversion/base.py:2266 vocab_size)
NEOX_BUILTIN_TOKENS = 50432
#: _set_vocab_rwkv_world's count when the config has no vocab_size (conversion/base.py:2207 vocab_size)
RWKV_WORLD_DEFAULT = 65536
#: the world vocabulary file _set_vocab_rwkv_world asserts and reads (conversion/base.py:2206 rwkv_vocab_v20230424)
RWKV_WORLD_VOCAB = "rwkv_vocab_v20230424.txt"
#: the config key of the token count (``self.hparams["vocab_size"]``: no alias, no "mamba_" prefix)
VOCAB_SIZE = "vocab_size"
#: a gemma3n key _create_vocab_sentencepiece prefers to vocab_size (conversion/base.py:2104 vocab_size)
PER_LAYER_INPUT = "vocab_size_per_layer_input"


@dataclass(frozen=True)
class VocabRule:
    """How one converter class sizes its token list.

    Attributes:
        source: the converter's lines (llama.cpp 0c1e57098 conversion/).
        required: ``hparams["vocab_size"]``: the converter stops without it (no tokenizer fallback).
        default: the count when the config has no vocab_size (None: the tokenizer's own count).
        pad: ``pad_vocab_size_multiple``'s default (None: no rounding up).
        pad_forced: a multiple the converter sets itself, whatever the config says.
        builtin: without tokenizer.json / tokenizer.model the built-in GPT-NeoX list is cut to the count.
        tokenizer_files: the files the converter looks for, in its order (``builtin`` and ``needs``).
        needs: the count is config-only when this file is next to config.json; otherwise the converter takes
            another tokenizer's own count.
        sentencepiece: a tokenizer.model branch reads vocab_size_per_layer_input before vocab_size.
        no_tokens: why the class writes no token list (None: it writes one).
        asserts_file: the converter stops (an assert) unless this file is next to config.json.
    """

    source: str
    required: bool = False
    default: int | None = None
    pad: int | None = None
    pad_forced: int | None = None
    builtin: bool = False
    tokenizer_files: tuple[str, ...] = ()
    needs: str | None = None
    sentencepiece: bool = False
    no_tokens: str | None = None
    asserts_file: str | None = None


_GPT2 = VocabRule("_set_vocab_gpt2: conversion/base.py:1403 set_vocab, conversion/base.py:1587 vocab_size")
_MAMBA1 = VocabRule("MambaModel: conversion/mamba.py:29 set_vocab", required=True, pad=8, builtin=True,
                    tokenizer_files=("tokenizer.json", "tokenizer.model"), sentencepiece=True)
_MAMBA2 = VocabRule("Mamba2Model: conversion/mamba.py:123 set_vocab", required=True, pad=16, builtin=True,
                    tokenizer_files=("tokenizer.model", "tokenizer.json"), sentencepiece=True)
_RWKV = VocabRule(
    "_set_vocab_rwkv_world: conversion/base.py:2206 rwkv_vocab_v20230424, conversion/base.py:2207 vocab_size",
    default=RWKV_WORLD_DEFAULT, asserts_file=RWKV_WORLD_VOCAB)

#: converter class (hf_architectures.CONVERTER_CLASSES) -> its rule; every class rsplan reads
VOCAB_RULES: dict[str, VocabRule] = {
    "mamba.py MambaModel": _MAMBA1,
    "mamba.py Mamba2Model": _MAMBA2,
    "rwkv.py Rwkv6Model": _RWKV,
    "rwkv.py Rwkv7Model": _RWKV,
    "lfm2.py LFM2Model": _GPT2,
    "lfm2.py LFM2ColBertModel": _GPT2,
    "lfm2.py LFM25AudioTokenizer": VocabRule(
        "LFM25AudioTokenizer: conversion/lfm2.py:250 set_vocab", no_tokens="its converter writes no token list "
        "(_set_vocab_none: tokenizer model 'none')"),
    "lfm2.py LFM2MoeModel": _GPT2,
    # _set_vocab_gpt2, else (a tiktoken tokenizer) the kimi-k2 list of range(vocab_size): vocab_size either way
    "kimi_linear.py KimiLinearModel": VocabRule("KimiLinearModel: conversion/kimi_linear.py:23 set_vocab"),
    "minimax.py MiniMaxText01Model": VocabRule("MiniMaxText01Model: conversion/minimax.py:48 set_vocab"),
    "qwen.py Qwen3NextModel": _GPT2,
    "qwen.py Qwen3_5TextModel": _GPT2,
    "qwen.py Qwen3_5MoeTextModel": _GPT2,
    "jamba.py JambaModel": VocabRule(
        "JambaModel: conversion/jamba.py:18 set_vocab, conversion/base.py:2104 vocab_size", needs="tokenizer.model",
        sentencepiece=True),
    "falcon_h1.py FalconH1Model": VocabRule("FalconH1Model: conversion/falcon_h1.py:57 set_vocab"),
    "nemotron.py NemotronHModel": VocabRule("NemotronHModel: conversion/nemotron.py:379 pad_vocab_size_multiple",
                                            required=True, pad_forced=8),
    "granite.py GraniteHybridModel": VocabRule(
        "GraniteHybridModel: conversion/granite.py:530 pad_vocab_size_multiple, conversion/mamba.py:123 set_vocab",
        required=True,
        pad_forced=8, builtin=True, tokenizer_files=("tokenizer.model", "tokenizer.json"), sentencepiece=True),
}
#: the raw mamba_ssm layout (hf_ssm_converters.MAMBA_SSM) converts as MambaModel or Mamba2Model by the arch
BY_ARCH: dict[str, str] = {"mamba": "mamba.py MambaModel", "mamba2": "mamba.py Mamba2Model"}


@dataclass(frozen=True)
class VocabCount:
    """The converter's token count (``n_vocab``) and where it came from, or None and why it is not known."""

    n_vocab: int | None
    origin: str


def _present(directory: Path | None, name: str, repo_files: Collection[str] | None) -> bool:
    """``name`` is next to config.json: in the hub repository's file list when given, else in ``directory``."""
    if repo_files is not None:
        return name in repo_files
    if directory is None:
        return False
    path = directory / name
    try:
        return path_kind(path) == "file"
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read file: {exc.strerror or exc}") from None


def vocab_count(cfg: HFParams, converter: str, arch: str, repo_files: Collection[str] | None = None) -> VocabCount:
    """The GGUF token count llama.cpp's converter writes for this config (see the module docstring).

    Args:
        cfg: the flattened config (text_config lifted), its directory used only to see which tokenizer files exist.
        converter: the converter class (hf_architectures), or the raw mamba_ssm reader's, resolved by ``arch``.
        arch: the llama.cpp arch the converter wrote.
        repo_files: a hub repository's file paths (they say which tokenizer files exist; None: look in
            ``cfg.directory``).

    Raises:
        ModelFileError: vocab_size or pad_vocab_size_multiple present but not a non-negative integer.
    """
    rule = VOCAB_RULES.get(converter) or VOCAB_RULES[BY_ARCH[arch]]
    if rule.no_tokens is not None:
        return VocabCount(None, f"{rule.no_tokens} ({rule.source})")
    if rule.asserts_file is not None and not _present(cfg.directory, rule.asserts_file, repo_files):
        return VocabCount(None, f"without {rule.asserts_file} next to config.json the converter stops (it asserts "
                                f"the file; a model with another tokenizer does not convert) ({rule.source})")
    if VOCAB_SIZE not in cfg.data:
        if rule.default is not None:
            return VocabCount(rule.default, f"default {rule.default} ({rule.source})")
        what = ("the converter requires it (hparams['vocab_size'])" if rule.required
                else "the converter then takes the tokenizer's own token count, which rsplan does not read")
        return VocabCount(None, f"config.json has no vocab_size: {what} ({rule.source})")
    raw = cfg.data[VOCAB_SIZE]
    if raw is None:
        return VocabCount(None, f"vocab_size is null, which the converter cannot use ({rule.source})")
    n = cfg.check_int(VOCAB_SIZE, raw, I32_MAX)
    if n == 0:
        return VocabCount(None, f"vocab_size is 0 ({rule.source})")
    if rule.sentencepiece and PER_LAYER_INPUT in cfg.data:
        return VocabCount(None, f"the config has {PER_LAYER_INPUT}, which the converter's tokenizer.model branch "
                                f"reads instead of vocab_size ({rule.source})")
    if rule.needs is not None and not _present(cfg.directory, rule.needs, repo_files):
        return VocabCount(None, f"without {rule.needs} next to config.json the converter counts tokenizer.json's "
                                f"tokens, which rsplan does not read ({rule.source})")
    origin = f"vocab_size ({rule.source})"
    if rule.pad_forced is None and rule.pad is not None and cfg.data.get("pad_vocab_size_multiple", 0) is None:
        return VocabCount(None, f"pad_vocab_size_multiple is null, which the converter cannot use ({rule.source})")
    if rule.pad_forced is not None or rule.pad is not None:
        n, origin = _padded(cfg, rule, n)
    if rule.builtin and n > NEOX_BUILTIN_TOKENS and not any(_present(cfg.directory, f, repo_files)
                                                                      for f in rule.tokenizer_files):
        return VocabCount(None, f"{origin} = {n} tokens, but without {' or '.join(rule.tokenizer_files)} next to "
                                f"config.json the converter takes the built-in GPT-NeoX list cut to "
                                f"{NEOX_BUILTIN_TOKENS} tokens; rsplan reads no tokenizer file")
    return VocabCount(n, origin)


def _padded(cfg: HFParams, rule: VocabRule, n: int) -> tuple[int, str]:
    """``-(vocab_size // -pad) * pad`` with the converter's multiple, and its origin."""
    if rule.pad_forced is not None:
        pad, k_pad = rule.pad_forced, f"{rule.pad_forced} (set by the converter)"
    elif cfg.data.get("pad_vocab_size_multiple") is not None:
        pad = cfg.check_int("pad_vocab_size_multiple", cfg.data["pad_vocab_size_multiple"], I32_MAX)
        if pad == 0:
            raise cfg.fail("pad_vocab_size_multiple", "must be > 0 (the converter rounds vocab_size up to it)")
        k_pad = f"pad_vocab_size_multiple {pad}"
    else:
        assert rule.pad is not None
        pad, k_pad = rule.pad, f"{rule.pad} (default pad_vocab_size_multiple)"
    return -(n // -pad) * pad, f"vocab_size {n} rounded up to a multiple of {k_pad} ({rule.source})"
