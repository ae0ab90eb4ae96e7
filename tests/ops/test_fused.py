"""The fused chunked path (ops/fused.py) against the quadratic reference and the portable path.

``dispatch.use(impl="fast")`` forces it on for every length and tiny blocks make even
short sequences span several blocks, so block boundaries, partial chunks and state hand-over
are all exercised."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.feature_maps import FavorPlus, Hedgehog, Polynomial, RandomReLU
from linattn.ops import dispatch
from linattn.ops import linear as linear_mod


@pytest.fixture
def fused_on(fast_path_calls):
    return fast_path_calls(linear_mod, "fused_linear_attention")


MAPS = {
    "elu": "elu",
    "relu": "relu",
    "taylor": "taylor",
    "poly3": Polynomial(3),
    "favor": FavorPlus(5, 12, seed=0).double(),
    "random-relu": RandomReLU(5, 12, seed=0).double(),
}


def _qkv(*batch, T=23, D=5, Dv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(*batch, T, d, generator=g, dtype=torch.float64) * 0.5 for d in (D, D, Dv)
    )


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 4])
def test_matches_reference_with_padding(fused_on, name, is_causal, chunk_size):
    q, k, v = _qkv(2, 3)
    mask = torch.rand(2, 23, generator=torch.Generator().manual_seed(1)) < 0.3
    mask[:, 0] = False
    kw = dict(feature_map=MAPS[name], is_causal=is_causal, key_padding_mask=mask)
    got = linattn.linear_attention(q, k, v, chunk_size=chunk_size, **kw)
    want = linattn.reference.linear_attention(q, k, v, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert fused_on, "the fused path was not taken"


@pytest.mark.parametrize("name", ["elu", "taylor", "favor"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(fused_on, name, is_causal):
    q, k, v = (t.requires_grad_(True) for t in _qkv(1, 2, T=11, D=3, Dv=2))
    mask = torch.zeros(1, 11, dtype=torch.bool)
    mask[0, 4] = True
    fmap = MAPS[name] if name != "favor" else FavorPlus(3, 6, seed=0).double()
    assert torch.autograd.gradcheck(
        lambda *a: linattn.linear_attention(
            *a, feature_map=fmap, is_causal=is_causal, chunk_size=3, key_padding_mask=mask
        ),
        (q, k, v),
    )


def test_gradcheck_through_initial_and_final_state(fused_on):
    q, k, v = _qkv(1, 2, T=10, D=3, Dv=2)
    _, st = linattn.linear_attention(q[..., :4, :], k[..., :4, :], v[..., :4, :], is_causal=True,
                                     return_state=True)
    S, z = st.S.clone().requires_grad_(True), st.z.clone().requires_grad_(True)
    rest = [t[..., 4:, :].clone().requires_grad_(True) for t in (q, k, v)]

    def f(S, z, q, k, v):
        o, s2 = linattn.linear_attention(
            q, k, v, is_causal=True, chunk_size=2, return_state=True,
            initial_state=linattn.LinearAttentionState(S, z),
        )
        return o, s2.S, s2.z

    assert torch.autograd.gradcheck(f, (S, z, *rest))


def test_prefill_continue_and_recurrent_step_agree(fused_on):
    q, k, v = _qkv(2, T=20)
    whole, final = linattn.linear_attention(q, k, v, is_causal=True, return_state=True)
    a, st = linattn.linear_attention(q[:, :13], k[:, :13], v[:, :13], is_causal=True,
                                     return_state=True)
    b, st2 = linattn.linear_attention(q[:, 13:], k[:, 13:], v[:, 13:], is_causal=True,
                                      initial_state=st, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(st2.S, final.S, rtol=1e-10, atol=1e-10)
    o_t, _ = linattn.linear_attention_step(q[:, 13], k[:, 13], v[:, 13], st)
    torch.testing.assert_close(o_t, whole[:, 13], rtol=1e-10, atol=1e-10)


def test_noncausal_cross_lengths(fused_on):
    q, _, _ = _qkv(2, T=9)
    _, k, v = _qkv(2, T=30, seed=1)
    got = linattn.linear_attention(q, k, v)
    torch.testing.assert_close(got, linattn.reference.linear_attention(q, k, v), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_low_precision_matches_portable_path(monkeypatch, dtype, is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = ((torch.rand(1, 2, 3000, 16, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    with dispatch.use(impl="portable"):
        portable = linattn.linear_attention(q, k, v, is_causal=is_causal)
    with dispatch.use(impl="fast"):
        fused = linattn.linear_attention(q, k, v, is_causal=is_causal)
    assert fused.dtype == dtype and torch.isfinite(fused).all()
    tol = 1e-4 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps * 10
    torch.testing.assert_close(fused.double(), portable.double(), rtol=tol, atol=tol)


def test_not_taken_for_trainable_or_positional_maps(fused_on):
    q, k, v = _qkv(2, T=12, D=4)
    h = Hedgehog(4, 3).double()
    out = linattn.linear_attention(q, k, v, feature_map=h)
    out.sum().backward()
    assert h.proj.weight.grad is not None  # trainable map: autograd's path, grads reach it
    linattn.cosformer_attention(q, k, v)
    assert not fused_on
