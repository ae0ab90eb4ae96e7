"""Padded (masked) keys and values may hold anything, nan and inf included: they must not reach
the output nor any gradient, on every path behind ``linattn.linear_attention``.

A masked key used to be mapped by φ first and zeroed afterwards, so the backward formed
0·φ'(nan) = nan in its gradient (the portable path with the Taylor or polynomial maps, the fused
path with any map). Now the key is replaced by 0 before φ, and its gradient is exactly 0."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.feature_maps import FavorPlus
from linattn.ops import dispatch, native
from linattn.ops.linear import op as linear_mod

D, DV, T = 4, 3, 11
MAPS = ["elu", "relu", "taylor", "polynomial", "favor+"]


def _map(name: str):
    return FavorPlus(D, 16, seed=0) if name == "favor+" else name


def _inputs(dtype: torch.dtype, fill: float):
    """q, k, v (2, 2, T, ·), a padding mask (2, T), and k, v with their padded rows filled."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, T, D, generator=g, dtype=torch.float64) * 0.5 for _ in range(2))
    v = torch.randn(2, 2, T, DV, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, T, dtype=torch.bool)
    mask[0, [2, 5, 9]] = True  # inside blocks and chunks, and in the last partial one
    mask[1, [1, 8, 10]] = True
    rows = mask[:, None, :, None]
    k_bad, v_bad = (torch.where(rows, torch.full_like(x, fill), x) for x in (k, v))
    k, v = (torch.where(rows, torch.zeros_like(x), x) for x in (k, v))  # the clean, zeroed ones
    return q, k, v, k_bad.to(dtype), v_bad.to(dtype), mask


@pytest.mark.parametrize("fill", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("impl", ["portable", "fused", "fast"])
def test_masked_keys_and_values_touch_nothing(fast_path_calls, impl, name, is_causal, fill):
    # "fast" in float32 takes the compiled path for elu and relu (where it is built) and the
    # fused one for the other maps; "portable" and "fused" run in float64.
    dtype = torch.float32 if impl == "fast" else torch.float64
    native_calls = fast_path_calls(linear_mod, "native_linear_attention")
    q, k, v, k_bad, v_bad, mask = _inputs(dtype, fill)
    fmap = _map(name)

    # the reference on the clean inputs (padded rows zeroed), with its gradients
    ref_in = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = linattn.reference.linear_attention(
        *ref_in, feature_map=fmap, is_causal=is_causal, key_padding_mask=mask)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want_grads = torch.autograd.grad((want * w).sum(), ref_in)

    got_in = [t.clone().requires_grad_(True) for t in (q.to(dtype), k_bad, v_bad)]
    with dispatch.use(impl=impl, block_size=8, chunk_size=4):
        got = linattn.linear_attention(
            *got_in, feature_map=fmap, is_causal=is_causal, key_padding_mask=mask)
    got_grads = torch.autograd.grad((got * w.to(dtype)).sum(), got_in)

    if impl == "fast" and dtype == torch.float32 and name in ("elu", "relu"):
        assert bool(native_calls) == (native.load() is not None)
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    padded = mask[:, None, :].expand(2, 2, T)
    for what, g, g_want in zip("qkv", got_grads, want_grads, strict=True):
        assert torch.isfinite(g).all(), f"d{what} is not finite"
        if what != "q":
            assert (g[padded] == 0).all(), f"d{what} at padded positions: {g[padded]}"
        torch.testing.assert_close(g.double(), g_want, rtol=tol, atol=tol)
