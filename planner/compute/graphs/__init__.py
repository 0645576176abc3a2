"""llama.cpp's reserve graphs, arch by arch (src/models/*.cpp, src/llama-graph.cpp at 0c1e57098), built from shape
rules only so that planner.ggml.alloc can size the compute buffer.

``BUILDERS`` maps a llama.cpp arch name to the function that builds its graph (``module:function`` in this
package, imported on first use so that ``rsplan estimate`` loads only the one it needs); ``MTP_BUILDERS`` the same
for ``--spec-type mtp`` draft contexts (LLM_GRAPH_TYPE_DECODER_MTP). An arch missing here has no compute model."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rsplan.planner.compute.graphs.common import GraphParams
    from rsplan.planner.ggml.alloc import Graph

BUILDERS: dict[str, str] = {
    "mamba": "mamba:build_mamba",
    "mamba2": "mamba:build_mamba",
    "lfm2": "lfm2:build_lfm2",
    "lfm2moe": "lfm2:build_lfm2",
    "qwen35": "qwen35:build_qwen35",
    "qwen35moe": "qwen35:build_qwen35",
    "qwen3next": "qwen35:build_qwen35",
    "nemotron_h": "nemotron_h:build_nemotron_h",
    "nemotron_h_moe": "nemotron_h:build_nemotron_h",
    "falcon-h1": "falcon_h1:build_falcon_h1",
    "rwkv6": "rwkv6:build_rwkv6",
    "rwkv6qwen2": "rwkv6:build_rwkv6qwen2",
    "rwkv7": "rwkv7:build_rwkv7",
    "arwkv7": "rwkv7:build_arwkv7",
    "minimax-01": "minimax:build_minimax_01",
    "jamba": "jamba:build_jamba",
    "kimi-linear": "kimi_linear:build_kimi_linear",
    "granitehybrid": "granite_hybrid:build_granite_hybrid",
    "plamo2": "plamo2:build_plamo2",
}

MTP_BUILDERS: dict[str, str] = {
    "qwen35": "qwen35:build_qwen35_mtp",
    "qwen35moe": "qwen35:build_qwen35_mtp",
    "qwen3next": "qwen35:build_qwen35_mtp",
}


def builder(table: dict[str, str], arch: str) -> Callable[[GraphParams], Graph] | None:
    """The graph builder of ``arch`` in ``table`` (BUILDERS or MTP_BUILDERS), or None."""
    ref = table.get(arch)
    if ref is None:
        return None
    module, func = ref.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)
