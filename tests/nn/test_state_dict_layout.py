"""Saved models keep loading: the state_dict keys, shapes and parameter order of the nn modules.

The layouts below were written down from the modules as they were before the nn layer was
restructured (DecoderBlock then subclassed EncoderBlock and DecayedMultiheadAttention subclassed
MultiheadLinearAttention). LM checkpoints store ``model.state_dict()`` and the optimizer's
state, which follows ``model.parameters()`` order, so both must stay as they are."""

from __future__ import annotations

import torch
from torch import nn

from linattn.nn import EncoderBlock, LinearTransformerLM


def _lm_layout() -> dict[str, tuple[int, ...]]:
    """LinearTransformerLM(vocab_size=11, d_model=8, num_layers=2, num_heads=2)."""
    out = {"embed.weight": (11, 8)}
    for i in range(2):
        b = f"blocks.{i}."
        out.update({
            b + "norm1.weight": (8,), b + "norm1.bias": (8,), b + "attn.decay": (2,),
            b + "attn.q_proj.weight": (8, 8), b + "attn.k_proj.weight": (8, 8),
            b + "attn.v_proj.weight": (8, 8), b + "attn.out_proj.weight": (8, 8),
            b + "norm2.weight": (8,), b + "norm2.bias": (8,),
            b + "mlp.0.weight": (32, 8), b + "mlp.0.bias": (32,),
            b + "mlp.3.weight": (8, 32), b + "mlp.3.bias": (8,),
        })
    out.update({"norm.weight": (8,), "norm.bias": (8,), "head.weight": (11, 8)})
    return out


def _encoder_stack_layout() -> dict[str, tuple[int, ...]]:
    """Two EncoderBlock(8, 2, 16, head_dim=3, max_len=5) in a ModuleList (FordATransformer's)."""
    out = {}
    for i in range(2):
        b = f"{i}."
        out.update({
            b + "norm1.weight": (8,), b + "norm1.bias": (8,), b + "attn.rel": (2, 9, 3),
            b + "attn.q_proj.weight": (6, 8), b + "attn.k_proj.weight": (6, 8),
            b + "attn.v_proj.weight": (6, 8), b + "attn.out_proj.weight": (8, 6),
            b + "norm2.weight": (8,), b + "norm2.bias": (8,),
            b + "mlp.0.weight": (16, 8), b + "mlp.0.bias": (16,),
            b + "mlp.3.weight": (8, 16), b + "mlp.3.bias": (8,),
        })
    return out


def _lm() -> nn.Module:
    return LinearTransformerLM(vocab_size=11, d_model=8, num_layers=2, num_heads=2)


def _encoder_stack() -> nn.Module:
    return nn.ModuleList(
        EncoderBlock(8, 2, 16, head_dim=3, feature_map="elu", max_len=5, dropout=0.1)
        for _ in range(2)
    )


def _check_old_layout_loads(model: nn.Module, layout: dict[str, tuple[int, ...]]) -> None:
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == layout
    gen = torch.Generator().manual_seed(0)
    old = {k: torch.rand(shape, generator=gen) + 0.5 for k, shape in layout.items()}
    if "embed.weight" in old:  # the LM ties its output projection to the embedding
        old["head.weight"] = old["embed.weight"]
    model.load_state_dict(old, strict=True)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, old[k], rtol=0, atol=0)


def test_lm_loads_a_state_dict_with_the_old_keys():
    _check_old_layout_loads(_lm(), _lm_layout())


def test_encoder_block_stack_loads_a_state_dict_with_the_old_keys():
    _check_old_layout_loads(_encoder_stack(), _encoder_stack_layout())


def test_parameter_order_is_unchanged():
    """Optimizer state is saved by parameter position: the order must not move."""
    want = [k for k in _lm_layout() if not k.endswith(".decay") and k != "head.weight"]
    assert [n for n, _ in _lm().named_parameters()] == want
    assert [n for n, _ in _encoder_stack().named_parameters()] == list(_encoder_stack_layout())
