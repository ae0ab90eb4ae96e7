"""The MQAR generator (linattn.recall.data): Zoology's layout and distributions."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.recall import IGNORE_INDEX, gap_distribution, mqar

T, P, V = 64, 8, 256


@pytest.fixture(scope="module")
def batch():
    return mqar(400, T, P, vocab_size=V, seed=3)


def test_shapes_and_dtypes(batch):
    x, y = batch
    assert x.shape == y.shape == (400, T)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < V


def test_pairs_at_the_start_keys_and_values_disjoint_and_unique(batch):
    x, _ = batch
    keys, values = x[:, 0:2 * P:2], x[:, 1:2 * P:2]
    assert bool(((keys >= 1) & (keys < V // 2)).all())
    assert bool(((values >= V // 2) & (values < V)).all())
    for row_k, row_v in zip(keys.tolist(), values.tolist(), strict=True):
        assert len(set(row_k)) == P and len(set(row_v)) == P


def test_every_key_queried_once_and_target_is_its_value(batch):
    x, y = batch
    for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
        pairs = dict(zip(xi[0:2 * P:2], xi[1:2 * P:2], strict=True))
        queries = [t for t, target in enumerate(yi) if target != IGNORE_INDEX]
        assert len(queries) == P
        assert all(t >= 2 * P and (t - 2 * P) % 2 == 0 for t in queries)  # even slots
        assert sorted(xi[t] for t in queries) == sorted(pairs)  # each key exactly once
        for t in queries:
            assert yi[t] == pairs[xi[t]]  # the value paired with that key earlier


def test_targets_ignored_outside_queries(batch):
    _, y = batch
    assert bool((y[:, :2 * P] == IGNORE_INDEX).all())
    assert int((y != IGNORE_INDEX).sum()) == 400 * P


def test_fillers_random_or_zero():
    x, y = mqar(200, T, P, vocab_size=V, seed=0, random_non_queries=False)
    free = y == IGNORE_INDEX
    free[:, :2 * P] = False
    assert bool((x[free] == 0).all())
    xr, _ = mqar(200, T, P, vocab_size=V, seed=0)
    fill = xr[free]
    # uniform over the whole vocabulary: both halves present, mean near (V - 1) / 2
    assert fill.float().mean().item() == pytest.approx((V - 1) / 2, rel=0.05)
    assert int((fill < V // 2).sum()) > 0 and int((fill >= V // 2).sum()) > 0


def test_gap_distribution_is_the_power_law():
    p = gap_distribution(T, P, 0.01)
    space = (T - 2 * P) // 2
    assert p.shape == (space,)
    assert float(p.sum()) == pytest.approx(1.0)
    g = torch.arange(1, space + 1, dtype=torch.float64)
    ratio = p / g ** (0.01 - 1)
    assert float(ratio.max() / ratio.min()) == pytest.approx(1.0)


def test_query_gaps_follow_the_power_law():
    """The first key's gap is drawn from p itself (later keys from what is left): its
    empirical frequencies match p within a 5-sigma binomial bound, and a = 1 is uniform."""
    n, T2, P2 = 4000, 40, 4
    for a in (0.01, 1.0):
        x, y = mqar(n, T2, P2, vocab_size=V, power_a=a, seed=11)
        first_key = x[:, 0]
        pos = (x == first_key[:, None]) & (y != IGNORE_INDEX)
        gaps = (pos.float().argmax(dim=1) - 2 * P2) // 2
        freq = torch.bincount(gaps, minlength=(T2 - 2 * P2) // 2).double() / n
        p = gap_distribution(T2, P2, a)
        bound = 5 * torch.sqrt(p * (1 - p) / n) + 1e-3
        assert bool(((freq - p).abs() <= bound).all()), (a, freq, p)


def test_power_law_puts_queries_early():
    _, y = mqar(500, 256, 16, seed=0)
    pos = (y != IGNORE_INDEX).nonzero()[:, 1].double()
    _, yu = mqar(500, 256, 16, power_a=1.0, seed=0)
    pos_u = (yu != IGNORE_INDEX).nonzero()[:, 1].double()
    assert pos.mean() < pos_u.mean()


def test_deterministic_per_seed():
    a = mqar(50, T, P, vocab_size=V, seed=5)
    b = mqar(50, T, P, vocab_size=V, seed=5)
    c = mqar(50, T, P, vocab_size=V, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    # the global RNG is untouched
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    mqar(5, T, P, vocab_size=V, seed=1)
    assert torch.equal(torch.rand(1), before)


def test_chunking_does_not_change_the_rows():
    """More rows than one internal block: every row still well formed, and zero rows work."""
    x, y = mqar(1100, 16, 2, vocab_size=32, seed=0)
    assert x.shape == (1100, 16) and int((y != IGNORE_INDEX).sum()) == 2200
    x0, y0 = mqar(0, 16, 2, vocab_size=32)
    assert x0.shape == y0.shape == (0, 16)


@pytest.mark.parametrize("kwargs, name", [
    ({"seq_len": 30}, "seq_len"),               # 4P > T
    ({"seq_len": 65}, "seq_len"),               # odd
    ({"num_kv_pairs": 0}, "num_kv_pairs"),
    ({"num_examples": -1}, "num_examples"),
    ({"num_examples": 2.0}, "num_examples"),
    ({"vocab_size": 16}, "vocab_size"),         # 7 keys < 8 pairs
    ({"power_a": 0.0}, "power_a"),
    ({"power_a": math.nan}, "power_a"),
    ({"power_a": True}, "power_a"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {"num_examples": 2, "seq_len": T, "num_kv_pairs": P, "vocab_size": V, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}: ") as err:
        mqar(**args)
    assert "\n" not in str(err.value)


def test_bad_flag_and_seed_types():
    with pytest.raises(TypeError, match="^random_non_queries: "):
        mqar(2, T, P, vocab_size=V, random_non_queries=1)
    with pytest.raises(TypeError, match="^seed: "):
        mqar(2, T, P, vocab_size=V, seed=1.5)
