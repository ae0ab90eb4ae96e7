"""Bad input to every op, step and reference: one-line ValueError/TypeError naming the argument;
empty sequences; keyword-only ``feature_map``/``eps``; the same defaults in an op and its
reference."""

from __future__ import annotations

import inspect

import numpy as np
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


#: Every op of the library on (B, H, T, ·) inputs: name -> call(q, k, v) (issue 51: an empty
#: batch or no heads).
BATCHED = {
    **{name: call for name, call in CALLS.items()},
    "window_linear_attention": lambda q, k, v: linattn.window_linear_attention(
        q, k, v, window=2),
    "window_linear_attention non-causal state": lambda q, k, v: linattn.window_linear_attention(
        q, k, v, window=2, is_causal=False),
    "window_linear_attention return_state": lambda q, k, v: linattn.window_linear_attention(
        q, k, v, window=2, return_state=True)[0],
    "flowformer_attention": lambda q, k, v: linattn.flowformer_attention(q, k, v),
    "flowformer_attention causal": lambda q, k, v: linattn.flowformer_attention(
        q, k, v, is_causal=True),
    "decay_softmax_attention": lambda q, k, v: linattn.decay_softmax_attention(q, k, v, 0.9),
    "gated_linear_attention g": lambda q, k, v: linattn.gated_linear_attention(
        q, k, v, g=-q[..., 0].detach().abs()),
    "gated_linear_attention gk": lambda q, k, v: linattn.gated_linear_attention(
        q, k, v, gk=-q.detach().abs()),
    "delta_rule": lambda q, k, v: linattn.delta_rule(
        q, k, v, torch.rand(q.shape[:-1], dtype=q.dtype, device=q.device)),
    "delta_rule gated": lambda q, k, v: linattn.delta_rule(
        q, k, v, torch.rand(q.shape[:-1], dtype=q.dtype, device=q.device),
        g=-q[..., 0].detach().abs(), gk=-q.detach().abs()),
    "decay_linear_attention tensor": lambda q, k, v: linattn.decay_linear_attention(
        q, k, v, torch.full(q.shape[1:2], 0.9, dtype=q.dtype, device=q.device)),
}
for _name in [n for n in BATCHED if "relative" in n]:  # r: one set of lags per head
    BATCHED[_name] = (lambda call: lambda q, k, v: call(q, k, v, r=torch.randn(
        q.shape[1], 2 * q.shape[2] - 1, q.shape[3], dtype=q.dtype, device=q.device)))(
        {"relative_linear_attention": linattn.relative_linear_attention,
         "relative_linear_attention causal fft": lambda q, k, v, r: (
             linattn.relative_linear_attention(q, k, v, r, is_causal=True, method="fft")),
         "reference.relative_linear_attention": reference.relative_linear_attention}[_name])


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("batch", [(0, H), (B, 0)], ids=["B=0", "H=0"])
@pytest.mark.parametrize("name", list(BATCHED))
def test_an_empty_batch_or_no_heads_give_an_empty_output(name, batch, impl):
    """Zero sequences or zero heads: an empty output of the right shape, gradients too (the
    decayed, window, causal Flowformer and portable gated forms failed in a reshape that
    could not infer a -1 from 0 elements)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*batch, T, d, generator=g, dtype=torch.float64).requires_grad_(True)
               for d in (D, D, DV))
    with dispatch.use(impl=impl):
        out = BATCHED[name](q, k, v)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == (*batch, T, DV) and out.dtype == q.dtype
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


# ----------------------------------------------------------------------------- issue 24: scalars


def _storages(x) -> set[int]:
    """The storages of every non-empty tensor in x (see :func:`_tensors`)."""
    return {t.untyped_storage().data_ptr() for t in _tensors(x) if t.numel()}


def _tensors(x) -> list[torch.Tensor]:
    """The tensors of an output: a tensor, a state dataclass or a tuple of them, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, tuple):
        return [t for part in x for t in _tensors(part)]
    return [getattr(x, f) for f in ("S", "z", "k", "v") if hasattr(x, f)]


def _beta(T=T):
    return torch.rand(B, H, T, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


#: ops with a flag argument: name -> (call(**flags), the flags it takes)
FLAGGED = {
    "linear_attention": (lambda **kw: linattn.linear_attention(*_qkv(), **kw),
                         ("is_causal", "return_state")),
    "relative_linear_attention": (lambda **kw: linattn.relative_linear_attention(
        *_qkv(), _r(), **kw), ("is_causal",)),
    "cosformer_attention": (lambda **kw: linattn.cosformer_attention(*_qkv(), **kw),
                            ("is_causal",)),
    "flowformer_attention": (lambda **kw: linattn.flowformer_attention(*_qkv(), **kw),
                             ("is_causal",)),
    "window_linear_attention": (lambda **kw: linattn.window_linear_attention(
        *_qkv(), window=2, **kw), ("is_causal", "return_state")),
    "decay_linear_attention": (lambda **kw: linattn.decay_linear_attention(
        *_qkv(), 0.5, **kw), ("return_state",)),
    "gated_linear_attention": (lambda **kw: linattn.gated_linear_attention(*_qkv(), **kw),
                               ("return_state",)),
    "delta_rule": (lambda **kw: linattn.delta_rule(*_qkv(), _beta(), **kw),
                   ("return_state", "qk_l2norm")),
    "delta_rule_step": (lambda **kw: linattn.delta_rule_step(
        *(_step(x) for x in _qkv()), _beta()[..., 0], **kw), ("qk_l2norm",)),
}
FLAG_CASES = [(name, flag) for name, (_, flags) in FLAGGED.items() for flag in flags]


@pytest.mark.parametrize("name, flag", FLAG_CASES)
@pytest.mark.parametrize("value", ["yes", None, 1, 0, 2, 1.0, torch.tensor(True)])
def test_flags_must_be_bools(name, flag, value):
    """A flag that is not a bool was taken by its truth value (is_causal="no" was causal)."""
    call, _ = FLAGGED[name]
    kw = {flag: value}
    if flag == "return_state" and name in ("linear_attention", "window_linear_attention"):
        kw["is_causal"] = True
    with pytest.raises(TypeError, match=rf"^{flag}: expected a bool, got \w+$"):
        call(**kw)


@pytest.mark.parametrize("name, flag", FLAG_CASES)
def test_numpy_bools_are_flags(name, flag):
    call, _ = FLAGGED[name]
    extra = {"is_causal": True} if flag == "return_state" and name in (
        "linear_attention", "window_linear_attention") else {}
    for value in (True, False):
        got = call(**{flag: np.bool_(value)}, **extra)
        want = call(**{flag: value}, **extra)
        assert type(got) is type(want)
        for a, b in zip(_tensors(got), _tensors(want), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


#: ops with a ``scale``: name -> call(scale, dtype of the inputs)
SCALED = {
    "gated_linear_attention": lambda s, dt=torch.float64: linattn.gated_linear_attention(
        *_cast(_qkv(), dt), scale=s),
    "gated_linear_attention_step": lambda s, dt=torch.float64:
        linattn.gated_linear_attention_step(*(_step(x) for x in _cast(_qkv(), dt)),
                                            scale=s)[0],
    "delta_rule": lambda s, dt=torch.float64: linattn.delta_rule(
        *_cast((*_qkv(), _beta()), dt), scale=s),
    "delta_rule_step": lambda s, dt=torch.float64: linattn.delta_rule_step(
        *(_step(x) for x in _cast(_qkv(), dt)), _beta()[..., 0].to(dt), scale=s)[0],
    "decay_softmax_attention": lambda s, dt=torch.float64: linattn.decay_softmax_attention(
        *_cast(_qkv(), dt), 0.9, scale=s),
    # fla's names check theirs with the same rule (the gated op's)
    "fla.chunk_simple_gla": lambda s, dt=torch.float64: linattn.fla.chunk_simple_gla(
        *(x.transpose(1, 2).contiguous() for x in _cast(_qkv(), dt)), scale=s)[0],
}


def _cast(xs, dtype):
    return tuple(x.to(dtype) for x in xs)


@pytest.mark.parametrize("name", list(SCALED))
@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1e300), (torch.float32, -1e39),
                                         (torch.float32, 1e-39), (torch.float32, 1e-46),
                                         (torch.bfloat16, 1e-40), (torch.float64, 1e-320)])
def test_scale_out_of_the_dtypes_range_is_named(name, dtype, scale):
    """A finite scale the computation in the inputs' dtype cannot carry: ±inf outputs (1e300
    in float32) or a silently wrong one (1e-46 is 0 in float32) before, a ValueError now."""
    if name == "decay_softmax_attention" and scale < 0:
        scale = -scale  # its scale must be positive anyway
    with pytest.raises(ValueError, match=r"^scale: \S+ is out of the range "):
        SCALED[name](scale, dtype)


@pytest.mark.parametrize("name", list(SCALED))
def test_scales_at_the_ends_of_the_range_give_finite_outputs(name):
    lo, hi = torch.finfo(torch.float32).tiny, 1e30
    for s in (lo, hi) if name == "decay_softmax_attention" else (lo, -lo):
        assert bool(torch.isfinite(SCALED[name](s, torch.float32)).all())
    assert bool(torch.isfinite(SCALED[name](1e300, torch.float64)).all())


@pytest.mark.parametrize("name", list(SCALED))
def test_numpy_scales_are_accepted(name):
    want = SCALED[name](0.5)
    for s in (np.float32(0.5), np.float64(0.5)):
        torch.testing.assert_close(SCALED[name](s), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(SCALED))
@pytest.mark.parametrize("scale", [True, np.True_, "0.5", 0.5 + 0j])
def test_scale_must_be_a_real_number(name, scale):
    with pytest.raises(TypeError, match=r"^scale: expected a real number or None, got \w+$"):
        SCALED[name](scale)


@pytest.mark.parametrize("name", list(SCALED))
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"),
                                   pytest.param(10 ** 400, id="10**400")])
def test_scale_must_be_finite(name, scale):
    with pytest.raises(ValueError, match=r"^scale: expected a finite "):
        SCALED[name](scale)


@pytest.mark.parametrize("name", [*CALLS, *STEPS])
def test_eps_too_large_for_a_float_is_named(name):
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0, got an "
                                         r"integer of 1329 bits$"):
        {**CALLS, **STEPS}[name](*_qkv(), eps=10 ** 400)


def test_numpy_eps_and_chunk_sizes_are_accepted():
    q, k, v = _qkv()
    want = linattn.gated_linear_attention(q, k, v, chunk_size=2)
    torch.testing.assert_close(linattn.gated_linear_attention(q, k, v, chunk_size=np.int32(2)),
                               want, rtol=0, atol=0)
    want = linattn.delta_rule(q, k, v, _beta(), chunk_size=2)
    torch.testing.assert_close(linattn.delta_rule(q, k, v, _beta(), chunk_size=np.int64(2)),
                               want, rtol=0, atol=0)
    torch.testing.assert_close(linattn.linear_attention(q, k, v, eps=np.float32(0.5)),
                               linattn.linear_attention(q, k, v, eps=0.5), rtol=0, atol=0)


@pytest.mark.parametrize("chunk", [np.True_, np.float64(2.0)])
def test_numpy_non_integers_are_not_chunk_sizes(chunk):
    with pytest.raises(ValueError, match=r"^chunk_size: expected a positive integer, got "):
        linattn.gated_linear_attention(*_qkv(), chunk_size=chunk)


#: every op, step and reference that takes ``gamma``: name -> call(gamma)
GAMMA_CALLS = {
    "decay_linear_attention": lambda g: linattn.decay_linear_attention(*_qkv(), g),
    "decay_linear_attention_step": lambda g: linattn.decay_linear_attention_step(
        *(_step(x) for x in _qkv()), g, _state()),
    "decay_softmax_attention": lambda g: linattn.decay_softmax_attention(*_qkv(), g),
    "reference.decay_linear_attention": lambda g: reference.decay_linear_attention(*_qkv(), g),
    "reference.decay_softmax_attention": lambda g: reference.decay_softmax_attention(*_qkv(), g),
}


@pytest.mark.parametrize("name", list(GAMMA_CALLS))
@pytest.mark.parametrize("gamma", ["0.9", None, True, np.True_, 0.5 + 0j, object(),
                                   torch.tensor([True, True, True]), ["0.9"]],
                         ids=lambda g: type(g).__name__)
def test_gamma_must_be_a_number_or_a_tensor(name, gamma):
    with pytest.raises(TypeError, match=r"^gamma: expected a number or a tensor of real "
                                        r"numbers, got [^\n]+$"):
        GAMMA_CALLS[name](gamma)


@pytest.mark.parametrize("name", list(GAMMA_CALLS))
@pytest.mark.parametrize("gamma", [pytest.param(10 ** 400, id="10**400"), -1, float("nan")])
def test_gamma_out_of_range_is_named(name, gamma):
    with pytest.raises(ValueError, match=r"^gamma: expected decays in [^\n]+$"):
        GAMMA_CALLS[name](gamma)


@pytest.mark.parametrize("name", list(GAMMA_CALLS))
def test_numpy_and_list_gammas_are_accepted(name):
    want = GAMMA_CALLS[name](torch.tensor([0.5, 0.75, 0.9], dtype=torch.float64))
    got = GAMMA_CALLS[name](np.array([0.5, 0.75, 0.9]))
    for a, b in zip(_tensors(got), _tensors(want), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    GAMMA_CALLS[name](np.float32(0.5))
    GAMMA_CALLS[name]([0.5, 0.75, 0.9])


# ----------------------------------------------------------------------------- issue 24: T = 0


def _cu_empty():
    return torch.tensor([0, 0, 0])


#: ops with a state at T = 0: name -> (call(q, k, v) with an initial state -> (o, state), the
#: initial state)
def _stateful_at_t0():
    q, k, v = _qkv(T=0)
    q1, k1, v1 = (x[:1] for x in (q, k, v))
    gen = torch.Generator().manual_seed(3)
    S0 = torch.randn(B, H, D, DV, generator=gen, dtype=torch.float64)
    S0n = torch.randn(2, H, D, DV, generator=gen, dtype=torch.float64)
    st = LinearAttentionState(S=S0.clone(), z=torch.rand(B, H, D, dtype=torch.float64))
    stn = LinearAttentionState(S=S0n.clone(), z=torch.rand(2, H, D, dtype=torch.float64))
    _, wst = linattn.window_linear_attention(*_qkv(T=3), window=2, return_state=True)
    g0, b0 = torch.zeros(B, H, 0, dtype=torch.float64), torch.zeros(B, H, 0, dtype=torch.float64)
    return {
        "gated_linear_attention": (lambda: linattn.gated_linear_attention(
            q, k, v, initial_state=S0, return_state=True), S0),
        "gated_linear_attention g": (lambda: linattn.gated_linear_attention(
            q, k, v, g0, initial_state=S0, return_state=True), S0),
        "gated_linear_attention cu_seqlens": (lambda: linattn.gated_linear_attention(
            q1, k1, v1, initial_state=S0n, return_state=True, cu_seqlens=_cu_empty()), S0n),
        "delta_rule": (lambda: linattn.delta_rule(q, k, v, b0, g0, initial_state=S0,
                                                  return_state=True), S0),
        "delta_rule cu_seqlens": (lambda: linattn.delta_rule(
            q1, k1, v1, b0[:1], initial_state=S0n, return_state=True,
            cu_seqlens=_cu_empty()), S0n),
        "delta_rule float32": (lambda: linattn.delta_rule(
            q.float(), k.float(), v.float(), b0.float(), initial_state=S0.float(),
            return_state=True), S0.float()),
        "linear_attention": (lambda: linattn.linear_attention(
            q, k, v, is_causal=True, initial_state=st, return_state=True), st),
        "linear_attention cu_seqlens": (lambda: linattn.linear_attention(
            q1, k1, v1, is_causal=True, initial_state=stn, return_state=True,
            cu_seqlens=_cu_empty()), stn),
        "decay_linear_attention": (lambda: linattn.decay_linear_attention(
            q, k, v, 0.5, initial_state=st, return_state=True), st),
        "window_linear_attention": (lambda: linattn.window_linear_attention(
            q, k, v, window=2, initial_state=wst, return_state=True), wst),
    }


@pytest.mark.parametrize("name", list(_stateful_at_t0()))
def test_empty_sequence_returns_a_new_state(name):
    """T = 0 returns the initial state's values in new tensors, never the input itself (a
    caller updating the returned state in place would change its input)."""
    call, S0 = _stateful_at_t0()[name]
    o, S = call()
    assert o.shape[-2] == 0
    assert S is not S0
    assert not _storages(S) & _storages(S0)
    for a, b in zip(_tensors(S), _tensors(S0), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if hasattr(S0, "count"):
        assert S.count == S0.count


@pytest.mark.parametrize("which", ["linear", "window"])
@pytest.mark.parametrize("arg, value, exc", [
    ("batch_shape", 3, TypeError), ("batch_shape", "23", TypeError),
    ("batch_shape", (2, -1), ValueError), ("batch_shape", (2.0,), ValueError),
    ("num_features", -1, ValueError), ("num_features", "4", ValueError),
    ("num_features", True, ValueError), ("num_features", 10 ** 30, ValueError),
    ("value_dim", 1.5, ValueError), ("dtype", torch.long, TypeError), ("dtype", "float", TypeError),
])
def test_state_zeros_sizes_are_named(which, arg, value, exc):
    """zeros() of the states: torch's own errors ("zeros(): argument 'size' failed to unpack
    the object at pos 3") named no argument."""
    kw = {"batch_shape": (2, 3), "num_features": 4, "value_dim": 5}
    if which == "window":
        kw.update(head_dim=4, window=3)
        cls = linattn.WindowLinearAttentionState
    else:
        cls = LinearAttentionState
    with pytest.raises(exc, match=rf"^{arg}: expected [^\n]+$"):
        cls.zeros(**{**kw, arg: value})
    st = cls.zeros(**{**kw, "batch_shape": torch.Size([np.int64(2), 3]),
                      "num_features": np.int64(4)})
    assert st.S.shape == (2, 3, 4, 5)


#: Every decoding step of the library: name -> call(q_t, k_t, v_t) with a 1-token state.
ZERO_D_STEPS = {
    "linear_attention_step": lambda q, k, v: linattn.linear_attention_step(
        q, k, v, LinearAttentionState.zeros((), 1, 1, dtype=torch.float64)),
    "decay_linear_attention_step": lambda q, k, v: linattn.decay_linear_attention_step(
        q, k, v, 0.9, LinearAttentionState.zeros((), 1, 1, dtype=torch.float64)),
    "window_linear_attention_step": lambda q, k, v: linattn.window_linear_attention_step(
        q, k, v, linattn.window_linear_attention(*(torch.ones(1, 1, dtype=torch.float64),) * 3,
                                                 window=2, return_state=True)[1], window=2),
    "gated_linear_attention_step": lambda q, k, v: linattn.gated_linear_attention_step(q, k, v),
    "delta_rule_step": lambda q, k, v: linattn.delta_rule_step(
        q, k, v, torch.tensor(0.5, dtype=torch.float64), None),
}


@pytest.mark.parametrize("name", list(ZERO_D_STEPS))
@pytest.mark.parametrize("which", ["q_t", "k_t", "v_t"])
def test_a_0d_step_input_is_named(name, which):
    """A 0-D tensor was an IndexError: the check unsqueezed it before asking its dim()."""
    args = {n: torch.ones(1, dtype=torch.float64) for n in ("q_t", "k_t", "v_t")}
    args[which] = torch.tensor(1.0, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"^{which}: expected shape \(\.\.\., D\), got \(\)$"):
        ZERO_D_STEPS[name](*args.values())
    ones = torch.ones(1, dtype=torch.float64)
    assert ZERO_D_STEPS[name](ones, ones, ones) is not None  # the same call with (1,) inputs


@pytest.mark.parametrize("name", list(BATCHED))
def test_meta_tensors_give_meta_outputs(name):
    """Shapes only (a model built on the meta device): the value checks of the gates, β and
    decays have no values to read there (they called .item(): a RuntimeError)."""
    if name.startswith("reference.") or "fft" in name:
        pytest.skip("the references and the FFT form compute on values")
    q, k, v = (torch.empty(B, H, T, d, device="meta", dtype=torch.float64) for d in (D, D, DV))
    out = BATCHED[name](q, k, v)
    out = out[0] if isinstance(out, tuple) else out
    assert out.is_meta and out.shape == (B, H, T, DV)


def test_meta_steps_give_meta_outputs():
    """The steps' value checks (β, the gates, γ) on the meta device: no values to read."""
    m = {"device": "meta", "dtype": torch.float64}
    q = torch.empty(B, H, D, **m)
    v = torch.empty(B, H, DV, **m)
    state = LinearAttentionState.zeros((B, H), D, DV, **m)
    outs = [
        linattn.decay_linear_attention_step(q, q, v, 0.9, state)[0],
        linattn.decay_linear_attention_step(q, q, v, torch.full((H,), 0.9, **m), state)[0],
        linattn.gated_linear_attention_step(q, q, v, g_t=torch.empty(B, H, **m),
                                            gk_t=torch.empty(B, H, D, **m))[0],
        linattn.delta_rule_step(q, q, v, torch.empty(B, H, **m), None,
                                g_t=torch.empty(B, H, **m))[0],
    ]
    assert all(o.is_meta and o.shape == (B, H, DV) for o in outs)


def test_meta_packed_sequences_and_the_new_ops_give_meta_outputs():
    """issue 51 probe: meta cu_seqlens (no offsets to read) and the conv and norm ops."""
    m = {"device": "meta", "dtype": torch.float32}
    q = torch.empty(1, 2, 8, 4, **m)
    cu = torch.tensor([0, 3, 8], device="meta")
    g = torch.empty(1, 2, 8, **m)
    for o, S in (linattn.gated_linear_attention(q, q, q, g=g, cu_seqlens=cu, return_state=True),
                 linattn.delta_rule(q, q, q, g, cu_seqlens=cu, return_state=True)):
        assert o.is_meta and o.shape == q.shape and S.is_meta and S.shape == (2, 2, 4, 4)
    o = linattn.linear_attention(q, q, q, is_causal=True, cu_seqlens=cu)
    assert o.is_meta and o.shape == q.shape
    assert linattn.rms_norm_gated(q, q, torch.empty(4, **m)).is_meta
    assert linattn.causal_conv1d(torch.empty(2, 8, 4, **m), torch.empty(4, 3, **m)).is_meta


def _sparse(x):
    return x.to_sparse()


def _nested(x):
    return torch.nested.nested_tensor(list(x.unbind(0)))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", [_sparse, _nested], ids=["sparse", "nested"])
@pytest.mark.parametrize("which", ["q", "v"])
@pytest.mark.parametrize("name", [*BATCHED, *STEPS])
def test_sparse_and_nested_inputs_are_named(name, which, make):
    """A sparse or nested q or v: a TypeError naming it (issue 51: reshape/expand errors, a
    NotImplementedError or torch's "Internal error ... Please file an issue")."""
    if make is _nested and (name in STEPS or (which == "q" and any(
            s in name for s in ("relative", "gated", "delta", "tensor")))):
        pytest.skip("the test's call slices q or v, or reads q's shape, for its other arguments")
    qkv = list(_qkv())
    i = "qkv".index(which)
    qkv[i] = make(qkv[i])
    with pytest.raises(TypeError, match=rf"^{which}(_t)?: expected a dense \(strided\) tensor, "
                                        r"got (torch\.sparse_coo|a nested tensor)$"):
        {**BATCHED, **STEPS}[name](*qkv)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", [_sparse, _nested], ids=["sparse", "nested"])
def test_sparse_and_nested_inputs_to_conv_norm_and_fla_are_named(make):
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    w = torch.randn(4, 3, dtype=torch.float64)
    want = r"^x: expected a dense \(strided\) tensor, got (torch\.sparse_coo|a nested tensor)$"
    with pytest.raises(TypeError, match=want):
        linattn.causal_conv1d(make(x), w)
    with pytest.raises(TypeError, match=want):
        linattn.rms_norm_gated(make(x), None)
    with pytest.raises(TypeError, match=want.replace("^x", "^q")):
        linattn.fla.chunk_gla(make(x.unsqueeze(2)), x.unsqueeze(2), x.unsqueeze(2),
                              -x.abs().unsqueeze(2))
    with pytest.raises(TypeError, match=want.replace("^x", "^r")):
        linattn.relative_linear_attention(*_qkv(), make(_r()))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_step_and_gated_inputs_are_named():
    q, k, v = (x[..., 0, :] for x in _qkv())
    want = r"^q(_t)?: expected a dense \(strided\) tensor, got a nested tensor$"
    with pytest.raises(TypeError, match=want):
        linattn.linear_attention_step(_nested(q), k, v, _state())
    with pytest.raises(TypeError, match=want):
        linattn.delta_rule_step(_nested(q), k, v, torch.rand(B, H, dtype=torch.float64))
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=want):
        linattn.gated_linear_attention(_nested(q), k, v, g=-torch.rand(B, H, T))
    with pytest.raises(TypeError, match=want):
        linattn.delta_rule(_nested(q), k, v, torch.rand(B, H, T, dtype=torch.float64))


def _inference(*xs):
    """Copies of ``xs`` made under torch.inference_mode (inference tensors)."""
    with torch.inference_mode():
        return tuple(x.clone() for x in xs)


def _out_and_grads(call, xs, wanted):
    """call(*xs) with the arguments at ``wanted`` requiring grad: the output and their
    gradients of a fixed weighting of the output (and of a returned state)."""
    xs = [x.detach().requires_grad_() if i in wanted else x for i, x in enumerate(xs)]
    torch.manual_seed(0)  # calls that draw an argument draw the same one
    out = call(*xs)
    outs = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
    loss = sum((t.double() * torch.linspace(-1, 1, t.numel(), dtype=torch.float64
                                            ).view(t.shape)).sum() for t in outs)
    loss.backward()
    return [outs[0].detach()] + [xs[i].grad for i in wanted]


def _assert_close_for(dtype, got, want):
    eps = torch.finfo(dtype).eps
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=16 * eps, atol=16 * eps * (1 + b.abs().max()))


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", [*BATCHED, *STEPS])
def test_inference_tensors_beside_inputs_requiring_grad(name, dtype, impl):
    """k and v made under torch.inference_mode beside a q that requires grad: the output and
    q's gradient of the same call with normal tensors (issue 51: torch's "Inference tensors
    cannot be saved for backward" escaped from linear_attention, decay_softmax_attention,
    flowformer_attention, gated_linear_attention, the steps and references)."""
    if name in STEPS and dtype != torch.float64:
        pytest.skip("the steps' test state is float64")
    call = {**BATCHED, **STEPS}[name]
    q, k, v = (x.to(dtype) for x in _qkv())
    with dispatch.use(impl=impl):
        got = _out_and_grads(call, [q, *_inference(k, v)], [0])
        want = _out_and_grads(call, [q, k, v], [0])
    _assert_close_for(dtype, got, want)


STEP_CALLS = {  # name: (call, arguments); q or x first
    "gated_linear_attention_step": (
        lambda q, k, v, S, gk: linattn.gated_linear_attention_step(q, k, v, S, gk_t=gk),
        lambda: [torch.randn(B, H, D), torch.randn(B, H, D), torch.randn(B, H, DV),
                 torch.randn(B, H, D, DV), -torch.rand(B, H, D)]),
    "delta_rule_step": (
        lambda q, k, v, b, S, g: linattn.delta_rule_step(q, k, v, b, S, g_t=g),
        lambda: [torch.randn(B, H, D), torch.nn.functional.normalize(torch.randn(B, H, D), dim=-1),
                 torch.randn(B, H, DV), torch.rand(B, H), torch.randn(B, H, D, DV),
                 -torch.rand(B, H)]),
    "window_linear_attention_step": (
        lambda q, k, v: linattn.window_linear_attention_step(
            q, k, v, linattn.WindowLinearAttentionState.zeros((B, H), D, D, DV, 2), window=2),
        lambda: [torch.randn(B, H, D), torch.randn(B, H, D), torch.randn(B, H, DV)]),
    "causal_conv1d": (
        lambda x, w, b, s: linattn.causal_conv1d(x, w, b, activation="silu", initial_state=s),
        lambda: [torch.randn(B, T, 6), torch.randn(6, 4), torch.randn(6), torch.randn(B, 6, 3)]),
    "causal_conv1d_step": (
        lambda x, s, w, b: linattn.causal_conv1d_step(x, s, w, b),
        lambda: [torch.randn(B, 6), torch.randn(B, 6, 3), torch.randn(6, 4), torch.randn(6)]),
    "rms_norm_gated": (
        lambda x, g, w: linattn.rms_norm_gated(x, g, w),
        lambda: [torch.randn(B, T, 6), torch.randn(B, T, 6), torch.randn(6)]),
    "reference.causal_conv1d": (
        lambda x, w, s: reference.causal_conv1d(x, w, initial_state=s),
        lambda: [torch.randn(B, T, 6), torch.randn(6, 4), torch.randn(B, 6, 3)]),
    "reference.gated_linear_attention": (
        lambda q, k, v, g: reference.gated_linear_attention(q, k, v, g=g),
        lambda: [torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, H, T, DV),
                 -torch.rand(B, H, T)]),
    "reference.delta_rule": (
        lambda q, k, v, b: reference.delta_rule(q, k, v, b),
        lambda: [torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, H, T, DV),
                 torch.rand(B, H, T)]),
}


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("name", list(STEP_CALLS))
def test_inference_tensors_beside_inputs_requiring_grad_in_steps_conv_and_norm(name, impl):
    """Each argument but the first made under torch.inference_mode in turn, the first
    requiring grad, and the reverse: the same output and gradient as with normal tensors
    (issue 51: torch's "Inference tensors cannot be saved for backward")."""
    call, make = STEP_CALLS[name]
    torch.manual_seed(3)
    xs = make()
    with dispatch.use(impl=impl):
        for i in range(1, len(xs)):
            for made, wanted in ((i, 0), (0, i)):
                odd = list(xs)
                odd[made], = _inference(xs[made])
                got = _out_and_grads(call, odd, [wanted])
                _assert_close_for(torch.float32, got, _out_and_grads(call, xs, [wanted]))


@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_a_state_written_in_place_that_is_an_inference_tensor(impl):
    """A state updated in place (inplace=True, fla's conv_state) made under
    torch.inference_mode: a ValueError naming it outside inference mode, where torch forbids
    the update (issue 51: torch's RuntimeError from the torch paths, while the compiled
    kernels wrote into it); inside inference mode the update happens in place."""
    torch.manual_seed(4)
    q, k, v = torch.randn(B, H, D), torch.randn(B, H, D), torch.randn(B, H, DV)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta, x, w = torch.rand(B, H), torch.randn(B, 6), torch.randn(6, 4)
    S, conv = _inference(torch.randn(B, H, D, DV), torch.randn(B, 6, 3))
    calls = {
        "state": lambda: linattn.delta_rule_step(q, k, v, beta, S, inplace=True),
        "state ": lambda: linattn.causal_conv1d_step(x, conv, w, inplace=True),
        "conv_state": lambda: linattn.fla.causal_conv1d_update(x, conv, w),
    }
    with dispatch.use(impl=impl):
        for name, call in calls.items():
            for grad_mode in (torch.no_grad, torch.enable_grad):
                before = (S.clone(), conv.clone())
                with grad_mode(), pytest.raises(
                        ValueError, match=rf"^{name.strip()}: written in place, but it was "
                                          r"made under torch.inference_mode"):
                    call()
                assert torch.equal(S, before[0]) and torch.equal(conv, before[1])
            with torch.inference_mode():
                before = (S.clone(), conv.clone())
                call()
                assert not (torch.equal(S, before[0]) and torch.equal(conv, before[1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_range_checks_see_every_element_and_refuse_nan(dtype):
    """The min-max reduction behind the value checks (β finite, log-gates <= 0, γ in [0, 1])
    finds one bad element anywhere, at either end, and nan among values in range."""
    from linattn.ops._common import check_range, within

    inf = float("inf")
    x = torch.rand(3, 1000, dtype=dtype) - 2  # in [-2, -1)
    assert within(x, -inf, 0.0) and within(x, -inf, inf, open_ends=True)
    assert within(x[:0], 0.0, 0.0)  # nothing to refuse
    for where in (0, 1717, 2999):
        for bad, lo, hi, open_ends in ((float("nan"), -inf, 0.0, False), (inf, -inf, inf, True),
                                       (-inf, -inf, inf, True), (0.5, -inf, 0.0, False)):
            y = x.clone()
            y.view(-1)[where] = bad
            assert not within(y, lo, hi, open_ends=open_ends), (where, bad)
            with pytest.raises(ValueError, match="^x: out of range, got it$"):
                check_range(y, lo, hi, "x: out of range", lambda: ", got it", open_ends=open_ends)
    y = x.clone()
    y.view(-1)[5] = -inf
    assert within(y, -inf, 0.0)  # a closed end takes its bound: a log-gate of -inf is a decay to 0
