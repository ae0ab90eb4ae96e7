"""linattn.onnx: exports to the opset-27 LinearAttention / CausalConvWithState ops, run in
onnxruntime against PyTorch.

Optional: runs where onnx, onnxruntime and onnxscript are installed (the ``onnx`` extra;
``.ci/extras.sh onnx`` installs it for CI), else skips. Per op (each update rule, the convolution)
and per LM kind: one export each, then ORT against PyTorch for a prefill, 64 decoding steps
carrying the state, several sequence lengths (dynamic T, 1 to 4,096) and a batch; the FordA
model's test-set predictions (held-out synthetic series where the data set is absent).
Tolerances are float32 machine epsilons relative to the largest value compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", minversion="1.23")
ort = pytest.importorskip("onnxruntime", minversion="1.32")
pytest.importorskip("onnxscript")

import linattn.onnx as lo  # noqa: E402
from linattn.nn import LinearTransformerLM  # noqa: E402
from linattn.nn.mixers import MIXERS  # noqa: E402
from linattn.onnx.exporter import export, input_names, output_names  # noqa: E402
from linattn.onnx.lm import pack_state, unpack_state  # noqa: E402
from linattn.onnx.runtime import LMSession, session  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
EPS = float(torch.finfo(torch.float32).eps)
#: ORT against PyTorch, relative to the largest magnitude: 512 float32 epsilons (6.1e-5; the
#: issue's target is 1e-4). Observed: below 3e-6 for every kind.
TOL = 512 * EPS


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def op_types(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


# -- one op per graph ------------------------------------------------------------------------

class _Recurrence(torch.nn.Module):
    def __init__(self, rule: str, heads: int, per_key: bool = False) -> None:
        super().__init__()
        self.rule, self.heads, self.per_key = rule, heads, per_key

    def forward(self, q, k, v, s, g, b):
        decay = g if self.rule in ("gated", "gated_delta") else None
        beta = b if self.rule in ("delta", "gated_delta") else None
        return torch.ops.linattn.onnx_linear_attention(q, k, v, s, decay, beta, self.rule,
                                                       self.heads, 0.25)


def _op_inputs(B: int, T: int, H: int, per_key: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    d = 16
    q = torch.randn(B, T, H * d, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, d, generator=gen), dim=-1)
    v = torch.randn(B, T, H * d, generator=gen)
    s = torch.randn(B, H, d, d, generator=gen)
    g = -torch.rand(B, T, H * d if per_key else H, generator=gen) * 0.2
    b = torch.rand(B, T, H, generator=gen)
    return q, k.reshape(B, T, H * d), v, s, g, b


@pytest.mark.parametrize("rule,per_key", [("linear", False), ("gated", False), ("gated", True),
                                          ("delta", False), ("gated_delta", False)])
def test_linear_attention_op(tmp_path, rule, per_key):
    """Each update rule is one LinearAttention node; ORT equals linattn's op at several T and
    batches from one export, the state in and out."""
    H = 2
    mod = _Recurrence(rule, H, per_key)
    args = _op_inputs(2, 8, H, per_key)
    B_, T_ = torch.export.Dim("B", max=64), torch.export.Dim("T", max=4096)
    shapes = tuple({0: B_, 1: T_} if i != 3 else {0: B_} for i in range(6))
    path = export(mod, args, tmp_path / "op.onnx", dynamic_shapes=shapes)
    assert op_types(path) == {"LinearAttention"}
    sess = session(path, 1)
    names = [i.name for i in sess.get_inputs()]
    for B, T in [(1, 1), (2, 8), (3, 200)]:
        args = _op_inputs(B, T, H, per_key, seed=T)
        feed = {n: a.numpy() for n, a in zip(names, args, strict=True)}
        o, S = sess.run(None, feed)
        ro, rS = mod(*args)
        assert rel_err(o, ro) < TOL and rel_err(S, rS) < TOL


def test_causal_conv_op(tmp_path):
    class Conv(torch.nn.Module):
        def forward(self, x, w, s):
            return torch.ops.linattn.onnx_causal_conv(x, w, s, "silu")

    gen = torch.Generator().manual_seed(0)
    x, w, s = (torch.randn(2, 6, 9, generator=gen), torch.randn(6, 1, 4, generator=gen),
               torch.randn(2, 6, 3, generator=gen))
    B_, T_ = torch.export.Dim("B", max=64), torch.export.Dim("T", max=4096)
    path = export(Conv(), (x, w, s), tmp_path / "conv.onnx",
                  dynamic_shapes=({0: B_, 2: T_}, None, {0: B_}))
    assert op_types(path) == {"CausalConvWithState"}
    sess = session(path, 1)
    x = torch.randn(3, 6, 40, generator=gen)
    s = torch.randn(3, 6, 3, generator=gen)
    y, tail = sess.run(None, {"input.0": x.numpy(), "input.1": w.numpy(), "input.2": s.numpy()})
    ry, rtail = Conv()(x, w, s)
    assert rel_err(y, ry) < TOL and rel_err(tail, rtail) == 0.0


# -- the language model ----------------------------------------------------------------------

#: name → (LinearTransformerLM keywords, the update rule its LinearAttention nodes carry)
#: one layer where a second would only repeat it (an export's time grows with the graph);
#: two for a single-state kind and for the hybrid's three states per layer
KINDS = {
    "linear": (dict(attention="linear", short_conv=3, num_layers=1), "gated"),
    "linear_undecayed": (dict(attention="linear", decay=[1.0, 1.0], num_layers=1), "linear"),
    "gated_delta": (dict(attention="gated_delta", num_layers=2), "gated_delta"),
    "deltanet": (dict(attention="deltanet", short_conv=4, num_layers=1), "delta"),
    "gla": (dict(attention="gla", num_layers=1), "gated"),
    "cosformer": (dict(attention="cosformer", num_layers=1), "linear"),
    "hybrid": (dict(attention="hybrid", window=8, short_conv=2, num_layers=2), "linear"),
    "flowformer": (dict(attention="flowformer", num_layers=1), "linear"),
}
VOCAB = 64


@pytest.fixture(scope="module", params=list(KINDS))
def exported(request, tmp_path_factory):
    kwargs, rule = KINDS[request.param]
    torch.manual_seed(0)
    model = LinearTransformerLM(VOCAB, 32, num_heads=2, mlp_dim=64, **kwargs).eval()
    path = export(model, torch.randint(0, VOCAB, (2, 8)),
                  tmp_path_factory.mktemp("lm") / f"{request.param}.onnx")
    return model, path, rule


def test_lm_graph(exported):
    """LinearAttention nodes (one per layer, the kind's rule), no Scan or Loop; the token
    shift a CausalConvWithState node; the states named inputs and outputs."""
    model, path, rule = exported
    proto = onnx.load(str(path))
    nodes = [n for n in proto.graph.node]
    la = [n for n in nodes if n.op_type == "LinearAttention"]
    assert len(la) == len(model.blocks)
    assert {onnx.helper.get_attribute_value(a) for n in la for a in n.attribute
            if a.name == "update_rule"} == {rule.encode()}
    assert not {"Scan", "Loop"} & {n.op_type for n in nodes}
    assert sum(n.op_type == "CausalConvWithState" for n in nodes) == (model.shift is not None)
    assert [i.name for i in proto.graph.input] == input_names(model)
    assert [o.name for o in proto.graph.output] == output_names(model)
    assert next(o.version for o in proto.opset_import if o.domain == "") == 27


@pytest.mark.parametrize("B,T", [(1, 1), (2, 7), (3, 64), (1, 300), (1, 4096)])
def test_lm_prefill_any_length(exported, B, T):
    """One export serves T = 1 … 4,096 and any batch: logits and states equal PyTorch's
    (cosFormer: up to its horizon, 1,024 positions)."""
    model, path, _ = exported
    most = MIXERS[model.config.attention].max_positions
    if most is not None and T > most:
        pytest.skip(f"{model.config.attention} holds {most} positions")
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(T))
    lm = LMSession(path, threads=1)
    logits = lm(ids.numpy())
    with torch.no_grad():
        ref, state = model(ids, return_state=True)
    assert rel_err(logits, ref) < TOL
    for got, want in zip(lm.states, pack_state(model, state, B), strict=True):
        assert rel_err(got, want) < TOL


def test_lm_decoding_carries_state(exported):
    """A prefill, then 64 tokens one at a time with the state carried through ORT: every
    step's logits and the final state equal PyTorch's recurrent steps."""
    model, path, _ = exported
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=gen)
    steps = torch.randint(0, VOCAB, (2, 64), generator=gen)
    lm = LMSession(path, threads=1)
    with torch.no_grad():
        ref, state = model(prompt, return_state=True)
        assert rel_err(lm(prompt.numpy()), ref) < TOL
        worst = 0.0
        for t in range(steps.shape[1]):
            ref, state = model(steps[:, t:t + 1], state, return_state=True)
            worst = max(worst, rel_err(lm(steps[:, t:t + 1].numpy()), ref))
    assert worst < TOL
    back = unpack_state(model, [torch.from_numpy(s) for s in lm.states], state.position)
    for got, want in zip(pack_state(model, back, 2), pack_state(model, state, 2),
                         strict=True):
        assert rel_err(got, want) < TOL


def test_lm_session_resets(exported):
    model, path, _ = exported
    lm = LMSession(path, threads=1)
    ids = np.zeros((1, 3), np.int64)
    first = lm(ids)
    lm.reset()
    np.testing.assert_array_equal(lm(ids), first)
    with pytest.raises(ValueError, match="ids"):
        lm(np.zeros(3, np.int64))


# -- the FordA model -------------------------------------------------------------------------

def _forda_data():
    folder = ROOT.parent / "shared" / "data" / "FordA"
    test = folder / "FordA_TEST.tsv.gz"
    if test.exists():
        from linattn.datasets import read_ucr_tsv

        return read_ucr_tsv(test)
    return None


def test_forda_predictions(tmp_path):
    """The shipped FordA model: ORT's predictions on the test set equal PyTorch's (held-out
    synthetic series where the data set is absent). Its logits go through logarithms of
    near-empty spectral bins, so even PyTorch in float32 differs from float64 by ~3e-4 on the
    test set: the bound is eight times that difference measured on 128 series (1.2e-4 there,
    a subset's maximum being smaller than the whole set's); ORT's was 4.3e-4."""
    pytest.importorskip("sklearn")
    pytest.importorskip("safetensors")
    from linattn.tsc.estimator import LinearAttentionClassifier

    est = LinearAttentionClassifier.load(ROOT / "models" / "forda")
    model = est.model_.eval()
    data = _forda_data()
    if data is None:
        X = np.random.default_rng(0).standard_normal((256, 500)).astype(np.float32)
        y = None
    else:
        X, y = data
    path = export(model, torch.from_numpy(X[:2]), tmp_path / "forda.onnx")
    assert "DFT" not in op_types(path)  # the spectra as exact tables (linattn.onnx.dft)
    sess = session(path, 1)
    logits = np.concatenate([sess.run(None, {"input": X[i:i + 512]})[0]
                             for i in range(0, len(X), 512)])
    with torch.no_grad():
        ref = est._logits(X).numpy()
        ref64 = model.double()(torch.from_numpy(X[:128]).double()).numpy()
    model.float()
    np.testing.assert_array_equal(est.classes_[logits.argmax(-1)], est.predict(X))
    conditioning = rel_err(ref[:128], ref64)
    assert rel_err(logits, ref) <= 8 * max(conditioning, 64 * EPS)
    if y is not None:
        assert (est.classes_[logits.argmax(-1)] == y).mean() == pytest.approx(0.9788, abs=1e-4)


# -- users' mistakes -------------------------------------------------------------------------

def test_errors_name_the_argument(tmp_path):
    model = LinearTransformerLM(VOCAB, 16, 1, 2, attention="softmax")
    with pytest.raises(ValueError, match="^attention: 'softmax'"):
        export(model, torch.zeros(1, 4, dtype=torch.long), tmp_path / "m.onnx")
    model = LinearTransformerLM(VOCAB, 16, 1, 2)
    with pytest.raises(ValueError, match="^example"):
        export(model, torch.zeros(1, 4), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="^max_length"):
        export(model, torch.zeros(1, 4, dtype=torch.long), tmp_path / "m.onnx", max_length=1)
    with pytest.raises(TypeError, match="^model"):
        export("model", torch.zeros(1, 4), tmp_path / "m.onnx")
    with pytest.raises(TypeError, match="^dynamic"):
        export(model, torch.zeros(1, 4, dtype=torch.long), tmp_path / "m.onnx", dynamic=1)
    with pytest.raises(ValueError, match="^threads"):
        session(tmp_path / "m.onnx", threads=0)
    assert lo.export is export and lo.LMSession is LMSession
