"""Plain-torch references of the state-row copies that surround every recurrent layer in llama.cpp's graph
(``build_rs``): the zero row, the gather of the input rows, and the copy-back of the extra rows."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, host_rows


def state_gather_ref(
    *, pool: torch.Tensor, rows: Rows, zero_row: int = -1, out: torch.Tensor | None = None
) -> tuple[torch.Tensor]:
    """Zero row ``zero_row`` of ``pool`` (if >= 0), then gather ``rows`` (ggml_get_rows).

    Args:
        pool: [R, F] any dtype; row ``zero_row`` is cleared in place first.
        rows: [E] int; a negative entry is padding (its output row is left as it was).
        zero_row: llama.cpp's ``rs_z``; -1 for none.
        out: [E, F] with the pool's dtype, or None for a new zero-filled tensor.

    Returns:
        (out,): [E, F], ``out[e] = pool[rows[e]]``.
    """
    rows_h = host_rows(rows)
    if out is None:
        out = torch.zeros((len(rows_h), *pool.shape[1:]), dtype=pool.dtype, device=pool.device)
    if zero_row >= 0:
        pool[zero_row] = 0
    for e, r in enumerate(rows_h):
        if r < 0:
            continue
        out[e] = pool[r]
    return (out,)


def state_scatter_ref(*, pool: torch.Tensor, states: torch.Tensor, rows: Rows) -> tuple[()]:
    """Copy ``states[e]`` into row ``rows[e]`` of ``pool`` (the copy-back of llama.cpp's extra states).

    Args:
        pool: [R, F], updated in place.
        states: [E, F] (a separate tensor: the rows gathered earlier in the step).
        rows: [E] int; a negative entry is padding (nothing written).

    Returns:
        ().
    """
    for e, r in enumerate(host_rows(rows)):
        if r < 0:
            continue
        pool[r] = states[e]
    return ()
