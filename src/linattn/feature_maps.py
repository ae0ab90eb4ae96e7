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
    "FavorPlus",
    "RandomReLU",
    "Hedgehog",
    "fit_hedgehog",
    "get_feature_map",
    "FEATURE_MAPS",
]


class FeatureMap(nn.Module):
    """Interface of every feature map. Subclasses override :meth:`forward_features` when queries
    and keys share φ, or :meth:`forward_queries` / :meth:`forward_keys` when they do not."""

    #: Added to the normaliser φ(q)·Σφ(k) by default; 0 when φ(q)·φ(k) > 0 always.
    eps: float = 0.0
    #: True when the features of token t depend on token t alone (not on its position or on
    #: other tokens): then a sequence may be mapped chunk by chunk (the fused fast path).
    tokenwise: bool = True

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
        # exp(x) for x <= 0, as the compiled kernels: elu(x) + 1 cancels to 0 in float32 below
        # x ≈ -17 (a vanishing normaliser); exp of x clamped to 0 keeps x > 0's gradient finite
        return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))


class ReluPlusOne(FeatureMap):
    r""":math:`\varphi(x) = \max(x, 0) + 1` (shifted ReLU), elementwise, ℓ = d. Positive."""

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        return F.relu(x) + 1.0


@functools.lru_cache(maxsize=64)
def _monomial_table(dim: int, degree: int) -> tuple[tuple[tuple[int, ...], ...],
                                                    tuple[float, ...]]:
    """Index tuples of all monomials of ``degree`` in ``dim`` variables (with repetition) and the
    square roots of their multinomial coefficients, as plain tuples (what a traced graph can
    hold as a constant).

    ``M = C(dim + degree - 1, degree)`` tuples, with
    ``(x·y)^degree = Σ_m coef_m² Π_j x[idx_mj] y[idx_mj]``.
    """
    combos = tuple(itertools.combinations_with_replacement(range(dim), degree))
    coef = []
    for c in combos:
        n = math.factorial(degree)
        for _, grp in itertools.groupby(c):
            n //= math.factorial(len(list(grp)))
        coef.append(math.sqrt(n))
    return combos, tuple(coef)


@torch.compiler.assume_constant_result  # a traced graph keeps the table as a constant
def _monomial_table_constant(dim: int, degree: int):
    return _monomial_table(dim, degree)


def _monomial_indices(dim: int, degree: int) -> tuple[Tensor, Tensor]:
    """:func:`_monomial_table` as tensors: ``idx: (M, degree)`` and ``coef: (M,)``."""
    combos, coef = _monomial_table_constant(dim, degree)
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


def _generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(torch.randint(0, 2**62, ()).item()) if seed is None else seed)
    return g


def _check_dim(x: Tensor, head_dim: int, name: str) -> None:
    if x.shape[-1] != head_dim:
        raise ValueError(f"{name}: expected inputs of last dimension {head_dim}, got {x.shape[-1]}")


def gaussian_orthogonal(num_rows: int, dim: int, generator: torch.Generator) -> Tensor:
    """(num_rows, dim) rows orthogonal within each block of ``dim`` rows, each row rescaled to
    the norm of an independent N(0, I_dim) vector (chi-distributed), so every row is marginally
    N(0, I) while rows in a block are exactly orthogonal (lower-variance estimates)."""
    blocks = []
    for start in range(0, num_rows, dim):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qmat, rmat = torch.linalg.qr(g)
        # sign fix: makes Q Haar-distributed, so each row's direction is uniform (unbiased)
        qmat = qmat * torch.sign(torch.diagonal(rmat)).unsqueeze(0)
        blocks.append(qmat.T[: min(dim, num_rows - start)])
    rows = torch.cat(blocks)
    norms = torch.randn(num_rows, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return rows * norms.unsqueeze(1)


class FavorPlus(FeatureMap):
    r"""Performer's positive orthogonal random features (FAVOR+) for the softmax kernel.

    With :math:`x' = x/d^{1/4}` and rows :math:`w_r \sim N(0, I_d)` (orthogonal within blocks
    of d, chi-distributed norms),

    .. math:: \varphi(x) = \frac{1}{\sqrt m}\exp\bigl(W x' - \lVert x'\rVert^2/2 - c\bigr),
              \qquad \mathbb E\bigl[\varphi(q)\cdot\varphi(k)\bigr]\,e^{c_q + c_k}
              = \exp(q\cdot k/\sqrt d),

    since :math:`\mathbb E_w[e^{w\cdot(a+b)}] = e^{\lVert a+b\rVert^2/2}`.

    Stabiliser c (subtracted in the exponent, so ``exp`` never overflows):

    * queries: the row's own maximum over features. A factor that depends on the query alone
      multiplies numerator and normaliser of that row alike and cancels.
    * keys (and relative vectors): the data-independent bound :math:`\max_r \lVert w_r\rVert^2/2`,
      which is ≥ :math:`w\cdot x' - \lVert x'\rVert^2/2` for every x' (complete the square), so
      key features lie in (0, 1/√m]. One constant for every key cancels between numerator
      and normaliser, and since it uses no data it takes nothing from later tokens: the
      causal, chunked and recurrent forms see exactly the same features.

    ``redraw()`` draws a new W (a buffer: saved and restored with the model). ``num_features``
    is m, whatever the head dimension.
    """

    def __init__(
        self,
        head_dim: int,
        num_features: int = 256,
        *,
        orthogonal: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if head_dim < 1 or num_features < 1:
            raise ValueError(
                f"head_dim, num_features: expected positive integers, got {head_dim}, "
                f"{num_features}"
            )
        self.head_dim, self.m, self.orthogonal, self.seed = head_dim, num_features, orthogonal, seed
        self._gen = _generator(seed)
        self.register_buffer("W", torch.empty(num_features, head_dim))
        self.redraw()

    def config(self) -> dict:
        return {
            "head_dim": self.head_dim,
            "num_features": self.m,
            "orthogonal": self.orthogonal,
            "seed": self.seed,
        }

    def num_features(self, head_dim: int) -> int:
        return self.m

    @torch.no_grad()
    def redraw(self) -> None:
        if self.orthogonal:
            W = gaussian_orthogonal(self.m, self.head_dim, self._gen)
        else:
            W = torch.randn(self.m, self.head_dim, generator=self._gen, dtype=torch.float64)
        self.W.copy_(W.to(self.W))

    def _exponent(self, x: Tensor, name: str) -> Tensor:
        _check_dim(x, self.head_dim, name)
        x = x * self.head_dim**-0.25
        return x @ self.W.to(x.dtype).T - 0.5 * x.square().sum(-1, keepdim=True)

    def forward_queries(self, x: Tensor) -> Tensor:
        h = self._exponent(x, "q")
        return torch.exp(h - h.amax(-1, keepdim=True).detach()) * self.m**-0.5

    def forward_keys(self, x: Tensor) -> Tensor:
        h = self._exponent(x, "k")
        bound = 0.5 * self.W.to(x.dtype).square().sum(-1).max()
        return torch.exp(h - bound) * self.m**-0.5


class RandomReLU(FeatureMap):
    r"""Random ReLU features: :math:`\varphi(x) = \mathrm{relu}(W x')/\sqrt m`,
    :math:`x' = x/d^{1/4}`, :math:`W_{rc} \sim N(0, 1)`.

    :math:`\varphi(q)\cdot\varphi(k)` estimates the first-order arc-cosine kernel
    :math:`\tfrac{1}{2\pi}\lVert q'\rVert\lVert k'\rVert(\sin\theta + (\pi-\theta)\cos\theta)`,
    which is non-negative but, for a finite draw, can be exactly 0 for a query whose
    projections are all negative. The normaliser is therefore guarded: ``eps`` = 1e-6 is added
    to it by default (and a zero normaliser gives a zero output).
    """

    eps = 1e-6

    def __init__(self, head_dim: int, num_features: int = 256, *, seed: int | None = None):
        super().__init__()
        self.head_dim, self.m, self.seed = head_dim, num_features, seed
        self._gen = _generator(seed)
        self.register_buffer("W", torch.empty(num_features, head_dim))
        self.redraw()

    def config(self) -> dict:
        return {"head_dim": self.head_dim, "num_features": self.m, "seed": self.seed}

    def num_features(self, head_dim: int) -> int:
        return self.m

    @torch.no_grad()
    def redraw(self) -> None:
        self.W.copy_(torch.randn(self.m, self.head_dim, generator=self._gen))

    def forward_features(self, x: Tensor) -> Tensor:
        _check_dim(x, self.head_dim, "x")
        x = x * self.head_dim**-0.25
        return F.relu(x @ self.W.to(x.dtype).T) * self.m**-0.5


class Hedgehog(FeatureMap):
    r"""A learnable feature map in the style of Hedgehog (Zhang et al., 2024).

    .. math:: \varphi(x) = \bigl[\mathrm{softmax}(W x' + b),\ \mathrm{softmax}(-(W x' + b))\bigr],
              \qquad x' = x/d^{1/4},\ \ell = 2m.

    Exponentials of a trainable projection can mimic softmax's spiky, monotone weights, which
    1 + elu cannot; the ± pair keeps negative projections informative. Features are positive,
    so the normaliser never vanishes. Train it with the task, or distil it first with
    :func:`fit_hedgehog` to match softmax attention on sample queries and keys.
    """

    def __init__(self, head_dim: int, num_features: int | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.m = head_dim if num_features is None else num_features
        self.proj = nn.Linear(head_dim, self.m)
        with torch.no_grad():
            if self.m == head_dim:  # start at the identity: early training sees q·k structure
                nn.init.eye_(self.proj.weight)
            self.proj.bias.zero_()

    def config(self) -> dict:
        return {"head_dim": self.head_dim, "num_features": self.m}

    def num_features(self, head_dim: int) -> int:
        return 2 * self.m

    def forward_features(self, x: Tensor) -> Tensor:
        _check_dim(x, self.head_dim, "x")
        h = self.proj(x * self.head_dim**-0.25)
        return torch.cat([h.softmax(-1), (-h).softmax(-1)], dim=-1)


def softmax_attention_weights(q: Tensor, k: Tensor) -> Tensor:
    """softmax(q kᵀ/√d) rows: (..., Tq, D), (..., Tk, D) -> (..., Tq, Tk)."""
    return (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)


def linear_attention_weights(
    fmap: FeatureMap, q: Tensor, k: Tensor, *, eps: float = 1e-12
) -> Tensor:
    """The (Tq, Tk) weights φ(q_i)·φ(k_j) / Σ_j φ(q_i)·φ(k_j) that linear attention applies."""
    sim = fmap.forward_queries(q) @ fmap.forward_keys(k).transpose(-1, -2)
    return sim / (sim.sum(-1, keepdim=True) + eps)


def fit_hedgehog(
    fmap: Hedgehog,
    q: Tensor,
    k: Tensor,
    *,
    steps: int = 300,
    lr: float = 1e-2,
) -> list[float]:
    """Distil ``fmap`` to mimic softmax attention: minimise the mean cross-entropy between the
    rows of softmax(q kᵀ/√d) and of its linear-attention weights, with Adam.

    q, k: (..., T, D) sample queries and keys (T small: the weights are T×T here — this is a
    fitting tool, not a fast path). Returns the loss after each step."""
    target = softmax_attention_weights(q, k).detach()
    opt = torch.optim.Adam(fmap.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        pred = linear_attention_weights(fmap, q, k)
        loss = -(target * pred.clamp_min(1e-12).log()).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


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
