"""Every built-in preset, written out as the GGUF llama.cpp's converter would produce (same keys, same value
types), reads back through the GGUF loader as the same model and gives the same plan, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset

FLAGS = [
    ("-c", "32768", "-np", "4"),
    ("-c", "8192", "-np", "3", "--spec-type", "eagle3", "-fa", "off"),
    ("-c", "0", "-np", "2", "-kvu", "-ctk", "bf16", "-ctv", "bf16", "--n-rs-seq", "2"),
]


def gguf_keys(spec: ModelSpec) -> dict[str, Any]:
    """The GGUF metadata (keys without the ``{arch}.`` prefix) that carries ``spec``."""
    kv: dict[str, Any] = {
        "context_length": spec.context_length,
        "embedding_length": spec.embedding_length,
        "block_count": spec.block_count,
        "feed_forward_length": spec.feed_forward_length,
    }
    if spec.nextn_predict_layers:
        kv["nextn_predict_layers"] = spec.nextn_predict_layers
    if spec.full_attention_interval is not None:
        kv["full_attention_interval"] = spec.full_attention_interval
    for key, value in spec.attention.model_dump(exclude_none=True).items():
        if key == "sliding_window" and value == 0:
            continue
        kv[f"attention.{key}"] = value
    for section in ("ssm", "shortconv", "kda"):
        block = getattr(spec, section)
        if block is not None:
            kv.update({f"{section}.{k}": v for k, v in block.model_dump(exclude_none=True).items()})
    if spec.wkv is not None:
        kv["wkv.head_size"] = spec.wkv.head_size
        kv["token_shift_count"] = spec.wkv.token_shift_count  # {arch}.token_shift_count, outside wkv.
    return kv


@pytest.mark.parametrize("name", builtin_preset_names())
def test_preset_and_its_gguf_give_the_same_plan(name, gguf_file, estimate_json):
    spec = load_builtin_preset(name)
    path = gguf_file(spec.arch, gguf_keys(spec), filename=f"{name}.gguf")
    for flags in FLAGS:
        from_preset = estimate_json(name, *flags)
        from_gguf = estimate_json(path, *flags)
        for d in (from_preset, from_gguf):
            d.pop("model")
            # the memory breakdown beside the caches knows the GGUF's weights (none in these metadata-only
            # twins) and names the model in its notes; the cache plan is what must agree
            for key in ("breakdown", "output_buffer", "compute", "model_bytes_exact", "notes", "mtp_draft",
                        "server_host"):
                d.pop(key)
        assert from_gguf == from_preset, (name, flags)
