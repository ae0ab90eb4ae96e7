"""linattn.tsc.competing: the dilations, the weights, the counts against a direct computation of
their definition, what the counts add up to, how they scale, persistence and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.tsc.competing import CompetingKernels, power_dilations

EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("length", [1, 9, 17, 100, 500])
def test_dilations_are_powers_of_two_whose_reach_fits(length):
    d = power_dilations(length)
    assert d[0] == 1 and np.all(d[1:] == 2 * d[:-1])
    assert 8 * d[-1] + 1 <= max(length, 9) and 8 * (2 * d[-1]) + 1 > length


def test_weights_are_centred_unit_abs_sum_and_fixed_by_the_seed(series):
    X = series(4, 100)
    a, b = CompetingKernels(random_state=3).fit(X), CompetingKernels(random_state=3).fit(X)
    c = CompetingKernels(random_state=4).fit(X)
    for w in a.weights_:
        assert w.shape == (64 * 8, 1, 9)
        np.testing.assert_allclose(w.sum(-1), 0, atol=10 * EPS32)
        np.testing.assert_allclose(w.abs().sum(-1), 1, atol=10 * EPS32)
    assert all(torch.equal(u, v) for u, v in zip(a.weights_, b.weights_, strict=True))
    assert not torch.equal(a.weights_[0], c.weights_[0])
    assert len({tuple(w[0, 0].tolist()) for w in a.weights_}) == len(a.weights_)  # per dilation


def _direct(x: np.ndarray, w: np.ndarray, d: int) -> np.ndarray:
    """One series, one dilation, written out from the definition in float64: for each group
    the soft count of its best kernel and the hard count of its worst, at every step."""
    L, n_kernels = len(x), w.shape[0]
    pad = np.concatenate([np.zeros(4 * d), x, np.zeros(4 * d)])
    z = np.array([[sum(w[k, j] * pad[t + j * d] for j in range(9)) for t in range(L)]
                  for k in range(n_kernels)])  # (kernels, L)
    soft, hard = np.zeros(n_kernels), np.zeros(n_kernels)
    for t in range(L):
        soft[z[:, t].argmax()] += max(z[:, t].max(), 0.0)
        hard[z[:, t].argmin()] += 1
    return np.sqrt(soft / L), np.sqrt(hard / L)


def test_counts_match_their_definition(series):
    X = series(2, 40)
    ck = CompetingKernels(groups=4, kernels=3, random_state=1).fit(X)
    got = ck.transform(X)
    g, k = 2, 3  # groups per input, kernels per group
    assert got.shape == (2, ck.n_features) and ck.n_features == len(ck.dilations_) * 4 * 3 * 2
    for i, x in enumerate(X.astype(np.float64)):
        dx = np.diff(x, prepend=x[0])
        col = 0
        for d, w in zip(ck.dilations_, ck.weights_, strict=True):
            w = w[:, 0].double().numpy()
            for one, ws in ((x, w[:g * k]), (dx, w[g * k:])):
                parts = [_direct(one, ws[j * k:(j + 1) * k], int(d)) for j in range(g)]
                soft = np.concatenate([p[0] for p in parts])
                hard = np.concatenate([p[1] for p in parts])
                np.testing.assert_allclose(got[i, col:col + g * k], soft, rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(got[i, col + g * k:col + 2 * g * k], hard,
                                           rtol=1e-5, atol=1e-6)
                col += 2 * g * k
        assert col == ck.n_features


def test_each_step_has_one_worst_kernel_per_group_and_soft_counts_scale_with_amplitude(series):
    X = series(3, 64)
    ck = CompetingKernels(groups=6, kernels=4).fit(X)
    F = ck.transform(X).reshape(3, len(ck.dilations_), 2, 2, 3, 4)  # dil, input, soft/hard, g, k
    hard = F[:, :, :, 1] ** 2 * 64  # counts of steps
    np.testing.assert_allclose(hard.sum(-1), 64, rtol=1e-5)  # random data: no ties
    F4 = ck.transform(4 * X).reshape(F.shape)
    np.testing.assert_allclose(F4[:, :, :, 0], 2 * F[:, :, :, 0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(F4[:, :, :, 1], F[:, :, :, 1], rtol=1e-6)
    # row independence: a series' features do not depend on the others in its batch
    np.testing.assert_allclose(ck.transform(X[1:2]), ck.transform(X)[1:2], rtol=1e-5, atol=1e-6)


def test_a_tie_counts_for_every_kernel_in_it():
    # an all-zero series: every response is exactly 0, so every kernel is both best (soft
    # count 0: clamped) and worst (hard count: every step)
    zero = np.zeros((2, 40), dtype=np.float32)
    ck = CompetingKernels(groups=4, kernels=3).fit(zero)
    F = ck.transform(zero).reshape(2, len(ck.dilations_), 2, 2, 2 * 3)  # dil, input, soft/hard
    assert (F[:, :, :, 0] == 0).all() and (F[:, :, :, 1] == 1).all()


def test_state_round_trip_and_damage(series):
    X = series(3, 80)
    ck = CompetingKernels(groups=4, kernels=2, random_state=5).fit(X)
    state = ck.state("c.")
    back = CompetingKernels(groups=4, kernels=2).load_state(state, "c.", 80)
    np.testing.assert_array_equal(back.transform(X), ck.transform(X))
    with pytest.raises(ValueError, match="c.dilations: missing or not those of length 200"):
        CompetingKernels(groups=4, kernels=2).load_state(state, "c.", 200)
    with pytest.raises(ValueError, match=r"c.weights.\*: expected"):
        CompetingKernels(groups=6, kernels=2).load_state(state, "c.", 80)


def test_errors_name_what_is_wrong(series):
    with pytest.raises(ValueError, match="groups must be even"):
        CompetingKernels(groups=5)
    with pytest.raises(ValueError, match="kernels must be an integer >= 2"):
        CompetingKernels(kernels=1)
    with pytest.raises(ValueError, match="random_state must be an integer >= 0"):
        CompetingKernels(random_state=np.random.default_rng(0))
    assert CompetingKernels(random_state=None).fit(series(1, 20)).weights_[0].shape[0] == 512
    with pytest.raises(RuntimeError, match="call fit before transform"):
        CompetingKernels().transform(series(1, 20))
    ck = CompetingKernels().fit(series(2, 20))
    with pytest.raises(ValueError, match="series have 30 samples, the kernels were fitted on 20"):
        ck.transform(series(2, 30))
    rev = series(2, 20)[:, ::-1]  # a negative-stride view is read like its copy
    np.testing.assert_array_equal(ck.transform(rev), ck.transform(rev.copy()))
    bad = series(2, 20)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"X\[1, 3\] is nan"):
        ck.transform(bad)
