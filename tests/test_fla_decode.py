"""linattn.fla's delta-rule front door at one token per sequence (issue 25): T = 1, or a packed
batch of one-token sequences (cu_seqlens 0, 1, ..., N), goes to the decoding step
(:func:`linattn.delta_rule_step`; the plain float32 case straight to the compiled kernel)
instead of the chunked form, with the same results and the same errors as the general path.
The ground truth is the float64 sequential reference, :func:`linattn.reference.delta_rule`;
the lean step itself (``inplace=``, ±inf β) is tested here too."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import fla
from linattn.ops import dispatch
from linattn.ops.delta import native as delta_native
from linattn.ops.delta import op as delta_op
from linattn.ops.gated import fla as gated_fla
from linattn.ops.reference import delta_rule as reference
from linattn.ops.reference import gated_linear_attention as gla_reference

pytestmark = pytest.mark.usefixtures("single_thread")



def skip_unless_takes(impl: str) -> None:
    """Skip when the dispatcher would refuse ``impl`` for a float32 step here (no compiled
    path, or LINATTN_NATIVE=0)."""
    try:
        with dispatch.use(impl=impl):
            dispatch.select("delta_rule", "step", torch.float32, "cpu", False, ("V:16",))
    except ValueError as e:
        pytest.skip(str(e))

B, H, K, V = 2, 3, 8, 16  # V a multiple of 16: the compiled step takes it


def make(T=1, dtype=torch.float64, seed=0, batch=B):
    """fla-layout q, k, v (batch, T, H, ·), g, beta (batch, T, H), h0 (batch, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"q": r(batch, T, H, K), "k": F.normalize(r(batch, T, H, K), dim=-1),
         "v": r(batch, T, H, V), "g": F.logsigmoid(r(batch, T, H) + 2),
         "beta": torch.sigmoid(r(batch, T, H)), "h0": r(batch, H, K, V) * 0.5}
    return {n: t.to(dtype) for n, t in x.items()}


def expected(x, *, gated, h0, scale, l2):
    """The reference over head-first views: o (B, T, H, V), final state (B, H, K, V)."""
    def hf(t):
        return None if t is None else t.double().transpose(1, 2)

    o, S = reference(hf(x["q"]), hf(x["k"]), hf(x["v"]), hf(x["beta"]),
                     hf(x["g"]) if gated else None, scale=scale,
                     initial_state=None if h0 is None else h0.double(), qk_l2norm=l2)
    return o.transpose(1, 2), S


def call(gated, x, **kw):
    if gated:
        return fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"],
                                                    beta=x["beta"], **kw)
    return fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw)


@pytest.fixture
def no_chunked_form(monkeypatch):
    """The chunked form must not run: a call that reaches it fails."""
    def refuse(*a, **kw):
        raise AssertionError("the chunked delta_rule ran for one-token sequences")

    monkeypatch.setattr(delta_op, "delta_rule", refuse)


CASES = list(itertools.product(
    [True, False],  # gated
    [False, True],  # initial_state given
    [False, True],  # output_final_state
    [None, 0.3],  # scale
    [False, True],  # use_qk_l2norm_in_kernel
))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gated, given, final, scale, l2", CASES)
def test_one_token_equals_reference(no_chunked_form, assert_close, dtype, gated, given, final,
                                    scale, l2):
    x = make(dtype=dtype)
    h0 = x["h0"].float() if given and dtype == torch.float32 else x["h0"] if given else None
    o, S = call(gated, x, scale=scale, initial_state=h0, output_final_state=final,
                use_qk_l2norm_in_kernel=l2)
    o_r, S_r = expected(x, gated=gated, h0=h0, scale=scale, l2=l2)
    assert o.shape == (B, 1, H, V) and o.dtype == dtype
    assert_close(o, o_r, ulps=64)
    if not final:
        assert S is None
        return
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert S.shape == (B, H, K, V) and S.dtype == acc
    assert_close(S, S_r, ulps=64)
    if given:
        assert S is not h0 and S.data_ptr() != h0.data_ptr()  # a new state, h0 untouched
        assert torch.equal(h0, x["h0"].to(h0.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_token_state_v_first(no_chunked_form, assert_close, dtype):
    x = make(dtype=dtype)
    h0 = x["h0"].to(torch.float32 if dtype == torch.float32 else dtype)
    o, S = call(True, x, initial_state=h0.transpose(-1, -2).contiguous(),
                output_final_state=True, state_v_first=True)
    o_r, S_r = expected(x, gated=True, h0=h0, scale=None, l2=False)
    assert_close(o, o_r, ulps=64)
    assert S.shape == (B, H, V, K)
    assert_close(S, S_r.transpose(-1, -2), ulps=64)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_one_token_sequences(no_chunked_form, assert_close, gated, dtype):
    """cu_seqlens 0, 1, ..., N over (1, N, H, ·): N decoding steps, one state each."""
    N = 4
    x = make(T=N, batch=1, dtype=dtype)
    h0 = make(batch=N, dtype=torch.float64)["h0"].to(x["h0"].dtype)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=torch.arange(N + 1))
    o, S = call(gated, x, **kw)
    assert o.shape == (1, N, H, V) and S.shape == (N, H, K, V)
    for n in range(N):  # each token alone, from its own state
        one = {name: t[:, n:n + 1] for name, t in x.items() if name != "h0"}
        o_r, S_r = expected(one, gated=gated, h0=h0[n:n + 1], scale=None, l2=False)
        assert_close(o[:, n:n + 1], o_r, ulps=64)
        assert_close(S[n:n + 1], S_r, ulps=64)


def test_longer_packed_sequences_take_the_chunked_form(assert_close):
    """cu_seqlens with a sequence of two tokens is no batch of steps: the general path, equal."""
    x = make(T=3, batch=1)
    h0 = make(batch=2)["h0"]
    o, S = call(True, x, initial_state=h0, output_final_state=True,
                cu_seqlens=torch.tensor([0, 1, 3]))
    o2, S2 = call(True, {n: t[:, 1:] for n, t in x.items() if n != "h0"}, initial_state=h0[1:],
                  output_final_state=True)
    assert_close(o[:, 1:], o2)
    assert_close(S[1:], S2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_token_errors_name_fla_arguments(dtype):
    """The errors of the general path, with fla's names (not the step's beta_t, g_t)."""
    x = make(dtype=dtype)
    h0 = x["h0"].to(torch.float32 if dtype == torch.float32 else dtype)
    for bad in (float("inf"), -float("inf"), float("nan")):
        beta = x["beta"].clone()
        beta[1, 0, 2] = bad
        with pytest.raises(ValueError, match=r"^beta: expected finite values"):
            fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=beta,
                                                 initial_state=h0)
        with pytest.raises(ValueError, match=r"^beta: expected finite values"):
            fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], beta, initial_state=h0)
    for bad in (0.5, float("nan")):
        g = x["g"].clone()
        g[0, 0, 1] = bad
        with pytest.raises(ValueError, match=r"^g: expected log decays <= 0"):
            fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g, beta=x["beta"],
                                                 initial_state=h0)
    with pytest.raises(ValueError, match=r"^scale: "):
        call(False, x, scale=-1.0, initial_state=h0)  # (fused_recurrent_delta_rule: > 0)
    with pytest.raises(ValueError, match=r"^scale: "):
        call(True, x, scale=float("nan"), initial_state=h0)
    with pytest.raises(ValueError, match=r"^initial_state: expected shape"):
        call(True, x, initial_state=h0[:1])
    with pytest.raises(ValueError, match=r"^output_final_state: expected a bool"):
        call(True, x, initial_state=h0, output_final_state="yes")
    with pytest.raises(ValueError, match=r"^v: "):
        call(True, {**x, "v": x["v"][:1]}, initial_state=h0)


def test_float32_front_door_runs_the_compiled_step(monkeypatch, assert_close):
    """The plain float32 token goes straight to the kernel (step_into), nothing else."""
    skip_unless_takes("native")
    seen = []
    real = delta_native.step_into

    def counting(*a, **kw):
        seen.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(delta_native, "step_into", counting)
    x = make(dtype=torch.float32)
    with dispatch.use(impl="native"):
        o, S = call(True, x, initial_state=x["h0"], output_final_state=True)
    assert seen == [1]
    o_r, S_r = expected(x, gated=True, h0=x["h0"], scale=None, l2=False)
    assert_close(o, o_r, ulps=64)
    assert_close(S, S_r, ulps=64)


# ------------------------------------------------------------------------- the lean step


def _step_inputs(dtype=torch.float32):
    x = make(dtype=dtype)
    return ([x[n][:, 0] for n in ("q", "k", "v", "beta")], x["g"][:, 0],
            x["h0"].to(torch.float64 if dtype == torch.float64 else torch.float32))


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_inplace(assert_close, impl, dtype):
    """inplace=True writes the new state into the given one and returns that object; the
    values are the out-of-place step's."""
    if impl == "native" and dtype == torch.float64:
        pytest.skip("the compiled step takes float32")
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs(dtype)
    with dispatch.use(impl=impl):
        o, S_new = linattn.delta_rule_step(q, k, v, beta, S, g_t=g, qk_l2norm=True)
        S_in = S.clone()
        o2, S2 = linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, qk_l2norm=True,
                                         inplace=True)
    assert S2 is S_in
    assert_close(o2, o)
    assert_close(S2, S_new)
    assert not torch.equal(S2, S)


def test_step_inplace_needs_a_state_of_the_accumulation_dtype():
    (q, k, v, beta), g, S = _step_inputs()
    with pytest.raises(ValueError, match=r"^state: inplace=True needs a state in torch.float32"):
        linattn.delta_rule_step(q, k, v, beta, None, inplace=True)
    with pytest.raises(ValueError, match=r"^state: inplace=True needs"):
        linattn.delta_rule_step(q, k, v, beta, S.double(), inplace=True)
    with pytest.raises(TypeError, match=r"^inplace: expected a bool"):
        linattn.delta_rule_step(q, k, v, beta, S, inplace=1)


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_step_refuses_non_finite_beta_on_every_path(impl, bad):
    """±inf β made the compiled step's output and state inf/nan unchecked (nan was refused by
    the kernel); now every path refuses all three, and an in-place state is left as it was."""
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs()
    beta = beta.clone()
    beta[0, 1] = bad
    S_in = S.clone()
    with dispatch.use(impl=impl), pytest.raises(ValueError, match=r"^beta_t: "):
        linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, inplace=True)
    assert torch.equal(S_in, S)
    big = torch.full_like(beta, 3e38)  # finite, but its sum overflows: still accepted
    with dispatch.use(impl=impl):
        o, _ = linattn.delta_rule_step(q, k, v, big, S, g_t=g)
    assert o.shape == v.shape


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
def test_step_refuses_positive_gates_without_writing(impl):
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs()
    g = g.clone()
    g[1, 0] = 0.25
    S_in = S.clone()
    with dispatch.use(impl=impl), pytest.raises(ValueError, match=r"^g_t: "):
        linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, inplace=True)
    assert torch.equal(S_in, S)


def test_the_beta_check_of_a_step_runs_no_reduction(monkeypatch):
    """fla's β is (B, 1, H): the compiled step's kernel checks it (nan and ±inf refused, before
    anything is written) and a good step runs no tensor reduction in Python (one cost a third of
    a step)."""
    skip_unless_takes("native")
    x = make(dtype=torch.float32)
    h0 = x["h0"].clone()
    for bad in (float("nan"), float("inf"), -float("inf")):
        beta = x["beta"].clone()
        beta[1, 0, 2] = bad
        with pytest.raises(ValueError, match=r"beta"):
            call(True, {**x, "beta": beta}, initial_state=h0, output_final_state=True)
        assert torch.equal(h0, x["h0"])

    def no_reduction(*a, **kw):
        raise AssertionError("a tensor reduction ran")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "isfinite", no_reduction)
        m.setattr(torch.Tensor, "isnan", no_reduction)
        o, S = call(True, x, initial_state=h0, output_final_state=True)
    assert o.shape == x["v"].shape and S.shape == h0.shape


# -------------------- GLA at one token
# linattn.fla's GLA front door at one token per sequence (issue 25): T = 1, or a packed batch
# of one-token sequences (cu_seqlens 0, 1, ..., N), goes to the decoding step
# (:func:`linattn.gated_linear_attention_step`) instead of the chunked form, with the results of
# the float64 sequential reference (:func:`linattn.reference.gated_linear_attention`).


def make_gla(dtype, seed=0):
    """fla-layout q, k (B, 1, H, K), v (B, 1, H, V), gates, h0 (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"q": r(B, 1, H, K), "k": r(B, 1, H, K), "v": r(B, 1, H, V),
         "g": F.logsigmoid(r(B, 1, H)), "gk": F.logsigmoid(r(B, 1, H, K)),
         "gv": F.logsigmoid(r(B, 1, H, V)), "h0": r(B, H, K, V) * 0.5}
    return {n: t.to(dtype) for n, t in x.items()}


@pytest.fixture
def no_gla_chunked_form(monkeypatch):
    """Fails the test if the chunked form runs: one token must take the step."""
    def refuse(*a, **kw):
        raise AssertionError("the chunked form ran for one token")
    monkeypatch.setattr(gated_fla, "gated_linear_attention", refuse)


def hf(t):
    return None if t is None else t.double().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gates,h0,final,svf,packed", list(itertools.product(
    [("gk",), ("gv",), ("gk", "gv")], [False, True], [False, True], [False, True],
    [False, True])))
def test_fused_recurrent_gla_one_token(no_gla_chunked_form, dtype, gates, h0, final, svf,
                                       packed):
    x = make_gla(dtype)
    kw = {g: x[g] for g in gates}
    S0 = x["h0"] if h0 else None
    if packed:  # B one-token sequences packed into one batch row
        args = [x[n].reshape(1, B, H, -1) for n in ("q", "k", "v")]
        kw = {g: t.reshape(1, B, H, -1) for g, t in kw.items()}
        kw["cu_seqlens"] = torch.arange(B + 1)
    else:
        args = [x[n] for n in ("q", "k", "v")]
    init = None if S0 is None else (S0.transpose(-1, -2).contiguous() if svf else S0)
    o, S = fla.fused_recurrent_gla(*args, **kw, scale=0.5, initial_state=init,
                                   output_final_state=final, state_v_first=svf)
    want_o, want_S = gla_reference(hf(x["q"]), hf(x["k"]), hf(x["v"]),
                               gk=hf(x["gk"]) if "gk" in gates else None,
                               gv=hf(x["gv"]) if "gv" in gates else None, scale=0.5,
                               initial_state=None if S0 is None else S0.double())
    tol = {"rtol": 64 * torch.finfo(dtype).eps, "atol": 64 * torch.finfo(dtype).eps}
    assert o.dtype == dtype and o.shape == args[2].shape
    torch.testing.assert_close(o.double().reshape(B, 1, H, V), want_o.transpose(1, 2), **tol)
    if not final:
        assert S is None
    else:
        got = S.transpose(-1, -2) if svf else S
        torch.testing.assert_close(got.double(), want_S, **tol)


@pytest.mark.parametrize("name", ["fused_recurrent_simple_gla", "chunk_simple_gla"])
def test_simple_gla_one_token(no_gla_chunked_form, name):
    x = make_gla(torch.float64)
    o, S = getattr(fla, name)(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"],
                              output_final_state=True)
    want_o, want_S = gla_reference(hf(x["q"]), hf(x["k"]), hf(x["v"]), g=hf(x["g"]),
                               initial_state=x["h0"])
    torch.testing.assert_close(o, want_o.transpose(1, 2))
    torch.testing.assert_close(S, want_S)


def test_reverse_of_one_token_is_the_token(no_gla_chunked_form):
    x = make_gla(torch.float64)
    fwd = fla.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["gk"], initial_state=x["h0"],
                                  output_final_state=True)
    rev = fla.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["gk"], initial_state=x["h0"],
                                  output_final_state=True, reverse=True)
    for a, b in zip(fwd, rev, strict=True):
        torch.testing.assert_close(a, b)


def test_two_tokens_still_take_the_chunked_form(monkeypatch):
    calls = []
    real = gated_fla.gated_linear_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gated_fla, "gated_linear_attention", spy)
    x = make_gla(torch.float64)
    q, k, v = (torch.cat([x[n], x[n]], 1) for n in ("q", "k", "v"))
    fla.fused_recurrent_gla(q, k, v, gk=torch.cat([x["gk"], x["gk"]], 1))
    assert calls == [1]
