"""The bounds of a model's hyper-parameters: llama.cpp's own maxima, and rsplan's far above any real model so that a
corrupt or hostile file cannot declare absurd sizes (the schema, the GGUF reader and the config.json converters
check against them)."""

from __future__ import annotations

#: llama.cpp's LLAMA_MAX_LAYERS.
MAX_LAYERS = 512
#: The largest width any single dimension may have. Real models stay far below (hidden sizes are <= 32768);
#: the bound keeps a corrupt or hostile file from declaring absurd sizes.
MAX_DIM = 1 << 20
#: The largest head count.
MAX_HEADS = 1 << 14
#: src/llama-hparams.h:12 LLAMA_MAX_EXPERTS.
MAX_EXPERTS = 1024
#: The largest training context (uint32 in llama.cpp).
MAX_CTX = (1 << 32) - 1
