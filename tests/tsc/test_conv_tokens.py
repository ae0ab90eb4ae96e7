"""linattn.tsc.conv_tokens: the kernels, the dilations, tokens against a direct computation of
their definition, determinism, row independence, the ablation's pooling identity, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.tsc.conv_tokens import KERNELS, ConvTokens, TokenNet, dilations

EPS32 = float(np.finfo(np.float32).eps)


def test_kernels_are_84_distinct_zero_sum_choices_of_three_taps():
    w = KERNELS[:, 0]
    assert w.shape == (84, 9)
    assert torch.equal(w.sum(1), torch.zeros(84))
    assert torch.equal((w == 2).sum(1), torch.full((84,), 3))
    assert len({tuple(r.tolist()) for r in w}) == 84


@pytest.mark.parametrize("length", [1, 5, 9, 24, 500, 1751])
def test_dilations_span_one_to_the_receptive_field(length):
    d = dilations(length)
    assert d[0] == 1 and d[-1] == max(1, (length - 1) // 8)
    assert np.all(np.diff(d) > 0) and len(d) <= 32


def _direct_conv(x: np.ndarray, kernel: np.ndarray, d: int) -> np.ndarray:
    """One kernel at dilation d over one series, "same" zero padding, in float64, written out
    from the definition."""
    L = len(x)
    padded = np.concatenate([np.zeros(4 * d), x, np.zeros(4 * d)])
    return np.array([sum(kernel[k] * padded[t + k * d] for k in range(9)) for t in range(L)])


@pytest.mark.parametrize("length, segments", [(40, 4), (50, 16), (23, 5)])
def test_tokens_match_the_definition(length, segments, series):
    X = series(6, length)
    conv = ConvTokens(segments=segments, features=84 * 8 * 2, quantiles=3).fit(X)
    T = conv.transform(X)
    S = min(segments, length)
    assert T.shape == (6, S, conv.n_features)
    nb = conv.biases_[0].shape[1]
    assert conv.n_features == 84 * len(conv.dilations_) * nb + 6
    edges = np.linspace(0, length, S + 1).round().astype(int)
    assert np.all(np.diff(edges) >= 1)
    x = X[2].astype(np.float64)
    # float32 convolution error bound: the kernel's |weights| sum to 12
    near_tol = 64 * EPS32 * 12 * np.abs(x).max()
    checked = 0
    for di, d in enumerate(conv.dilations_):
        for k in (0, 41, 83):
            out = _direct_conv(x, KERNELS[k, 0].numpy().astype(np.float64), int(d))
            for j in range(nb):
                bias = float(conv.biases_[di][k, j])
                col = di * 84 * nb + k * nb + j
                for s_ in range(S):
                    seg = slice(edges[s_], edges[s_ + 1])
                    n = edges[s_ + 1] - edges[s_]
                    above, near = out[seg] > bias, np.abs(out[seg] - bias) <= near_tol
                    got = T[2, s_, col]
                    # exact away from the threshold; a position on it may fall either side
                    assert abs(got - above.mean()) <= near.sum() / n + 4 * EPS32, (d, k, j, s_)
                    checked += near.sum() == 0
    assert checked > 0
    for q_col, level in ((-6, 0), (-4, 2)):  # the series' min and max per segment
        z = (X[2] - X[2].mean()) / (X[2].std() + 1e-6)
        want = [(z[a:b].min() if level == 0 else z[a:b].max())
                for a, b in zip(edges[:-1], edges[1:], strict=True)]
        np.testing.assert_allclose(T[2, :, q_col], want, rtol=0, atol=100 * EPS32)
    assert T[:, :, :-6].min() >= 0 and T[:, :, :-6].max() <= 1 + 10 * EPS32  # means of 0/1


def test_mean_over_tokens_is_the_global_proportion_for_equal_segments(series):
    X = series(5, 64)
    conv = ConvTokens(segments=8, quantiles=0).fit(X)
    pooled = conv.transform(X).mean(1)
    whole = ConvTokens(segments=1, quantiles=0).fit(X).transform(X)[:, 0]
    np.testing.assert_allclose(pooled, whole, rtol=0, atol=100 * EPS32)


def test_fixed_by_the_training_series_and_the_seed(series):
    X, other = series(20, 50), series(7, 50, seed=1)
    a = ConvTokens(random_state=3).fit(X)
    b = ConvTokens(random_state=3).fit(X)
    c = ConvTokens(random_state=4).fit(X)
    np.testing.assert_array_equal(a.transform(other), b.transform(other))
    assert not np.array_equal(a.transform(other), c.transform(other))
    # a row's tokens do not depend on the rows beside it. The convolution's float32 rounding
    # may differ with the batch, so a value lying on a threshold may flip: one position of a
    # 3-sample segment (50 samples / 16) at most, and almost every value identical
    full, part = a.transform(other), a.transform(other[2:5])
    np.testing.assert_allclose(full[2:5], part, rtol=0, atol=1 / 3 + 10 * EPS32)
    assert np.mean(full[2:5] == part) > 0.999


def test_short_series_get_one_token_per_sample(series):
    X = series(4, 5)
    T = ConvTokens(segments=16).fit_transform(X)
    assert T.shape[:2] == (4, 5)


def test_numpy_integers_are_accepted(series):
    conv = ConvTokens(segments=np.int64(4), features=np.int32(300), quantiles=np.int64(0))
    assert conv.fit_transform(series(3, 40)).shape[:2] == (3, 4)


def test_errors_name_what_is_wrong(series):
    X = series(3, 20)
    with pytest.raises(ValueError, match=r"segments must be an integer >= 1"):
        ConvTokens(segments=0)
    with pytest.raises(ValueError, match=r"quantiles must be an integer >= 0"):
        ConvTokens(quantiles=1.5)
    with pytest.raises(RuntimeError, match="call fit"):
        ConvTokens().transform(X)
    bad = X.copy()
    bad[1, 7] = np.nan
    with pytest.raises(ValueError, match=r"X\[1, 7\] is nan"):
        ConvTokens().fit(bad)
    with pytest.raises(ValueError, match="series have 21 samples, the tokens were fitted on 20"):
        ConvTokens().fit(X).transform(series(2, 21))
    with pytest.raises(ValueError, match=r"shape \(n_series, length\)"):
        ConvTokens().fit(X[0])


def test_token_net_shapes_and_the_ablation_is_a_model_of_the_pooled_tokens():
    torch.manual_seed(0)
    x = torch.randn(3, 8, 20)
    net = TokenNet(20, 8, 5).eval()
    assert net(x).shape == (3, 5) and len(net.blocks) == 2
    pool = TokenNet(20, 8, 5, num_layers=0).eval()
    assert len(pool.blocks) == 0
    mean = x.mean(1, keepdim=True).expand_as(x)
    tol = 50 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(pool(x), pool(mean), rtol=tol, atol=tol)
    # with the mixer the order of the tokens matters (relative positions), pooled it does not
    perm = x[:, torch.randperm(8)]
    torch.testing.assert_close(pool(x), pool(perm), rtol=tol, atol=tol)
    assert not torch.allclose(net(x), net(perm), rtol=tol, atol=tol)
