"""Which implementation runs :func:`linattn.linear_attention`: the one place that decides.

Three implementations compute the same function (tested against each other and against the
float64 reference):

* ``"native"``: the compiled CPU kernels of :mod:`linattn.ops.native` (1 + elu and 1 + relu,
  float32, or bfloat16 without gradients);
* ``"fused"``: the chunked, buffer-reusing torch form of :mod:`linattn.ops.linear.fused` (any
  token-wise map without trainable parameters, CPU);
* ``"portable"``: the whole-tensor torch form in :mod:`linattn.ops.linear` (everything, every
  device, double backward).

The default policy (``impl="auto"``) takes the native path where it applies *and* where it was
measured to beat plain torch on this machine (:func:`linattn.ops.native.wins`: a short
calibration at the first call, cached beside the compiled library), then the fused path from
``fused_min_t`` tokens, else the portable one. ``LINATTN_NATIVE=0`` turns the native path off,
``LINATTN_NATIVE=1`` takes it wherever it applies without asking the calibration.

Tests and benchmarks choose a path with :func:`use` instead of patching module globals::

    with dispatch.use(impl="portable"):
        o = linattn.linear_attention(q, k, v)           # the portable form, whatever T is
    with dispatch.use(impl="fast", block_size=8, chunk_size=4):
        ...                                             # native or fused at every length,
                                                        # short inputs spanning several blocks
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

__all__ = ["Policy", "policy", "use", "IMPLS", "native_setting", "DEFAULT_CHUNK_SIZE"]

#: The causal chunk length C of every chunked form (linear, relative, decayed attention, the
#: models built on them) when a call gives none: the one home of this number.
DEFAULT_CHUNK_SIZE = 64

#: ``auto``: measured choice; ``torch``: what ``auto`` takes without the compiled path (what
#: ``LINATTN_NATIVE=0`` runs); ``fast``: native where it applies, else fused, at every length;
#: ``native`` / ``fused`` / ``portable``: that path only (ValueError where it cannot run).
IMPLS = ("auto", "torch", "fast", "native", "fused", "portable")


@dataclass(frozen=True)
class Policy:
    """How :func:`linattn.linear_attention` picks and sizes its implementation.

    Attributes:
        impl: one of :data:`IMPLS`.
        fused_min_t: ``auto`` takes the fused path from this many tokens (shorter sequences are
            cheaper as a few whole-tensor operations).
        block_size: tokens per block of the native and fused paths (rounded down to whole
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
            if not isinstance(value, int) or value < (0 if name == "fused_min_t" else 1):
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")

    def block_for(self, chunk: int) -> int:
        """Block length for causal chunks of ``chunk`` tokens: whole chunks, at least one."""
        return max(chunk, self.block_size // chunk * chunk)


# Policy is frozen, so a shared default is safe.
_POLICY: ContextVar[Policy] = ContextVar("linattn_policy", default=Policy())  # noqa: B039


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


def native_setting() -> str:
    """``LINATTN_NATIVE``: "0" (off), "1" (on wherever it applies) or "auto" (unset: measured)."""
    value = os.environ.get("LINATTN_NATIVE", "").strip()
    return value if value in ("0", "1") else "auto"
