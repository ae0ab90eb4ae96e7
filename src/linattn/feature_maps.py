r"""Feature maps :math:`\varphi` that turn a kernel into a dot product.

Linear attention replaces the softmax weight :math:`\exp(q\cdot k)` by
:math:`\varphi(q)\cdot\varphi(k)` with :math:`\varphi:\mathbb{R}^d\to\mathbb{R}^\ell`. Every map
here is an :class:`torch.nn.Module` with one small interface:

* ``forward_queries(x)`` and ``forward_keys(x)``: ``(..., T, d) -> (..., T, ℓ)``; queries and
  keys may be mapped differently (random maps with stabilisers do);
* ``num_features(head_dim)``: ℓ for a head dimension d;
* ``redraw()``: draw new random parameters; a no-op for deterministic maps;
* ``eps``: the default guard added to the attention normaliser (0 for strictly positive maps).

A map owns its scaling (the Taylor map's :math:`1/\sqrt d`, for instance): the ops take no separate
``scale``. Strings are shortcuts resolved by :func:`get_feature_map`.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "FeatureMap",
    "EluPlusOne",
    "ReluPlusOne",
    "Taylor",
    "Polynomial",
    "get_feature_map",
    "FEATURE_MAPS",
]


class FeatureMap(nn.Module):
    """Interface of every feature map. Subclasses override :meth:`forward_features` when queries
    and keys share φ, or :meth:`forward_queries` / :meth:`forward_keys` when they do not."""

    #: Added to the normaliser φ(q)·Σφ(k) by default; 0 when φ(q)·φ(k) > 0 always.
    eps: float = 0.0

    def num_features(self, head_dim: int) -> int:
        """ℓ, the number of features for inputs of last dimension ``head_dim``."""
        raise NotImplementedError

    def forward_features(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_queries(self, x: Tensor) -> Tensor:
        """φ applied to queries: ``(..., T, d) -> (..., T, ℓ)``."""
        return self.forward_features(x)

    def forward_keys(self, x: Tensor) -> Tensor:
        """φ applied to keys: ``(..., T, d) -> (..., T, ℓ)``."""
        return self.forward_features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_keys(x)

    def redraw(self) -> None:
        """Draw new random parameters. Deterministic maps have none: nothing happens."""

    def new_feature_map(self) -> FeatureMap:
        """A fresh map of the same kind (for per-layer copies of random maps)."""
        return type(self)(**self.config())

    def config(self) -> dict:
        """Constructor arguments that rebuild this map."""
        return {}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items())


class EluPlusOne(FeatureMap):
    r""":math:`\varphi(x) = 1 + \mathrm{elu}(x)`, elementwise, ℓ = d.

    Strictly positive (``elu(x) > -1``) and smooth at 0, so every attention weight is positive and
    the normaliser never vanishes (Katharopoulos et al., 2020)."""

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0


class ReluPlusOne(FeatureMap):
    r""":math:`\varphi(x) = \max(x, 0) + 1` (shifted ReLU), elementwise, ℓ = d. Positive."""

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        return F.relu(x) + 1.0


@functools.lru_cache(maxsize=64)
def _monomial_indices(dim: int, degree: int) -> tuple[Tensor, Tensor]:
    """Index tuples of all monomials of ``degree`` in ``dim`` variables (with repetition) and the
    square roots of their multinomial coefficients.

    Returns ``idx: (M, degree)`` and ``coef: (M,)``, ``M = C(dim + degree - 1, degree)``, with
    ``(x·y)^degree = Σ_m coef_m² Π_j x[idx_mj] y[idx_mj]``.
    """
    combos = list(itertools.combinations_with_replacement(range(dim), degree))
    coef = []
    for c in combos:
        n = math.factorial(degree)
        for _, grp in itertools.groupby(c):
            n //= math.factorial(len(list(grp)))
        coef.append(math.sqrt(n))
    idx = torch.tensor(combos, dtype=torch.long).reshape(len(combos), degree)
    return idx, torch.tensor(coef, dtype=torch.float64)


def _monomials(x: Tensor, degree: int) -> Tensor:
    """Features of ``(x·y)^degree``: ``(..., d) -> (..., C(d + degree - 1, degree))``."""
    if degree == 0:
        return x.new_ones(*x.shape[:-1], 1)
    idx, coef = _monomial_indices(x.shape[-1], degree)
    idx = idx.to(x.device)
    prod = x[..., idx[:, 0]]
    for j in range(1, degree):
        prod = prod * x[..., idx[:, j]]
    return prod * coef.to(device=x.device, dtype=x.dtype)


class Taylor(FeatureMap):
    r"""Second-order Taylor expansion of :math:`\exp(s)`, :math:`s = q\cdot k/\sqrt d`:

    .. math::
        \varphi(x) = \bigl(1,\; x/d^{1/4},\; \mathrm{vec}_{\le}(x x^\top)/(\sqrt2\sqrt d)\bigr),
        \qquad \varphi(q)\cdot\varphi(k) = 1 + s + s^2/2 .

    Only the upper triangle of :math:`x x^\top` is kept, off-diagonal entries scaled by √2 so the
    dot product still counts each pair twice: ℓ = 1 + d + d(d+1)/2. The kernel
    :math:`1 + s + s^2/2 = \tfrac12\bigl((1+s)^2 + 1\bigr) \ge \tfrac12` is positive for every s.
    """

    def num_features(self, head_dim: int) -> int:
        return 1 + head_dim + head_dim * (head_dim + 1) // 2

    def forward_features(self, x: Tensor) -> Tensor:
        d = x.shape[-1]
        x = x * d**-0.25  # now s = x_q·x_k, the quadratic block is (x x^T) / √2
        quad = _monomials(x, 2) * (0.5**0.5)
        return torch.cat([x.new_ones(*x.shape[:-1], 1), x, quad], dim=-1)


class Polynomial(FeatureMap):
    r"""Explicit features of the polynomial kernel :math:`(x\cdot y + c)^p`.

    With :math:`x' = (x, \sqrt c)`, :math:`(x\cdot y + c)^p = (x'\cdot y')^p`, whose features are
    the degree-p monomials of x' weighted by the square roots of their multinomial coefficients:
    ℓ = C(d + p, p). The kernel is positive for even p (and c > 0); for odd p it can be negative
    or zero, so the attention normaliser may vanish: use ``eps`` or an even degree.
    """

    def __init__(self, degree: int = 2, c: float = 1.0) -> None:
        super().__init__()
        if not isinstance(degree, int) or degree < 1:
            raise ValueError(f"degree: expected a positive integer, got {degree!r}")
        if c < 0:
            raise ValueError(f"c: expected c >= 0, got {c!r}")
        self.degree = degree
        self.c = float(c)

    def config(self) -> dict:
        return {"degree": self.degree, "c": self.c}

    def num_features(self, head_dim: int) -> int:
        return math.comb(head_dim + self.degree, self.degree)

    def forward_features(self, x: Tensor) -> Tensor:
        ext = torch.cat([x, x.new_full((*x.shape[:-1], 1), math.sqrt(self.c))], dim=-1)
        return _monomials(ext, self.degree)


#: The string shortcuts accepted wherever a feature map is taken.
FEATURE_MAPS: dict[str, type[FeatureMap]] = {
    "elu": EluPlusOne,
    "relu": ReluPlusOne,
    "taylor": Taylor,
    "polynomial": Polynomial,
}


def get_feature_map(feature_map: str | FeatureMap) -> FeatureMap:
    """Resolve a name from :data:`FEATURE_MAPS` or pass a :class:`FeatureMap` through."""
    if isinstance(feature_map, FeatureMap):
        return feature_map
    if isinstance(feature_map, str):
        cls = FEATURE_MAPS.get(feature_map.lower())
        if cls is None:
            names = ", ".join(sorted(FEATURE_MAPS))
            raise ValueError(f"feature_map: unknown name {feature_map!r}; choose from {names}")
        return cls()
    raise TypeError(
        f"feature_map: expected a name or a FeatureMap, got {type(feature_map).__name__}"
    )
