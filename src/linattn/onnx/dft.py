"""The real DFT as two products with exact tables, for export.

onnxruntime's CPU ``DFT`` of a length that is not a power of two lost accuracy here (the cause
inside ORT was not traced; float32 twiddle angles would explain it): on the FordA model's
500-sample spectra, whose logarithm
amplifies any error in a near-empty bin, ORT's logits were 7e-2 (relative) from PyTorch's where
float32 against float64 PyTorch differ by 3e-4. While a model is exported, ``torch.fft.rfft``
along the last dimension is computed as ``x @ cos`` and ``x @ sin`` with tables built in
float64 from ``(k·n) mod N`` (exact angles), rounded once to x's dtype: O(N²) work per
transform instead of O(N log N), which for the FordA model's N = 40 and 500 is under a MFLOP
per series."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["exact_rfft"]


def _tables(n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    k = torch.arange(n // 2 + 1, dtype=torch.int64)
    t = torch.arange(n, dtype=torch.int64)
    angle = (t[:, None] * k[None, :] % n).double() * (2 * math.pi / n)  # (N, N//2 + 1)
    return torch.cos(angle).to(dtype), (-torch.sin(angle)).to(dtype)


def _rfft_by_tables(x: Tensor) -> Tensor:
    cos, sin = _tables(x.shape[-1], x.dtype)
    return torch.complex(x @ cos, x @ sin)


@contextlib.contextmanager
def exact_rfft() -> Iterator[None]:
    """``torch.fft.rfft(x)`` / ``rfft(x, dim=-1)`` of a real tensor by tables inside the
    block (module docstring); any other call as it was."""
    original = torch.fft.rfft

    def rfft(x, n=None, dim=-1, norm=None, *, out=None):
        if n is None and dim in (-1, x.dim() - 1) and norm is None and out is None \
                and not x.is_complex():
            return _rfft_by_tables(x)
        return original(x, n, dim, norm, out=out)

    torch.fft.rfft = rfft
    try:
        yield
    finally:
        torch.fft.rfft = original
