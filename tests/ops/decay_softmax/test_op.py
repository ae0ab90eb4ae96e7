"""decay_softmax_attention (the fold of the ALiBi bias into one more coordinate, in query
blocks) against the float64 reference with the materialised bias."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import reference
from linattn.ops.decay_softmax.op import decay_softmax_attention

GAMMAS = torch.tensor([0.75, 0.9, 0.99, 1.0])


def qkv(T: int, S: int, D: int = 8, Dv: int = 8, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, T, D, generator=g, dtype=dtype)
    k = torch.randn(2, 4, S, D, generator=g, dtype=dtype)
    v = torch.randn(2, 4, S, Dv, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("T,S", [(1, 1), (17, 17), (40, 40), (1, 30), (9, 40), (33, 33)])
@pytest.mark.parametrize("block_size", [1, 4, 7, 512])
def test_matches_reference_float64(T, S, block_size):
    q, k, v = qkv(T, S)
    got = decay_softmax_attention(q, k, v, GAMMAS, block_size=block_size)
    want = reference.decay_softmax_attention(q, k, v, GAMMAS)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("D,Dv", [(8, 3), (5, 12), (16, 17)])
def test_value_width_and_scale(D, Dv):
    q, k, v = qkv(20, 26, D, Dv)
    got = decay_softmax_attention(q, k, v, GAMMAS, scale=0.3, block_size=6)
    torch.testing.assert_close(got, reference.decay_softmax_attention(q, k, v, GAMMAS, scale=0.3),
                               rtol=0, atol=1e-12)


def test_reference_is_sdpa_with_the_float_bias():
    """The reference against the obvious implementation it replaces (a float (T, S) mask)."""
    q, k, v = qkv(12, 12)
    lag = torch.arange(12.0)[:, None] - torch.arange(12.0)[None, :]
    bias = torch.where(lag >= 0, lag * GAMMAS.double().log()[:, None, None], -math.inf)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(reference.decay_softmax_attention(q, k, v, GAMMAS), want)


def test_chunk_after_cache_equals_whole():
    """The last T rows of a whole sequence equal a chunk of T queries over all S keys."""
    q, k, v = qkv(50, 50)
    whole = decay_softmax_attention(q, k, v, GAMMAS, block_size=8)
    part = decay_softmax_attention(q[..., 35:, :], k, v, GAMMAS, block_size=8)
    torch.testing.assert_close(part, whole[..., 35:, :], rtol=0, atol=1e-12)


def test_float32_long_sequence_small_gamma():
    """S = 3,000 at γ = 0.75: one offset for the whole sequence would put 860 into the score
    (float32 errors ~1e-4); the block-relative offset keeps the error at float32 level."""
    q, k, v = qkv(300, 3000, 16, 16, dtype=torch.float32)
    got = decay_softmax_attention(q, k, v, GAMMAS, block_size=64)
    want = reference.decay_softmax_attention(q.double(), k.double(), v.double(), GAMMAS)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


def test_bfloat16_computed_in_float32():
    q, k, v = qkv(40, 40, dtype=torch.bfloat16)
    got = decay_softmax_attention(q, k, v, GAMMAS, block_size=16)
    assert got.dtype == torch.bfloat16
    want = reference.decay_softmax_attention(q.double(), k.double(), v.double(), GAMMAS)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-2)


def test_gradients_match_reference():
    q, k, v = (t.requires_grad_() for t in qkv(10, 14, 4, 3))
    gamma = torch.tensor([0.75, 0.9, 0.99, 0.995], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda *a: decay_softmax_attention(*a, block_size=3), (q, k, v, gamma))
    out = decay_softmax_attention(q, k, v, gamma, block_size=4)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v, gamma))
    ref = reference.decay_softmax_attention(q, k, v, gamma)
    want = torch.autograd.grad(ref.pow(2).sum(), (q, k, v, gamma))
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kwargs,match", [
    ({"gamma": torch.tensor([0.5, 0.0, 0.9, 1.0])}, "gamma"),
    ({"gamma": 1.5}, "gamma"),
    ({"scale": -1.0}, "scale"),
    ({"block_size": 0}, "block_size"),
])
def test_bad_arguments_are_named(kwargs, match):
    q, k, v = qkv(4, 4)
    args = {"gamma": GAMMAS, **kwargs}
    with pytest.raises(ValueError, match=match):
        decay_softmax_attention(q, k, v, args.pop("gamma"), **args)


def test_more_queries_than_keys_is_refused():
    q, k, v = qkv(6, 4)
    with pytest.raises(ValueError, match="k: expected at least as many keys"):
        decay_softmax_attention(q, k, v, GAMMAS)


# ----------------------------------------------------------------------------- issue 24


@pytest.mark.parametrize("S", [0, 5])
def test_no_queries_give_an_empty_output(S):
    """T = 0 (also with S = 0 keys) is an empty (..., 0, Dv) output, as in the other ops
    (``torch.cat`` of no blocks used to raise), connected to the inputs for backward."""
    q, k, v = (t.requires_grad_() for t in qkv(0, S, 8, 3))
    out = decay_softmax_attention(q, k, v, GAMMAS)
    assert out.shape == (2, 4, 0, 3) and out.dtype == q.dtype
    assert reference.decay_softmax_attention(q, k, v, GAMMAS).shape == (2, 4, 0, 3)
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and (t.grad == 0).all()


@pytest.mark.parametrize("T,S,block_size", [(1, 1, 512), (1, 4, 512), (5, 5, 2), (3, 7, 2)])
def test_double_backward(T, S, block_size):
    """``create_graph=True`` differentiates a recomputation (the CPU flash kernel's backward is
    not differentiable): second derivatives in float64 against finite differences."""
    q, k, v = (t.requires_grad_() for t in qkv(T, S, 3, 2))
    gamma = torch.tensor([0.75, 0.9, 0.99, 0.995], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, gamma):
        return decay_softmax_attention(q, k, v, gamma, block_size=block_size)

    torch.autograd.gradgradcheck(f, (q, k, v, gamma))
    # and the first gradient built with create_graph equals the plain one
    out = f(q, k, v, gamma)
    g1 = torch.autograd.grad(out.pow(2).sum(), (q, k, v, gamma), create_graph=True)
    g2 = torch.autograd.grad(f(q, k, v, gamma).pow(2).sum(), (q, k, v, gamma))
    for a, b in zip(g1, g2, strict=True):
        assert a.requires_grad
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_gradient_to_some_inputs_only_and_twice_with_retain_graph():
    q, k, v = qkv(6, 9, 4, 3)
    k.requires_grad_()
    out = decay_softmax_attention(q, k, v, GAMMAS, block_size=4)
    w = torch.randn_like(out)
    (g1,) = torch.autograd.grad(out, k, w, retain_graph=True)
    (g2,) = torch.autograd.grad(out, k, w)
    ref = reference.decay_softmax_attention(q, k, v, GAMMAS)
    (want,) = torch.autograd.grad(ref, k, w)
    torch.testing.assert_close(g1, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(g2, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan"), 0.0, -1.0,
                                   pytest.param(10 ** 400, id="10**400")])
def test_scale_must_be_finite_and_positive(scale):
    q, k, v = qkv(10, 10)
    for fn in (decay_softmax_attention, reference.decay_softmax_attention):
        with pytest.raises(ValueError, match=r"^scale: expected a finite positive number"):
            fn(q, k, v, GAMMAS, scale=scale)


@pytest.mark.parametrize("scale", [True, "0.5", [0.5]])
def test_scale_must_be_a_number(scale):
    q, k, v = qkv(4, 4)
    for fn in (decay_softmax_attention, reference.decay_softmax_attention):
        with pytest.raises(TypeError, match=r"^scale: expected a real number or None, got "):
            fn(q, k, v, GAMMAS, scale=scale)


def test_numpy_scalars_are_accepted():
    q, k, v = qkv(9, 9)
    want = decay_softmax_attention(q, k, v, float(np.float32(0.9)), scale=0.5, block_size=4)
    got = decay_softmax_attention(q, k, v, np.float32(0.9), scale=np.float32(0.5),
                                  block_size=np.int64(4))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("block_size", [0, -1, 2.0, True, "4", None])
def test_block_size_must_be_a_positive_integer(block_size):
    q, k, v = qkv(4, 4)
    with pytest.raises(ValueError, match=r"^block_size: expected a positive integer, got "):
        decay_softmax_attention(q, k, v, GAMMAS, block_size=block_size)


def test_huge_block_size_is_one_block():
    q, k, v = qkv(9, 12)
    torch.testing.assert_close(decay_softmax_attention(q, k, v, GAMMAS, block_size=10 ** 30),
                               decay_softmax_attention(q, k, v, GAMMAS), rtol=0, atol=0)


@pytest.mark.parametrize("scale", [torch.finfo(torch.float32).tiny, 1e-30, 1e30, 1e38, 3e38])
@pytest.mark.parametrize("T,S", [(1, 40), (33, 33), (9, 40)])
def test_float32_scales_at_the_ends_of_its_range(scale, T, S):
    """Every scale float32 carries gives the reference's output: 1e-39-like scales made the
    bias coordinate ±inf (it was divided by the scale), 1e38 made the scores inf; both NaN
    everywhere before. Scales beyond √max are computed in float64. The tolerance is float32's
    softmax rounding (the largest scales are a hard arg-max: the same rows of v)."""
    q, k, v = qkv(T, S, dtype=torch.float32, seed=3)
    got = decay_softmax_attention(q, k, v, GAMMAS, scale=scale, block_size=8)
    want = reference.decay_softmax_attention(q.double(), k.double(), v.double(),
                                             GAMMAS.double(), scale=scale)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    tol = 64 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("scale", [1e-39, 1e-46, 4e38])
def test_float32_scales_it_cannot_carry_are_refused(scale):
    q, k, v = qkv(9, 9, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^scale: \S+ is out of the range torch.float32 "):
        decay_softmax_attention(q, k, v, GAMMAS, scale=scale)


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_float64_takes_float64_scales(scale):
    q, k, v = qkv(9, 12)
    got = decay_softmax_attention(q, k, v, GAMMAS, scale=scale, block_size=4)
    want = reference.decay_softmax_attention(q, k, v, GAMMAS, scale=scale)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
