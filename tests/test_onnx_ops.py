"""linattn.onnx.ops: the torch ops that an ONNX export traces, without onnx installed.

Each equals linattn's sequential float64 references (the ONNX operators' definitions: the
recurrence token by token) and passes torch's own op checks (fake shapes, schema)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linattn.onnx.ops  # noqa: F401  (registers the ops)
from linattn import reference

pytestmark = pytest.mark.usefixtures("single_thread")

OP = torch.ops.linattn.onnx_linear_attention.default


def _inputs(B=2, T=9, H=2, d=8, per_key=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, d, generator=gen)
    k = F.normalize(torch.randn(B, T, H, d, generator=gen), dim=-1)
    v = torch.randn(B, T, H, d, generator=gen)
    s = torch.randn(B, H, d, d, generator=gen)
    g = -torch.rand(B, T, H, d if per_key else 1, generator=gen) * 0.3
    b = torch.rand(B, T, H, generator=gen)
    return q, k, v, s, g, b


@pytest.mark.parametrize("rule,per_key", [("linear", False), ("gated", False), ("gated", True),
                                          ("delta", False), ("gated_delta", False)])
def test_matches_reference(rule, per_key, assert_close):
    q, k, v, s, g, b = _inputs(per_key=per_key)
    B, T, H, d = q.shape
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    decay = g.reshape(B, T, -1) if gated else None
    beta = b if delta else None
    o, S = OP(q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1), s, decay, beta,
              rule, H, 0.5)
    heads = [t.transpose(1, 2).double() for t in (q, k, v)]  # (B, H, T, d)
    gh = g.transpose(1, 2).double()
    if delta:
        ro, rS = reference.delta_rule(*heads, b.transpose(1, 2).double(),
                                      gh[..., 0] if gated else None, scale=0.5,
                                      initial_state=s.double())
    else:
        g_, gk = (None, None) if not gated else (None, gh) if per_key else (gh[..., 0], None)
        ro, rS = reference.gated_linear_attention(*heads, g=g_, gk=gk, scale=0.5,
                                                  initial_state=s.double())
    assert_close(o, ro.transpose(1, 2).reshape(B, T, -1).float(), ulps=64)
    assert_close(S, rS.float(), ulps=64)


def test_opcheck():
    q, k, v, s, g, b = _inputs(T=5)
    B, T, H, d = q.shape
    args = (q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1), s,
            g.reshape(B, T, -1), b, "gated_delta", H, 0.5)
    torch.library.opcheck(OP, args, test_utils=("test_schema", "test_faketensor"))
    x, w, st = torch.randn(2, 6, 7), torch.randn(6, 1, 4), torch.randn(2, 6, 3)
    torch.library.opcheck(torch.ops.linattn.onnx_causal_conv.default, (x, w, st, "silu"),
                          test_utils=("test_schema", "test_faketensor"))


def test_causal_conv_matches_reference(assert_close):
    gen = torch.Generator().manual_seed(0)
    x, w, st = (torch.randn(2, 6, 7, generator=gen), torch.randn(6, 1, 4, generator=gen),
                torch.randn(2, 6, 3, generator=gen))
    y, tail = torch.ops.linattn.onnx_causal_conv(x, w, st, "silu")
    # linattn's reference: channel-last x, weight (D, W) with its last tap on the newest input
    ry, rtail = reference.causal_conv1d(x.transpose(1, 2).double(), w[:, 0].double(),
                                        activation="silu", initial_state=st.double())
    assert_close(y, ry.transpose(1, 2).float(), ulps=16)
    torch.testing.assert_close(tail, torch.cat([st, x], -1)[..., -3:], rtol=0, atol=0)
