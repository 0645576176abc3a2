"""Shape rules of the ggml ops the graphs use (ggml/src/ggml.c), checked on shapes worked out by hand."""

from __future__ import annotations

import pytest

from rsplan.planner.ggml import ops as g


def test_rwkv_wkv7_holds_the_token_rows_then_the_states():
    # 2 heads of 4, 3 tokens, 2 sequences: [S * H, n_tokens + S * n_seqs] = [8, 3 + 4 * 2] f32
    k = g.new_tensor(g.F32, 4, 2, 3)
    state = g.new_tensor(g.F32, 4 * 4 * 2, 2)
    out = g.rwkv_wkv7(k, k, k, k, k, k, state)
    assert out.ne == (8, 11, 1, 1)
    assert out.nbytes == 8 * 11 * 4


def test_binary_ops_broadcast_and_refuse_what_ggml_asserts():
    a = g.new_tensor(g.F32, 6, 4, 2)
    assert g.add(a, g.new_tensor(g.F32, 6, 1, 2)).ne == (6, 4, 2, 1)  # b repeats over a's rows
    assert g.mul(a, g.new_tensor(g.F32, 3)).ne == (6, 4, 2, 1)  # 6 % 3 == 0
    for op in (g.add, g.sub, g.mul, g.div):
        with pytest.raises(g.GGMLAbort, match="ggml_can_repeat"):
            op(a, g.new_tensor(g.F32, 6, 3, 2))  # 4 % 3 != 0
    empty = g.new_tensor(g.F32, 0, 4)
    assert g.add(empty, empty).nbytes == 0  # an empty b repeats only onto an empty a
    with pytest.raises(g.GGMLAbort):
        g.add(a, empty)


def test_reshape_keeps_the_elements_or_aborts_as_ggml_does():
    a = g.new_tensor(g.F32, 6, 4)  # 24 elements
    assert g.reshape(a, 3, 8).ne == (3, 8, 1, 1)
    assert g.reshape(a, 2, 3, 4).nb == (4, 8, 24, 96)
    three = r"GGML_ASSERT\(ggml_nelements\(a\) == ne0\*ne1\*ne2\) fails in ggml_reshape_3d"
    with pytest.raises(g.GGMLAbort, match=three):
        g.reshape(a, 2, 3, 5)  # 30 != 24
    with pytest.raises(g.GGMLAbort, match=r"ne0\*ne1\)"):
        g.reshape(g.new_tensor(g.F32, 6, 0), 6, 4)  # no tokens cannot become 4 (ggml.c:3751 ggml_reshape_3d)
