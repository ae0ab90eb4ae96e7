"""linattn.fla's GLA front door at one token per sequence (issue 25): T = 1, or a packed batch
of one-token sequences (cu_seqlens 0, 1, ..., N), goes to the decoding step
(:func:`linattn.gated_linear_attention_step`) instead of the chunked form, with the results of
the float64 sequential reference (:func:`linattn.reference.gated_linear_attention`)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from linattn import fla
from linattn.ops.gated import fla as gated_fla
from linattn.ops.reference import gated_linear_attention as reference

B, H, K, V = 2, 3, 8, 16


def make(dtype, seed=0):
    """fla-layout q, k (B, 1, H, K), v (B, 1, H, V), gates, h0 (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"q": r(B, 1, H, K), "k": r(B, 1, H, K), "v": r(B, 1, H, V),
         "g": F.logsigmoid(r(B, 1, H)), "gk": F.logsigmoid(r(B, 1, H, K)),
         "gv": F.logsigmoid(r(B, 1, H, V)), "h0": r(B, H, K, V) * 0.5}
    return {n: t.to(dtype) for n, t in x.items()}


@pytest.fixture
def no_chunked_form(monkeypatch):
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
def test_fused_recurrent_gla_one_token(no_chunked_form, dtype, gates, h0, final, svf,
                                       packed):
    x = make(dtype)
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
    want_o, want_S = reference(hf(x["q"]), hf(x["k"]), hf(x["v"]),
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
def test_simple_gla_one_token(no_chunked_form, name):
    x = make(torch.float64)
    o, S = getattr(fla, name)(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"],
                              output_final_state=True)
    want_o, want_S = reference(hf(x["q"]), hf(x["k"]), hf(x["v"]), g=hf(x["g"]),
                               initial_state=x["h0"])
    torch.testing.assert_close(o, want_o.transpose(1, 2))
    torch.testing.assert_close(S, want_S)


def test_reverse_of_one_token_is_the_token(no_chunked_form):
    x = make(torch.float64)
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
    x = make(torch.float64)
    q, k, v = (torch.cat([x[n], x[n]], 1) for n in ("q", "k", "v"))
    fla.fused_recurrent_gla(q, k, v, gk=torch.cat([x["gk"], x["gk"]], 1))
    assert calls == [1]
