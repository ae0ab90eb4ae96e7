"""Which implementation runs each op: the one dispatcher.

Every op that has more than one implementation registers its **backends** here, each with what
it supports (devices, dtypes, gradients, whether it can run inside a ``torch.compile`` or
``torch.export`` graph, the op-specific conditions, and for compiled backends which ISA builds
can run it), and asks :func:`select` which one takes a call. :func:`select` alone reads the
policy (:func:`use`), the environment (``LINATTN_NATIVE``, ``LINATTN_NATIVE_ISA``) and the
calibration results (:mod:`linattn.ops.calibration`), so that the same ``impl=`` means the same
thing for every op:

``auto`` (the default)
    the compiled backend where it applies *and* the calibration measured it faster than torch
    on this machine for this form (choosing among the ISA builds the CPU can run), else the
    op's torch rule (e.g. ``fused`` from ``fused_min_t`` tokens, else ``portable``).
    ``LINATTN_NATIVE=0`` makes it ``torch``; ``LINATTN_NATIVE=1`` takes the compiled backend
    wherever it applies, unmeasured.
``torch``
    what ``auto`` takes without the compiled backends.
``fast``
    the compiled backend where it applies, else the fastest torch one (fused before portable)
    at every length, unmeasured.
``native`` / ``fused`` / ``portable``
    that backend only; a call it cannot take, or an op without it, is a ``ValueError`` that
    says why — for every op alike.

Inside a traced graph (``torch.compile``, ``torch.export``) only backends that can be traced
are candidates: the compiled kernels (registered as ``linattn::`` custom ops) and the portable
torch forms, not the buffer-reusing eager ones. The choice is made once per graph, when it is
traced: it does not follow a later :func:`use` or environment change (``torch.compiler.reset()``
to trace again).

Tests and benchmarks choose a path with :func:`use` instead of patching module globals::

    with dispatch.use(impl="portable"):
        o = linattn.linear_attention(q, k, v)           # the portable form, whatever T is
    with dispatch.use(impl="fast", block_size=8, chunk_size=4):
        ...                                             # short inputs spanning several blocks
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

import torch

from linattn import _cbuild
from linattn._config import env_raw
from linattn.ops import calibration
from linattn.ops.calibration import Choice
from linattn.ops.native import runnable_isas, torch_threads

__all__ = ["Policy", "policy", "use", "IMPLS", "native_setting", "isa_setting",
           "DEFAULT_CHUNK_SIZE", "Backend", "Choice", "register", "backends", "select",
           "register_calibration", "register_problems", "decoding_steps", "Problem", "step_kernels",
           "report"]

#: The causal chunk length C of every chunked form (linear, relative, decayed attention, the
#: models built on them) when a call gives none: the one home of this number.
DEFAULT_CHUNK_SIZE = 64

#: The policies: see the module docstring.
IMPLS = ("auto", "torch", "fast", "native", "fused", "portable")


@dataclass(frozen=True)
class Policy:
    """How :func:`select` picks, and how the fast paths size their work.

    Attributes:
        impl: one of :data:`IMPLS`.
        fused_min_t: ``auto`` takes linear attention's fused path from this many tokens
            (shorter sequences are cheaper as a few whole-tensor operations).
        block_size: tokens per block of the compiled and fused paths (rounded down to whole
            causal chunks, at least one chunk): 512 keeps a block's features of 8 heads in L2.
        chunk_size: the causal chunk length when the call gives none.
    """

    impl: str = "auto"
    fused_min_t: int = 2048
    block_size: int = 512
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {self.impl!r}")
        for name in ("fused_min_t", "block_size", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) \
                    or value < (0 if name == "fused_min_t" else 1):
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")

    def block_for(self, chunk: int) -> int:
        """Block length for causal chunks of ``chunk`` tokens: whole chunks, at least one."""
        return max(chunk, self.block_size // chunk * chunk)


# Policy is frozen, so a shared default is safe.
_POLICY: ContextVar[Policy] = ContextVar("linattn_policy", default=Policy())  # noqa: B039


@torch.compiler.assume_constant_result  # a traced graph keeps the policy it was traced under
def policy() -> Policy:
    """The policy in force (the default, or the innermost :func:`use`)."""
    return _POLICY.get()


@contextmanager
def use(**changes) -> Iterator[Policy]:
    """Within the block, the current policy with ``changes`` (fields of :class:`Policy`)."""
    token = _POLICY.set(replace(_POLICY.get(), **changes))
    try:
        yield _POLICY.get()
    finally:
        _POLICY.reset(token)


# --------------------------------------------------------------------------------- environment
def native_setting() -> str:
    """``LINATTN_NATIVE``: "0", "1" or "auto" (:func:`linattn._cbuild.native_setting`, where
    every setting's rule is: a bad value warns once and is ignored)."""
    return _cbuild.native_setting()


def isa_setting() -> str | None:
    """``LINATTN_NATIVE_ISA``, a build of :data:`~linattn.ops.native.ISA_FLAGS` or None
    (:func:`linattn._cbuild.isa_setting`); read only when a compiled backend is considered
    (with ``LINATTN_NATIVE=0`` it is never read)."""
    return _cbuild.isa_setting()


# ------------------------------------------------------------------------------------ backends
@dataclass(frozen=True)
class Backend:
    """One implementation of one op, and what it can take.

    Attributes:
        op: the op's name (the key :func:`select` is asked with).
        name: "native" (compiled kernels), "fused" (buffer-reusing eager torch) or "portable"
            (whole-tensor torch, everything, every device).
        compiled: runs the C kernels of :mod:`linattn.ops.native` (one of its ISA builds).
        traceable: may run inside a ``torch.compile`` / ``torch.export`` graph.
        devices: device types it runs on (None: every device).
        dtypes: input dtypes it takes (None: every floating dtype).
        grad_dtypes: dtypes it can also differentiate (None: all of ``dtypes``; (): none).
        accepts: op-specific conditions on the call's traits: the reason it cannot take the
            call, or None.
        available: compiled backends: the reason an ISA build cannot run it, or None.
        prefer: the torch rule of ``auto``: whether to take this backend for a call of this
            length under this policy rather than the next one (None: always).
    """

    op: str
    name: str
    compiled: bool = False
    traceable: bool = True
    devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    grad_dtypes: tuple[torch.dtype, ...] | None = None
    accepts: Callable[[tuple[str, ...]], str | None] | None = field(default=None, compare=False)
    available: Callable[[str], str | None] | None = field(default=None, compare=False)
    prefer: Callable[[int | None, Policy], bool] | None = field(default=None, compare=False)

    def refuses(self, dtype: torch.dtype, device: str, grad: bool, traits: tuple[str, ...],
                tracing: bool) -> str | None:
        """Why this backend cannot take the call (one phrase), or None."""
        if self.devices is not None and device not in self.devices:
            return f"runs on {'/'.join(self.devices)} only, not {device}"
        if tracing and not self.traceable:
            return "cannot run inside a torch.compile or torch.export graph"
        if self.dtypes is not None and dtype not in self.dtypes:
            return f"takes {', '.join(str(d) for d in self.dtypes)}, not {dtype}"
        if grad:
            allowed = self.dtypes if self.grad_dtypes is None else self.grad_dtypes
            if allowed is not None and dtype not in allowed:
                return f"has no gradient for {dtype}"
        return None if self.accepts is None else self.accepts(traits)


_REGISTRY: dict[str, list[Backend]] = {}
_PROBLEMS: dict[str, dict[str, Callable[[], Callable[[Choice], Callable[[], object]]]]] = {}
_LOCK = threading.Lock()


def register(backend: Backend) -> Backend:
    """Add (or replace, by op and name) a backend. Registration order is the preference order
    of the torch rule: fastest torch backend first, the portable one last."""
    with _LOCK:
        entries = _REGISTRY.setdefault(backend.op, [])
        entries[:] = [b for b in entries if b.name != backend.name] + [backend]
        _memo.clear()
    return backend


def register_compiled(op: str, available: Callable[[str], str | None], *,
                      differentiable: bool = False,
                      accepts: Callable[[tuple[str, ...]], str | None] | None = None) -> None:
    """The two backends of an op with C kernels for every input dtype and the torch form only
    beside them: "native" (CPU; float32, bfloat16 and float16 inputs; with ``differentiable``,
    gradients in each of them: its backward's float32 passes on widened 16-bit inputs) and
    "portable"."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    register(Backend(op, "native", compiled=True, devices=("cpu",), dtypes=dtypes,
                     grad_dtypes=dtypes if differentiable else (), available=available,
                     accepts=accepts))
    register(Backend(op, "portable"))


def backends(op: str) -> list[Backend]:
    """The registered backends of ``op``, in preference order."""
    return list(_REGISTRY.get(op, ()))


def register_calibration(op: str, forms: dict[str, Callable[[], Callable[[Choice],
                                                                        Callable[[], object]]]]):
    """The problems :func:`select` measures ``op``'s compiled backend on: per form (e.g.
    "causal fwd+bwd", "step"), a factory that builds the inputs once and returns
    ``run(choice) -> thunk``, a zero-argument function that runs one call of that backend (and
    build) directly — not through the public op, so that the measurement cannot recurse."""
    with _LOCK:
        _PROBLEMS[op] = dict(forms)
        _memo.clear()


#: A calibration problem's builder: ``problem(form, sizes, gen) -> run`` (see
#: :func:`register_problems`).
Problem = Callable[[str, tuple, torch.Generator], Callable[[Choice], Callable[[], object]]]


def register_problems(op: str, sizes: dict[str, tuple], problem: Problem) -> None:
    """:func:`register_calibration` with one builder for every form: when a form is first
    measured, ``problem(form, sizes[form], gen)`` builds its inputs (float32, whatever the
    default dtype of the triggering call, drawn from ``gen``, seeded 0) and returns
    ``run(choice) -> thunk``."""
    def factory(form: str) -> Callable[[], Callable[[Choice], Callable[[], object]]]:
        return lambda: problem(form, sizes[form], torch.Generator().manual_seed(0))

    register_calibration(op, {form: factory(form) for form in sizes})


def decoding_steps(native: Callable[[str], object], portable: Callable[[], object],
                   n: int = 10) -> Callable[[Choice], Callable[[], None]]:
    """A calibration problem's ``run`` for a decoding form: n steps, each ``native(isa)`` (the
    chosen build's kernel) or ``portable()`` (the torch form)."""
    def run(choice: Choice) -> Callable[[], None]:
        def steps() -> None:
            for _ in range(n):
                if choice.backend == "native":
                    native(choice.isa)
                else:
                    portable()
        return steps
    return run


# ------------------------------------------------------------------------------------ select
_memo: dict[tuple, Choice] = {}


@torch.compiler.assume_constant_result  # chosen once per traced graph, from static facts only
def select(op: str, form: str, dtype: torch.dtype, device: str, grad: bool,
           traits: tuple[str, ...] = (), length: int | None = None,
           tracing: bool = False) -> Choice:
    """The backend that runs this call of ``op``.

    Args:
        op: a registered op. form: its calibration form for this call (see
            :func:`register_calibration`). dtype, device: of the inputs. grad: whether autograd
            will want gradients. traits: op-specific facts the backends' ``accepts`` read
            (e.g. "map:elu", "masked"). length: the sequence length, for the torch rule (None
            inside traced graphs). tracing: the call is being traced.

    Raises ValueError when the policy names a backend that the op lacks or that cannot take the
    call. Repeated calls with the same facts cost a dictionary lookup."""
    pol = _POLICY.get()
    # (the policy fields the choice depends on: hashing the whole dataclass costs more; the
    # variables as set, parsed only on a miss: this is on every decoding step)
    key = (op, form, dtype, device, grad, traits, length, tracing, pol.impl, pol.fused_min_t,
           env_raw("LINATTN_NATIVE"), env_raw("LINATTN_NATIVE_ISA"), torch_threads())
    choice = _memo.get(key)
    if choice is None:
        choice = _select(op, form, dtype, device, grad, traits, length, tracing, pol,
                         native_setting())
        if len(_memo) > 4096:
            _memo.clear()
        _memo[key] = choice
    return choice


def _select(op, form, dtype, device, grad, traits, length, tracing, pol, setting) -> Choice:
    entries = _REGISTRY.get(op)
    if not entries:
        raise ValueError(f"dispatch: no backends registered for {op!r}")
    impl = pol.impl
    if impl in ("native", "fused", "portable"):
        return _explicit(op, entries, impl, dtype, device, grad, traits, tracing, setting)
    compiled = None
    if impl != "torch" and setting != "0":
        compiled = _compiled(entries, dtype, device, grad, traits, tracing)
    if compiled is not None:
        backend, isas = compiled
        if impl == "fast" or setting == "1":
            return Choice(backend.name, isas[0])
        problem = _PROBLEMS.get(op, {}).get(form)
        if problem is not None:  # auto: measured, per form, among the builds
            winner = calibration.winner(op, form, backend.name, isas, _torch_names(entries),
                                        problem)
            if winner is not None:
                return Choice(backend.name, winner)
    return _torch_rule(entries, dtype, device, grad, traits, length, tracing, pol,
                       fast=impl == "fast")


def step_kernels(op: str, dtype: torch.dtype, kernels_here: Callable[[str], dict | None],
                 traits: tuple[str, ...] = ()) -> dict | None:
    """The kernels of an op's lean decoding step (an untraced CPU step without gradients, its
    arguments not yet checked in full): ``kernels_here(isa)`` of the build :func:`select`
    chooses, or None where it chooses torch or that build does not load."""
    choice = select(op, "step", dtype, "cpu", False, traits, None, False)
    return kernels_here(choice.isa) if choice.backend == "native" else None


def _torch_names(entries: list[Backend]) -> list[str]:
    return [b.name for b in entries if not b.compiled]


def _explicit(op, entries, impl, dtype, device, grad, traits, tracing, setting) -> Choice:
    backend = next((b for b in entries if b.name == impl), None)
    if backend is None:
        have = ", ".join(b.name for b in entries)
        raise ValueError(f"dispatch impl={impl!r}: {op} has no {impl!r} backend (it has: "
                         f"{have})")
    reason = backend.refuses(dtype, device, grad, traits, tracing)
    isa = None
    if reason is None and backend.compiled:
        if setting == "0":
            reason = "turned off by LINATTN_NATIVE=0"
        else:
            isa = isa_setting() or "native"
            if backend.available is not None:
                reason = backend.available(isa)
    if reason is not None:
        raise ValueError(f"dispatch impl={impl!r}: {op} cannot take this call on its {impl} "
                         f"backend ({reason})")
    return Choice(backend.name, isa)


def _compiled(entries, dtype, device, grad, traits, tracing):
    """The compiled backend that can take the call and the ISA builds it can run here (the
    one of LINATTN_NATIVE_ISA, else every runnable one), or None."""
    for backend in entries:
        if not backend.compiled or backend.refuses(dtype, device, grad, traits, tracing):
            continue
        isas = _builds(backend)
        if isas:
            return backend, isas
    return None


def _builds(backend: Backend) -> list[str]:
    """The ISA builds that can run a compiled backend here: the one of LINATTN_NATIVE_ISA, else
    every build this CPU runs ("native" first), less those that do not load."""
    forced = isa_setting()
    isas = [forced] if forced else runnable_isas()
    if backend.available is not None:
        isas = [isa for isa in isas if backend.available(isa) is None]
    return isas


def _torch_rule(entries, dtype, device, grad, traits, length, tracing, pol, fast) -> Choice:
    last_reason = None
    for backend in entries:
        if backend.compiled:
            continue
        last_reason = backend.refuses(dtype, device, grad, traits, tracing)
        if last_reason is not None:
            continue
        if fast or backend.prefer is None or backend.prefer(length, pol):
            return Choice(backend.name)
    raise ValueError(f"dispatch: no torch backend can take this call ({last_reason})")


# ------------------------------------------------------------------------------------ report
def report() -> list[dict]:
    """What the default path takes on this machine, per op and calibration form, at the current
    thread count: the backend, the build and the calibration's times (ms, the fastest call). For
    ``linattn bench`` and the docs; measures what was not measured yet. Every op folder is
    imported first: an op registers its backends when it is first used."""
    import importlib

    from linattn.ops import OPS

    for name in OPS:
        importlib.import_module(f"linattn.ops.{name}")
    rows = []
    for op, forms in _PROBLEMS.items():
        for form in forms:
            compiled = next((b for b in _REGISTRY.get(op, ()) if b.compiled), None)
            row = {"op": op, "form": form, "threads": torch_threads()}
            setting = native_setting()
            if compiled is None or setting == "0":
                row.update(backend="torch", isa=None, times=None,
                           why="LINATTN_NATIVE=0" if setting == "0" else "no compiled backend")
            else:
                isas = _builds(compiled)
                if not isas:
                    row.update(backend="torch", isa=None, times=None,
                               why=compiled.available("native") if compiled.available else "")
                else:
                    verdict = calibration.verdict(op, form, compiled.name, isas,
                                                  _torch_names(_REGISTRY[op]), forms[form])
                    win = verdict["winner"]
                    row.update(backend=compiled.name if win != "torch" else "torch",
                               isa=None if win == "torch" else win, times=verdict["ms"],
                               why="LINATTN_NATIVE=1" if setting == "1" else "measured")
            rows.append(row)
    return rows
