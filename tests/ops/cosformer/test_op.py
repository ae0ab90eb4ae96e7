"""cosformer_attention against its quadratic reference."""

from __future__ import annotations

import pytest
import torch

import linattn


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("T", [1, 2, 17, 130])
def test_matches_reference(is_causal, T):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, T, generator=g) < 0.25
    mask[:, 0] = False
    for m in (None, mask):
        got = linattn.cosformer_attention(q, k, v, is_causal=is_causal, key_padding_mask=m,
                                          chunk_size=16)
        want = linattn.reference.cosformer_attention(q, k, v, is_causal=is_causal,
                                                     key_padding_mask=m)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_weights_decay_with_distance():
    """Identical positive q and k everywhere: the output is a cosine-weighted mean of v that
    favours near positions — check against the explicit weights."""
    T = 8
    q = k = torch.ones(1, T, 2, dtype=torch.float64)
    v = torch.eye(T, dtype=torch.float64).unsqueeze(0)  # output row i = the weights of row i
    w = linattn.cosformer_attention(q, k, v, eps=0.0)[0]
    assert torch.all(w.diagonal() == w.max(dim=-1).values)
    assert w[0, 1] > w[0, T - 1]


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(is_causal):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(1, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(3)]
    assert torch.autograd.gradcheck(
        lambda *a: linattn.cosformer_attention(*a, is_causal=is_causal), args
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_stay_finite(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = ((torch.rand(2, 512, 8, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    out = linattn.cosformer_attention(q, k, v, is_causal=True)
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_needs_equal_lengths():
    with pytest.raises(ValueError, match="k: cosFormer"):
        linattn.cosformer_attention(torch.randn(4, 2), torch.randn(5, 2), torch.randn(5, 2))
