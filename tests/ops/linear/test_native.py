"""The compiled float32 path (ops/linear/native.py, ops/linear/kernels.c) against the float64
reference.

The native path is forced for every length (``dispatch.use(impl="fast")``) and tiny blocks make
short sequences span several blocks (and partial causal chunks), so every hand-over of the
state (S, z) between blocks and chunks is exercised, forward and backward."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import _cbuild
from linattn.ops import dispatch, native
from linattn.ops.linear import native as lnative
from linattn.ops.linear import op as linear_mod
from linattn.ops.linear import passes

pytestmark = pytest.mark.skipif(
    lnative.kernels() is None, reason=f"compiled path: {lnative.unavailable()}"
)


@pytest.fixture
def native_on(fast_path_calls):
    """Force the fast path; count the calls that really took the native route."""
    return fast_path_calls(linear_mod, "native_linear_attention")


def _qkv(*batch, T, D, Dv, seed=0, Tq=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, Tq or T, D, generator=g) * 0.8
    k, v = torch.randn(*batch, T, D, generator=g) * 0.8, torch.randn(*batch, T, Dv, generator=g)
    return q, k, v


def _grads(fn, inputs, g):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(g.to(out.dtype))
    return out.detach(), [x.grad for x in leaves]


def _assert_matches_reference(q, k, v, chunk_size=None, **kw):
    """Output and input gradients of the fast path (float32) against the reference in float64,
    to float32 rounding: outputs to 2e-5, gradients to 2e-5 of their largest entry."""
    g = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(9))
    got, got_g = _grads(
        lambda *x: linattn.linear_attention(*x, chunk_size=chunk_size, **kw), (q, k, v), g
    )
    want, want_g = _grads(
        lambda *x: linattn.reference.linear_attention(*x, **kw),
        (q.double(), k.double(), v.double()),
        g.double(),
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
    for name, a, b in zip("qkv", got_g, want_g, strict=False):
        scale = max(b.abs().max().item(), 1e-2)  # T = 1: dq is exactly 0
        err = (a.double() - b).abs().max().item() / scale
        assert err < 2e-5, f"d{name}: relative error {err:.2e}"


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "T, D, Dv, chunk_size",
    [(23, 5, 4, 3), (40, 16, 16, 4), (64, 64, 64, None), (47, 20, 33, 5), (1, 3, 2, None),
     # widths and chunks that are multiples of 16: the one-pass compiled causal forward, with
     # several chunks per block, several blocks and a partial last chunk (recurrent form), and
     # a state beyond REC_MAX_STATE in kernels.c (its chunked form)
     (150, 16, 32, 16), (100, 32, 16, 32), (200, 64, 64, None), (70, 144, 128, 16)],
)
def test_matches_reference(native_on, feature_map, is_causal, T, D, Dv, chunk_size):
    q, k, v = _qkv(2, 3, T=T, D=D, Dv=Dv)
    _assert_matches_reference(q, k, v, feature_map=feature_map, is_causal=is_causal,
                              chunk_size=chunk_size)
    assert native_on, "the native path was not taken"


@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_mask_and_non_finite_padded_keys(native_on, is_causal):
    q, k, v = _qkv(2, 3, T=29, D=6, Dv=5)
    mask = torch.rand(2, 29, generator=torch.Generator().manual_seed(1)) < 0.3
    mask[:, 0] = False
    _assert_matches_reference(q, k, v, is_causal=is_causal, key_padding_mask=mask, chunk_size=4)
    # Whatever a padded key or value holds contributes nothing, its gradient is zero.
    k2, v2 = k.clone(), v.clone()
    per_head = mask[:, None].expand(2, 3, 29)
    k2[per_head], v2[per_head] = float("nan"), float("inf")
    k2, v2 = k2.requires_grad_(True), v2.requires_grad_(True)
    out = linattn.linear_attention(q, k2, v2, is_causal=is_causal, key_padding_mask=mask)
    torch.testing.assert_close(
        out, linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
    )
    out.sum().backward()
    assert torch.isfinite(k2.grad).all() and torch.isfinite(v2.grad).all()
    assert (k2.grad[per_head] == 0).all() and (v2.grad[per_head] == 0).all()


def test_every_key_padded_gives_zero_output(native_on):
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 2, T=10, D=4, Dv=3))
    out = linattn.linear_attention(q, k, v, key_padding_mask=torch.ones(1, 10, dtype=torch.bool))
    assert (out == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


class _CountingKernels(dict):
    """The bound kernels with the calls to one of them recorded (their fields, by name)."""

    def __init__(self, fns: dict, entry: str):
        super().__init__(fns)
        self.calls = []
        real = fns[entry]

        def counted(**fields):
            self.calls.append(types.SimpleNamespace(**fields))
            return real(**fields)

        self[entry] = counted


def test_one_pass_causal_forward_is_taken_and_partial_chunks(monkeypatch, native_on):
    """The compiled one-pass causal kernel (``la_causal_forward``) really runs, once for all T
    (keeping the state before each block of 16 tokens itself), on sequences whose last chunk
    holds 1 token (T = 129) and 15 tokens (T = 143), and gives the reference's values; the
    blocked kernels (one pass refused) agree with it to float32 rounding."""
    lib = _CountingKernels(lnative.kernels(), "causal_forward")
    monkeypatch.setattr(passes, "kernels", lambda isa="native": lib)
    one_pass = passes._single_pass
    for T in (129, 143):  # last chunks of 1 and 15 tokens
        q, k, v = _qkv(1, 2, T=T, D=16, Dv=32)
        lib.calls.clear()
        with torch.no_grad():
            got = linattn.linear_attention(q, k, v, is_causal=True, chunk_size=16)
        assert [(args.T, args.block) for args in lib.calls] == [(T, 16)]  # the tail inside
        want = linattn.reference.linear_attention(q.double(), k.double(), v.double(),
                                                  is_causal=True)
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
        lib.calls.clear()
        native_on.clear()
        monkeypatch.setattr(passes, "_single_pass", lambda b, c, backward=False: False)
        with torch.no_grad():
            blocked = linattn.linear_attention(q, k, v, is_causal=True, chunk_size=16)
        monkeypatch.setattr(passes, "_single_pass", one_pass)
        assert not lib.calls and native_on  # the blocked kernels, still the native path
        torch.testing.assert_close(got, blocked, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("is_causal", [False, True])
def test_threads_split_heads(monkeypatch, native_on, is_causal):
    """With several torch threads the compiled passes run on groups of heads in parallel:
    5 heads over 3 threads (uneven groups) give what one thread gives, forward and backward."""
    q, k, v = _qkv(1, 5, T=300, D=16, Dv=16)
    g = torch.randn(1, 5, 300, 16)
    results = []
    for threads in (1, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=threads: n)
        results.append(_grads(lambda *x: linattn.linear_attention(*x, is_causal=is_causal),
                              (q, k, v), g))
    (o1, g1), (o3, g3) = results
    torch.testing.assert_close(o3, o1, rtol=0, atol=0)
    for a, b in zip(g3, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("is_causal", [False, True])
def test_expanded_output_gradient(native_on, is_causal):
    """``.sum().backward()`` hands the op a stride-0 gradient, which the passes copy one block
    at a time: same gradients as an explicit tensor of ones."""
    q, k, v = _qkv(1, 3, T=140, D=16, Dv=32, Tq=None)
    run = lambda *x: linattn.linear_attention(*x, is_causal=is_causal)  # noqa: E731
    _, want = _grads(run, (q, k, v), torch.ones(1, 3, 140, 32))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    run(*leaves).sum().backward()
    for a, b in zip(leaves, want, strict=True):
        torch.testing.assert_close(a.grad, b, rtol=1e-6, atol=1e-6)
    assert native_on


@pytest.mark.parametrize("T, Tq, D, Dv", [(37, 13, 8, 7), (130, 70, 16, 32), (50, 200, 32, 16)])
def test_cross_lengths(native_on, T, Tq, D, Dv):
    """Non-causal with Tq != Tk: block passes (odd widths) and the one-pass kernels (widths
    multiples of 16, partial chunks on both sides)."""
    q, k, v = _qkv(2, T=T, D=D, Dv=Dv, Tq=Tq)
    _assert_matches_reference(q, k, v)


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_state_in_and_out_with_gradients(native_on, feature_map):
    """initial_state / return_state: values and gradients (through S and z) as the portable
    path computes them in float64."""
    q, k, v = _qkv(2, 2, T=19, D=6, Dv=5)
    S0 = torch.rand(2, 2, 6, 5, generator=torch.Generator().manual_seed(3))
    z0 = torch.rand(2, 2, 6, generator=torch.Generator().manual_seed(4)) + 1

    def run(q, k, v, S0, z0):
        st = linattn.LinearAttentionState(S=S0, z=z0)
        o, st = linattn.linear_attention(q, k, v, feature_map=feature_map, is_causal=True,
                                         chunk_size=4, initial_state=st, return_state=True)
        return o.sum() + (st.S * 0.3).sum() + (st.z * 0.7).sum()

    got = [x.clone().requires_grad_(True) for x in (q, k, v, S0, z0)]
    run(*got).backward()
    with dispatch.use(impl="portable"):
        want = [x.double().requires_grad_(True) for x in (q, k, v, S0, z0)]
        run(*want).backward()
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5)


def test_prefill_then_step_continues_exactly(native_on):
    q, k, v = _qkv(1, 2, T=21, D=5, Dv=4)
    full = linattn.linear_attention(q, k, v, is_causal=True, chunk_size=4)
    head, st = linattn.linear_attention(q[..., :20, :], k[..., :20, :], v[..., :20, :],
                                        is_causal=True, chunk_size=4, return_state=True)
    last, _ = linattn.linear_attention_step(q[..., 20, :], k[..., 20, :], v[..., 20, :], st)
    torch.testing.assert_close(torch.cat([head, last.unsqueeze(-2)], -2), full)


@pytest.mark.parametrize("Dv, chunk_size", [(12, None), (32, None), (16, 16)])
def test_default_sizes_long_sequence(Dv, chunk_size):
    """The shipped block size over several blocks of many chunks (Dv = 32, 16: the one-pass
    compiled causal forward and backward; Dv = 12: the chunked torch products), with a
    non-contiguous input."""
    q, k, v = _qkv(1, 2, T=2 * dispatch.Policy().block_size + 77, D=16, Dv=Dv)
    q = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, column-major rows
    for is_causal in (False, True):
        _assert_matches_reference(q, k, v, is_causal=is_causal, chunk_size=chunk_size)


@pytest.mark.parametrize("strided_grad", [False, True])
def test_causal_backward_over_several_blocks(native_on, strided_grad):
    """The compiled causal backward walks the blocks from the last in one call per group of
    heads where the output gradient's rows are contiguous (la_causal_backward_blocks), and
    block by block, its rows copied, where they are not: both against the reference, over
    five blocks (the last one short) of several chunks."""
    q, k, v = _qkv(2, 3, T=150, D=16, Dv=32)
    g = torch.randn(2, 3, 150, 32, generator=torch.Generator().manual_seed(4))
    if strided_grad:
        g = g.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, column-major
    with dispatch.use(block_size=32):
        got, got_g = _grads(lambda *x: linattn.linear_attention(*x, is_causal=True,
                                                                chunk_size=16), (q, k, v), g)
    want, want_g = _grads(lambda *x: linattn.reference.linear_attention(*x, is_causal=True),
                          (q.double(), k.double(), v.double()), g.double())
    assert native_on  # the compiled path ran
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
    for name, a, b in zip("qkv", got_g, want_g, strict=True):
        err = (a.double() - b).abs().max().item() / b.abs().max().item()
        assert err < 2e-5, f"d{name}: relative error {err:.2e}"


# ------------------------------------------------------------------------ the compiled passes


def _phi(kind: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    lnative.phi(kind, x, out)
    return out


def _exact_elu1(x: torch.Tensor) -> torch.Tensor:
    """1 + elu(x) from float64 (float32's elu(x) + 1 cancels: exp(-20) comes out 0)."""
    xd = x.double()
    return torch.where(xd > 0, xd + 1, torch.exp(xd)).float()


def test_phi_matches_exact_values_to_a_few_ulp():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(3, 1000, 16, generator=g) * s for s in (0.1, 1, 10, 40)], 1)
    torch.testing.assert_close(_phi(0, x), _exact_elu1(x), rtol=3e-7, atol=2e-38)
    torch.testing.assert_close(_phi(1, x), F.relu(x) + 1, rtol=0, atol=0)


def test_phi_special_values():
    x = torch.tensor([[[-float("inf"), -1e30, -100.0, -87.5, -0.0, 0.0, 1e-30, 1e30,
                        float("inf"), float("nan"), -1.0, 2.0, -5.0, 0.5, -20.0, 3.0, -0.25]]])
    elu, relu = _phi(0, x), _phi(1, x)
    want_elu, want_relu = _exact_elu1(x), F.relu(x) + 1
    torch.testing.assert_close(elu, want_elu, rtol=3e-7, atol=2e-38, equal_nan=True)
    torch.testing.assert_close(relu, want_relu, equal_nan=True)
    assert torch.isnan(elu[0, 0, 9]) and torch.isnan(relu[0, 0, 9])  # NaN propagates


def test_phi_keep_mask_and_column_sums():
    x = torch.randn(2, 9, 20)
    keep = torch.rand(2, 9) < 0.6
    out, z = torch.empty(2, 9, 20), torch.full((2, 20), 0.5)
    lnative.phi(0, x, out, z, keep)
    want = torch.where(keep.unsqueeze(-1), _exact_elu1(x), 0.0)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(z, 0.5 + want.sum(1))


def test_disabled_by_environment_or_missing_compiler(monkeypatch, tmp_path):
    q, k, v = _qkv(1, T=30, D=4, Dv=3)
    with dispatch.use(impl="fast"):
        want = linattn.linear_attention(q, k, v, is_causal=True)
    for setup in ({"env": "0"}, {"compiler": None}):
        monkeypatch.setattr(native.build, "_libs", {})
        monkeypatch.setattr(passes._KERNELS, "_bound", {})
        dispatch._memo.clear()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached there
        if "env" in setup:
            monkeypatch.setenv("LINATTN_NATIVE", "0")
        else:
            monkeypatch.delenv("LINATTN_NATIVE", raising=False)
            monkeypatch.setattr(_cbuild, "compiler", lambda: None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "no C compiler: torch path"
            with dispatch.use(impl="fast"):
                assert dispatch.select(linear_mod.OP, "causal forward", torch.float32, "cpu",
                                       False, ("map:compiled", "map:tokenwise")).backend == "fused"
                got = linattn.linear_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(got, want)
    dispatch._memo.clear()


def test_not_taken_for_other_dtypes_and_maps(native_on):
    q, k, v = _qkv(1, T=12, D=4, Dv=3)
    linattn.linear_attention(q.double(), k.double(), v.double())
    linattn.linear_attention(q, k, v, feature_map="taylor")
    assert not native_on


# --------------------------------------------------------------------------------- bfloat16


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_bfloat16_forward_matches_reference(native_on, feature_map, is_causal):
    """bfloat16 without gradients: products on bfloat16 blocks, sums and states in float32.
    The output is within a few bfloat16 rounding steps of the exact result for the same
    (rounded) inputs."""
    q, k, v = (x.bfloat16() for x in _qkv(2, 3, T=45, D=20, Dv=33))
    mask = torch.rand(2, 45, generator=torch.Generator().manual_seed(1)) < 0.3
    mask[:, 0] = False
    kw = dict(feature_map=feature_map, is_causal=is_causal, key_padding_mask=mask)
    with torch.no_grad():
        got = linattn.linear_attention(q, k, v, chunk_size=4, **kw)
    want = linattn.reference.linear_attention(q.double(), k.double(), v.double(), **kw)
    assert got.dtype == torch.bfloat16 and native_on
    eps = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got.double(), want, rtol=4 * eps, atol=4 * eps)


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("T, chunk", [(1, 32), (64, 32), (301, 32), (45, 48), (200, 64)])
@pytest.mark.parametrize("D, Dv", [(64, 48), (160, 112), (64, 64)])
def test_bfloat16_one_pass_within_its_bound(native_on, amx, feature_map, is_causal, T, chunk, D,
                                            Dv):
    """The one-pass forwards on bfloat16 (ℓ a multiple of 32, no mask), which run their
    products on bfloat16 dot products where the build has them (kernels.c: φ(k), φ(q), the
    state and the causal scores rounded to bfloat16, sums in float32): |o − exact| ≤
    3u·max_t |v_tj| + u·|o_j| with u = 2⁻⁸ (bfloat16's unit roundoff; a u for each rounded
    operand of a product and for the state or score it came from, one for the output), plus
    float32 sums and, in the non-causal form, 4·2⁻¹⁷·max_t |v_tj| for φ made to 2⁻¹⁷ (tiles.h).
    On AMX tiles the products round the same operands. Elsewhere the float32-arithmetic
    passes meet the same bound: the causal recurrent form takes states up to 128 x 128
    (D = 64; on tiles the chunked form takes every size), the dot products the larger one;
    Dv = 64 and chunks of 64 fill whole tiles."""
    q, k, v = (x.bfloat16() for x in _qkv(2, 3, T=T, D=D, Dv=Dv, seed=T))
    with torch.no_grad():
        # chunks of 32 or 48: the one-pass kernels (the fixture's chunks of 4 take the block
        # passes); T = 45 in one chunk of 48 leaves rows and pairs beyond the tiles' 16s
        got = linattn.linear_attention(q, k, v, feature_map=feature_map, is_causal=is_causal,
                                       chunk_size=chunk)
    want = linattn.reference.linear_attention(q.double(), k.double(), v.double(),
                                              feature_map=feature_map, is_causal=is_causal)
    assert got.dtype == torch.bfloat16 and native_on
    u = torch.finfo(torch.bfloat16).eps / 2
    vmax = v.double().abs().amax(dim=-2, keepdim=True)  # per head and column
    phi_err = 0.0 if is_causal else 4 * 2.0**-17
    bound = 3 * u * vmax + u * want.abs() + (64 * torch.finfo(torch.float32).eps + phi_err) * vmax
    err = (got.double() - want).abs()
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("D, Dv", [(32, 16), (160, 112)])
def test_bfloat16_with_gradients_against_the_reference(native_on, monkeypatch, is_causal, D, Dv):
    """bfloat16 with gradients: the one-pass backwards read q, k, v, the output and its
    gradient as bfloat16 rows and write dq, dk, dv in bfloat16, with no widened copy made (no
    cast in Python); where they cannot (the causal state above the recurrent form's 128 x 128:
    D = 160, Dv = 112), the inputs are widened to float32 first (a differentiable cast). Either
    way the output and the gradients are within a bfloat16 rounding of the exact ones."""
    base = [x.bfloat16() for x in _qkv(1, 2, T=70, D=D, Dv=Dv)]
    g = torch.randn(1, 2, 70, Dv, generator=torch.Generator().manual_seed(3))
    leaves = [x.clone().requires_grad_(True) for x in base]
    casts = []
    real_cast = lnative.recycled_cast
    monkeypatch.setattr(lnative, "recycled_cast", lambda *a: casts.append(1) or real_cast(*a))
    out = linattn.linear_attention(*leaves, is_causal=is_causal, chunk_size=32)
    assert native_on and out.dtype == torch.bfloat16
    out.backward(g.bfloat16())
    widened = is_causal and D * Dv > passes.REC_MAX_STATE
    assert len(casts) == (4 if widened else 0)  # q, k, v and the output's rounding
    wide = [x.double().requires_grad_(True) for x in base]
    want = linattn.reference.linear_attention(*wide, is_causal=is_causal)
    want.backward(g.bfloat16().double())
    eps = torch.finfo(torch.bfloat16).eps
    gots, refs = [out] + [x.grad for x in leaves], [want] + [x.grad for x in wide]
    for got, ref in zip(gots, refs, strict=True):
        assert got.dtype == torch.bfloat16
        atol = eps * ref.abs().max().item()
        torch.testing.assert_close(got.double(), ref.detach(), rtol=eps, atol=atol)


@pytest.mark.parametrize("is_causal, T", [(True, 1), (True, 200), (False, 200)])
def test_bfloat16_gradients_where_dq_cancels(native_on, is_causal, T):
    """A loss of the output's own values (Σ o² over every other token): g = 2o, so that
    dφ(q) = S·dn + ds·z cancels at a causal run's first tokens (exactly, at the first one).
    The one-pass backwards take ds from S·dn (the state they hold) rather than from the saved
    output: read from the bfloat16 output, its rounding left ~2⁻⁹·|g||o|/s in dq, 7 % of dq's
    largest entry at T = 200 (a reviewer's case). Bound: the forward's bfloat16 products
    (3u·max|v|, u = 2⁻⁸, reaching the gradients through g = 2o) and the gradients' own rounding:
    2·eps of the largest entry. (Not the non-causal T = 1, whose exact dq is 0: its state's
    sums take φ(k) rounded to bfloat16 and its normaliser's the float32 φ(k), so its dq is
    ~u·|g||v| of that mismatch, 0.3 % of dv's largest entry, where the widened path gave 2e-6.)"""
    gen = torch.Generator().manual_seed(T)
    base = [torch.randn(2, 3, T, d, generator=gen).bfloat16() for d in (32, 32, 48)]

    def grads(dtype, fn):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in base]
        fn(*leaves, is_causal=is_causal)[..., ::2, :].float().pow(2).sum().backward()
        return [x.grad.double() for x in leaves]

    got = grads(torch.bfloat16, lambda *a, **kw: linattn.linear_attention(*a, chunk_size=32, **kw))
    want = grads(torch.float64, linattn.reference.linear_attention)
    assert native_on
    eps = torch.finfo(torch.bfloat16).eps
    for a, b in zip(got, want, strict=True):  # (T = 1: dq, dk are eps's terms, ~1e-6)
        scale = max(b.abs().max().item(), 1e-3)
        torch.testing.assert_close(a, b, rtol=eps, atol=2 * eps * scale)


@pytest.mark.parametrize("feature_map", [0, 1])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("T", [1, 37, 300])
def test_bfloat16_backward_is_the_float32_one_rounded(feature_map, is_causal, T):
    """The one-pass backwards on bfloat16 rows (q, k, v, the saved output, its gradient) are
    the float32 backward on the values those rows hold, each gradient rounded once: dq, dk, dv
    within one bfloat16 rounding of the float32 pass's, the state's gradients (float32 sums)
    equal to float32 rounding. T = 37: partial chunks (32 a chunk, blocks of 64 tokens)."""
    N, L, Dv, chunk, block = 3, 64, 48, 32, 64
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(N, T, d, generator=gen).bfloat16() for d in (L, L, Dv))
    g_out = torch.randn(N, T, Dv, generator=gen).bfloat16()
    S0, z0 = torch.randn(N, L, Dv, generator=gen) / 4, torch.rand(N, L, generator=gen) + 1
    g_S, g_z = torch.randn(N, L, Dv, generator=gen), torch.randn(N, L, generator=gen)
    out, S, z, Ss, zs = passes.forward(q, k, v, S0, z0, None, feature_map, 1e-6, block, chunk,
                                       is_causal, "native")
    common = (S0, z0, Ss, zs, S, z)
    rest = (g_S, g_z, feature_map, 1e-6, block, chunk, is_causal, "native")
    got = passes.backward(q, k, v, None, *common, out, g_out, *rest)
    want = passes.backward(q.float(), k.float(), v.float(), None, *common, out.float(),
                           g_out.float(), *rest)
    eps, f32 = torch.finfo(torch.bfloat16).eps, torch.finfo(torch.float32).eps
    for a, b in zip(got[:3], want[:3], strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b, rtol=eps, atol=eps * b.abs().max().item())
    for a, b in zip(got[3:], want[3:], strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=16 * f32, atol=16 * f32 * b.abs().max().item())


def test_bfloat16_backward_rule_is_the_kernels():
    """Python's rule for which backwards take bfloat16 rows (passes.REC_MAX_STATE, plain
    Python under torch.compile) is the kernels' own (la_linear_backward_bf16), which refuses
    the others."""
    fns = lnative.kernels()
    for L, Dv in [(16, 16), (64, 64), (128, 128), (144, 112), (128, 144), (256, 64), (160, 112)]:
        assert fns["backward_bf16"](0, L, Dv) == 1
        assert fns["backward_bf16"](1, L, Dv) == (L * Dv <= passes.REC_MAX_STATE)
        assert passes.backward_takes_bf16(L, Dv, 32, True, False) == (
            L * Dv <= passes.REC_MAX_STATE)


def test_phi_bfloat16_in_and_out():
    x = torch.randn(2, 50, 40) * 5
    xb = x.bfloat16()
    want = _exact_elu1(xb.float())
    eps = torch.finfo(torch.bfloat16).eps
    for src, dst_dtype in ((xb, torch.bfloat16), (xb, torch.float32), (x, torch.bfloat16)):
        out = torch.empty(x.shape, dtype=dst_dtype)
        lnative.phi(0, src, out)
        ref = _exact_elu1(src.float()).to(dst_dtype)
        torch.testing.assert_close(out.float(), ref.float(), rtol=eps, atol=1e-37)
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    lnative.phi(0, xb, out)
    torch.testing.assert_close(out.float(), want, rtol=eps, atol=1e-37)
    nan = torch.full((1, 1, 17), float("nan"), dtype=torch.bfloat16)
    out = torch.empty_like(nan)
    lnative.phi(0, nan, out)
    assert torch.isnan(out).all()


# ------------------------------------------------------------------- edge cases from review


def test_relu_gradient_for_tiny_positive_inputs(native_on):
    """1 + relu has gradient 1 for every x > 0, also where 1 + x rounds to 1 in float32."""
    q, k, v = _qkv(1, 1, T=40, D=16, Dv=16)
    k = k.abs() * 1e-8  # 0 < k < 2^-24: φ(k) == 1 exactly, φ'(k) == 1
    for is_causal in (False, True):
        _assert_matches_reference(q, k, v, feature_map="relu", is_causal=is_causal)
    mask = torch.zeros(1, 40, dtype=torch.bool)  # the block passes (padding mask) too
    _assert_matches_reference(q, k, v, feature_map="relu", key_padding_mask=mask)


def test_bfloat16_with_a_trainable_initial_state(native_on):
    """bfloat16 inputs, initial state that needs gradients: the compiled passes (D = 8: the
    block passes, the inputs widened), gradients flow to the state."""
    q, k, v = (x.bfloat16() for x in _qkv(1, 2, T=20, D=8, Dv=6))
    S = torch.rand(1, 2, 8, 6, requires_grad=True)
    z = (torch.rand(1, 2, 8) + 1).requires_grad_(True)
    out = linattn.linear_attention(q, k, v, is_causal=True,
                                   initial_state=linattn.LinearAttentionState(S=S, z=z))
    out.float().sum().backward()
    assert native_on and torch.isfinite(S.grad).all() and torch.isfinite(z.grad).all()


@pytest.mark.parametrize("impl", ["auto", "fast", "portable"])
def test_initial_state_on_another_device_is_a_clean_error(impl):
    q, k, v = _qkv(1, 2, T=20, D=8, Dv=6)
    st = linattn.LinearAttentionState(S=torch.zeros(1, 2, 8, 6, device="meta"),
                                      z=torch.zeros(1, 2, 8, device="meta"))
    want = r"^initial_state: expected S and z on the inputs' device cpu, got meta and meta$"
    with dispatch.use(impl=impl), pytest.raises(ValueError, match=want):
        linattn.linear_attention(q, k, v, is_causal=True, initial_state=st)


@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_batch(is_causal):
    q, k, v = (x.requires_grad_(True) for x in _qkv(0, 4, T=70, D=16, Dv=16))
    out = linattn.linear_attention(q, k, v, is_causal=is_causal)
    assert out.shape == (0, 4, 70, 16)
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_threads_after_fork(forked_child_exit):
    """A child forked after the head-group thread pool started must not wait on the parent's
    (absent) worker threads."""
    setup = (
        "import os, torch, linattn\n"
        "torch.set_num_threads(2)\n"
        "q = torch.randn(1, 4, 200, 16)\n"
        "linattn.linear_attention(q, q, q, is_causal=True)\n"
    )
    child = (
        "linattn.linear_attention(q, q, q, is_causal=True)\n"
        "os._exit(7)\n"
    )
    assert forked_child_exit(setup, child) == 7
