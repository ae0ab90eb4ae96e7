"""EncoderBlock and LinearTransformerEncoder: pre-norm wiring, masks, per-layer parameters."""

from __future__ import annotations

import torch

import linattn
from linattn.feature_maps import FavorPlus, Hedgehog
from linattn.nn import EncoderBlock, LinearTransformerEncoder


def test_block_is_pre_norm_residual():
    torch.manual_seed(0)
    block = EncoderBlock(16, 2, mlp_dim=32, max_len=8).double().eval()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    h = x + block.attn(block.norm1(x))
    want = h + block.mlp(block.norm2(h))
    torch.testing.assert_close(block(x), want, rtol=0, atol=0)


def test_encoder_shapes_layers_and_mask_passthrough():
    torch.manual_seed(1)
    enc = LinearTransformerEncoder(3, 64, 4, mlp_dim=128, max_len=50, dropout=0.1).double()
    enc.eval()
    assert len(enc.layers) == 3
    # each layer owns its relative vectors
    assert len({id(layer.attn.rel) for layer in enc.layers}) == 3
    x = torch.randn(2, 50, 64, dtype=torch.float64)
    mask = torch.zeros(2, 50, dtype=torch.bool)
    mask[1, 30:] = True
    y = enc(x, key_padding_mask=mask)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[1, 30:] = 100.0
    y2 = enc(x2, key_padding_mask=mask)
    torch.testing.assert_close(y2[1, :30], y[1, :30], rtol=1e-10, atol=1e-10)


def test_dropout_only_in_training():
    torch.manual_seed(2)
    enc = LinearTransformerEncoder(1, 16, 2, dropout=0.5)
    x = torch.randn(1, 6, 16)
    enc.eval()
    torch.testing.assert_close(enc(x), enc(x))
    enc.train()
    assert not torch.equal(enc(x), enc(x))


def _fmap_params(enc):
    return [layer.attn.feature_map.proj.weight for layer in enc.layers]


def test_layers_do_not_share_a_learnable_feature_map():
    """A Hedgehog instance is copied into every layer: separate tensors, trained separately."""
    torch.manual_seed(3)
    template = Hedgehog(8)
    enc = LinearTransformerEncoder(2, 16, 2, feature_map=template)
    w0, w1 = _fmap_params(enc)
    assert w0.data_ptr() != w1.data_ptr()
    assert {"layers.0.attn.feature_map.proj.weight",
            "layers.1.attn.feature_map.proj.weight"} <= set(enc.state_dict())
    before = w1.detach().clone()
    enc(torch.randn(2, 5, 16)).square().sum().backward()
    torch.optim.SGD(enc.layers[0].attn.feature_map.parameters(), lr=1.0).step()
    assert not torch.equal(w0, before)  # layer 0's map trained ...
    torch.testing.assert_close(w1, before, rtol=0, atol=0)  # ... layer 1's did not move
    torch.testing.assert_close(template.proj.weight, before, rtol=0, atol=0)


def test_layers_get_their_own_random_features_and_save_them():
    torch.manual_seed(4)
    enc = LinearTransformerEncoder(2, 16, 2, feature_map=FavorPlus(8, 32)).eval()
    W0, W1 = (layer.attn.feature_map.W for layer in enc.layers)
    assert not torch.equal(W0, W1)
    state = enc.state_dict()
    torch.testing.assert_close(state["layers.1.attn.feature_map.W"], W1, rtol=0, atol=0)
    torch.manual_seed(5)  # another draw everywhere until the state is loaded
    other = LinearTransformerEncoder(2, 16, 2, feature_map=FavorPlus(8, 32)).eval()
    x = torch.randn(2, 5, 16)
    assert not torch.equal(other(x), enc(x))
    other.load_state_dict(state)
    torch.testing.assert_close(other(x), enc(x), rtol=0, atol=0)


def test_encoder_selects_flow_attention():
    torch.manual_seed(0)
    enc = LinearTransformerEncoder(2, 16, 2, attention="flow", feature_map="sigmoid")
    assert all(layer.attn.attention == "flow" for layer in enc.layers)
    x = torch.randn(3, 7, 16)
    # the blocks' attention is Flowformer's: recompute layer 0 by hand with the op
    layer = enc.layers[0]
    h = layer.norm1(x)
    q, k, v = layer.attn.project(h)
    o = linattn.flowformer_attention(q, k, v, feature_map=layer.attn.feature_map)
    expected = layer.mlp_residual(x + layer.attn.merge(o))
    torch.testing.assert_close(layer(x), expected)
    assert enc(x).shape == (3, 7, 16)
