"""The quadratic reference is the ground truth: hold it to the definition, written as loops."""

from __future__ import annotations

import pytest
import torch

from linattn import reference

pytestmark = pytest.mark.usefixtures("single_thread")


def _loop_attention(fmap, q, k, v, is_causal, pad=None):
    """o_i = Σ_j w_ij v_j / (Σ_j w_ij + eps), w_ij = φ(q_i)·φ(k_j), over unpadded j (≤ i when
    causal), eps the map's default; 0 where the normaliser is exactly 0."""
    Tq, Tk = q.shape[0], k.shape[0]
    out = torch.zeros(Tq, v.shape[-1], dtype=v.dtype)
    for i in range(Tq):
        js = [j for j in range(Tk) if (not is_causal or j <= i) and (pad is None or not pad[j])]
        if not js:
            continue  # no key at all: zero output
        w = torch.stack([fmap.forward_queries(q[i]) @ fmap.forward_keys(k[j]) for j in js])
        den = w.sum() + fmap.eps
        if den != 0:
            out[i] = (w[:, None] * v[js]).sum(0) / den
    return out


@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_loops(make_map, qkv, is_causal):
    feature_map = make_map(3)
    q, k, v = qkv(2, T=6, D=3, Dv=2)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map, is_causal=is_causal)
    for b in range(2):
        want = _loop_attention(feature_map, q[b], k[b], v[b], is_causal)
        torch.testing.assert_close(ref[b], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_loops_with_padding(make_map, qkv, is_causal):
    feature_map = make_map(3)
    q, k, v = qkv(3, 2, T=5, D=3, Dv=2)
    pad = torch.tensor(
        [[False, True, False, False, True], [True, True, True, True, True], [True] * 4 + [False]]
    )
    ref = reference.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=pad
    )
    for b in range(3):
        for h in range(2):
            want = _loop_attention(feature_map, q[b, h], k[b, h], v[b, h], is_causal, pad[b])
            torch.testing.assert_close(ref[b, h], want, rtol=1e-12, atol=1e-12)


def test_reference_different_lengths(make_map, qkv):
    feature_map = make_map(2)
    q, k, v = qkv(T=3, Tk=7, D=2, Dv=4)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map)
    torch.testing.assert_close(
        ref, _loop_attention(feature_map, q, k, v, False), rtol=1e-12, atol=1e-12
    )
