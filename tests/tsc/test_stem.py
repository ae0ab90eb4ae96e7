"""StemNet: shapes and pooling at any length, per-series normalisation, the ablation without
the mixer, and training that tells two shapes apart wherever they sit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.tsc.conv_classifier import stem_net_proba, train_stem_net
from linattn.tsc.stem import StemNet


@pytest.mark.parametrize(("length", "stride", "tokens"), [(20, 1, 20), (100, 1, 32),
                                                          (1751, 4, 32), (2000, 4, 32)])
def test_shapes_pooling_and_tokens(length, stride, tokens):
    net = StemNet(length, 3).eval()
    assert (net.stride, net.tokens) == (stride, tokens)  # at most 512 samples, 32 tokens
    seen = []
    net.convs.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    assert net(torch.randn(5, length)).shape == (5, 3)
    # the convolutions see ceil(length / stride) samples (a partial last window is kept)
    assert seen == [(5, 64, -(-length // stride))] and net.pooled_length == -(-length // stride)
    assert len(net.blocks) == 2 and len(StemNet(length, 3, num_layers=0).blocks) == 0


def test_each_series_is_normalised_on_its_own():
    torch.manual_seed(0)
    net = StemNet(80, 2).eval()
    x = torch.randn(4, 80)
    # a recording's offset and gain do not change its logits (up to float32 rounding)
    tol = 1e3 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(net(3.0 * x + 7.0), net(x), rtol=tol, atol=tol)


def test_training_tells_a_bump_from_a_dip_anywhere():
    g = np.random.default_rng(0)
    n, length = 64, 120
    y = np.arange(n) % 2
    t = np.arange(length)
    X = 0.3 * g.standard_normal((n, length))
    centres = g.integers(15, 105, n)  # anywhere: the convolutions find it, the pooling keeps it
    X += np.where(y == 0, 2, -2)[:, None] * np.exp(-0.5 * ((t[None] - centres[:, None]) / 4.0) ** 2)
    X = X.astype(np.float32)
    net = train_stem_net(X[:48], y[:48], 2, steps=60, seed=0)
    assert not net.training  # returned ready to predict
    p = stem_net_proba(net, X[48:], batch=5)  # in batches: the same as at once
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(p, stem_net_proba(net, X[48:]), rtol=1e-5, atol=1e-6)
    assert (p.argmax(1) == y[48:]).mean() >= 0.9
    # one seed fixes the weights and the batches
    again = stem_net_proba(train_stem_net(X[:48], y[:48], 2, steps=60, seed=0), X[48:])
    np.testing.assert_allclose(again, p, rtol=1e-4, atol=1e-5)
