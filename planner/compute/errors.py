"""The compute-buffer model's errors, apart so that the graph builders and the searches can raise and catch them
without importing the reserve code."""

from __future__ import annotations

from rsplan.errors import RsplanError


class ComputeModelError(RsplanError):
    """No compute-buffer model for this model (arch not modelled, or a size it needs is unknown)."""


class LlamaAbortError(ComputeModelError):
    """llama.cpp itself aborts while reserving a graph for these flags (a GGML_ASSERT on shapes fails), so no
    context, and no compute buffer, exists (e.g. MiniMax-01 with a KV stream per sequence when n_seq_max does not
    divide the ubatch)."""
