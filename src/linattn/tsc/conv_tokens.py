"""Random dilated-convolution tokens: a series becomes ``segments`` tokens of pooled features.

The ROCKET family (ROCKET, MiniRocket, MultiRocket) is strong on the UCR archive because many
fixed convolution kernels at many dilations, each followed by a threshold and the *proportion
of positive values* (PPV) over the series, describe where in amplitude and scale a series has
its shapes. :class:`ConvTokens` computes the same kind of feature, but per time segment instead
of over the whole series, so that a token mixer (linear attention) can relate what happens in
one part of a series to another; the mean over the tokens is the global PPV that a ridge head
reads (docs/timeseries.md).

The kernels: length 9, weight 2 on three taps and −1 on the other six (the 84 ways to choose
three of nine; each kernel sums to zero, so a constant series gives 0); dilations spaced
exponentially from 1 to ``(length − 1) // 8`` (at most ``max_dilations``); "same" zero
padding. Each (kernel, dilation) gets ``biases`` thresholds, quantiles of that kernel's output
on one training series drawn at random, at the low-discrepancy levels ``frac(j · 0.618…)``.
With ``quantiles`` the tokens also carry that many quantiles of the series and of its first
difference within the segment, both z-normalised per series (interval statistics, what the
interval methods read). All of it is fixed at ``fit`` from the training series alone.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from linattn._config import Check, Range

__all__ = ["ConvTokens", "KERNELS", "dilations", "check_param", "at_least"]

#: (84, 1, 9): weight 2 on each choice of three taps of nine, −1 elsewhere.
KERNELS = torch.full((84, 1, 9), -1.0)
for _i, _taps in enumerate(itertools.combinations(range(9), 3)):
    KERNELS[_i, 0, list(_taps)] = 2.0
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_CHUNK_FLOATS = 1 << 24  # about 64 MB of comparisons at a time


def at_least(low: int) -> tuple[Check, str]:
    """An integer parameter's rule: its :class:`~linattn._config.Check` and how errors say it."""
    return Check(int, Range(low, math.inf)), f"an integer >= {low}"


def check_param(where: str, name: str, value: Any, rule: tuple[Check, str]) -> None:
    """ValueError ``"{where}: {name} must be {text}, got {value!r}"`` unless the rule's
    :class:`~linattn._config.Check` (its type and range: integers not bools, finite numbers)
    allows ``value``."""
    check, text = rule
    try:
        check.check(name, value)
    except (ValueError, OverflowError):  # OverflowError: an integer too large for a float
        raise ValueError(f"{where}: {name} must be {text}, got {value!r}") from None


def dilations(length: int, max_dilations: int = 32) -> np.ndarray:
    """Distinct dilations from 1 to ``max(1, (length − 1) // 8)``, exponentially spaced: the
    receptive field ``8·d + 1`` reaches at most the whole series."""
    top = max(1, (length - 1) // 8)
    grid = 2.0 ** np.linspace(0.0, math.log2(top), max_dilations)
    return np.unique(np.floor(grid + 1e-9).astype(np.int64))  # 2**log2(top) may round below


def _conv(x: Tensor, d: int) -> Tensor:
    """All 84 kernels at dilation ``d``, same length: (n, L) -> (n, 84, L)."""
    return F.conv1d(F.pad(x[:, None], (4 * d, 4 * d)), KERNELS, dilation=d)


def _check(X, where: str) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float32)  # torch.from_numpy refuses negative strides
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{where}: X must have shape (n_series, length) with both positive, "
                         f"got {X.shape}")
    bad = np.argwhere(~np.isfinite(X))
    if len(bad):
        r, t = bad[0]
        raise ValueError(f"{where}: X[{r}, {t}] is {X[r, t]}: fill missing values first "
                         "(linattn.tsc.data.fill_nan_padding)")
    return X


def _check_fitted_length(X, where: str, length: int, what: str) -> np.ndarray:
    """:func:`_check` of X, and a ValueError unless its series have the fitted ``length``
    (``what``: the fitted thing the message names)."""
    X = _check(X, where)
    if X.shape[1] != length:
        raise ValueError(f"{where}: series have {X.shape[1]} samples, {what} were fitted on "
                         f"{length}")
    return X


class ConvTokens:
    """Fixed random dilated convolutions pooled per segment: (n, L) -> (n, segments, F).

    ``segments``: tokens per series (at most the length); ``features``: about how many PPV
    features a token has (``84 · len(dilations) · biases`` with ``biases =
    max(1, features // (84 · len(dilations)))``); ``quantiles``: interval quantiles of the
    series and of its difference per token (``2 · quantiles`` more features, 0: none);
    ``random_state``: the draw of the series the thresholds come from.
    """

    def __init__(self, segments: int = 16, features: int = 2000, quantiles: int = 9,
                 max_dilations: int = 32, random_state: int = 0) -> None:
        for name, value, low in (("segments", segments, 1), ("features", features, 1),
                                 ("quantiles", quantiles, 0), ("max_dilations", max_dilations, 1)):
            check_param("ConvTokens", name, value, at_least(low))
        self.segments, self.features, self.quantiles = int(segments), int(features), int(quantiles)
        self.max_dilations, self.random_state = int(max_dilations), random_state

    # -- fitting -------------------------------------------------------------------------
    def fit(self, X, y=None) -> ConvTokens:
        """Dilations and thresholds from training series X: (n, L)."""
        X = _check(X, "ConvTokens.fit")
        rng = np.random.default_rng(self.random_state)
        self.length_ = X.shape[1]
        self.dilations_, nb, self.edges_ = self._layout(self.length_)
        levels = torch.tensor((np.arange(1, nb + 1) * _GOLDEN) % 1.0, dtype=torch.float32)
        rows = torch.arange(84)
        self.biases_ = []
        for d in self.dilations_:
            series = torch.from_numpy(X[rng.integers(len(X), size=84)])
            out = _conv(series, int(d))[rows, rows]  # kernel k on its own drawn series
            self.biases_.append(torch.quantile(out, levels, dim=1).T.contiguous())  # (84, nb)
        return self

    def _layout(self, length: int) -> tuple[np.ndarray, int, np.ndarray]:
        """(dilations, thresholds per kernel and dilation, segment edges) for series of
        ``length`` samples: all that the parameters fix before any data is seen."""
        dil = dilations(length, self.max_dilations)
        nb = max(1, self.features // (84 * len(dil)))
        S = min(self.segments, length)
        return dil, nb, np.linspace(0, length, S + 1).round().astype(np.int64)

    # -- persistence -------------------------------------------------------------------
    def state(self, prefix: str) -> dict[str, Tensor]:
        """The fitted state as named tensors (``prefix`` + ``dilations``, ``edges``,
        ``biases.J``), for a safetensors file."""
        out = {prefix + "dilations": torch.from_numpy(self.dilations_.astype(np.int64)),
               prefix + "edges": torch.from_numpy(self.edges_.astype(np.int64))}
        out.update({f"{prefix}biases.{j}": b.contiguous() for j, b in enumerate(self.biases_)})
        return out

    def load_state(self, tensors: dict[str, Tensor], prefix: str, length: int) -> ConvTokens:
        """Restore what :meth:`state` wrote, for series of ``length`` samples; ValueError
        naming the tensor when one is missing or does not fit these parameters (a damaged or
        edited file): the dilations, edges and threshold count follow from the parameters
        and the length, so only the thresholds' values are free."""
        dil, nb, edges = self._layout(length)

        def get(name: str) -> Tensor:
            if prefix + name not in tensors:
                raise ValueError(f"missing tensor {prefix + name}")
            return tensors[prefix + name]

        for name, want in (("dilations", dil), ("edges", edges)):
            got = get(name)
            if got.dtype != torch.int64 or got.shape != want.shape \
                    or not np.array_equal(got.numpy(), want):
                raise ValueError(f"{prefix}{name}: not those of these parameters at length "
                                 f"{length} (expected int64 {want.tolist()})")
        biases = [get(f"biases.{j}") for j in range(len(dil))]
        if any(b.dtype != torch.float32 or b.shape != (84, nb) for b in biases):
            raise ValueError(f"{prefix}biases.*: expected {len(dil)} float32 tensors of shape "
                             f"(84, {nb})")
        self.length_, self.dilations_, self.edges_, self.biases_ = length, dil, edges, biases
        return self

    @property
    def n_features(self) -> int:
        """Features per token."""
        return sum(b.numel() for b in self.biases_) + 2 * self.quantiles

    # -- transforming --------------------------------------------------------------------
    def transform(self, X) -> np.ndarray:
        """Tokens (n, S, n_features) float32 of series X: (n, L) (L the fitted length)."""
        if not hasattr(self, "biases_"):
            raise RuntimeError("ConvTokens: call fit before transform")
        X = _check_fitted_length(X, "ConvTokens.transform", self.length_, "the tokens")
        S = len(self.edges_) - 1
        average = torch.zeros(self.length_, S)  # mean over each segment
        for s in range(S):
            a, b = self.edges_[s], self.edges_[s + 1]
            average[a:b, s] = 1.0 / (b - a)
        per_row = 84 * max(b.shape[1] for b in self.biases_) * self.length_
        chunk = max(1, _CHUNK_FLOATS // per_row)
        out = np.empty((len(X), S, self.n_features), dtype=np.float32)
        for i in range(0, len(X), chunk):
            x = torch.from_numpy(X[i:i + chunk])
            parts = [self._ppv(x, int(d), b, average)
                     for d, b in zip(self.dilations_, self.biases_, strict=True)]
            if self.quantiles:
                parts.append(self._interval_quantiles(x))
            out[i:i + chunk] = torch.cat(parts, 1).transpose(1, 2).numpy()
        return out

    def fit_transform(self, X, y=None) -> np.ndarray:
        return self.fit(X).transform(X)

    @staticmethod
    def _ppv(x: Tensor, d: int, bias: Tensor, average: Tensor) -> Tensor:
        """Proportion of positions above each threshold, per segment: (n, 84·nb, S)."""
        c = _conv(x, d)
        # the comparison written straight into float32: a bool tensor then .float() made two
        # passes over the largest array of the fit and took ~40 % of the transform's time
        above = torch.empty(c.shape[0], c.shape[1], bias.shape[1], c.shape[2])
        torch.gt(c[:, :, None, :], bias[None, :, :, None], out=above)
        return above.flatten(1, 2) @ average

    def _interval_quantiles(self, x: Tensor) -> Tensor:
        """Quantiles of the z-normalised series and its difference per segment: (n, 2q, S)."""
        levels = torch.linspace(0.0, 1.0, self.quantiles)
        out = []
        for z in (x, torch.diff(x, dim=1, prepend=x[:, :1])):
            z = (z - z.mean(1, keepdim=True)) / (z.std(1, keepdim=True, correction=0) + 1e-6)
            out.append(torch.stack([torch.quantile(z[:, a:b], levels, dim=1).T
                                    for a, b in zip(self.edges_[:-1], self.edges_[1:],
                                                    strict=True)], 2))
        return torch.cat(out, 1)


class TokenNet(torch.nn.Module):
    """A classifier over :class:`ConvTokens`: (B, S, F) -> (B, n_classes) logits.

    Dropout on the features, one linear embedding to ``d_model``, ``num_layers`` pre-norm
    linear-attention :class:`~linattn.nn.EncoderBlock` s with learned relative positions
    (``max_len`` = S, or S + 1 with a global token), mean over tokens, LayerNorm, linear head.
    With ``global_features`` > 0 the forward pass also takes the series' global features
    (B, global_features), embedded by their own dropout and linear map into one more token
    placed after the segments, so that attention can relate each segment to the whole series.
    ``num_layers=0`` is the ablation: the same model with the mixer removed, a linear model of
    the pooled tokens."""

    def __init__(self, n_features: int, tokens: int, n_classes: int, d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, dropout: float = 0.1,
                 global_features: int = 0) -> None:
        super().__init__()
        from linattn.nn import EncoderBlock

        self.embed = torch.nn.Sequential(torch.nn.Dropout(dropout),
                                         torch.nn.Linear(n_features, d_model))
        self.global_embed = (torch.nn.Sequential(torch.nn.Dropout(dropout),
                                                 torch.nn.Linear(global_features, d_model))
                             if global_features else None)
        length = tokens + (1 if global_features else 0)
        self.blocks = torch.nn.ModuleList(
            EncoderBlock(d_model, num_heads, 2 * d_model, head_dim=d_model // num_heads,
                         max_len=length, dropout=dropout) for _ in range(num_layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, n_classes)

    def forward(self, tokens: Tensor, global_features: Tensor | None = None) -> Tensor:
        h = self.embed(tokens)
        if self.global_embed is not None:
            if global_features is None:
                raise ValueError("TokenNet: this net has a global token; pass global_features")
            h = torch.cat([h, self.global_embed(global_features)[:, None]], 1)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h.mean(1)))
