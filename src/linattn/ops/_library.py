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

And the public ops' arguments made under ``torch.inference_mode`` (:func:`takes_inference_tensors`,
:func:`for_autograd`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from linattn.ops.native.threads import torch_on_one_thread

__all__ = ["NAMESPACE", "KernelOp", "tracing", "lean_step_dtype", "lean_step_scale",
           "takes_inference_tensors", "for_autograd"]

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


#: What a decoding step's compiled kernel reads itself (la_gdr_step, la_gla_step: 16-bit rows
#: widened inside, exactly).
_STEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def lean_step_dtype(inputs: tuple[object, ...], state: object) -> torch.dtype | None:
    """The dtype of a decoding step that may go straight to its compiled kernel, or None.

    Straight means: every input (None skipped) a plain, contiguous CPU tensor of one dtype
    among float32, bfloat16 and float16, the state a plain contiguous float32 CPU tensor, no
    gradient wanted, nothing traced. Attribute comparisons only (~2 µs for six tensors), no
    conversion or reduction: at H = 16, K = V = 64 the kernel itself takes ~7 µs. Anything else
    gives None, and the op's general checks run (and raise the errors)."""
    T = Tensor
    grad = torch.is_grad_enabled()
    if not (type(state) is T and state.dtype is torch.float32 and state.is_cpu
            and state.is_contiguous() and not (grad and state.requires_grad)):
        return None
    dt = None
    for x in inputs:
        if x is None:
            continue
        if type(x) is not T or not (x.is_cpu and x.is_contiguous()) or (grad and x.requires_grad):
            return None
        if dt is None:
            dt = x.dtype
            if dt not in _STEP_DTYPES:
                return None
        elif x.dtype is not dt:
            return None
    return None if dt is None or tracing() else dt


def lean_step_scale(scale: object, K: int) -> float | None:
    """A decoding step's scale as the kernel takes it (default K^-1/2), or None for anything
    but a float of magnitude below 2 (the general path splits larger ones: split_scale)."""
    if scale is None:
        return K ** -0.5
    return scale if type(scale) is float and -2.0 < scale < 2.0 else None


def _wants_grad(tensors: list[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _Decided:
    """The small-call rule in force for one call in this thread (see :class:`KernelOp`):
    torch's count narrowed to 1 when ``small``, and the decision recorded, so that the kernel
    op called inside the same call does not decide again."""

    __slots__ = ("narrowing",)

    def __init__(self, small: bool) -> None:
        self.narrowing = torch_on_one_thread(small) if small else None

    def __enter__(self) -> None:
        _decision.depth += 1
        if self.narrowing is not None:
            self.narrowing.__enter__()

    def __exit__(self, *exc) -> None:
        try:
            if self.narrowing is not None:
                self.narrowing.__exit__(*exc)
        finally:
            _decision.depth -= 1


class _Decision(threading.local):
    depth = 0  # calls of this thread whose small-call decision is in force


_decision = _Decision()
_UNDECIDED = contextlib.nullcontext()


class KernelOp:
    """``linattn::<name>``: ``fn`` registered as a CPU custom op with the shape function
    ``fake`` and, if given, ``backward`` / ``setup_context`` as its autograd formula (see
    :meth:`torch.library.custom_op`; ``fn`` needs full type hints, its outputs must be new
    tensors). Calling the object runs ``fn`` directly in plain eager calls that want no
    gradient, and the registered op otherwise.

    The small-call rule lives here, and only here: ``small(*args)`` says whether a call is too
    small for threads (:func:`linattn.ops.native.is_small` with the op's threshold); its torch
    operations then run on one thread too (:func:`linattn.ops.native.torch_on_one_thread`),
    in eager calls and inside compiled graphs alike (the op's implementation runs eagerly in
    both). It is decided once per call: by :meth:`one_thread` where the op's entry wants its
    own torch work (argument checks, casts, state copies) narrowed as well, else when the
    object is called; a call already decided in this thread is not asked again."""

    def __init__(self, name: str, fn: Callable, fake: Callable, *,
                 backward: Callable | None = None, setup_context: Callable | None = None,
                 small: Callable[..., bool] | None = None) -> None:
        self.name = f"{NAMESPACE}::{name}"
        self.impl, self.small = fn, small
        registered = fn
        if small is not None:
            @functools.wraps(fn)
            def registered(*args):  # the op's implementation, run eagerly (also in a graph)
                with self._decided(args):
                    return fn(*args)

        self.op = torch.library.custom_op(self.name, registered, mutates_args=(),
                                          device_types="cpu")
        self.op.register_fake(fake)
        self.differentiable = backward is not None
        if backward is not None:
            self.op.register_autograd(backward, setup_context=setup_context)

    def _decided(self, args: tuple):
        if self.small is None or _decision.depth:
            return _UNDECIDED
        return _Decided(self.small(*args))

    def one_thread(self, *args):
        """The small-call rule for a whole call of this op, entered by the op before its own
        torch work (``with kernel_op.one_thread(q, k, v): ...``, args as ``small`` takes
        them). Not for traced calls (the caller knows: it has asked :func:`tracing`)."""
        return self._decided(args)

    def __call__(self, *args):
        if tracing(*args):
            return self.op(*args)
        if self.small is None:  # (a decoding step: nothing to decide, nothing entered)
            return self._run(args)
        with self._decided(args):
            return self._run(args)

    def _run(self, args: tuple):
        if self.differentiable and _wants_grad([a for a in args if isinstance(a, Tensor)]):
            return self.op(*args)
        return self.impl(*args)


# ------------------------------------------------------------------- inference tensors
def _tensors_in(x: object) -> list[Tensor]:
    """The tensors an argument holds: itself, a state dataclass's fields, a tuple's items."""
    if isinstance(x, Tensor):
        return [x]
    if hasattr(type(x), "__dataclass_fields__"):
        return [t for f in type(x).__dataclass_fields__ if isinstance(t := getattr(x, f), Tensor)]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, Tensor)]
    return []


_SCALARS = (bool, int, float, str)


def _any_inference(args: tuple, kwargs: dict) -> bool:
    """Whether an inference tensor is among the arguments: a loop that asks plain tensors
    directly and skips None and scalars (0.8 µs for a decoding step's seven arguments, where a
    generator over every argument's tensors took 1.7 µs: on every step with grad enabled)."""
    for x in (*args, *kwargs.values()):
        if type(x) is Tensor:
            if x.is_inference():
                return True
        elif x is not None and not isinstance(x, _SCALARS):
            if any(t.is_inference() for t in _tensors_in(x)):
                return True
    return False


def _records(values: list[object]) -> bool:
    """Whether autograd records a call with these arguments: a tensor among them, or a
    parameter of a module among them (a trainable feature map, the module itself), requires
    grad."""
    for x in values:
        if isinstance(x, torch.nn.Module):
            if any(p.requires_grad for p in x.parameters()):
                return True
        elif any(t.requires_grad for t in _tensors_in(x)):
            return True
    return False


def _as_normal(x: object) -> object:
    """``x`` with its inference tensors replaced by clones (normal tensors, equal values)."""
    if isinstance(x, Tensor):
        return x.clone() if x.is_inference() else x
    if hasattr(type(x), "__dataclass_fields__") and any(t.is_inference() for t in _tensors_in(x)):
        return type(x)(**{f: _as_normal(getattr(x, f)) for f in type(x).__dataclass_fields__})
    if isinstance(x, (tuple, list)) and any(t.is_inference() for t in _tensors_in(x)):
        return type(x)(_as_normal(t) for t in x)
    return x


def for_autograd(x: Tensor) -> Tensor:
    """``x``, or a clone of it where it is an inference tensor (made under
    ``torch.inference_mode``) and autograd may record what it feeds: a module's input beside
    its trainable parameters (see :func:`takes_inference_tensors`)."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling() and x.is_inference():
        return x.clone()
    return x


def takes_inference_tensors(*, written: tuple[str, ...] = (),
                            written_if_inplace: tuple[str, ...] = ()) -> Callable:
    """Decorator of a public function: tensors made under ``torch.inference_mode`` among its
    arguments work beside arguments that require grad.

    An inference tensor can neither require grad nor be saved for backward, so an op that
    saves one (``k`` made in inference mode, ``q`` requiring grad) fails inside torch with
    "Inference tensors cannot be saved for backward". When autograd records the call, such
    arguments are taken as the constants they are: a clone (a normal tensor, equal values,
    no gradient: none could reach the inference tensor either). Arguments the function writes
    in place (``written``; ``written_if_inplace`` under ``inplace=True``) are never cloned:
    writing into a copy would lose the update (:func:`~linattn.ops._common.check_own_memory`
    refuses them).
    Not applied while traced; no cost beyond :func:`torch.is_grad_enabled` without grad."""
    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if (torch.is_grad_enabled() and not torch.compiler.is_compiling()
                    and _any_inference(args, kwargs)):
                bound = signature.bind_partial(*args, **kwargs)
                if _records(list(bound.arguments.values())):
                    kept = written + (written_if_inplace
                                      if bound.arguments.get("inplace") is True else ())
                    for name, x in bound.arguments.items():
                        if name not in kept:
                            bound.arguments[name] = _as_normal(x)
                    return fn(*bound.args, **bound.kwargs)
            return fn(*args, **kwargs)

        return call

    return wrap
