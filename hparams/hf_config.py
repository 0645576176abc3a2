"""Hugging Face config.json -> ModelSpec, the way llama.cpp's converter maps it.

This module is the reader and the public entry (``read_hf_config``, ``load_hf_config``): it reads config.json,
lifts a nested text config to the top and picks the converter class (by ``architectures[0]`` as the converter
picks it, see hf_architectures.py; by ``model_type`` when a config names no architectures). The converter
(hf_converters.py, hf_ssm_converters.py, with the toolkit of hf_base.py) writes the GGUF keys llama.cpp's converter
(convert_hf_to_gguf.py, conversion/<model>.py at llama.cpp 0c1e57098) would write for this config, each tagged
with the config.json keys it came from; ``llama_loader.load_spec`` then reads them exactly as it reads a GGUF
file, so a config.json and the GGUF converted from it give the same ModelSpec. Only the keys that reach the
cache-relevant GGUF keys and the expert keys the tensor list reads (expert counts and widths, shared experts, leading
dense layers; Jamba's expert layers, which a GGUF says only through its tensor table) are read; alias keys live in
hf_aliases.py. The token list's length (``vocab_size``) is the converter's where config.json alone decides it
(hf_vocab.py), else left unset with the reason (``HFModel.vocab_unknown``).

Known limits (the converter reads more than config.json): Qwen3-Next's MTP layer count comes from the
checkpoint's tensor names (read here from model.safetensors.index.json when it is next to config.json, else 0,
as with ``--no-mtp``); transformers defaults that a config.json omits are not filled in, except where noted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rsplan.errors import ModelFileError, UnsupportedArchError
from rsplan.files import path_kind
from rsplan.hparams import hf_aliases as A
from rsplan.hparams.gguf_keys import General, Tokenizer
from rsplan.hparams.hf_architectures import BY_MODEL_TYPE, BY_NAME
from rsplan.hparams.hf_base import HFConverter, HFParams, KeyWriter, WrittenKey, parse_json_text
from rsplan.hparams.hf_converters import WRITERS
from rsplan.hparams.hf_dtypes import HF_DTYPES
from rsplan.hparams.hf_ssm_converters import MAMBA_SSM
from rsplan.hparams.hf_vocab import VocabCount, vocab_count
from rsplan.hparams.llama_loader import LoadedModel, MetaInfo, load_spec, printable
from rsplan.hparams.model import ModelSpec, ServingSpec
from rsplan.hparams.yaml_preset import read_text_file

#: config.json is small (the largest real ones, with a vision tower, are a few KiB).
MAX_CONFIG_BYTES = 4 << 20


class _HFMetadata:
    """llama_loader.Metadata over the keys the converter would write."""

    def __init__(self, w: KeyWriter, arch: str, name: str, where: str, vocab: VocabCount) -> None:
        self.where = where
        self.prefix = f"{arch}."
        self.kv = dict(w.kv)
        self.kv[General.ARCHITECTURE] = WrittenKey(MetaInfo("str"), arch, "model_type")
        self.kv[General.NAME] = WrittenKey(MetaInfo("str"), name, "directory name")
        if vocab.n_vocab is not None:  # the token list's length is all the loader reads of it
            self.kv[Tokenizer.TOKENS] = WrittenKey(MetaInfo("arr", "str", vocab.n_vocab), None, vocab.origin)
        self.wanted = w.wanted

    def _local(self, key: str) -> str:
        return key.removeprefix(self.prefix) if key.startswith(self.prefix) else key

    def info(self, key: str) -> MetaInfo | None:
        entry = self.kv.get(self._local(key))
        return entry.info if entry else None

    def value(self, key: str) -> Any:
        return self.kv[self._local(key)].value

    def describe(self, key: str) -> str:
        local = self._local(key)
        entry = self.kv.get(local)
        if entry is not None:
            return f"{entry.origin} (GGUF {key})"
        looked_for = self.wanted.get(local)
        return f"{looked_for} (GGUF {key})" if looked_for else f"(GGUF {key}, not written by the converter)"


@dataclass(frozen=True)
class HFModel:
    """A config.json read for sizing: the spec, where each number came from, and the converter used."""

    loaded: LoadedModel
    model_type: str | None  # config.json's model_type (None when it names none)
    converter: str
    config_path: str
    #: the architecture name that picked the converter (architectures[0]); None when the config names none
    architecture: str | None = None
    #: why the spec has no vocab_size (the converter's token count needs a file rsplan does not read); None when set
    vocab_unknown: str | None = None
    #: config.json's quantization_config.quant_method ("fp8", "awq", ...): a quantized checkpoint, whose weights
    #: are not torch_dtype's size; None without one
    quant_method: str | None = None
    #: config.json's tie_word_embeddings where it says it (vLLM and SGLang tie the output head to the embedding by
    #: it; llama.cpp's converter goes by the checkpoint's tensors instead); None where it does not
    config_tied: bool | None = None

    @property
    def spec(self) -> ModelSpec:
        return self.loaded.spec


def _read_config(path: Path) -> tuple[dict[str, Any], Path]:
    config = path
    try:
        if path_kind(path) == "dir":
            config = path / "config.json"
        missing = path_kind(config) == "missing"
    except OSError as exc:
        raise ModelFileError(f"{config}: cannot read file: {exc.strerror or exc}") from None
    if missing:
        raise ModelFileError(f"{config}: no such file (a model directory needs a config.json)")
    text = read_text_file(config, MAX_CONFIG_BYTES)
    data = parse_json_text(text, config)
    if not isinstance(data, dict):
        raise ModelFileError(f"{config}: expected a JSON object of config keys, got a {type(data).__name__}")
    return data, config


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    """ModelBase.load_hparams + TextModel.__init__: a nested text config's keys override the top level's."""
    for key in A.TEXT_CONFIG:
        nested = data.get(key)
        if isinstance(nested, dict):
            return {**data, **nested}
    return data


def _names(value: Any, key: str, where: str) -> list[str]:
    """A list of class names (architectures), checked as HFParams.list_of checks lists."""
    if not isinstance(value, list):
        raise ModelFileError(f"{where}: {key}: expected a list, got {type(value).__name__}")
    if not value:
        raise ModelFileError(f"{where}: {key}: expected at least one class name, got an empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ModelFileError(f"{where}: {key}[{i}]: expected str, got {json.dumps(item)[:40]}")
    return value


def _architecture(data: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    """get_model_architecture (conversion/base.py), for text models: ``(name, key it came from)``, or
    ``(None, None)`` when the config names no architectures.

    architectures[0], replaced by the text config's architectures[0] when it has that key (the converter renames
    llm_config / lm_config / ... to text_config first, as ``_flatten`` reads them)."""
    name = key = None
    if data.get("architectures") is not None:
        name, key = _names(data["architectures"], "architectures", where)[0], "architectures[0]"
    for nested_key in A.TEXT_CONFIG:
        nested = data.get(nested_key)
        if isinstance(nested, dict):
            if nested.get("architectures") is not None:
                key = f"{nested_key}.architectures[0]"
                name = _names(nested["architectures"], f"{nested_key}.architectures", where)[0]
            break
    return name, key


def _converter(data: dict[str, Any], where: str) -> tuple[str | None, HFConverter]:
    """The converter class llama.cpp's converter would pick for this config, and the architecture name that picked
    it: by architectures[0] as convert_hf_to_gguf.py does; by model_type when the config names no architectures (the
    converter itself needs them); the raw mamba_ssm layout by its ssm_cfg."""
    name, key = _architecture(data, where)
    if name is not None:
        cls = BY_NAME.get(name)
        if cls is None:
            shown = printable(name[:80])
            raise UnsupportedArchError(
                f"{where}: {key}: '{shown}' is not a class llama.cpp's converter registers for an architecture "
                f"rsplan sizes (convert_hf_to_gguf.py picks its converter by this name; supported: "
                f"{', '.join(sorted(BY_NAME))})"
            )
        if cls.unread is not None:
            raise UnsupportedArchError(
                f"{where}: {key}: '{name}' ({cls.converter}, llama.cpp arch {'/'.join(cls.archs)}): rsplan does "
                f"not read this config.json because {cls.unread}; size the converted GGUF file instead"
            )
        return name, WRITERS[cls.converter]
    if "ssm_cfg" in data:  # get_model_architecture: "<ssm_cfg.layer>ForCausalLM" (see _mamba_ssm)
        return None, MAMBA_SSM
    model_type = data.get("model_type")
    if model_type is None:
        raise ModelFileError(f"{where}: architectures / model_type: required key not found")
    if not isinstance(model_type, str):
        raise ModelFileError(f"{where}: model_type: expected a string, got {json.dumps(model_type)[:40]}")
    cls = BY_MODEL_TYPE.get(model_type)
    if cls is None:
        raise UnsupportedArchError(
            f"{where}: model_type: '{printable(model_type[:60])}' is not supported "
            f"(supported: {', '.join(sorted(BY_MODEL_TYPE))}; a config that names its architectures is read by "
            "them, as llama.cpp's converter reads it)"
        )
    return None, WRITERS[cls.converter]


def _dtype_value(flat: dict[str, Any], aliases: Sequence[str], where: str,
                 sources: dict[str, str], field_name: str) -> str | None:
    """The first of ``aliases`` present, as one of HF_DTYPES ("torch.bfloat16" is read as "bfloat16").

    Another dtype name (a float8 or int8 checkpoint's, "auto") reads as None: the serving engines then treat the
    model like one without the key (vLLM falls back to bfloat16 for dtypes its GPU path does not run), and
    llama.cpp's sizes never depend on it. A value that is not a string is a malformed config."""
    for key in aliases:
        value = flat.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ModelFileError(f"{where}: {key}: expected a dtype name, got {json.dumps(value)[:40]}")
        name = value.removeprefix("torch.")
        if name not in HF_DTYPES:
            return None
        sources[f"serving.{field_name}"] = key
        return name
    return None


def _serving(flat: dict[str, Any], architectures: Any, where: str, sources: dict[str, str]) -> ServingSpec | None:
    """What vLLM and SGLang read beyond the converter's keys: dtypes, the derived max model length and the model
    class (the top level's ``architectures[0]``: vLLM resolves the config's own list, not the text config's; None
    when the config names none of them); ``sources`` gets the key each value came from."""
    architecture = None
    if architectures is not None:
        architecture = _names(architectures, "architectures", where)[0]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", architecture) or len(architecture) > 200:
            raise ModelFileError(f"{where}: architectures[0]: '{printable(architecture[:60])}' is not a class name")
        sources["serving.architecture"] = "architectures[0]"
    lengths: dict[str, int] = {}
    for key in A.SERVING_CONTEXT:
        value = flat.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 32:
            raise ModelFileError(f"{where}: {key}: expected a context length in 1..2**32-1, got "
                                 f"{json.dumps(value)[:40]}")
        lengths[key] = value
    max_len = lengths.get("model_max_length", min(lengths.values(), default=None))
    if max_len is not None:
        key = "model_max_length" if "model_max_length" in lengths else min(lengths, key=lambda k: lengths[k])
        sources["serving.max_model_len"] = key + (" (vLLM: the smallest context key; model_max_length wins)"
                                                  if len(lengths) > 1 else "")
    serving = ServingSpec(
        torch_dtype=_dtype_value(flat, A.TORCH_DTYPE, where, sources, "torch_dtype"),
        mamba_ssm_dtype=_dtype_value(flat, A.MAMBA_SSM_DTYPE, where, sources, "mamba_ssm_dtype"),
        mamba_ssm_cache_dtype=_dtype_value(flat, A.MAMBA_SSM_CACHE_DTYPE, where, sources, "mamba_ssm_cache_dtype"),
        max_model_len=max_len,
        architecture=architecture,
    )
    return serving if any(value is not None for value in serving.model_dump().values()) else None


def _with_spec_fields(loaded: LoadedModel, w: KeyWriter, meta: _HFMetadata) -> LoadedModel:
    """``loaded`` with the converter's ``spec_fields`` (what a GGUF says only through its tensor table), validated
    as the loader validates (a failure names the config keys, as the loader's errors do)."""
    spec = loaded.spec
    update: dict[str, Any] = {}
    sources = dict(loaded.sources)
    for name, (value, origin) in w.spec_fields.items():
        update[name] = value
        sources[name] = origin
    if not update:
        return loaded
    try:
        spec = ModelSpec.model_validate({**spec.model_dump(exclude_unset=True), **update})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = next((str(p) for p in err["loc"] if str(p) in update), ".".join(str(p) for p in err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        raise ModelFileError(f"{meta.where}: {sources.get(field, field)}: {msg}") from None
    return LoadedModel(spec, sources)


#: Archs whose converter drops the checkpoint's output matrix when it equals the embedding (conversion/mamba.py:79
#: output_name, MambaModel.modify_tensors): whether the GGUF has output.weight depends on the data.
_OUTPUT_BY_DATA = frozenset({"mamba"})


def _tied_output(arch: str, cfg: HFParams) -> tuple[bool, str] | None:
    """Whether the converted GGUF has no output.weight (llama.cpp then reuses token_embd), with where that came
    from: the converters of these archs write output.weight exactly when the checkpoint holds an ``lm_head.weight``
    (config.json's tie flag is not read), which model.safetensors.index.json's weight_map says. None where nothing
    next to config.json says it (a bare config.json, one safetensors file) or the data decides (_OUTPUT_BY_DATA):
    the tensor list then counts output.weight and the weights' note says so."""
    if arch in _OUTPUT_BY_DATA:
        return None
    found = cfg.checkpoint_tensor_names
    if found is None:
        return None
    names, index = found
    heads = [n for n in names if (n == "lm_head.weight" or n.endswith(".lm_head.weight")) and "mtp" not in n]
    if heads:
        return False, f"{index.name}: the checkpoint has {heads[0]} (the converter writes it as output.weight)"
    return True, f"{index.name}: no lm_head.weight in the checkpoint (llama.cpp reuses token_embd)"


def read_hf_config(path: str | Path, repo_files: Collection[str] | None = None) -> HFModel:
    """Read a Hugging Face config.json (or a model directory holding one) the way llama.cpp converts it.

    ``repo_files``: the hub repository's file paths when config.json came from one (the token count can depend
    on which tokenizer files exist: hf_vocab.py); None looks next to config.json.

    Raises:
        ModelFileError: unreadable or invalid JSON, a missing, null, wrong-typed or negative key, per-layer
            lists of the wrong length, or values llama.cpp would refuse.
        UnsupportedArchError: an architecture (or, without architectures, a model_type) rsplan does not size.
    """
    path = Path(path)
    data, config = _read_config(path)
    where = str(config)
    architecture, family = _converter(data, where)
    model_type = data.get("model_type") if isinstance(data.get("model_type"), str) else None
    flat = _flatten(data)
    cfg = HFParams(flat, where, config.parent, prefix="mamba" if family.mamba_prefix else None)
    w = KeyWriter()
    arch = family.write(cfg, w)
    vocab = vocab_count(cfg, family.converter, arch, repo_files)
    name = config.parent.name if config.name == "config.json" and config.parent.name else config.stem
    meta = _HFMetadata(w, arch, name, where, vocab)
    loaded = _with_spec_fields(load_spec(meta, fallback_name=name or "config", source=where), w, meta)
    sources = dict(loaded.sources)
    if vocab.n_vocab is not None:
        sources["vocab_size"] = vocab.origin
    update: dict[str, Any] = {"serving": _serving(flat, data.get("architectures"), where, sources)}
    tied = _tied_output(arch, cfg)
    if tied is not None:
        update["tie_word_embeddings"], sources["tie_word_embeddings"] = tied
    spec = loaded.spec.model_copy(update=update)
    loaded = LoadedModel(spec, sources)
    return HFModel(loaded, model_type, family.converter, where, architecture,
                   None if vocab.n_vocab is not None else vocab.origin, _quant_method(data),
                   _config_key(data, "tie_word_embeddings", bool))


def _config_key(data: dict[str, Any], key: str, kind: type) -> Any:
    """``key`` of config.json (top level, else its nested text config) when it is a ``kind``; else None."""
    for where in (data, data.get("text_config")):
        value = where.get(key) if isinstance(where, dict) else None
        if isinstance(value, kind):
            return value
    return None


def _quant_method(data: dict[str, Any]) -> str | None:
    """config.json's ``quantization_config.quant_method`` (top level, or a nested text config's), printable; "unnamed"
    where the section exists without one; None without the section."""
    for where in (data, data.get("text_config")):
        q = where.get("quantization_config") if isinstance(where, dict) else None
        if q is not None:
            method = q.get("quant_method") if isinstance(q, dict) else None
            return printable(method[:40]) if isinstance(method, str) else "unnamed"
    return None


def load_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a config.json file or a model directory (see ``read_hf_config``)."""
    return read_hf_config(path).spec
