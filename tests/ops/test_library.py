"""linattn's kernels as PyTorch custom ops (ops/_library.py): registered, traceable, checked by
``torch.library.opcheck`` (schema, fake implementation, autograd registration, AOT dispatch),
and called directly, without the op dispatcher, only when nothing needs it."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from linattn.ops import _library
from linattn.ops.delta import native as delta_native
from linattn.ops.linear import native as linear_native
from linattn.ops.linear import passes as linear_passes

needs_native = pytest.mark.skipif(linear_native.kernels() is None,
                                  reason=f"compiled path: {linear_native.unavailable()}")


def test_tracing_is_detected_under_every_tracer():
    x = torch.randn(3)
    assert not _library.tracing(x, None, 1.0)
    with FakeTensorMode():
        assert _library.tracing(torch.randn(3))
    seen = []
    torch.vmap(lambda t: seen.append(_library.tracing(t)) or t)(torch.randn(2, 3))
    from torch.fx.experimental.proxy_tensor import make_fx

    make_fx(lambda t: seen.append(_library.tracing(t)) or t * 2)(torch.randn(2))
    assert seen == [True, True]
    assert torch.equal(torch.compile(lambda t: t * 2 if _library.tracing(t) else t,
                                     fullgraph=True, backend="eager")(x), x * 2)


def test_the_ops_are_registered_in_the_linattn_namespace():
    import linattn.ops

    names = linattn.ops.register_custom_ops()
    for name in ("linear_attention_fwd", "linear_attention_bwd", "gdr_forward", "gdr_step",
                 "conv_forward", "conv_step", "rms_norm_gated"):
        assert hasattr(torch.ops.linattn, name), name
        assert f"linattn::{name}" in names


def _linear_args(is_causal, grad=False, T=40, keep=False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, T, 16, generator=g).requires_grad_(grad) for _ in range(3))
    S0, z0 = torch.zeros(3, 16, 16), torch.zeros(3, 16)
    mask = (torch.rand(3, T, generator=g) < 0.8) if keep else None
    return (q, k, v, S0, z0, mask, 0, 1e-6, 16, 16, is_causal, "native")


@needs_native
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_opcheck_linear_attention(is_causal, keep):
    torch.library.opcheck(torch.ops.linattn.linear_attention_fwd.default,
                          _linear_args(is_causal, grad=True, keep=keep))


@needs_native
@pytest.mark.parametrize("gated", [False, True])
def test_opcheck_delta_rule(gated):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    beta, gate = torch.rand(1, 2, 9, generator=g), -torch.rand(1, 2, 9, generator=g)
    S0 = torch.zeros(1, 2, 16, 16)
    torch.library.opcheck(torch.ops.linattn.gdr_forward.default,
                          (q, k, v, beta, gate if gated else None, S0, None, 0.25, True,
                           "native"))
    step = (q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0],
            gate[:, :, 0] if gated else None, S0, 0.25, True, "native")
    torch.library.opcheck(torch.ops.linattn.gdr_step.default, step)


@needs_native
def test_plain_eager_calls_skip_the_op_dispatcher(monkeypatch):
    """No gradient and no trace: the kernel is called directly; gradients or a trace: the
    registered op (which records the autograd formula / the graph node)."""
    used = []
    op = linear_native._FORWARD
    real = op.op
    monkeypatch.setattr(op, "op", lambda *a: used.append(1) or real(*a))
    with torch.no_grad():
        op(*_linear_args(True, grad=True))
    op(*_linear_args(True, grad=False))
    assert used == []
    out = op(*_linear_args(True, grad=True))[0]
    assert used == [1] and out.requires_grad
    step = delta_native.delta_rule_step_native
    real_step = step.op
    monkeypatch.setattr(step, "op", lambda *a: used.append(2) or real_step(*a))
    x = torch.randn(1, 2, 16)
    args = (x, x, x, torch.rand(1, 2), None, torch.zeros(1, 2, 16, 16), 0.25, True, "native")
    step(*args)
    assert used == [1]
    with FakeTensorMode() as mode:
        step(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert used == [1, 2]


@needs_native
def test_the_ops_compute_the_same_function_where_the_kernels_cannot_be_had(monkeypatch):
    """An exported program names the ops; run where no compiled library loads (no compiler),
    they compute the same function in torch operations, gradients included."""
    args = _linear_args(True, grad=True, keep=True)
    want = linear_native._FORWARD(*args)
    want[0].sum().backward()
    want_grads = [x.grad.clone() for x in args[:3]]
    for x in args[:3]:
        x.grad = None
    x = torch.randn(1, 2, 16)
    step = (x, x, x, torch.rand(1, 2), None, torch.randn(1, 2, 16, 16), 0.25, True, "native")
    want_step = delta_native.delta_rule_step_native(*step)
    monkeypatch.setattr(linear_passes, "kernels", lambda isa="native": None)
    monkeypatch.setattr(delta_native, "kernels", lambda isa="native": None)
    got = linear_native._FORWARD(*args)
    for a, b in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    got[0].sum().backward()
    for x, g in zip(args[:3], want_grads, strict=True):
        torch.testing.assert_close(x.grad, g, rtol=1e-4, atol=1e-5)
    for a, b in zip(delta_native.delta_rule_step_native(*step), want_step, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("op", ["linear", "gated", "delta", "conv", "norm"])
def test_the_small_call_rule_is_decided_once_per_call(op, monkeypatch):
    """The rule "a small call runs on one thread" is declared once, on the op's KernelOp
    (``small``), and asked once per call: the op's entry decides for its whole call, and the
    custom op it calls inside does not ask again (a call that wants gradients asks once
    more, for the backward)."""
    import linattn
    from linattn.ops import dispatch
    from linattn.ops.conv import native as conv_native
    from linattn.ops.gated import native as gated_native
    from linattn.ops.norm import native as norm_native

    kernel_op = {"linear": linear_native._FORWARD, "gated": gated_native._FORWARD,
                 "delta": delta_native.delta_rule_native,
                 "conv": conv_native.conv_prefill_native,
                 "norm": norm_native.rms_norm_native}[op]
    asked = []
    real = kernel_op.small
    monkeypatch.setattr(kernel_op, "small", lambda *a: asked.append(1) or real(*a))
    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    with dispatch.use(impl="native"), torch.no_grad():
        if op == "linear":
            linattn.linear_attention(q, k, v, is_causal=True)
        elif op == "gated":
            linattn.gated_linear_attention(q, k, v, g=-torch.rand(1, 2, 16))
        elif op == "delta":
            linattn.delta_rule(q, k, v, torch.rand(1, 2, 16))
        elif op == "conv":
            linattn.causal_conv1d(torch.randn(1, 16, 32), torch.randn(32, 4))
        else:
            x = torch.randn(64, 512)  # above the lean decoding path (no rule: one kernel call)
            linattn.rms_norm_gated(x, torch.randn(64, 512))
    assert asked == [1]


def test_a_kernel_op_without_a_rule_never_narrows():
    op = _library.KernelOp.__new__(_library.KernelOp)
    op.small = None
    with op.one_thread(torch.randn(2, 2)):
        assert _library._decision.depth == 0
