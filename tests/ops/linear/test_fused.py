"""The fused chunked path (ops/linear/fused.py) against the quadratic reference and the portable
path.

``dispatch.use(impl="fast")`` forces it on for every length and tiny blocks make even
short sequences span several blocks, so block boundaries, partial chunks and state hand-over
are all exercised."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import linattn
from linattn.feature_maps import FavorPlus, Hedgehog, Polynomial, RandomReLU
from linattn.ops import dispatch
from linattn.ops.linear import op as linear_mod

SMALL_BLOCKS = {"block_size": 8, "chunk_size": 4}


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


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_low_precision_matches_portable_path(dtype, is_causal, seed):
    """Both paths read the same half-precision inputs, sum in float32 and round the output once
    to ``dtype``. Their float32 results differ only by summation order: T = 3000 terms, a few
    tens of float32 eps at the output scale at most (measured over 8 seeds: up to 26 eps32 for
    float32 inputs, under 2 for float16/bfloat16). Rounding two such nearby values to ``dtype``
    gives the same number or neighbours, so the outputs differ by at most one ulp of ``dtype``
    at the value (≤ eps·|value|, 2^-7 relative for bfloat16) plus that float32 difference: rtol
    = eps of ``dtype``, atol = 64 float32 eps at the output scale (the old bound allowed 16 %
    of the output scale in bfloat16)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.rand(1, 2, 3000, 16, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    with dispatch.use(impl="portable"):
        portable = linattn.linear_attention(q, k, v, is_causal=is_causal)
    with dispatch.use(impl="fast"):
        fused = linattn.linear_attention(q, k, v, is_causal=is_causal)
    assert fused.dtype == dtype and torch.isfinite(fused).all()
    scale = portable.double().abs().max().item()
    atol = 64 * torch.finfo(torch.float32).eps * scale
    torch.testing.assert_close(fused.double(), portable.double(), rtol=torch.finfo(dtype).eps,
                               atol=atol)


def test_not_taken_for_trainable_or_positional_maps(fused_on):
    q, k, v = _qkv(2, T=12, D=4)
    h = Hedgehog(4, 3).double()
    out = linattn.linear_attention(q, k, v, feature_map=h)
    out.sum().backward()
    assert h.proj.weight.grad is not None  # trainable map: autograd's path, grads reach it
    linattn.cosformer_attention(q, k, v)
    assert not fused_on


# ---------------------------------------------------------------------------------------------
# double backward: with create_graph=True the fast paths differentiate a torch recomputation


def _penalty_grads(impl, q, k, v, **kw):
    """∂L/∂(q, k, v) for the gradient penalty L = Σ o·w + Σ (∂(Σ o·w)/∂q)², through ``impl``.
    A first gradient without a graph would silently drop the penalty's own gradient."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    w = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64).to(q.dtype)  # the same weights in every dtype
    with dispatch.use(impl=impl, block_size=8, chunk_size=4):
        fit = (linattn.linear_attention(q, k, v, **kw) * w).sum()
        (gq,) = torch.autograd.grad(fit, q, create_graph=True)
        assert gq.requires_grad, "the first gradient has no graph"
        return torch.autograd.grad(fit + gq.square().sum(), (q, k, v))


@pytest.mark.parametrize("name", ["elu", "taylor", "favor"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradient_penalty_matches_portable(fused_on, name, is_causal):
    q, k, v = _qkv(2, 2, T=13)
    mask = torch.zeros(2, 13, dtype=torch.bool)
    mask[0, 4] = mask[1, 11] = True
    kw = dict(feature_map=MAPS[name], is_causal=is_causal, key_padding_mask=mask)
    got = _penalty_grads("fused", q, k, v, **kw)
    assert fused_on, "the fused path was not taken"
    want = _penalty_grads("portable", q, k, v, **kw)
    for g, g_want in zip(got, want, strict=True):
        torch.testing.assert_close(g, g_want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradgradcheck(fused_on, is_causal):
    q, k, v = (t.requires_grad_(True) for t in _qkv(1, 2, T=7, D=3, Dv=2))
    mask = torch.zeros(1, 7, dtype=torch.bool)
    mask[0, 2] = True
    with dispatch.use(impl="fused", block_size=4, chunk_size=2):
        assert torch.autograd.gradgradcheck(
            lambda *a: linattn.linear_attention(
                *a, feature_map="taylor", is_causal=is_causal, key_padding_mask=mask),
            (q, k, v),
        )
    assert fused_on


def test_gradgradcheck_through_initial_and_final_state(fused_on):
    q, k, v = _qkv(1, 2, T=6, D=3, Dv=2)
    _, st = linattn.linear_attention(q, k, v, is_causal=True, return_state=True)
    inputs = [t.clone().requires_grad_(True) for t in (st.S, st.z, q, k, v)]

    def f(S, z, q, k, v):
        o, s2 = linattn.linear_attention(
            q, k, v, is_causal=True, return_state=True,
            initial_state=linattn.LinearAttentionState(S, z),
        )
        return o, s2.S, s2.z

    with dispatch.use(impl="fused", block_size=4, chunk_size=2):
        assert torch.autograd.gradgradcheck(f, inputs)
        assert torch.autograd.gradgradcheck(lambda *a: f(*a)[1], inputs)  # the state alone


@pytest.mark.skipif(linattn.ops.native.load() is None, reason="compiled path not available")
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradient_penalty_native_matches_portable(fast_path_calls, is_causal):
    calls = fast_path_calls(linear_mod, "native_linear_attention")
    q, k, v = _qkv(1, 2, T=40, D=16, Dv=16)
    got = _penalty_grads("native", *(t.float() for t in (q, k, v)), is_causal=is_causal)
    assert calls, "the native path was not taken"
    want = _penalty_grads("portable", q, k, v, is_causal=is_causal)
    for g, g_want in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), g_want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# sizes: a chunk longer than the sequence, empty batches and sequences

# In a fresh process whose address space is capped at 2 GiB over what torch needs: a chunk of
# 65536 over 5 tokens, not clamped, would allocate 65536² scores per head (34 GB for two) and
# fail here instead of swapping the machine.
_CHUNK_SCRIPT = """
import resource, torch, linattn
from linattn.feature_maps import EluPlusOne
from linattn.ops import dispatch, native
from linattn.ops.linear.fused import fused_linear_attention
impls = ["fused", "portable"] + (["native"] if native.load() is not None else [])
q = torch.randn(1, 2, 64, 4)
for impl in impls:  # warm up: thread pools and libraries are in place before the cap
    with dispatch.use(impl=impl):
        linattn.linear_attention(q, q, q, is_causal=True)
vm = next(int(s.split()[1]) for s in open("/proc/self/status") if s.startswith("VmSize"))
cap = vm * 1024 + (2 << 30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
q, k, v = (torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
want = linattn.reference.linear_attention(q, k, v, is_causal=True)
for impl in impls:
    with dispatch.use(impl=impl):
        got = linattn.linear_attention(q, k, v, is_causal=True, chunk_size=65536)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
got, _ = fused_linear_attention(q, k, v, EluPlusOne(), is_causal=True, keep=None, eps=0.0,
                                chunk=65536, block=65536)  # on its own, without op.py's clamp
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok", *impls)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_huge_chunk_on_a_short_sequence_allocates_little():
    res = subprocess.run([sys.executable, "-c", _CHUNK_SCRIPT], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[0] == "ok"


@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (0, 2, 0, 4), (2, 3, 0, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("impl", ["portable", "fused", "native", "fast"])
def test_empty_batch_or_sequence(impl, is_causal, shape):
    if impl == "native" and linattn.ops.native.load() is None:
        pytest.skip("compiled path not available")
    q, k, v = (torch.randn(shape) for _ in range(3))  # float32 elu: native can take it
    mask = torch.zeros(shape[0], shape[-2], dtype=torch.bool)
    with dispatch.use(impl=impl, **SMALL_BLOCKS):
        with torch.no_grad():
            out = linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
        assert out.shape == shape
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        out = linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
        assert out.shape == shape
        out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == shape for t in (q, k, v))
