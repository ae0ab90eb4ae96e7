"""linattn's compiled kernels inside PyTorch's op system: ``linattn::`` custom ops.

Each compiled kernel is registered with :func:`torch.library.custom_op` under the ``linattn``
namespace, with a fake implementation (output shapes and dtypes only) and, where it has one, its
gradient as the op's autograd formula. ``torch.compile`` and ``torch.export`` then trace it as
one node of the graph without ever reading a data pointer, AOTInductor packages it as a call to
the op, and an exported program runs it in any process that has registered the ops
(:func:`linattn.ops.register_custom_ops`, or simply using an op).

A call through the op dispatcher costs about 8 µs (measured on an AMD EPYC); a whole decoding
step of the delta rule (16 heads, K = V = 64) about 30. So :class:`KernelOp` calls the kernel
directly when nothing needs the dispatcher — a plain eager call with real tensors, no trace, no
transform and no gradient wanted — and goes through the registered op otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from linattn.ops.native import is_small, torch_on_one_thread

__all__ = ["NAMESPACE", "KernelOp", "tracing"]

NAMESPACE = "linattn"
_PLAIN = (Tensor, torch.nn.Parameter)


def tracing(*tensors: object) -> bool:
    """Whether this call is being traced or transformed rather than run: ``torch.compile``
    (Dynamo), ``torch.export`` (strict or not), ``make_fx``, a fake-tensor or other Python
    dispatch mode, ``vmap``/``grad`` transforms, or tensor subclasses among ``tensors``. Then
    nothing may read tensor values or data pointers, and only traceable backends may run."""
    if torch.compiler.is_compiling():
        return True
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return True
    return any(isinstance(t, Tensor) and type(t) not in _PLAIN for t in tensors)


def _wants_grad(tensors: list[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _one_thread_when_small(fn: Callable, small: Callable[..., bool]) -> Callable:
    """``fn`` run under :func:`linattn.ops.native.torch_on_one_thread` when ``small(*args,
    **kwargs)`` (the signature, and so a custom op's schema, is ``fn``'s)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch_on_one_thread(small(*args, **kwargs)):
            return fn(*args, **kwargs)

    return run


def one_thread_when_small(min_work: int) -> Callable[[Callable], Callable]:
    """Decorate an op ``fn(q, k, v, ...)`` so that an eager call below the thread policy's
    threshold (:func:`linattn.ops.native.is_small`) runs all of its torch operations on one
    thread: its argument checks (value checks reduce over every gate), casts and state copies,
    not only its kernels. Traced calls (fake or functional tensors, Dynamo) run ``fn`` as it
    is."""
    def small(q, k, v, *_, **__) -> bool:
        if (torch.compiler.is_compiling() or not isinstance(q, Tensor)
                or not isinstance(v, Tensor) or q.dim() < 2 or tracing(q, k, v)):
            return False
        return is_small(q, v, min_work)

    return lambda fn: _one_thread_when_small(fn, small)


class KernelOp:
    """``linattn::<name>``: ``fn`` registered as a CPU custom op with the shape function
    ``fake`` and, if given, ``backward`` / ``setup_context`` as its autograd formula (see
    :meth:`torch.library.custom_op`; ``fn`` needs full type hints, its outputs must be new
    tensors). Calling the object runs ``fn`` directly in plain eager calls that want no
    gradient, and the registered op otherwise. ``small(*args)``: whether a call is too small
    for threads; its torch operations then run on one thread too
    (:func:`linattn.ops.native.torch_on_one_thread`), in eager calls and inside compiled graphs
    alike (the op's implementation runs eagerly in both)."""

    def __init__(self, name: str, fn: Callable, fake: Callable, *,
                 backward: Callable | None = None, setup_context: Callable | None = None,
                 small: Callable[..., bool] | None = None) -> None:
        self.name = f"{NAMESPACE}::{name}"
        if small is not None:
            fn = _one_thread_when_small(fn, small)
        self.impl = fn
        self.op = torch.library.custom_op(self.name, fn, mutates_args=(), device_types="cpu")
        self.op.register_fake(fake)
        self.differentiable = backward is not None
        if backward is not None:
            self.op.register_autograd(backward, setup_context=setup_context)

    def __call__(self, *args):
        if tracing(*args):
            return self.op(*args)
        if self.differentiable and _wants_grad([a for a in args if isinstance(a, Tensor)]):
            return self.op(*args)
        return self.impl(*args)
