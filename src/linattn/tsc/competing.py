"""Competing random kernels: how often each kernel of a group wins, Hydra's idea (issue 27).

The PPV features of :class:`~linattn.tsc.conv_tokens.ConvTokens` ask, kernel by kernel, how
often a response exceeds a threshold. Hydra (Dempster, Schmidt and Webb, 2023) asks a
different question, closer to a dictionary method: kernels are drawn in small groups, and at
every time step the kernels of a group *compete*; a feature is how often (and how strongly)
each kernel is the best match in its group, and how often it is the worst. Counting patterns
this way is what the dictionary methods do, and it complements the PPV features (on the UCR
archive Hydra with MultiRocket beats either alone).

This is our own formulation of that idea:

* ``groups`` groups of ``kernels`` kernels of length 9, weights drawn from N(0, 1), each kernel
  centred (it sums to 0: a constant series gives 0) and scaled to unit absolute sum, a fresh
  draw per dilation; dilations ``2**0, 2**1, ...`` up to a receptive field of the whole series
  (``8·d + 1 <= length``; dilation 1 alone below 9 samples), "same" zero padding;
* half the groups read the series, half its first difference (the difference carries slope
  shape that a level-dominated series hides);
* per (dilation, group, kernel) two features: the sum of the kernel's response, clamped at 0,
  over the steps where it is its group's largest (a soft count), and the number of steps where
  it is the smallest (a hard count), each divided by the length so that features do not scale
  with it; a tie counts for every kernel in it (an all-zero window: every kernel is worst);
* the square root of each (counts are heavy-tailed), ready to be standardised on training data.

Everything is fixed by the parameters, the seed (None means 0) and the length: ``fit`` only
records the length and draws the weights, no training data is read beyond its shape.

A known limit: the centred weights sum to 0 only up to float32 rounding, so on a constant
stretch at a level other than 0 the responses are rounding residue, and which kernel is "worst"
there may differ between CPUs (BLAS summation order); a zero stretch (trailing padding filled
with zeros) ties exactly and is stable.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.tsc.conv_tokens import _check, _check_fitted_length, at_least, check_param

__all__ = ["CompetingKernels", "power_dilations"]

_CHUNK_FLOATS = 1 << 19  # about 2 MB of responses at a time: the max/min passes stay in cache


def power_dilations(length: int) -> np.ndarray:
    """Dilations 1, 2, 4, … while the receptive field ``8·d + 1`` fits in ``length``."""
    top = max(1, (length - 1) // 8)
    return 2 ** np.arange(int(np.floor(np.log2(top))) + 1, dtype=np.int64)


class CompetingKernels:
    """Hydra-style competing-kernel counts: (n, L) -> (n, n_features) float32 (module docstring).

    ``groups``: groups per dilation (even: half read the series, half its difference);
    ``kernels``: kernels per group; ``random_state``: the weights' draw.
    ``n_features = len(power_dilations(L)) · groups · kernels · 2``.
    """

    def __init__(self, groups: int = 64, kernels: int = 8, random_state: int = 0) -> None:
        check_param("CompetingKernels", "groups", groups, at_least(2))
        if random_state is not None:
            check_param("CompetingKernels", "random_state", random_state, at_least(0))
        check_param("CompetingKernels", "kernels", kernels, at_least(2))
        if groups % 2:
            raise ValueError(f"CompetingKernels: groups must be even (half read the difference), "
                             f"got {groups}")
        self.groups, self.kernels, self.random_state = int(groups), int(kernels), random_state

    def fit(self, X, y=None) -> CompetingKernels:
        """The length of X: (n, L) and a weight draw per dilation."""
        X = _check(X, "CompetingKernels.fit")
        self.length_ = X.shape[1]
        self.dilations_ = power_dilations(self.length_)
        gen = torch.Generator().manual_seed(int(self.random_state or 0))
        self.weights_ = []
        for _ in self.dilations_:
            w = torch.randn(self.groups * self.kernels, 1, 9, generator=gen)
            w = w - w.mean(-1, keepdim=True)
            self.weights_.append(w / w.abs().sum(-1, keepdim=True))
        return self

    def state(self, prefix: str) -> dict[str, Tensor]:
        """The fitted state as named tensors (``prefix`` + ``dilations``, ``weights.J``), for
        a safetensors file."""
        out = {prefix + "dilations": torch.from_numpy(self.dilations_.astype(np.int64))}
        out.update({f"{prefix}weights.{j}": w.contiguous() for j, w in enumerate(self.weights_)})
        return out

    def load_state(self, tensors: dict[str, Tensor], prefix: str, length: int
                   ) -> CompetingKernels:
        """Restore what :meth:`state` wrote, for series of ``length`` samples; ValueError
        naming the tensor when one is missing or does not fit these parameters."""
        dil = power_dilations(length)
        got = tensors.get(prefix + "dilations")
        if got is None or got.dtype != torch.int64 or got.shape != dil.shape \
                or not np.array_equal(got.numpy(), dil):
            raise ValueError(f"{prefix}dilations: missing or not those of length {length} "
                             f"(expected int64 {dil.tolist()})")
        shape = (self.groups * self.kernels, 1, 9)
        weights = [tensors.get(f"{prefix}weights.{j}") for j in range(len(dil))]
        if any(w is None or w.dtype != torch.float32 or w.shape != shape for w in weights):
            raise ValueError(f"{prefix}weights.*: expected {len(dil)} float32 tensors of shape "
                             f"{shape}")
        self.length_, self.dilations_, self.weights_ = length, dil, weights
        return self

    @property
    def n_features(self) -> int:
        return len(self.dilations_) * self.groups * self.kernels * 2

    def transform(self, X) -> np.ndarray:
        """Features (n, n_features) float32 of series X: (n, L) (L the fitted length)."""
        if not hasattr(self, "weights_"):
            raise RuntimeError("CompetingKernels: call fit before transform")
        X = _check_fitted_length(X, "CompetingKernels.transform", self.length_, "the kernels")
        chunk = max(1, _CHUNK_FLOATS // (self.groups * self.kernels * self.length_))
        out = np.empty((len(X), self.n_features), dtype=np.float32)
        for i in range(0, len(X), chunk):
            x = torch.from_numpy(X[i:i + chunk])
            dx = torch.diff(x, dim=1, prepend=x[:, :1])
            out[i:i + chunk] = torch.cat([self._counts(x, dx, int(d), w) for d, w in
                                          zip(self.dilations_, self.weights_, strict=True)],
                                         1).numpy()
        return out

    def fit_transform(self, X, y=None) -> np.ndarray:
        return self.fit(X).transform(X)

    def _counts(self, x: Tensor, dx: Tensor, d: int, w: Tensor) -> Tensor:
        """(n, groups · kernels · 2) of one dilation."""
        n, g, k = len(x), self.groups // 2, self.kernels
        taps = w[:, 0]  # (groups · kernels, 9)
        parts = []
        for series, rows in ((x, taps[:g * k]), (dx, taps[g * k:])):
            # the dilated windows as a view, one batched matmul: (g·k, 9) @ (n, 9, L). Kernels
            # before time: the competition (max and min over k) then reads whole rows of L
            # contiguous steps, and the counts sum along them
            windows = F.pad(series, (4 * d, 4 * d)).unfold(1, 8 * d + 1, 1)[:, :, ::d]
            z = torch.matmul(rows, windows.transpose(1, 2)).view(n, g, k, -1)
            best = (z >= z.amax(2, keepdim=True)).float().mul_(z).clamp_(min=0)
            worst = (z <= z.amin(2, keepdim=True)).float()
            parts += [best.sum(-1).flatten(1), worst.sum(-1).flatten(1)]
        return (torch.cat(parts, 1) / self.length_).sqrt()
