"""state_gather / state_scatter: reference and torch path (the Triton row copy is in the interpreter tests)."""

from __future__ import annotations

import pytest
import torch

from rsplan.kernels.state_copy import (
    state_gather_ref,
    state_gather_torch,
    state_scatter_ref,
    state_scatter_torch,
)


@pytest.mark.parametrize("gather", [state_gather_ref, state_gather_torch], ids=["ref", "torch"])
def test_gather_zeroes_rs_z_first_then_copies_rows(gather):
    pool = torch.arange(6 * 5, dtype=torch.float32).view(6, 5)
    before = pool.clone()
    out = torch.full((4, 5), float("nan"))
    gather(pool=pool, rows=[3, 1, -1, 1], zero_row=1, out=out)
    assert torch.equal(out[0], before[3])
    assert torch.equal(out[1], torch.zeros(5)) and torch.equal(out[3], torch.zeros(5))  # read after the zeroing
    assert torch.isnan(out[2]).all()  # padding untouched
    assert torch.equal(pool[1], torch.zeros(5))
    for r in (0, 2, 3, 4, 5):
        assert torch.equal(pool[r], before[r])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_torch_matches_reference(dtype):
    pool = torch.randn(7, 3, 4).to(dtype)
    rows = [6, 0, 2, -1, 5]
    a, b = pool.clone(), pool.clone()
    (o1,) = state_gather_ref(pool=a, rows=rows, zero_row=-1)
    (o2,) = state_gather_torch(pool=b, rows=torch.tensor(rows))
    assert torch.equal(o1, o2) and torch.equal(a, b) and o2.dtype == dtype


@pytest.mark.parametrize("scatter", [state_scatter_ref, state_scatter_torch], ids=["ref", "torch"])
def test_scatter_writes_only_its_rows(scatter):
    pool = torch.zeros(5, 3)
    states = torch.arange(9, dtype=torch.float32).view(3, 3)
    assert scatter(pool=pool, states=states, rows=[4, -1, 1]) == ()
    assert torch.equal(pool[4], states[0]) and torch.equal(pool[1], states[2])
    assert torch.equal(pool[[0, 2, 3]], torch.zeros(3, 3))


def test_scatter_rejects_duplicate_rows_and_rows_outside_the_pool():
    pool = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="rows must be distinct"):
        state_scatter_torch(pool=pool, states=torch.zeros(2, 2), rows=[1, 1])
    with pytest.raises(ValueError, match=r"rows\[0\] = 3 is outside the pool \(3 rows\)"):
        state_gather_torch(pool=pool, rows=[3])
