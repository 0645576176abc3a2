"""State-row copies around a recurrent layer: ``state_gather`` (zero row + get_rows) and ``state_scatter``
(copy-back of the extra rows). See ``reference.py`` for the semantics."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.state_copy.reference import state_gather_ref, state_scatter_ref
from rsplan.kernels.state_copy.row_copy import gather_bytes, scatter_bytes, state_gather_torch, state_scatter_torch

__all__ = [
    "gather_bytes",
    "scatter_bytes",
    "state_gather",
    "state_gather_ref",
    "state_gather_torch",
    "state_scatter",
    "state_scatter_ref",
    "state_scatter_torch",
]

#: the ops: Triton on CUDA, torch elsewhere (rsplan.kernels.dispatch)
state_gather = dispatched("state_gather", state_gather_torch)
state_scatter = dispatched("state_scatter", state_scatter_torch)
