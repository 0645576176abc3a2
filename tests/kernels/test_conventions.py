"""The references follow llama.cpp's conventions (ggml-cpu's ops.cpp): plane order, group mapping,
tiled heads, the transposed delta-net state, the softplus threshold, which conv planes are written, and the
MiniMax-01 blockwise formulation. Expected values are computed by hand in each test."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_cases import Case, make_call

from rsplan.kernels.conv_state import conv_state_ref
from rsplan.kernels.gated_delta import gated_delta_ref
from rsplan.kernels.lightning import lightning_ref, lightning_slopes
from rsplan.kernels.rwkv6 import rwkv6_ref
from rsplan.kernels.rwkv7 import rwkv7_ref
from rsplan.kernels.ssm_scan import ssm_scan_ref, ssm_scan_torch

F = torch.nn.functional


def test_ssm_plane_p_holds_the_state_after_t_minus_p_tokens():
    T, K, M = 5, 4, 2
    kw, pool, _ = make_call("ssm_scan", Case(1, T, {"H": 2, "P": 3, "G": 1, "S": 8}, K=K, M=M))
    full = pool.clone()
    ssm_scan_ref(pool=full, **kw)
    for p in range(K):
        prefix = pool.clone()
        short = {k: (v[:, : T - p] if k in ("x", "dt", "B", "C") else v) for k, v in kw.items()}
        ssm_scan_ref(pool=prefix, **{**short, "n_planes": 1})
        torch.testing.assert_close(full[p * M], prefix[0], msg=f"plane {p}")


def test_ssm_one_token_decode_writes_plane_0_only():
    kw, pool, _ = make_call("ssm_scan", Case(1, 1, {"H": 2, "P": 3, "G": 1, "S": 8}, K=4, M=2))
    before = pool.clone()
    ssm_scan_torch(pool=pool, **kw)
    assert not torch.equal(pool[0], before[0])
    for p in range(1, 4):
        assert torch.equal(pool[p * 2], before[p * 2])


def test_ssm_heads_share_groups_consecutively():
    # H = 4, G = 2: heads 0, 1 use group 0 and heads 2, 3 group 1 (h // (H / G), not h % G)
    H, P, G, S = 4, 2, 2, 3
    pool = torch.zeros(1, H, P, S)
    x = torch.ones(1, 1, H, P)
    dt = torch.full((1, 1, H), 25.0)  # softplus(25) = 25 exactly (threshold 20)
    A = torch.zeros(H)
    B = torch.stack([torch.full((S,), 1.0), torch.full((S,), 2.0)])[None, None]
    C = torch.ones(1, 1, G, S)
    (y,) = ssm_scan_ref(pool=pool, x=x, dt=dt, A=A, B=B, C=C, src_rows=[0], dst_rows=[0])
    # y = sum_s d * x * B[g] * C = 25 * 3 * B[g]
    assert y[0, 0, :, 0].tolist() == [75.0, 75.0, 150.0, 150.0]


@pytest.mark.parametrize(
    ("dt", "expected"), [(25.0, 25.0), (20.5, 20.5), (0.0, math.log(2.0)), (-3.0, math.log1p(math.exp(-3.0)))]
)
def test_ssm_softplus_threshold(dt, expected):
    pool = torch.zeros(1, 1, 1, 1)
    (y,) = ssm_scan_ref(
        pool=pool,
        x=torch.ones(1, 1, 1, 1),
        dt=torch.full((1, 1, 1), dt),
        A=torch.zeros(1),
        B=torch.ones(1, 1, 1, 1),
        C=torch.ones(1, 1, 1, 1),
        src_rows=[0],
        dst_rows=[0],
    )
    assert y.item() == pytest.approx(expected, rel=1e-6)


def test_mamba1_decays_per_state_element():
    A = torch.tensor([[-1.0, -2.0]])
    pool = torch.ones(1, 1, 1, 2)
    ssm_scan_ref(
        pool=pool,
        x=torch.zeros(1, 1, 1, 1),
        dt=torch.full((1, 1, 1), 25.0),
        A=A,
        B=torch.zeros(1, 1, 1, 2),
        C=torch.zeros(1, 1, 1, 2),
        src_rows=[0],
        dst_rows=[0],
    )
    torch.testing.assert_close(pool[0, 0, 0], torch.exp(torch.tensor([-25.0, -50.0])))


def test_conv_is_cross_correlation_newest_last():
    D, W = 3, 4
    pool = torch.arange(D * (W - 1), dtype=torch.float32).view(1, D, W - 1)
    x = torch.tensor([[[10.0, 20.0, 30.0]]])
    w_last = torch.zeros(D, W)
    w_last[:, W - 1] = 1.0
    (y,) = conv_state_ref(pool=pool.clone(), x=x, weight=w_last, src_rows=[0], dst_rows=[0])
    assert y[0, 0].tolist() == [10.0, 20.0, 30.0]
    w_first = torch.zeros(D, W)
    w_first[:, 0] = 1.0
    (y,) = conv_state_ref(pool=pool.clone(), x=x, weight=w_first, src_rows=[0], dst_rows=[0])
    assert y[0, 0].tolist() == pool[0, :, 0].tolist()  # the oldest window entry


def test_conv_window_shifts_oldest_first():
    pool = torch.tensor([[[1.0, 2.0, 3.0]]])  # D = 1, W = 4
    conv_state_ref(pool=pool, x=torch.tensor([[[4.0], [5.0]]]), weight=torch.ones(1, 4), src_rows=[0], dst_rows=[0])
    assert pool[0, 0].tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize("clamp", [False, True], ids=["mamba2-planes", "delta-net-planes"])
def test_conv_planes_beyond_the_ubatch(clamp):
    M, K = 1, 4  # T = 2 tokens
    pool = torch.full((M * K, 1, 3), -1.0)
    pool[0, 0] = torch.tensor([1.0, 2.0, 3.0])
    x = torch.tensor([[[4.0], [5.0]]])
    conv_state_ref(pool=pool, x=x, weight=torch.ones(1, 4), src_rows=[0], dst_rows=[0], n_planes=K, clamp_planes=clamp)
    assert pool[0, 0].tolist() == [3.0, 4.0, 5.0]  # after 2 tokens
    assert pool[1, 0].tolist() == [2.0, 3.0, 4.0]  # after 1 token
    if clamp:  # planes >= T get the window from before the ubatch
        assert pool[2, 0].tolist() == [1.0, 2.0, 3.0]
        assert pool[3, 0].tolist() == [1.0, 2.0, 3.0]
    else:
        assert pool[2, 0].tolist() == [-1.0, -1.0, -1.0]
        assert pool[3, 0].tolist() == [-1.0, -1.0, -1.0]


def _delta_by_hand(S_kv, q, k, v, g, beta, kda):
    """One token on the untransposed state S[key][value]."""
    S_kv = S_kv * (torch.exp(g)[:, None] if kda else torch.exp(g))
    delta = (v - k @ S_kv) * beta
    S_kv = S_kv + torch.outer(k, delta)
    return S_kv, (q @ S_kv) / math.sqrt(k.numel())


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_delta_state_is_transposed_and_value_heads_tile_key_heads(kda):
    Hk, Hv, D = 2, 4, 5
    kw, pool, _ = make_call("gated_delta", Case(1, 1, {"Hk": Hk, "Hv": Hv, "Dk": D, "Dv": D, "kda": int(kda)}, M=1))
    before = pool.clone()
    (o,) = gated_delta_ref(pool=pool, **kw)
    for h in range(Hv):
        hk = h % Hk  # tiled: value head 2 uses key head 0
        S_kv = before[0, h].T  # stored [value j, key i]
        S_new, o_h = _delta_by_hand(
            S_kv, kw["q"][0, 0, hk], kw["k"][0, 0, hk], kw["v"][0, 0, h], kw["g"][0, 0, h], kw["beta"][0, 0, h], kda
        )
        torch.testing.assert_close(pool[0, h], S_new.T)
        torch.testing.assert_close(o[0, 0, h], o_h)


def test_wkv6_by_hand():
    kw, pool, _ = make_call("rwkv6", Case(1, 1, {"H": 1, "S": 4}, M=1))
    S0 = pool[0, 0].clone()
    (y,) = rwkv6_ref(pool=pool, **kw)
    r, k, v, w = (kw[n][0, 0, 0] for n in "rkvw")
    u = kw["u"][0]
    kv = torch.outer(k, v)  # [key, value]
    torch.testing.assert_close(y[0, 0, 0], r @ (u[:, None] * kv + S0))
    torch.testing.assert_close(pool[0, 0], w[:, None] * S0 + kv)


def test_wkv7_by_hand():
    kw, pool, _ = make_call("rwkv7", Case(1, 1, {"H": 1, "S": 4}, M=1))
    S0 = pool[0, 0].clone()  # [value i, key j]
    (y,) = rwkv7_ref(pool=pool, **kw)
    r, w, k, v, a, b = (kw[n][0, 0, 0] for n in "rwkvab")
    S1 = S0 * w[None, :] + torch.outer(v, k) + torch.outer(S0 @ a, b)
    torch.testing.assert_close(pool[0, 0], S1)
    torch.testing.assert_close(y[0, 0, 0], S1 @ r)


def test_lightning_matches_llamacpp_blockwise_formulation():
    T, H, S = 6, 2, 4
    kw, pool, _ = make_call("lightning", Case(1, T, {"H": H, "S": S}, M=1))
    kw["slope"] = lightning_slopes(H, 3, 8)
    kv_old = pool[0].clone()  # [H, value, key]
    ssum = kw["slope"]
    q, k, v = (kw[n][0].transpose(0, 1) for n in "qkv")  # [H, T, S]
    idx = torch.arange(T, dtype=torch.float32)
    q_decay = torch.exp(-ssum[:, None] * (idx + 1))  # [H, T]
    k_decay = torch.exp(-ssum[:, None] * (T - idx - 1))
    diff = idx[:, None] - idx[None, :]
    diag = torch.where(diff >= 0, torch.exp(-ssum[:, None, None] * diff), torch.zeros(()))  # [H, T, T]
    o_expected = torch.einsum("htk,hvk->htv", q * q_decay[..., None], kv_old)
    o_expected += torch.einsum("hts,hsv->htv", (q @ k.transpose(1, 2)) * diag, v)
    kv_new = kv_old * torch.exp(-ssum * T)[:, None, None] + torch.einsum("htk,htv->hvk", k * k_decay[..., None], v)
    (o,) = lightning_ref(pool=pool, **kw)
    torch.testing.assert_close(o[0].transpose(0, 1), o_expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[0], kv_new, rtol=1e-4, atol=1e-4)


def test_lightning_slopes_follow_llamacpp():
    s = lightning_slopes(64, 0, 80)
    start = 2 ** (-(2 ** -(6 - 3)))
    assert s[0].item() == pytest.approx(start * (1 + 1e-5))
    assert s[5].item() == pytest.approx(start**6 * (1 + 1e-5))
    assert lightning_slopes(8, 79, 80)[0].item() == pytest.approx(0.5 * 1e-5, rel=1e-3)


# -- argument checks ------------------------------------------------------------------------------------


def test_shape_errors_name_the_tensor_and_shapes():
    kw, pool, _ = make_call("ssm_scan", Case(2, 1, {"H": 4, "P": 2, "G": 2, "S": 8}))
    with pytest.raises(ValueError, match=r"dt must have shape \[2, 1, 4\], got \[2, 1, 3\]"):
        ssm_scan_torch(pool=pool, **{**kw, "dt": torch.zeros(2, 1, 3)})
    with pytest.raises(ValueError, match=r"pool rows \(4\) are not a multiple of n_planes \(3\)"):
        ssm_scan_torch(pool=pool, **{**kw, "n_planes": 3})
    with pytest.raises(ValueError, match=r"dst_rows\[1\] = 7 is outside plane 0"):
        ssm_scan_torch(pool=pool, **{**kw, "dst_rows": [0, 7]})
    with pytest.raises(ValueError, match="sequences 0 and 1 both write row 1"):
        ssm_scan_torch(pool=pool, **{**kw, "dst_rows": [1, 1]})
    with pytest.raises(ValueError, match=r"heads \(4\) must be a multiple of groups \(3\)"):
        ssm_scan_ref(pool=pool, **{**kw, "B": torch.zeros(2, 1, 3, 8), "C": torch.zeros(2, 1, 3, 8)})


@pytest.mark.parametrize("impl", [ssm_scan_ref, ssm_scan_torch], ids=["reference", "torch"])
def test_mamba1_has_no_snapshot_planes(impl):
    kw, pool, _ = make_call("ssm_scan", Case(2, 1, {"H": 4, "P": 2, "G": 2, "S": 8}))
    with pytest.raises(ValueError, match=r"Mamba-1 \(A of shape \[H, S\]\) has no snapshot planes: n_planes must be 1"):
        impl(pool=pool, **{**kw, "A": torch.zeros(4, 8), "n_planes": 2})


def test_gated_delta_rejects_a_bad_decay_shape():
    kw, pool, _ = make_call("gated_delta", Case(1, 1, {"Hk": 1, "Hv": 2, "Dk": 4, "Dv": 4}))
    with pytest.raises(ValueError, match=r"g must be \[N, T, Hv\]"):
        gated_delta_ref(pool=pool, **{**kw, "g": torch.zeros(1, 1, 3)})
