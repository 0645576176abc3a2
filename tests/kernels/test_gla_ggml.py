"""The gla kernels against ggml_compute_forward_gla_f32 (ggml-cpu/ops.cpp, llama.cpp 0c1e57098), transcribed
here loop for loop in float64 on flat arrays in ggml's layout: k, v, q, g as [T_total, H, S] with the tokens of
a ubatch grouped by sequence, the states as [n_seqs, H, S, S] (``h * S * S + i * S + j``), the scale applied to
q, and the output rows accumulated over i from zero."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Case, make_call

from rsplan.kernels.gla import gla_ref, gla_torch


def ggml_gla_f64(k, v, q, g, state, scale):
    """ggml's scalar loop (the non-SIMD branch; the SIMD one computes the same sums). Returns (dst, new_state)
    with dst [T_total * C] and new_state [n_seqs * C * S] flat, C = H * S."""
    T, H, S = k.shape
    n_seqs = state.shape[0]
    C = H * S
    k, v, q, g = (x.double().reshape(-1).tolist() for x in (k, v, q, g))
    prev0 = state.double().reshape(-1).tolist()
    dst = [0.0] * (T * C)
    new = [0.0] * (n_seqs * S * C)
    h_stride, h_stride_2d, t_stride = S, S * S, C
    for t in range(T):
        t_offset = t * t_stride
        state_offset = S * C * (t // (T // n_seqs))
        first = t % (T // n_seqs) == 0
        for h in range(H):
            t_h_offset = t_offset + h * h_stride
            h_2d_offset = h * h_stride_2d
            for i in range(S):
                t_h_i_offset = t_h_offset + i
                h_2d_i_offset = h_2d_offset + i * h_stride
                k_val = k[t_h_i_offset]
                q_val = q[t_h_i_offset] * scale
                g_val = g[t_h_i_offset]
                for j in range(S):
                    t_h_j_offset = t_h_offset + j
                    h_2d_i_j_offset = h_2d_i_offset + j
                    v_val = v[t_h_j_offset]
                    kv_val = v_val * k_val
                    prev = (prev0 if first else new)[state_offset + h_2d_i_j_offset]
                    temp_val = prev * g_val + kv_val
                    dst[t_h_j_offset] += temp_val * q_val
                    new[state_offset + h_2d_i_j_offset] = temp_val
    return torch.tensor(dst, dtype=torch.float64), torch.tensor(new, dtype=torch.float64)


@pytest.mark.parametrize("T", [1, 3, 20], ids=["decode", "short", "chunked-prefill"])
@pytest.mark.parametrize("fn", [gla_ref, gla_torch], ids=["reference", "torch"])
def test_gla_matches_ggml_in_float64(fn, T):
    N, H, S = 2, 2, 8
    kw, pool, _ = make_call("gla", Case(N, T, {"H": H, "S": S}, M=2))
    before = pool.clone()
    (y,) = fn(pool=pool, **kw)
    # ggml: [n_seqs * T, H, S] inputs grouped by sequence, the state rows of the ubatch in order
    flat = {n: kw[n].reshape(N * T, H, S) for n in "kvqg"}
    dst, new = ggml_gla_f64(flat["k"], flat["v"], flat["q"], flat["g"], before, S**-0.5)
    torch.testing.assert_close(y.double().reshape(-1), dst, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.double().reshape(-1), new, rtol=1e-5, atol=1e-5)


def test_gla_scale_is_applied_to_q_and_defaults_to_head_size():
    kw, pool, _ = make_call("gla", Case(1, 2, {"H": 1, "S": 4}, M=1))
    (y_default,) = gla_ref(pool=pool.clone(), **kw)
    (y_two,) = gla_ref(pool=pool.clone(), scale=2.0, **kw)
    torch.testing.assert_close(y_two, y_default * 2.0 / 4**-0.5)


def test_gla_is_not_wkv6():
    """The decay comes before the read-out: with g = 0 the output depends on the current token only."""
    kw, pool, _ = make_call("gla", Case(1, 1, {"H": 1, "S": 4}, M=1))
    kw["g"] = torch.zeros_like(kw["g"])
    (y,) = gla_ref(pool=pool, **kw)
    q, k, v = (kw[n][0, 0, 0] for n in "qkv")
    torch.testing.assert_close(y[0, 0, 0], 0.5 * (q @ k) * v)
