"""Multi-query associative recall (MQAR): the data of Zoology (Arora et al. 2023,
HazyResearch/zoology ``zoology/data/associative_recall.py``), regenerated here.

One example of length T with P key–value pairs and vocabulary V:

* the vocabulary is split in two: keys are drawn from ``[1, V // 2)``, values from
  ``[V // 2, V)`` (token 0 is the filler before ``random_non_queries`` replaces it), P distinct
  keys and P distinct values per example;
* the first 2P tokens are the pairs, ``k_1 v_1 k_2 v_2 … k_P v_P``;
* the remaining ``T − 2P`` tokens hold one query of every key, in slots of two tokens: key j is
  placed at position ``2P + 2·g_j``, its gap ``g_j`` drawn from ``{0, …, (T − 2P)/2 − 1}``
  without replacement with probability ``∝ (g + 1)^(a − 1)`` (a power law; ``power_a`` a = 0.01
  puts most queries soon after the pairs, a = 1 is uniform). Gaps are drawn key by key, each
  from what the previous keys left, with the weights renormalised (what NumPy's
  ``choice(replace=False, p=...)`` and torch's ``multinomial`` do);
* targets are −100 (ignored) everywhere except at the query positions, whose target is the
  value paired with that key: the model reads the key and must predict its value as the next
  token;
* with ``random_non_queries`` (Zoology's default) every other position in the query region is
  a uniformly random token of the whole vocabulary (it may equal a key or value of the
  example: the fillers are noise the model must ignore); without it they are 0.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from linattn.recall.options import check_mqar

__all__ = ["mqar", "gap_distribution", "check_mqar", "IGNORE_INDEX"]

#: The target of positions that are not queries (``torch.nn.functional.cross_entropy``'s
#: default ``ignore_index``).
IGNORE_INDEX = -100

# Rows drawn at once: memory stays flat (a few (rows, T) blocks) however many examples are asked
# for.
_ROWS = 1024


def gap_distribution(seq_len: int, num_kv_pairs: int, power_a: float = 0.01) -> Tensor:
    """The probability of each query gap g = 0 … S − 1, ``S = (seq_len − 2P) / 2``, for the first
    key drawn: ``(g + 1)^(a − 1)`` normalised. (S,) float64."""
    space = (seq_len - 2 * num_kv_pairs) // 2
    g = torch.arange(1, space + 1, dtype=torch.float64)
    w = g ** (power_a - 1.0)
    return w / w.sum()


def _distinct(rows: int, low: int, high: int, count: int, gen: torch.Generator) -> Tensor:
    """(rows, count) int64: per row, ``count`` distinct integers of [low, high) in random order,
    uniform over such ordered tuples.

    Floyd's algorithm (a uniform subset in ``count`` draws, whatever the range: ranking all
    V/2 candidates per row cost 20× more), then a random order of each row."""
    n = high - low
    chosen = torch.empty(rows, count, dtype=torch.int64)
    for i, j in enumerate(range(n - count, n)):
        t = torch.randint(j + 1, (rows,), generator=gen)
        taken = (chosen[:, :i] == t[:, None]).any(dim=1)
        chosen[:, i] = torch.where(taken, j, t)
    order = torch.rand(rows, count, generator=gen).argsort(dim=1)
    return chosen.gather(1, order) + low


def mqar(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int = 8192,
         power_a: float = 0.01, *, random_non_queries: bool = True,
         seed: int = 0) -> tuple[Tensor, Tensor]:
    """``num_examples`` MQAR sequences (module docstring): ``(inputs, targets)``, both
    (num_examples, seq_len) int64; ``targets`` is −100 (:data:`IGNORE_INDEX`) except at the
    ``num_kv_pairs`` query positions of each row.

    Deterministic for a given ``seed`` (a :class:`torch.Generator` of its own; the global RNG
    is untouched) and independent of the thread count. Different seeds give the train,
    validation and test sets. ValueError naming the argument for a bad value (see
    :func:`check_mqar`)."""
    n, T, P, V, a = check_mqar(num_examples, seq_len, num_kv_pairs, vocab_size, power_a)
    if not isinstance(random_non_queries, bool):
        raise TypeError(f"random_non_queries: expected a bool, got {random_non_queries!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an integer, got {seed!r}")
    gen = torch.Generator().manual_seed(int(seed))
    half, ctx = V // 2, 2 * P
    log_p = gap_distribution(T, P, a).log()
    inputs = torch.zeros(n, T, dtype=torch.int64)
    targets = torch.full((n, T), IGNORE_INDEX, dtype=torch.int64)
    for start in range(0, n, _ROWS):
        rows = min(_ROWS, n - start)
        keys = _distinct(rows, 1, half, P, gen)
        values = _distinct(rows, half, V, P, gen)
        # gaps without replacement, key by key, ∝ p: the Gumbel top-P of log p is exactly the
        # sequential draw (Plackett–Luce), its order the order in which keys take their gaps
        u = torch.rand(rows, log_p.numel(), generator=gen, dtype=torch.float64)
        gaps = (log_p - torch.log(-torch.log(u.clamp_min(1e-300)))).topk(P, dim=1).indices
        x, y = inputs[start:start + rows], targets[start:start + rows]
        x[:, 0:ctx:2], x[:, 1:ctx:2] = keys, values
        pos = ctx + 2 * gaps
        x.scatter_(1, pos, keys)
        y.scatter_(1, pos, values)
        if random_non_queries:
            fill = torch.randint(V, (rows, T), generator=gen)
            free = y == IGNORE_INDEX
            free[:, :ctx] = False
            x[free] = fill[free]
    return inputs, targets
