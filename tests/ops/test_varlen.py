"""Packed variable-length batches (cu_seqlens) equal separate calls, sequence by sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import delta_rule, gated_linear_attention
from linattn.ops.delta.op import l2_normalised

F64 = torch.float64
CU = torch.tensor([0, 7, 7, 20, 33])  # an empty sequence and lengths across chunk boundaries


def _packed(T=33, H=3, K=5, V=4):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, T, K, generator=gen, dtype=F64)
    k = l2_normalised(torch.randn(1, H, T, K, generator=gen, dtype=F64))
    v = torch.randn(1, H, T, V, generator=gen, dtype=F64)
    beta = torch.rand(1, H, T, generator=gen, dtype=F64)
    g = F.logsigmoid(torch.randn(1, H, T, generator=gen, dtype=F64))
    gk = F.logsigmoid(torch.randn(1, H, T, K, generator=gen, dtype=F64))
    S0 = torch.randn(len(CU) - 1, H, K, V, generator=gen, dtype=F64)
    return q, k, v, beta, g, gk, S0


def _piece(x, a, b):
    return x[..., a:b] if x.dim() == 3 else x[..., a:b, :]


@pytest.mark.parametrize("op", ["gla", "delta"])
def test_packed_equals_separate_calls(op):
    q, k, v, beta, g, gk, S0 = _packed()
    if op == "gla":
        def run(q, k, v, beta, g, gk, **kw):
            return gated_linear_attention(q, k, v, g, gk, chunk_size=4, return_state=True, **kw)
    else:
        def run(q, k, v, beta, g, gk, **kw):
            return delta_rule(q, k, v, beta, g, chunk_size=4, return_state=True, **kw)
    o, S = run(q, k, v, beta, g, gk, initial_state=S0, cu_seqlens=CU)
    assert o.shape == v.shape and S.shape == S0.shape
    for n in range(len(CU) - 1):
        a, b = CU[n].item(), CU[n + 1].item()
        on, Sn = run(*(_piece(x, a, b) for x in (q, k, v, beta, g, gk)),
                     initial_state=S0[n:n + 1])
        torch.testing.assert_close(o[..., a:b, :], on)
        torch.testing.assert_close(S[n:n + 1], Sn)


@pytest.mark.parametrize("cu, match", [
    (torch.tensor([0, 5, 30]), "from 0 to T = 33"),
    (torch.tensor([1, 5, 33]), "from 0 to T = 33"),
    (torch.tensor([0, 20, 5, 33]), "non-decreasing"),
    (torch.tensor([0.0, 33.0]), "integer tensor"),
    (torch.tensor([33]), r"shape \(N \+ 1,\)"),
    ([0, 33], "integer torch.Tensor"),
])
def test_bad_cu_seqlens_are_named(cu, match):
    q, k, v, *_ = _packed()
    with pytest.raises((TypeError, ValueError), match=match):
        gated_linear_attention(q, k, v, cu_seqlens=cu)


def test_packed_batches_need_batch_one():
    q, k, v, *_ = _packed()
    q2, k2, v2 = (torch.cat([x, x]) for x in (q, k, v))
    with pytest.raises(ValueError, match="batch dimension of 1"):
        gated_linear_attention(q2, k2, v2, cu_seqlens=CU)


def test_packed_initial_state_has_one_row_per_sequence():
    q, k, v, *_ = _packed()
    with pytest.raises(ValueError, match=r"initial_state: expected shape \(4, 3, 5, 4\)"):
        gated_linear_attention(q, k, v, cu_seqlens=CU, initial_state=torch.zeros(1, 3, 5, 4))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("fmap", ["elu", "taylor"])
def test_linear_attention_packed_equals_separate_calls(is_causal, fmap):
    from linattn import LinearAttentionState, linear_attention

    q, k, v, *_ = _packed()
    kw = {"feature_map": fmap, "is_causal": is_causal, "chunk_size": 4}
    if is_causal:
        gen = torch.Generator().manual_seed(3)
        from linattn.feature_maps import get_feature_map

        L = get_feature_map(fmap).num_features(5)
        S0 = LinearAttentionState(torch.rand(4, 3, L, 4, generator=gen, dtype=F64),
                                  torch.rand(4, 3, L, generator=gen, dtype=F64))
        o, S = linear_attention(q, k, v, cu_seqlens=CU, initial_state=S0, return_state=True, **kw)
    else:
        o = linear_attention(q, k, v, cu_seqlens=CU, **kw)
    for n in range(len(CU) - 1):
        a, b = CU[n].item(), CU[n + 1].item()
        parts = [x[..., a:b, :] for x in (q, k, v)]
        if is_causal:
            S0n = LinearAttentionState(S0.S[n:n + 1], S0.z[n:n + 1])
            on, Sn = linear_attention(*parts, initial_state=S0n, return_state=True, **kw)
            torch.testing.assert_close(S.S[n:n + 1], Sn.S)
            torch.testing.assert_close(S.z[n:n + 1], Sn.z)
        else:
            on = linear_attention(*parts, **kw)
        torch.testing.assert_close(o[..., a:b, :], on)


def test_linear_attention_packed_refuses_a_padding_mask():
    from linattn import linear_attention

    q, k, v, *_ = _packed()
    with pytest.raises(ValueError, match="key_padding_mask: not combinable with cu_seqlens"):
        linear_attention(q, k, v, cu_seqlens=CU, key_padding_mask=torch.zeros(1, 33, dtype=bool))
