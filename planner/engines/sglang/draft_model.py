"""The draft model of SGLang's speculative decoding (``--speculative-draft-model-path``), read from its config.json.

Paths are relative to SGLang 0.5.23's ``sglang/srt/`` package. The draft's layer count is what the target's cells
reserve and what the draft worker's own pool holds (``model_executor/model_runner_components/
spec_aux_hidden_state.py:156-176``: ``num_nextn_predict_layers`` where the draft's config names it, else
``max(num_hidden_layers, num_attention_layers)``); the draft worker builds that pool from the draft's own
ModelConfig (``mem_cache/kv_cache_configurator.py:470-478``: its KV heads, ``get_num_kv_heads(tp)`` =
``max(1, heads // tp)``, and head dim).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsplan.planner.engines.base import EngineError

#: The largest config.json read (a model's config is a few KiB).
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class DraftModel:
    """What SGLang reads of a draft model for its KV.

    Attributes:
        layers: ``eagle_draft_num_layers``: the layers the target's cells reserve and the draft pool holds.
        kv_heads: the draft's num_key_value_heads (all ranks).
        head_dim: the draft's head dim (``head_dim``, else ``hidden_size / num_attention_heads``).
        source: where it was read.
    """

    layers: int
    kv_heads: int
    head_dim: int
    source: str

    def kv_elements(self, tp: int) -> int:
        """K and V elements per token and layer on one of ``tp`` ranks: ``2 * max(1, kv_heads // tp) * head_dim``."""
        return 2 * max(1, self.kv_heads // tp) * self.head_dim


def _positive(config: dict[str, Any], key: str, where: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1 << 20:
        raise EngineError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def read_draft_model(ref: str) -> DraftModel:
    """The draft model of ``--speculative-draft-model-path``: a local config.json, or a folder holding one.

    Raises:
        EngineError: no such file (a Hugging Face id is not fetched: its config.json is asked for), a file that is
            not a config, or a config without the fields SGLang sizes the draft's KV from.
    """
    path = Path(ref)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise EngineError(f"--speculative-draft-model-path {ref}: no config.json there (rsplan reads the draft's "
                          "config.json from a file or a folder holding it; download it for a Hugging Face id)")
    where = f"--speculative-draft-model-path {path}"
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise EngineError(f"{where}: {path.stat().st_size:,} bytes is not a model's config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineError(f"{where}: not a JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise EngineError(f"{where}: not a JSON object")
    text = config.get("text_config")
    config = {**config, **text} if isinstance(text, dict) else config
    nextn = _positive(config, "num_nextn_predict_layers", where)
    hidden = _positive(config, "num_hidden_layers", where)
    layers = nextn or hidden
    if layers is None:
        raise EngineError(f"{where}: no num_hidden_layers (or num_nextn_predict_layers)")
    heads = _positive(config, "num_attention_heads", where)
    kv_heads = _positive(config, "num_key_value_heads", where) or heads
    head_dim = _positive(config, "head_dim", where)
    if head_dim is None:
        size = _positive(config, "hidden_size", where)
        if size is None or heads is None or size % heads:
            raise EngineError(f"{where}: no head_dim, and hidden_size / num_attention_heads does not give it")
        head_dim = size // heads
    if kv_heads is None:
        raise EngineError(f"{where}: no num_key_value_heads or num_attention_heads")
    return DraftModel(layers, kv_heads, head_dim, str(path))
