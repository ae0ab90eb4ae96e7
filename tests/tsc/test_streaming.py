"""The streaming classifier: streaming equals offline, O(1) state, save/restore mid-stream."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from linattn.tsc.streaming import (
    StreamingClassifier,
    StreamingConfig,
    StreamState,
    accuracy_by_fraction,
    train_streaming,
)


def _model(**kw):
    torch.manual_seed(0)
    return StreamingClassifier(length=47, patch=5, d_model=16, num_layers=2, num_heads=2,
                               mlp_dim=32, **kw).eval()


def _x(B=3, L=47, seed=0):
    return torch.randn(B, L, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sizes", [[47], [1] * 47, [3, 9, 2, 20, 13], [5] * 9 + [2]])
def test_stream_equals_offline(sizes):
    m, x = _model(), _x()
    with torch.no_grad():
        offline = m(x)  # (B, T, C), the last patch zero padded
    chunks = torch.split(x, sizes, dim=1)
    streamed = torch.stack(list(m.stream(chunks)), 1)
    assert offline.shape == streamed.shape == (3, 10, 2)
    torch.testing.assert_close(streamed, offline, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(streamed[:, -1], offline[:, -1], rtol=1e-4, atol=1e-5)


def test_stream_accepts_one_series_as_numpy():
    m, x = _model(), _x(B=1)
    out = list(m.stream([x[0, :20].numpy(), x[0, 20:].numpy()]))
    with torch.no_grad():
        torch.testing.assert_close(out[-1], m(x)[:, -1], rtol=1e-4, atol=1e-5)


def test_state_is_constant_size():
    m, x = _model(), _x(L=200)
    st = StreamState()
    sizes = []
    for _ in m.stream(torch.split(x, 5, dim=1), st, flush=False):
        sizes.append(sum(t.numel() for t in st.to_dict().values()))
    assert len(sizes) == 40 and len(set(sizes)) == 1


def test_save_restore_mid_stream_continues_identically():
    m, x = _model(), _x()
    st = StreamState()
    first = list(m.stream([x[:, :23]], st, flush=False))  # 4 patches, 3 samples pending
    saved = {k: v.clone() for k, v in st.to_dict().items()}
    rest_a = list(m.stream([x[:, 23:]], st))
    rest_b = list(m.stream([x[:, 23:]], StreamState.from_dict(saved)))
    assert len(first) == 4 and len(rest_a) == len(rest_b) == 6
    for a, b in zip(rest_a, rest_b, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        torch.testing.assert_close(torch.stack(first + rest_a, 1), m(x), rtol=1e-4, atol=1e-5)


def test_prediction_is_causal():
    m, x = _model(), _x()
    y = x.clone()
    y[:, 30:] = 100.0
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:, :6], m(y)[:, :6])  # patches 0-5 end before 30


def test_bad_input_raises():
    with pytest.raises(ValueError, match="x"):
        _model()(torch.zeros(3))
    with pytest.raises(ValueError, match="chunks"):
        list(_model().stream([torch.zeros(1, 2, 3)]))


def test_short_training_learns_a_separable_toy_problem():
    g = np.random.default_rng(0)
    y = g.integers(0, 2, 128)
    X = g.normal(size=(128, 47)).astype(np.float32) + (2 * y[:, None] - 1) * 1.0
    m = StreamingClassifier(length=47, patch=5, d_model=16, num_layers=1, num_heads=2,
                            mlp_dim=32, dropout=0.0)
    hist = train_streaming(m, X, y, X_val=X, y_val=y, epochs=4, batch_size=32, lr=5e-3,
                           progress=False)
    acc = accuracy_by_fraction(m, X, y)
    assert len(hist) == 4 and acc.shape == (10,)
    assert acc[-1] > 0.9


def test_deprecated_layers_and_heads_still_work():
    with pytest.warns(DeprecationWarning, match="'layers' is deprecated, use 'num_layers'"):
        cfg = StreamingConfig(layers=3, num_heads=2)
    assert (cfg.num_layers, cfg.num_heads) == (3, 2) and "layers" not in cfg.to_dict()
    with pytest.warns(DeprecationWarning) as caught:
        old = StreamingConfig.from_dict({"d_model": 16, "layers": 1, "heads": 2})
    assert sorted(str(w.message) for w in caught) == [
        "StreamingConfig: 'heads' is deprecated, use 'num_heads'",
        "StreamingConfig: 'layers' is deprecated, use 'num_layers'"]
    assert old == StreamingConfig(d_model=16, num_layers=1, num_heads=2)
    with pytest.warns(DeprecationWarning):
        m = StreamingClassifier(old, heads=4)  # an override in the old spelling wins
    assert (m.config.num_layers, m.config.num_heads, len(m.blocks)) == (1, 4, 1)
    with pytest.raises(ValueError, match=r"unknown keys \['depth'\]"):
        StreamingConfig.from_dict({"depth": 2})


def test_training_stops_on_request_and_resumes_identically(tmp_path):
    torch.set_num_threads(1)
    g = np.random.default_rng(1)
    y = g.integers(0, 2, 40)
    X = g.normal(size=(40, 20)).astype(np.float32) + (2 * y[:, None] - 1) * 0.5
    kw = dict(X_val=X[:10], y_val=y[:10], epochs=3, batch_size=16, lr=5e-3, progress=False)

    def run(out, **extra):
        torch.manual_seed(0)
        m = StreamingClassifier(length=20, patch=5, d_model=8, num_layers=1, num_heads=2,
                                mlp_dim=16)  # dropout on: the saved RNG state matters
        hist = train_streaming(m, X, y, checkpoint_dir=out / "ck",
                               metrics_path=out / "metrics.jsonl", **kw, **extra)
        return m, hist

    ref, ref_hist = run(tmp_path / "a")

    def stop(loop):
        if loop.step == 4:  # mid epoch 2 (3 batches an epoch)
            loop.request_stop()

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", on_step=stop)
    m, hist = run(tmp_path / "b", resume=True)
    strip = [{k: v for k, v in r.items() if k != "time_s"} for r in hist]
    assert strip == [{k: v for k, v in r.items() if k != "time_s"} for r in ref_hist]
    for k, v in ref.state_dict().items():  # the best epoch's weights, in both runs
        assert torch.equal(m.state_dict()[k], v), k
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
