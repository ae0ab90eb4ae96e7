"""Bad input to every op, step and reference: one-line ValueError/TypeError naming the argument;
empty sequences; keyword-only ``feature_map``/``eps``; the same defaults in an op and its
reference."""

from __future__ import annotations

import inspect

import pytest
import torch

import linattn
from linattn import LinearAttentionState, reference
from linattn.ops import dispatch

B, H, T, D, DV = 2, 3, 6, 4, 5


def _qkv(T=T, D=D):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for d in (D, D, DV))


def _r(T=T, D=D):
    g = torch.Generator().manual_seed(1)
    return torch.randn(H, max(2 * T - 1, 0), D, generator=g, dtype=torch.float64)


def _state():
    return LinearAttentionState.zeros((B, H), D, DV, dtype=torch.float64)


def _step(x):
    return x[..., 0, :]


#: Every op, step and reference that takes ``eps``: name -> call(q, k, v, **kwargs).
CALLS = {
    "linear_attention": lambda q, k, v, **kw: linattn.linear_attention(q, k, v, **kw),
    "linear_attention causal": lambda q, k, v, **kw: linattn.linear_attention(
        q, k, v, is_causal=True, **kw),
    "relative_linear_attention": lambda q, k, v, **kw: linattn.relative_linear_attention(
        q, k, v, _r(q.shape[-2]), **kw),
    "relative_linear_attention causal fft": lambda q, k, v, **kw: (
        linattn.relative_linear_attention(q, k, v, _r(q.shape[-2]), is_causal=True,
                                          method="fft", **kw)),
    "cosformer_attention": lambda q, k, v, **kw: linattn.cosformer_attention(q, k, v, **kw),
    "cosformer_attention causal": lambda q, k, v, **kw: linattn.cosformer_attention(
        q, k, v, is_causal=True, **kw),
    "decay_linear_attention": lambda q, k, v, **kw: linattn.decay_linear_attention(
        q, k, v, 0.5, **kw),
    "reference.linear_attention": lambda q, k, v, **kw: reference.linear_attention(
        q, k, v, **kw),
    "reference.relative_linear_attention": lambda q, k, v, **kw: (
        reference.relative_linear_attention(q, k, v, _r(q.shape[-2]), **kw)),
    "reference.cosformer_attention": lambda q, k, v, **kw: reference.cosformer_attention(
        q, k, v, **kw),
    "reference.decay_linear_attention": lambda q, k, v, **kw: reference.decay_linear_attention(
        q, k, v, 0.5, **kw),
}
STEPS = {
    "linear_attention_step": lambda q, k, v, **kw: linattn.linear_attention_step(
        _step(q), _step(k), _step(v), _state(), **kw),
    "decay_linear_attention_step": lambda q, k, v, **kw: linattn.decay_linear_attention_step(
        _step(q), _step(k), _step(v), 0.5, _state(), **kw),
}
#: The ops that take ``chunk_size``.
CHUNKED = ["linear_attention", "linear_attention causal", "relative_linear_attention",
           "relative_linear_attention causal fft", "cosformer_attention",
           "cosformer_attention causal", "decay_linear_attention"]


@pytest.mark.parametrize("name", [*CALLS, *STEPS])
@pytest.mark.parametrize("eps", [float("nan"), float("inf"), float("-inf"), -1e-6])
def test_eps_must_be_finite_and_not_negative(name, eps):
    q, k, v = _qkv()
    want = r"^eps: expected a finite number >= 0, got -?(nan|inf|1e-06)$"
    with pytest.raises(ValueError, match=want):
        {**CALLS, **STEPS}[name](q, k, v, eps=eps)


@pytest.mark.parametrize("name", [*CALLS, *STEPS])
@pytest.mark.parametrize("eps", ["1e-6", True, None])
def test_eps_must_be_a_number(name, eps):
    q, k, v = _qkv()
    call = {**CALLS, **STEPS}[name]
    if eps is None:  # None is the map's (or the op's) default, always valid
        assert torch.isfinite(call(q, k, v, eps=None)[0]).all()
        return
    with pytest.raises(TypeError, match=r"^eps: expected a real number, got (str|bool)$"):
        call(q, k, v, eps=eps)


@pytest.mark.parametrize("name", [*CALLS, *STEPS])
def test_eps_zero_is_accepted(name):
    """0 is the default of the strictly positive maps (1 + elu here): a valid value."""
    q, k, v = _qkv()
    out = {**CALLS, **STEPS}[name](q, k, v, eps=0)
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()


def test_a_feature_map_with_a_bad_default_eps_is_named():
    class Bad(linattn.feature_maps.EluPlusOne):
        eps = float("nan")

    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^eps \(the default of Bad\): expected a finite"):
        linattn.linear_attention(q, k, v, feature_map=Bad())


@pytest.mark.parametrize("name", CHUNKED)
@pytest.mark.parametrize("chunk", [0, -1, 1.5, True, "8"])
def test_chunk_size_must_be_a_positive_integer(name, chunk):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^chunk_size: expected a positive integer, got "):
        CALLS[name](q, k, v, chunk_size=chunk)


@pytest.mark.parametrize("name", CHUNKED)
def test_numpy_integer_chunk_size_is_accepted(name):
    np = pytest.importorskip("numpy")
    q, k, v = _qkv()
    torch.testing.assert_close(CALLS[name](q, k, v, chunk_size=np.int64(4)),
                               CALLS[name](q, k, v, chunk_size=4), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(CALLS))
def test_empty_sequence_gives_an_empty_output(name):
    """T = 0 as linear_attention has it: an empty output of the right shape, no error (the
    cosFormer positions used to divide by T)."""
    q, k, v = (x.requires_grad_(True) for x in _qkv(T=0))
    out = CALLS[name](q, k, v)
    assert out.shape == (B, H, 0, DV) and out.dtype == q.dtype
    out.sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("name", [*CALLS, *STEPS])
def test_zero_head_dimension_is_a_clean_error(name):
    q, k, v = _qkv(D=0)
    with pytest.raises(ValueError, match=r"^q: expected a head dimension D >= 1, got shape"):
        {**CALLS, **STEPS}[name](q, k, v)


@pytest.mark.parametrize("name", list(CALLS))
def test_zero_head_dimension_on_the_fast_paths(name):
    q, k, v = (x.float() for x in _qkv(D=0))
    with dispatch.use(impl="fast"), pytest.raises(ValueError, match=r"^q: expected a head "):
        CALLS[name](q, k, v)


#: (function, number of leading positional parameters): everything after them keyword-only.
SIGNATURES = [
    (linattn.linear_attention, 3),
    (linattn.relative_linear_attention, 4),
    (linattn.cosformer_attention, 3),
    (linattn.decay_linear_attention, 4),
    (linattn.linear_attention_step, 4),
    (linattn.decay_linear_attention_step, 5),
    (reference.linear_attention, 3),
    (reference.relative_linear_attention, 4),
    (reference.cosformer_attention, 3),
    (reference.decay_linear_attention, 4),
]


@pytest.mark.parametrize("fn, positional", SIGNATURES, ids=lambda x: getattr(x, "__qualname__",
                                                                            str(x)))
def test_feature_map_and_eps_are_keyword_only(fn, positional):
    params = list(inspect.signature(fn).parameters.values())
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:positional])
    assert all(p.kind is p.KEYWORD_ONLY for p in params[positional:])
    names = {p.name for p in params[positional:]}
    assert "eps" in names and ("feature_map" in names or "cosformer" in fn.__name__)


def _defaults(fn) -> dict:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.default is not p.empty}


@pytest.mark.parametrize("op, ref", [
    (linattn.linear_attention, reference.linear_attention),
    (linattn.relative_linear_attention, reference.relative_linear_attention),
    (linattn.cosformer_attention, reference.cosformer_attention),
    (linattn.decay_linear_attention, reference.decay_linear_attention),
])
def test_op_and_reference_share_defaults(op, ref):
    """Every argument both take has the same default (cosFormer's eps was 1e-6 in the
    reference and None, the map's 1e-6, in the op)."""
    ops, refs = _defaults(op), _defaults(ref)
    shared = ops.keys() & refs.keys()
    assert "eps" in shared
    assert {n: ops[n] for n in shared} == {n: refs[n] for n in shared}


def test_cosformer_default_eps_gives_the_reference_values():
    """Relu features vanish for all-negative queries: the default eps decides those rows."""
    q, k, v = _qkv()
    q = q - 1.0  # many non-positive coordinates: small normalisers, where eps matters
    torch.testing.assert_close(linattn.cosformer_attention(q, k, v),
                               reference.cosformer_attention(q, k, v), rtol=1e-12, atol=1e-12)
