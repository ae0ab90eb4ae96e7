"""linattn.linear_attention (non-causal and chunked causal) against the quadratic reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linattn
from linattn import reference
from linattn.feature_maps import FavorPlus
from linattn.ops import dispatch, native
from linattn.ops.linear import op as linear_mod
from linattn.ops.linear.op import DEFAULT_CHUNK_SIZE

pytestmark = pytest.mark.usefixtures("single_thread")

SHAPES = [  # (batch dims, T, D, Dv)
    ((2, 3), 1, 4, 3),  # T = 1
    ((2, 3), 7, 4, 3),  # odd T, D != Dv
    ((2,), 9, 3, 5),  # 3-D input
    ((), 5, 4, 2),  # 2-D input (T, D)
    ((2, 1, 2), 13, 2, 6),  # three leading batch dims
    ((1, 2), 2 * DEFAULT_CHUNK_SIZE + 3, 3, 2),  # several default chunks plus a ragged tail
]


# ---------------------------------------------------------------------------------------------
# agreement with the reference


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("batch,T,D,Dv", SHAPES)
def test_matches_reference_float64(
    linear_path, make_map, qkv, assert_close, is_causal, batch, T, D, Dv
):
    q, k, v = qkv(*batch, T=T, D=D, Dv=Dv)
    feature_map = make_map(D)
    out = linattn.linear_attention(q, k, v, feature_map=feature_map, is_causal=is_causal)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map, is_causal=is_causal)
    assert out.dtype == torch.float64
    assert out.shape == (*batch, T, Dv)
    assert_close(out, ref)


@pytest.mark.parametrize("Tq,Tk", [(1, 6), (7, 3), (5, 11)])
def test_non_causal_different_lengths(linear_path, make_map, qkv, assert_close, Tq, Tk):
    q, k, v = qkv(2, 3, T=Tq, Tk=Tk, D=4, Dv=5)
    feature_map = make_map(4)
    out = linattn.linear_attention(q, k, v, feature_map=feature_map)
    assert out.shape == (2, 3, Tq, 5)
    assert_close(out, reference.linear_attention(q, k, v, feature_map=feature_map))


@pytest.mark.parametrize("T", [1, 5, 17])
def test_chunk_sizes_agree(linear_path, make_map, qkv, T):
    q, k, v = qkv(2, 2, T=T, D=3, Dv=4)
    feature_map = make_map(3)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map, is_causal=True)
    for chunk in (1, 3, T, T + 5, None):
        out = linattn.linear_attention(
            q, k, v, feature_map=feature_map, is_causal=True, chunk_size=chunk
        )
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12, msg=f"chunk_size={chunk}")


def test_causal_ignores_the_future(linear_path, qkv):
    q, k, v = qkv(2, T=10, D=4, Dv=3)
    out = linattn.linear_attention(q, k, v, is_causal=True, chunk_size=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, 6:] = torch.randn_like(k2[:, 6:]) * 3
    v2[:, 6:] = 100.0
    out2 = linattn.linear_attention(q, k2, v2, is_causal=True, chunk_size=4)
    # a leak of the changed future (values of 100) would be far above float64 rounding; the
    # fused kernel's blocked sums may round the kept rows differently (1.1e-14 seen)
    tol = 64 * torch.finfo(out.dtype).eps * out.abs().max().item()
    torch.testing.assert_close(out2[:, :6], out[:, :6], rtol=0, atol=tol)
    assert not torch.allclose(out2[:, 6:], out[:, 6:])


def test_eps_argument(qkv):
    q, k, v = qkv(1, T=4, D=2, Dv=2)
    big = linattn.linear_attention(q, k, v, eps=1e6)
    ref = reference.linear_attention(q, k, v, eps=1e6)
    torch.testing.assert_close(big, ref, rtol=1e-12, atol=1e-12)
    # a huge eps dominates the normaliser: the output shrinks towards 0
    assert big.abs().max() < 1e-3 * linattn.linear_attention(q, k, v).abs().max()


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    T=st.integers(1, 20),
    D=st.integers(1, 5),
    Dv=st.integers(1, 5),
    is_causal=st.booleans(),
    chunk=st.one_of(st.none(), st.integers(1, 25)),
    fused=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_shapes_property(
    build_map, map_names, batch, T, D, Dv, is_causal, chunk, fused, seed, data
):
    name = data.draw(st.sampled_from(map_names), label="feature_map")
    fmap = build_map(name, D)
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*batch, T, D, generator=g, dtype=torch.float64) * 0.5 for _ in range(2))
    v = torch.randn(*batch, T, Dv, generator=g, dtype=torch.float64)
    # force the fast or the portable path, with blocks of 4 tokens
    with dispatch.use(impl="fast" if fused else "portable", block_size=4):
        out = linattn.linear_attention(
            q, k, v, feature_map=fmap, is_causal=is_causal, chunk_size=chunk
        )
    ref = reference.linear_attention(q, k, v, feature_map=fmap, is_causal=is_causal)
    assert out.shape == (*batch, T, Dv)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# dtypes


@pytest.mark.parametrize("is_causal", [False, True])
def test_float32_close_to_float64(linear_path, make_map, qkv, assert_close, is_causal):
    q, k, v = qkv(2, 3, T=70, D=8, Dv=5)  # scale 0.5: odd polynomial kernels stay positive
    q32, k32, v32 = (t.float() for t in (q, k, v))
    fmap32, fmap64 = make_map(8, torch.float32), make_map(8, torch.float64)
    out = linattn.linear_attention(q32, k32, v32, feature_map=fmap32, is_causal=is_causal)
    assert out.dtype == torch.float32
    # compare with float64 on the same (rounded) inputs and the same map
    ref = linattn.linear_attention(
        q32.double(), k32.double(), v32.double(), feature_map=fmap64, is_causal=is_causal
    )
    assert_close(out, ref, ulps=64)


@pytest.mark.parametrize("is_causal", [False, True])
def test_float32_keys_far_below_zero(linear_path, is_causal):
    """1 + elu of keys near -20 is exp(k) ≈ 1e-9, not 0: the portable path's elu(k) + 1 cancelled
    to 0 in float32, its normaliser vanished, and a D = 1 head was off by ~1 where the compiled
    path (exp) was right (issue 51)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 9, 1, generator=g)
    k = -20.0 - torch.rand(1, 1, 9, 1, generator=g)
    v = torch.randn(1, 1, 9, 3, generator=g)
    out = linattn.linear_attention(q, k, v, is_causal=is_causal)
    ref = linattn.reference.linear_attention(q.double(), k.double(), v.double(),
                                             is_causal=is_causal)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T", [1, 5])
def test_size_one_dimensions_with_any_stride(T):
    """D = 1 (and T = 1) views of every other element: a size-1 dimension's stride is any
    number, and ``.contiguous()`` keeps it; the compiled pass refused them with "native pass:
    rows must be contiguous" (issue 51)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, 2 * d, generator=g)[..., ::2].requires_grad_()
               for d in (1, 1, 5))
    out = linattn.linear_attention(q, k, v, is_causal=True)
    w = torch.randn(out.shape, generator=g)
    (out * w).sum().backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = linattn.reference.linear_attention(*leaves, is_causal=True)
    (ref * w.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    for x, r in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(x.grad.double(), r.grad, rtol=1e-5, atol=1e-6)


HALF_MAPS = ["elu", "relu", "taylor", "polynomial"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("name", HALF_MAPS)
@pytest.mark.parametrize("T", [1, 333, 4096])
def test_half_inputs_large_values(assert_close, dtype, is_causal, name, T):
    """Values up to |x| = 10, T up to 4096: sums run in float32, so the result is finite and within
    a few output ulps of float64 on the same inputs (the rounding of the output dominates)."""
    g = torch.Generator().manual_seed(T)
    q, k, v = ((torch.rand(1, 2, T, 16, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    assert q.abs().max() > 9.5
    out = linattn.linear_attention(q, k, v, feature_map=name, is_causal=is_causal)
    assert out.dtype == dtype
    # float64 on the same (rounded) inputs; the float64 fast path is held to the reference above
    ref = linattn.linear_attention(
        q.double(), k.double(), v.double(), feature_map=name, is_causal=is_causal
    )
    assert_close(out, ref, ulps=2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_d64_taylor(assert_close, dtype):
    """The largest kernel here: Taylor at d = 64, |x| up to 10, s²/2 up to ~3e5 per pair."""
    g = torch.Generator().manual_seed(1)
    q, k, v = ((torch.rand(1, 1, 4096, 64, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    for is_causal in (False, True):
        out = linattn.linear_attention(q, k, v, feature_map="taylor", is_causal=is_causal)
        ref = linattn.linear_attention(
            q.double(), k.double(), v.double(), feature_map="taylor", is_causal=is_causal
        )
        assert_close(out, ref, ulps=2)


def test_half_state_accumulates_in_float32(linear_path, qkv):
    q, k, v = qkv(2, T=9, D=4, Dv=3, dtype=torch.bfloat16)
    out, state = linattn.linear_attention(q, k, v, is_causal=True, return_state=True)
    assert out.dtype == torch.bfloat16
    assert state.S.dtype == torch.float32 and state.z.dtype == torch.float32
    _, state64 = linattn.linear_attention(
        q.double(), k.double(), v.double(), is_causal=True, return_state=True
    )
    assert state64.S.dtype == torch.float64
    # The compiled path (taken by "fused" here: bfloat16 without gradients) keeps φ(k) in
    # bfloat16 (one rounding per feature); its states are float32 sums.
    tol = torch.finfo(torch.bfloat16).eps if linear_path == "fused" else 1e-6
    torch.testing.assert_close(state.S.double(), state64.S, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# key padding


def _garbage_like(x, kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(x.shape, generator=g, dtype=x.dtype) * 1e3
    return torch.full_like(x, float(kind))  # "inf", "-inf", "nan"


def _pad_mask(B, T, lengths):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kind", ["random", "inf", "-inf", "nan"])
def test_padded_keys_change_nothing(linear_path, make_map, qkv, is_causal, kind):
    B, H, T = 3, 2, 9
    q, k, v = qkv(B, H, T=T, D=3, Dv=4)
    feature_map = make_map(3)
    mask = _pad_mask(B, T, [9, 5, 1])
    out = linattn.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask
    )
    keep = (~mask)[:, None, :, None]
    k2 = torch.where(keep, k, _garbage_like(k, kind, 1))
    v2 = torch.where(keep, v, _garbage_like(v, kind, 2))
    out2 = linattn.linear_attention(
        q, k2, v2, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask
    )
    assert torch.isfinite(out2).all()
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)
    ref = reference.linear_attention(
        q, k2, v2, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask
    )
    torch.testing.assert_close(ref, out, rtol=1e-9, atol=1e-9)
    # each batch element equals attention over its unpadded keys alone (non-causal) / the
    # first n rows equal the unpadded prefix (causal: later rows still see only the prefix)
    for b, n in enumerate([9, 5, 1]):
        alone = linattn.linear_attention(
            q[b : b + 1, :, :n] if is_causal else q[b : b + 1],
            k[b : b + 1, :, :n],
            v[b : b + 1, :, :n],
            feature_map=feature_map,
            is_causal=is_causal,
        )
        rows = out[b : b + 1, :, : alone.shape[-2]]
        torch.testing.assert_close(rows, alone, rtol=1e-9, atol=1e-9)
        if is_causal and n < T:  # rows from n on see exactly the n unpadded keys
            rest = linattn.linear_attention(
                q[b, :, n:], k[b, :, :n], v[b, :, :n], feature_map=feature_map
            )
            torch.testing.assert_close(out[b, :, n:], rest, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("is_causal", [False, True])
def test_all_but_one_padded(linear_path, make_map, qkv, is_causal):
    B, T = 2, 6
    q, k, v = qkv(B, 3, T=T, D=4, Dv=2)
    feature_map = make_map(4)
    only = [0, 4]  # the single kept key of each batch element
    mask = torch.ones(B, T, dtype=torch.bool)
    for b, j in enumerate(only):
        mask[b, j] = False
    out = linattn.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask, chunk_size=4
    )
    assert torch.isfinite(out).all()
    for b, j in enumerate(only):
        rows = slice(j, T) if is_causal else slice(0, T)
        # one key: o_i = w/(w + eps) v_j, w = φ(q_i)·φ(k_j) (v_j when eps = 0); 0 if w + eps = 0
        fk = feature_map.forward_keys(k[b, :, j : j + 1]).transpose(-1, -2)
        w = feature_map.forward_queries(q[b, :, rows]) @ fk  # (H, rows, 1)
        den = w + feature_map.eps
        gain = torch.where(den == 0, 0.0, w / torch.where(den == 0, 1.0, den))
        want = gain * v[b, :, j : j + 1]
        torch.testing.assert_close(out[b, :, rows], want, rtol=1e-12, atol=1e-12)
        if feature_map.eps == 0:
            assert (gain[den != 0] == 1).all()
        if is_causal:  # rows before the only key see no key at all: zero output
            assert (out[b, :, :j] == 0).all()


@pytest.mark.parametrize("is_causal", [False, True])
def test_all_padded_gives_zero(linear_path, qkv, is_causal):
    q, k, v = qkv(2, 2, T=5, D=3, Dv=2)
    mask = torch.ones(2, 5, dtype=torch.bool)
    out = linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
    assert (out == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
def test_zero_width_values(linear_path, dtype, grad):
    """v of width Dv = 0 gives an empty output and the normaliser's state on every path (the
    compiled causal pass raised a reshape RuntimeError, the non-causal one 'rows must be
    contiguous')."""
    q, k = (torch.randn(1, 2, 5, 8, dtype=dtype, requires_grad=grad) for _ in range(2))
    v = torch.randn(1, 2, 5, 0, dtype=dtype, requires_grad=grad)
    out = linattn.linear_attention(q, k, v)
    assert out.shape == (1, 2, 5, 0) and out.dtype == dtype
    out, state = linattn.linear_attention(q, k, v, is_causal=True, return_state=True)
    assert out.shape == (1, 2, 5, 0) and state.S.shape == (1, 2, 8, 0)
    z = (torch.nn.functional.elu(k.double()) + 1).sum(-2)
    torch.testing.assert_close(state.z.double(), z, rtol=2e-2, atol=1e-4)
    if grad:
        (out.float().sum() + state.z.float().sum()).backward()
        assert q.grad is not None and k.grad.shape == k.shape


@pytest.mark.parametrize("is_causal", [False, True])
def test_mask_with_3d_and_2d_inputs(linear_path, make_map, qkv, is_causal):
    q, k, v = qkv(3, T=8, D=4, Dv=3)
    feature_map = make_map(4)
    mask = _pad_mask(3, 8, [8, 3, 6])
    out = linattn.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask
    )
    ref = reference.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask
    )
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    # 2-D input takes a (T,) mask, and agrees with its batch row of the 3-D call
    out1 = linattn.linear_attention(
        q[1], k[1], v[1], feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask[1]
    )
    torch.testing.assert_close(out1, out[1], rtol=1e-12, atol=1e-12)


def test_mask_broadcasts_over_heads_5d(linear_path, qkv):
    q, k, v = qkv(2, 2, 3, T=6, D=3, Dv=2)
    mask = _pad_mask(2, 6, [6, 2])
    out = linattn.linear_attention(q, k, v, key_padding_mask=mask)
    ref = reference.linear_attention(q, k, v, key_padding_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        out[1], linattn.linear_attention(q[1], k[1, :, :, :2], v[1, :, :, :2]), rtol=1e-9, atol=1e-9
    )


# ---------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(linear_path, make_map, qkv, is_causal):
    q, k, v = (t.requires_grad_() for t in qkv(2, T=5, D=2, Dv=2))
    feature_map = make_map(2)
    mask = torch.tensor([[False, False, False, True, False], [True, False, False, False, False]])

    def f(q, k, v):
        return linattn.linear_attention(
            q,
            k,
            v,
            feature_map=feature_map,
            is_causal=is_causal,
            key_padding_mask=mask,
            chunk_size=2,
        )

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradcheck_through_initial_state(linear_path, make_map, qkv):
    q, k, v = (t.requires_grad_() for t in qkv(T=4, D=2, Dv=2))
    feature_map = make_map(2)
    L = feature_map.num_features(2)
    g = torch.Generator().manual_seed(5)
    S = (torch.rand(L, 2, generator=g, dtype=torch.float64)).requires_grad_()
    z = (torch.rand(L, generator=g, dtype=torch.float64) + 1.0).requires_grad_()

    def f(q, k, v, S, z):
        state = linattn.LinearAttentionState(S=S, z=z)
        o, new = linattn.linear_attention(
            q,
            k,
            v,
            feature_map=feature_map,
            is_causal=True,
            initial_state=state,
            return_state=True,
            chunk_size=3,
        )
        return o, new.S, new.z

    assert torch.autograd.gradcheck(f, (q, k, v, S, z))


def test_gradients_match_reference(linear_path, make_map, qkv):
    feature_map = make_map(3)
    for is_causal in (False, True):
        q, k, v = (t.requires_grad_() for t in qkv(2, 2, T=9, D=3, Dv=4))
        w = torch.randn(2, 2, 9, 4, dtype=torch.float64)
        grads = []
        for fn in (linattn.linear_attention, reference.linear_attention):
            kw = {"chunk_size": 4} if fn is linattn.linear_attention else {}
            (fn(q, k, v, feature_map=feature_map, is_causal=is_causal, **kw) * w).sum().backward()
            grads.append([t.grad.clone() for t in (q, k, v)])
            for t in (q, k, v):
                t.grad = None
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# memory: nothing T×T


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, torch, linattn
    from linattn.ops import dispatch
    from linattn.ops.native import empty_cache

    def peak_kib():  # this process's own high-water mark (the ru_maxrss of an exec'd child
        # starts at its parent's RSS, so it would hide growth below the pytest process's size)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    def reset_peak():  # the high-water mark back to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    torch.manual_seed(0)
    T, D = 2**17, 64
    q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
    growth = {}
    for path in ("portable", "fast"):
        for causal in (False, True):
            small = (t[..., :4096, :].clone() for t in (q, k, v))
            with dispatch.use(impl=path):
                linattn.linear_attention(*small, is_causal=causal)  # load kernels first
                reset_peak()
                before = peak_kib()
                out = linattn.linear_attention(q, k, v, is_causal=causal)
                after = peak_kib()
            assert out.shape == (1, 1, T, D) and bool(torch.isfinite(out).all())
            del out
            empty_cache()  # or the next call reuses this output's buffer: no growth to see
            growth[f"{path}, is_causal={causal}"] = (after - before) * 1024
    print(json.dumps(growth))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_long_sequence_builds_nothing_quadratic():
    """T = 2^17, D = 64, float32: a T×T float32 matrix would be 64 GiB; inputs are 3 × 32 MiB.
    Peak resident growth of one call, measured in a fresh process for both forms and both
    implementations, must stay well under 1 GiB (and be at least the 32 MiB output, or the
    measurement saw nothing)."""
    # One thread: memory, not speed, so robust to a busy machine. A fixed mmap threshold: glibc
    # otherwise raises it after the first large free and serves later buffers from memory that
    # is still resident, which would hide their growth from the counter.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    res = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    if res.returncode != 0 and "clear_refs" in res.stderr and "PermissionError" in res.stderr:
        pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs not writable)")
    assert res.returncode == 0, res.stderr
    growth = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(growth) == 4
    out_bytes = 2**17 * 64 * 4
    for case, g in growth.items():
        # At least ~the output (0.9 of it: a few pages of it may have been resident already,
        # e.g. reused from the warm-up call), or the counter saw nothing.
        assert 0.9 * out_bytes <= g < 1 << 29, f"{case}: peak growth {g / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------------------------
# bad arguments


def test_bad_arguments(qkv):
    q, k, v = qkv(2, 3, T=5, D=4, Dv=2)
    la = linattn.linear_attention
    with pytest.raises(ValueError, match="^k: last dimension"):
        la(q, k[..., :3], v)
    with pytest.raises(ValueError, match="^v: shape"):
        la(q, k, v[..., :4, :])
    with pytest.raises(ValueError, match="^k: batch dimensions"):
        la(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="^k: causal"):
        la(q, k[..., :4, :], v[..., :4, :], is_causal=True)
    with pytest.raises(ValueError, match="^q: expected shape"):
        la(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0])
    with pytest.raises(TypeError, match="^q: expected a floating-point"):
        la(q.long(), k, v)
    with pytest.raises(TypeError, match="^v: expected a floating-point"):
        la(q, k, v.int())
    with pytest.raises(TypeError, match="^k: expected a torch.Tensor"):
        la(q, k.numpy(), v)
    with pytest.raises(TypeError, match="q, k, v: expected one dtype"):
        la(q, k.float(), v)
    with pytest.raises(ValueError, match="^feature_map: unknown name 'softmax'"):
        la(q, k, v, feature_map="softmax")
    with pytest.raises(TypeError, match="^feature_map"):
        la(q, k, v, feature_map=None)
    with pytest.raises(ValueError, match="^chunk_size"):
        la(q, k, v, is_causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="^chunk_size"):
        la(q, k, v, is_causal=True, chunk_size=2.5)
    with pytest.raises(ValueError, match="initial_state/return_state"):
        la(q, k, v, return_state=True)


def test_bad_masks(qkv):
    q, k, v = qkv(2, 3, T=5, D=4, Dv=2)
    la = linattn.linear_attention
    ok = torch.zeros(2, 5, dtype=torch.bool)
    for is_causal in (False, True):
        with pytest.raises(ValueError, match=r"^key_padding_mask: expected shape \(2, 5\)"):
            la(q, k, v, is_causal=is_causal, key_padding_mask=ok[:, :4])
        per_head = torch.zeros(2, 3, 5, dtype=torch.bool)
        with pytest.raises(ValueError, match="^key_padding_mask: expected shape"):
            la(q, k, v, is_causal=is_causal, key_padding_mask=per_head)
        with pytest.raises(TypeError, match="^key_padding_mask: expected dtype torch.bool"):
            la(q, k, v, is_causal=is_causal, key_padding_mask=ok.float())
        with pytest.raises(TypeError, match="^key_padding_mask: expected a bool tensor"):
            la(q, k, v, is_causal=is_causal, key_padding_mask=[[False] * 5] * 2)


def test_bad_initial_state(qkv):
    q, k, v = qkv(2, 3, T=5, D=4, Dv=2)
    la = linattn.linear_attention
    good = linattn.LinearAttentionState.zeros((2, 3), 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="initial_state/return_state"):
        la(q, k, v, initial_state=good)
    with pytest.raises(ValueError, match="^initial_state: expected S"):
        la(q, k, v, is_causal=True, initial_state=linattn.LinearAttentionState.zeros((2, 3), 5, 2))
    with pytest.raises(ValueError, match="^initial_state: expected S"):
        la(q, k, v, is_causal=True, initial_state=linattn.LinearAttentionState.zeros((3,), 4, 2))
    with pytest.raises(TypeError, match="^initial_state: expected a LinearAttentionState"):
        la(q, k, v, is_causal=True, initial_state=(good.S, good.z))


# -------------------- padded keys holding nan or inf
# Padded (masked) keys and values may hold anything, nan and inf included: they must not reach
# the output nor any gradient, on every path behind ``linattn.linear_attention``.
#
# A masked key used to be mapped by φ first and zeroed afterwards, so the backward formed
# 0·φ'(nan) = nan in its gradient (the portable path with the Taylor or polynomial maps, the fused
# path with any map). Now the key is replaced by 0 before φ, and its gradient is exactly 0.


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
