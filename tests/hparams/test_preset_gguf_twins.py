"""Every built-in preset, written out as the GGUF llama.cpp's converter would produce (same keys, same value
types), reads back through the GGUF loader as the same model and gives the same plan, byte for byte."""

from __future__ import annotations

import pytest

from rsplan.hparams.gguf_keys import spec_metadata
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset

FLAGS = [
    ("-c", "32768", "-np", "4"),
    ("-c", "8192", "-np", "3", "--spec-type", "eagle3", "-fa", "off"),
    ("-c", "0", "-np", "2", "-kvu", "-ctk", "bf16", "-ctv", "bf16", "--n-rs-seq", "2"),
]


@pytest.mark.parametrize("name", builtin_preset_names())
def test_preset_and_its_gguf_give_the_same_plan(name, gguf_file, estimate_json):
    spec = load_builtin_preset(name)
    path = gguf_file(spec.arch, spec_metadata(spec), filename=f"{name}.gguf")
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


#: the ModelSpec fields spec_metadata writes that the loader reads back (the rest are labels, weights or serving
#: facts; full_attention_interval is read only without attention.recurrent_layers, as llama.cpp reads it)
WRITTEN = ("arch", "context_length", "embedding_length", "block_count", "nextn_predict_layers", "feed_forward_length",
           "ssm", "wkv", "shortconv", "kda")
#: RWKV-7's LoRA ranks shape weights only: llama.cpp's hparams loader does not read them
NOT_READ = {"decay_lora_rank", "iclr_lora_rank", "value_residual_mix_lora_rank", "gate_lora_rank"}


@pytest.mark.parametrize("name", builtin_preset_names())
def test_preset_metadata_reads_back_as_the_same_fields(name, gguf_file):
    from rsplan.hparams.gguf_file import load_gguf

    spec = load_builtin_preset(name)
    back = load_gguf(gguf_file(spec.arch, spec_metadata(spec), filename=f"{name}.gguf"))
    assert {f: getattr(back, f) for f in WRITTEN} == {f: getattr(spec, f) for f in WRITTEN}
    attention = {k: v for k, v in spec.attention.model_dump().items() if k not in NOT_READ}
    assert {k: v for k, v in back.attention.model_dump().items() if k not in NOT_READ} == attention
    if spec.attention.recurrent_layers is None:
        assert back.full_attention_interval == spec.full_attention_interval
