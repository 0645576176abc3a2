"""The Hugging Face architecture names llama.cpp's converter registers for the archs rsplan sizes, as data.

convert_hf_to_gguf.py picks its converter class by config.json's ``architectures[0]`` (the text config's when that
names architectures; ``get_model_architecture`` in conversion/base.py), not by ``model_type``; each class lists the
names it answers to with ``@ModelBase.register(...)`` (conversion/<file>.py, llama.cpp 0c1e57098). This table holds,
for every converter class whose GGUF carries an arch in ``archs.ARCHS``, those names and the archs it writes.
tests/hparams/test_hf_architectures.py checks it against the converter's source when the source is present.

The same table answers the reverse question for a GGUF file, which records only the llama.cpp arch: which Hugging
Face classes it can have been converted from (``hf_classes``). This module imports nothing heavy: the vLLM rules
read it on the ``rsplan estimate`` path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConverterClass:
    """One converter class of llama.cpp's convert_hf_to_gguf.py.

    Attributes:
        converter: ``"<file>.py <Class>"`` in llama.cpp's conversion/ folder.
        archs: the llama.cpp archs its GGUF files carry (NemotronHModel switches to nemotron_h_moe at run time
            for MoE configs).
        names: every name ``@ModelBase.register`` gives it, in the converter's order.
        model_types: config.json ``model_type`` values rsplan reads as this class when a config names no
            architectures (the converter itself then stops: "Failed to detect model architecture").
        unread: why rsplan cannot read this class's config.json (its GGUF files are still sized); None when it can.
    """

    converter: str
    archs: tuple[str, ...]
    names: tuple[str, ...]
    model_types: tuple[str, ...] = ()
    unread: str | None = None


CONVERTER_CLASSES: tuple[ConverterClass, ...] = (
    ConverterClass("mamba.py MambaModel", ("mamba",),
                   ("MambaForCausalLM", "MambaLMHeadModel", "FalconMambaForCausalLM"), ("mamba", "falcon_mamba")),
    ConverterClass("mamba.py Mamba2Model", ("mamba2",), ("Mamba2ForCausalLM",), ("mamba2",)),
    ConverterClass("rwkv.py Rwkv6Model", ("rwkv6",), ("Rwkv6ForCausalLM",), ("rwkv6",)),
    ConverterClass("rwkv.py RWKV6Qwen2Model", ("rwkv6qwen2",), ("RWKV6Qwen2ForCausalLM",),
                   unread="its converter's keys (Qwen2 attention-derived head counts) are not modelled"),
    ConverterClass("rwkv.py Rwkv7Model", ("rwkv7",), ("Rwkv7ForCausalLM", "RWKV7ForCausalLM"), ("rwkv7",)),
    ConverterClass("rwkv.py ARwkv7Model", ("arwkv7",), ("RwkvHybridForCausalLM",),
                   unread="its converter's keys (the ARWKV hybrid) are not modelled"),
    ConverterClass("lfm2.py LFM2Model", ("lfm2",), ("Lfm2ForCausalLM", "LFM2ForCausalLM"), ("lfm2",)),
    # the embedding variants write LFM2's keys plus pooling / causal-attention flags that leave the cache alone
    ConverterClass("lfm2.py LFM2ColBertModel", ("lfm2",), ("Lfm2Model", "Lfm2BidirectionalModel")),
    # the audio detokenizer adds attention.sliding_window, which LFM2's loader reads
    ConverterClass("lfm2.py LFM25AudioTokenizer", ("lfm2",), ("Lfm25AudioTokenizer",)),
    ConverterClass("lfm2.py LFM2MoeModel", ("lfm2moe",), ("Lfm2MoeForCausalLM",), ("lfm2_moe",)),
    ConverterClass("kimi_linear.py KimiLinearModel", ("kimi-linear",), ("KimiLinearModel", "KimiLinearForCausalLM"),
                   ("kimi_linear",)),
    ConverterClass("minimax.py MiniMaxText01Model", ("minimax-01",),
                   ("MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM"), ("minimax_text_01", "minimax_m1")),
    ConverterClass("qwen.py Qwen3NextModel", ("qwen3next",), ("Qwen3NextForCausalLM",), ("qwen3_next",)),
    ConverterClass("qwen.py Qwen3_5TextModel", ("qwen35",),
                   ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"), ("qwen3_5", "qwen3_5_text")),
    ConverterClass("qwen.py Qwen3_5MoeTextModel", ("qwen35moe",),
                   ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
                   ("qwen3_5_moe", "qwen3_5_moe_text")),
    ConverterClass("minicpm.py MiniCPMV4_6TextModel", ("qwen35",), ("MiniCPMV4_6ForConditionalGeneration",),
                   unread="its converter's keys (MiniCPM-V 4.6's wrapped Qwen3.5 config) are not modelled"),
    ConverterClass("jamba.py JambaModel", ("jamba",), ("JambaForCausalLM",), ("jamba",)),
    ConverterClass("falcon_h1.py FalconH1Model", ("falcon-h1",), ("FalconH1ForCausalLM",), ("falcon_h1",)),
    ConverterClass("plamo.py Plamo2Model", ("plamo2",), ("Plamo2ForCausalLM", "PLaMo2ForCausalLM"),
                   unread="its converter's keys are not modelled"),
    ConverterClass("nemotron.py NemotronHModel", ("nemotron_h", "nemotron_h_moe"), ("NemotronHForCausalLM",),
                   ("nemotron_h",)),
    ConverterClass("nemotron.py NemotronHPuzzleModel", ("nemotron_h_moe",), ("NemotronHPuzzleForCausalLM",),
                   unread="its per-block MoE layout (block_configs) is not modelled"),
    ConverterClass("granite.py GraniteHybridModel", ("granitehybrid",),
                   ("GraniteMoeHybridForCausalLM", "BambaForCausalLM"), ("granitemoehybrid", "bamba")),
)

#: architecture name -> its converter class
BY_NAME: dict[str, ConverterClass] = {name: c for c in CONVERTER_CLASSES for name in c.names}
#: config.json model_type -> the converter class rsplan reads it as when the config names no architectures
BY_MODEL_TYPE: dict[str, ConverterClass] = {t: c for c in CONVERTER_CLASSES for t in c.model_types}


def hf_classes(arch: str) -> tuple[str, ...]:
    """The Hugging Face architecture names whose converter writes llama.cpp arch ``arch``, in table order (empty
    for an arch rsplan does not size)."""
    return tuple(name for c in CONVERTER_CLASSES if arch in c.archs for name in c.names)
