"""llama.cpp's reserve graphs, arch by arch (src/models/*.cpp, src/llama-graph.cpp at 0c1e57098), built from shape
rules only so that planner.ggml_alloc can size the compute buffer. ``BUILDERS`` maps a llama.cpp arch name to the
function that builds its graph; an arch missing here has no compute-buffer model."""

from __future__ import annotations

from collections.abc import Callable

from rsplan.planner.ggml_alloc import Graph
from rsplan.planner.graphs.common import GraphParams
from rsplan.planner.graphs.lfm2 import build_lfm2
from rsplan.planner.graphs.mamba import build_mamba
from rsplan.planner.graphs.nemotron_h import build_nemotron_h
from rsplan.planner.graphs.qwen35 import build_qwen35, build_qwen35_mtp

#: The graphs of ``--spec-type mtp`` draft contexts (LLM_GRAPH_TYPE_DECODER_MTP).
MTP_BUILDERS: dict[str, Callable[[GraphParams], Graph]] = {
    "qwen35": build_qwen35_mtp,
    "qwen35moe": build_qwen35_mtp,
    "qwen3next": build_qwen35_mtp,
}

BUILDERS: dict[str, Callable[[GraphParams], Graph]] = {
    "mamba": build_mamba,
    "mamba2": build_mamba,
    "lfm2": build_lfm2,
    "lfm2moe": build_lfm2,
    "qwen35": build_qwen35,
    "qwen35moe": build_qwen35,
    "qwen3next": build_qwen35,
    "nemotron_h": build_nemotron_h,
}
