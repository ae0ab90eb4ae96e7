"""flowformer_attention against its quadratic reference and the formulas of the paper / the
authors' code, written out position by position."""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch

import linattn
from linattn import reference
from linattn.ops.flowformer.op import FLOW_EPS, SigmoidFeatures

F64 = torch.float64


def _qkv(*shape, Tk=None, Dv=5, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    *batch, T, D = shape
    Tk = T if Tk is None else Tk
    return (torch.randn(*batch, T, D, generator=g, dtype=dtype),
            torch.randn(*batch, Tk, D, generator=g, dtype=dtype),
            torch.randn(*batch, Tk, Dv, generator=g, dtype=dtype))


def _mask(B, T, p, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < p
    mask[:, 0] = False
    return mask


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("T", [1, 2, 17, 70])
def test_matches_reference(is_causal, T):
    q, k, v = _qkv(2, 3, T, 4, seed=T)
    mask = _mask(2, T, 0.3, T)
    for km, qm in [(None, None), (mask, None), (None, mask), (mask, mask)]:
        got = linattn.flowformer_attention(q, k, v, is_causal=is_causal, key_padding_mask=km,
                                           query_padding_mask=qm, chunk_size=16)
        want = reference.flowformer_attention(q, k, v, is_causal=is_causal,
                                              key_padding_mask=km, query_padding_mask=qm)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("feature_map", ["elu", "relu", SigmoidFeatures()])
def test_other_feature_maps_and_cross_attention(feature_map):
    q, k, v = _qkv(2, 7, 3, Tk=11, seed=1)
    mask = _mask(2, 11, 0.3, 1)
    got = linattn.flowformer_attention(q, k, v, feature_map=feature_map, key_padding_mask=mask)
    want = reference.flowformer_attention(q, k, v, feature_map=feature_map,
                                          key_padding_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    for is_causal in (False, True):
        q, k, v = _qkv(2, 9, 3, seed=2)
        torch.testing.assert_close(
            linattn.flowformer_attention(q, k, v, feature_map=feature_map, is_causal=is_causal),
            reference.flowformer_attention(q, k, v, feature_map=feature_map,
                                           is_causal=is_causal),
            rtol=1e-9, atol=1e-9)


def _by_the_formulas(q, k, v, is_causal, eps=FLOW_EPS):
    """The module docstring's formulas (the authors' code, sigmoid features), one position at a
    time in Python loops: (T, D) inputs, no padding."""
    fq, fk = torch.sigmoid(q), torch.sigmoid(k)
    n, m = fq.shape[0], fk.shape[0]
    dot = torch.dot
    if not is_causal:
        In = [dot(fq[i] + eps, fk.sum(0) + eps) for i in range(n)]
        Out = [dot(fk[j] + eps, fq.sum(0) + eps) for j in range(m)]
        Ih = [dot(fq[i] + eps, sum(fk[j] / Out[j] for j in range(m)) + eps) for i in range(n)]
        Oh = torch.stack([dot(fk[j] + eps, sum(fq[i] / In[i] for i in range(n)) + eps)
                          for j in range(m)]).clamp(-1, 1)
        c = torch.softmax(Oh, 0) * m
        return torch.stack([
            torch.sigmoid(Ih[i] * n / m) * sum(dot(fq[i], fk[j]) * c[j] * v[j] for j in range(m))
            / In[i] for i in range(n)])
    rows = []
    T = n
    Iu = [dot(fq[i] + eps, fk[: i + 1].sum(0) + eps) for i in range(T)]  # t·I_t
    Ou = [dot(fk[j] + eps, fq[: j + 1].sum(0) + eps) for j in range(T)]  # t·O_t
    In = [Iu[t] / (t + 1) for t in range(T)]
    Out = [Ou[t] / (t + 1) for t in range(T)]
    Ih = [dot(fq[i] + eps, sum(fk[j] / Out[j] for j in range(i + 1)) + eps) / (i + 1)
          for i in range(T)]
    Oh = [min(max(dot(fk[j] + eps, sum(fq[i] / In[i] for i in range(j + 1)) + eps) / (j + 1),
                  -1.0), 1.0) for j in range(T)]
    e = [torch.exp(torch.as_tensor(x, dtype=q.dtype)) for x in Oh]
    c = [e[j] * (j + 1) / sum(e[: j + 1]) for j in range(T)]
    for i in range(T):
        acc = sum(dot(fq[i], fk[j]) * c[j] * v[j] for j in range(i + 1))
        rows.append(torch.sigmoid(Ih[i]) * acc / Iu[i])
    return torch.stack(rows)


@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_the_formulas_position_by_position(is_causal):
    q, k, v = _qkv(6, 3, seed=3)
    want = _by_the_formulas(q, k, v, is_causal)
    torch.testing.assert_close(linattn.flowformer_attention(q, k, v, is_causal=is_causal), want,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference.flowformer_attention(q, k, v, is_causal=is_causal),
                               want, rtol=1e-12, atol=1e-12)


def test_the_clamp_is_reached():
    """Σ_i φ(q_i)/I_i ≈ n/Σ_j φ(k_j) coordinate-wise, so Ô_j ≈ n/m: with n = m about half the
    conserved outgoing flows exceed 1, and the clamp of the authors' code decides them. The
    inputs of the formula test above are such; here the clamp is shown to be active."""
    q, k, v = _qkv(6, 3, seed=3)
    fq, fk = torch.sigmoid(q), torch.sigmoid(k)
    raw = fk @ (fq / (fq @ fk.sum(0)).unsqueeze(-1)).sum(0)  # Ô before the clamp (ε = 0)
    assert (raw > 1 + 1e-3).any() and (raw < 1 - 1e-3).any()
    unclamped = torch.softmax(raw, 0)
    assert not torch.allclose(unclamped, torch.softmax(raw.clamp(-1, 1), 0))
    torch.testing.assert_close(linattn.flowformer_attention(q, k, v, eps=0),
                               _by_the_formulas(q, k, v, False, eps=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(is_causal):
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 2, 5, 3, Dv=2, seed=5))
    mask = torch.tensor([[False, False, True, False, False]])
    op = functools.partial(linattn.flowformer_attention, chunk_size=2)  # several blocks
    for fn in (op, reference.flowformer_attention):
        assert torch.autograd.gradcheck(
            lambda q, k, v, fn=fn: fn(q, k, v, is_causal=is_causal, key_padding_mask=mask,
                                      query_padding_mask=mask), (q, k, v))
        assert torch.autograd.gradcheck(lambda q, k, v, fn=fn: fn(q, k, v, is_causal=is_causal),
                                        (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_reference(is_causal):
    q, k, v = _qkv(2, 2, 13, 4, seed=6)
    mask = _mask(2, 13, 0.3, 6)
    grads = []
    op = functools.partial(linattn.flowformer_attention, chunk_size=4)  # several blocks
    for fn in (op, reference.flowformer_attention):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves, is_causal=is_causal, key_padding_mask=mask, query_padding_mask=mask)
        out.square().sum().backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("is_causal", [False, True])
def test_chunk_size_does_not_change_the_result(is_causal):
    q, k, v = _qkv(2, 40, 4, seed=7)
    a = linattn.flowformer_attention(q, k, v, is_causal=is_causal, chunk_size=1)
    b = linattn.flowformer_attention(q, k, v, is_causal=is_causal, chunk_size=64)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_both_ways_gives_the_unpadded_sequence(is_causal, side):
    """The same mask as key and query padding: the real rows are those of the sequence without
    its padding, whatever the padded tokens hold (inf and nan in keys and values)."""
    q, k, v = _qkv(1, 2, 12, 4, seed=8)
    real = slice(0, 8) if side == "right" else slice(4, 12)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[:, real] = False
    k, v = k.clone(), v.clone()
    k[:, :, mask[0]] = float("inf")
    v[:, :, mask[0]] = float("nan")
    out = linattn.flowformer_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask,
                                       query_padding_mask=mask)
    want = linattn.flowformer_attention(q[:, :, real], k[:, :, real], v[:, :, real],
                                        is_causal=is_causal)
    torch.testing.assert_close(out[:, :, real], want, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(out).all()


def test_key_padding_alone_keeps_every_query_a_sink():
    """Only keys are removed: the padded positions' queries still count (n, Σ φ(q))."""
    q, k, v = _qkv(1, 10, 3, seed=9)
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[:, 7:] = True
    both = linattn.flowformer_attention(q, k, v, key_padding_mask=mask, query_padding_mask=mask)
    keys_only = linattn.flowformer_attention(q, k, v, key_padding_mask=mask)
    assert not torch.allclose(both[:, :7], keys_only[:, :7])
    torch.testing.assert_close(keys_only, linattn.flowformer_attention(q, k[:, :7], v[:, :7]))


def test_all_keys_masked_gives_zeros():
    q, k, v = _qkv(2, 1, 5, 3, seed=10)
    mask = torch.tensor([[True] * 5, [False] * 5])
    for is_causal in (False, True):
        for eps in (None, 0.0):
            for fn in (linattn.flowformer_attention, reference.flowformer_attention):
                out = fn(q, k, v, is_causal=is_causal, key_padding_mask=mask, eps=eps)
                assert torch.isfinite(out).all()
                assert (out[0] == 0).all() and (out[1] != 0).any()


def test_causal_rows_ignore_the_future():
    q, k, v = _qkv(1, 12, 4, seed=11)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, 7:] = torch.randn(1, 5, x.shape[-1], dtype=F64)
    a = linattn.flowformer_attention(q, k, v, is_causal=True)
    b = linattn.flowformer_attention(q2, k2, v2, is_causal=True)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_lower_precision(dtype, is_causal):
    """Sums accumulate in float32: the output, in the input's dtype, is the float64 reference
    within a few units of that dtype's rounding."""
    q, k, v = (x.to(dtype) for x in _qkv(2, 2, 300, 8, seed=12, dtype=torch.float32))
    out = linattn.flowformer_attention(q, k, v, is_causal=is_causal)
    assert out.dtype == dtype
    want = reference.flowformer_attention(q.double(), k.double(), v.double(),
                                          is_causal=is_causal)
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


def test_long_sequence_never_builds_t_by_t():
    """T = 2¹⁶: a T×T float32 matrix would be 16 GiB per head; the fast path holds O(T)."""
    q, k, v = _qkv(1, 1, 2**16, 4, Dv=4, seed=13, dtype=torch.float32)
    for is_causal in (False, True):
        out = linattn.flowformer_attention(q, k, v, is_causal=is_causal)
        assert out.shape == v.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("fn", [linattn.flowformer_attention, reference.flowformer_attention])
def test_empty_sequence(fn, is_causal):
    q, k, v = (x.requires_grad_(True) for x in _qkv(2, 3, 0, 4))
    out = fn(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, 0, 5) and out.dtype == F64
    out.sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("fn", [linattn.flowformer_attention, reference.flowformer_attention])
def test_zero_width_values(fn, is_causal):
    """v of width Dv = 0 gives an empty output (the causal chunked sums raised a reshape
    RuntimeError: a -1 of an empty tensor cannot be inferred)."""
    q, k, v = (x.requires_grad_(True) for x in _qkv(2, 3, 9, 4, Dv=0))
    out = fn(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, 9, 0) and out.dtype == F64
    out.sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("fn", [linattn.flowformer_attention, reference.flowformer_attention])
def test_bad_arguments(fn):
    q, k, v = _qkv(2, 3, 6, 4)
    for eps in (float("nan"), float("inf"), -1e-6):
        with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0"):
            fn(q, k, v, eps=eps)
    for eps in ("1e-6", True):
        with pytest.raises(TypeError, match=r"^eps: expected a real number"):
            fn(q, k, v, eps=eps)
    with pytest.raises(ValueError, match=r"^feature_map: unknown name 'nope'; choose from .*sig"):
        fn(q, k, v, feature_map="nope")
    with pytest.raises(TypeError, match=r"^feature_map: expected a name or a FeatureMap"):
        fn(q, k, v, feature_map=3)
    with pytest.raises(TypeError, match=r"^query_padding_mask: expected dtype torch.bool"):
        fn(q, k, v, query_padding_mask=torch.zeros(2, 6))
    with pytest.raises(ValueError, match=r"^query_padding_mask: expected shape \(2, 6\)"):
        fn(q, k, v, query_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^key_padding_mask: expected shape"):
        fn(q, k, v, key_padding_mask=torch.zeros(3, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^k: causal attention needs as many keys"):
        fn(q, k[..., :5, :], v[..., :5, :], is_causal=True)
    with pytest.raises(ValueError, match=r"^q: expected a head dimension D >= 1"):
        fn(*_qkv(2, 3, 6, 0))
    with pytest.raises(TypeError, match=r"^q: expected a floating-point tensor"):
        fn(q.long(), k, v)


def test_chunk_size_must_be_a_positive_integer():
    q, k, v = _qkv(2, 6, 4)
    for chunk in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match=r"^chunk_size: expected a positive integer"):
            linattn.flowformer_attention(q, k, v, is_causal=True, chunk_size=chunk)


def test_signature_keyword_only_and_shared_defaults():
    for fn in (linattn.flowformer_attention, reference.flowformer_attention):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:3]] == ["q", "k", "v"]
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:3])
        assert all(p.kind is p.KEYWORD_ONLY for p in params[3:])
    op, ref = (
        {p.name: p.default for p in inspect.signature(fn).parameters.values()
         if p.default is not p.empty}
        for fn in (linattn.flowformer_attention, reference.flowformer_attention)
    )
    assert op.pop("chunk_size") is None
    assert op == ref == {"feature_map": "sigmoid", "is_causal": False, "key_padding_mask": None,
                         "query_padding_mask": None, "eps": None}


def test_default_eps_is_the_authors():
    q, k, v = _qkv(1, 8, 3, seed=14)
    torch.testing.assert_close(linattn.flowformer_attention(q, k, v),
                               linattn.flowformer_attention(q, k, v, eps=1e-6), rtol=0, atol=0)
    assert not torch.equal(linattn.flowformer_attention(q, k, v),
                           linattn.flowformer_attention(q, k, v, eps=0))
    assert FLOW_EPS == 1e-6 and math.isclose(SigmoidFeatures()(torch.zeros(1)).item(), 0.5)
