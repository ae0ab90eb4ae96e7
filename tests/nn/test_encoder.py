"""EncoderBlock and LinearTransformerEncoder: pre-norm wiring, masks, parameter sharing."""

from __future__ import annotations

import torch

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
