"""linattn.lm.generation: load_model (also the earlier checkpoint layout), generate_text."""

from __future__ import annotations

import pytest
import torch

from linattn.lm import LMConfig, generate_text, load_model
from linattn.nn import LinearTransformerLM
from linattn.train_loop import CheckpointError


def _model(**kw):
    torch.manual_seed(0)
    return LinearTransformerLM.from_config(LMConfig(256, 16, 1, 2, **kw)).eval()


def test_load_model_reads_both_checkpoint_layouts(tmp_path):
    model = _model(attention="hybrid", window=4)
    ids = torch.randint(0, 256, (1, 9))
    cfg = model.config.to_dict()
    torch.save({"meta": {"model_config": cfg}, "model": model.state_dict()}, tmp_path / "new.pt")
    torch.save({"model_config": cfg, "model": model.state_dict()}, tmp_path / "old.pt")
    for name in ("new.pt", "old.pt"):
        loaded, _ = load_model(tmp_path / name)
        assert not loaded.training and loaded.config == model.config
        with torch.no_grad():
            assert torch.equal(loaded(ids), model(ids))
    torch.save({"model_config": {**cfg, "nope": 1}, "model": {}}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="cannot load a model.*unknown keys"):
        load_model(tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="cannot load a model"):
        load_model(tmp_path / "missing")


def test_generate_text_is_seeded_and_decodes_utf8():
    model = _model()
    a = "".join(generate_text(model, "def ", 20, seed=1))
    assert a == "".join(generate_text(model, "def ", 20, seed=1))
    assert a != "".join(generate_text(model, "def ", 20, seed=2))
    greedy = model.generate(torch.tensor([list(b"def ")]), 20, temperature=0)[0, 4:]
    want = bytes(greedy.tolist()).decode("utf-8", errors="replace")
    assert "".join(generate_text(model, "def ", 20, temperature=0)) == want
    with pytest.raises(ValueError, match="^prompt: give at least one character"):
        generate_text(model, "", 5)


def test_non_finite_or_garbage_checkpoint_is_refused(tmp_path):
    model = _model()
    sd = model.state_dict()
    sd["blocks.0.mlp.0.weight"][2, 3] = float("nan")
    torch.save({"meta": {"model_config": model.config.to_dict()}, "model": sd},
               tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match=r"nan.pt: blocks.0.mlp.0.weight holds "
                                              r"non-finite values \(NaN or infinity\)"):
        load_model(tmp_path / "nan.pt")
    (tmp_path / "garbage.pt").write_bytes(b"garbage\x80\x03")
    with pytest.raises(CheckpointError, match=r"garbage.pt: cannot load a model \(not a torch "
                                              r"checkpoint") as err:
        load_model(tmp_path / "garbage.pt")
    assert "weights_only" not in str(err.value)  # not torch's advice to load it unsafely


@pytest.mark.parametrize("kw, match", [
    ({"temperature": float("nan")}, "^temperature: expected a finite number >= 0, got nan"),
    ({"temperature": -1.0}, "^temperature: expected a finite number >= 0"),
    ({"top_k": 0}, "^top_k: expected a positive integer"),
    ({"max_new_tokens": -1}, "^max_new_tokens: expected a non-negative integer"),
    ({"seed": 1.5}, "^seed: expected an integer"),
])
def test_generate_text_checks_its_options_at_once(kw, match):
    with pytest.raises(ValueError, match=match):
        generate_text(_model(), "def ", **{"max_new_tokens": 3, **kw})


def test_a_cosformer_past_its_horizon_is_refused_before_the_first_piece():
    """The stream failed after printing about 1 KB; now generate_text raises at once, naming
    the option (the prompt's tokens and the new ones but the last are read)."""
    model = _model(attention="cosformer")
    with pytest.raises(ValueError, match=r"^max_new_tokens: cosformer's weights hold for 1024 "
                                         r"positions, 1025 asked for$"):
        generate_text(model, "def ", 1022)
    with pytest.raises(ValueError, match=r"^prompt: cosformer's weights hold for 1024 "):
        generate_text(model, "x" * 1025, 1)
    assert len(list(generate_text(model, "def ", 1021))) > 0  # 1024 positions: fits


def test_a_prompt_that_is_not_utf8_is_named():
    """A command-line argument with a byte that is not UTF-8 reaches Python as a lone
    surrogate: its encoding error named no option."""
    with pytest.raises(ValueError, match=r"^prompt: not UTF-8 text \(character 2 is a lone "
                                         r"surrogate '\\udcff'"):
        generate_text(_model(), "ab\udcffc", 3)


def test_a_checkpoint_missing_a_tensor_names_it(tmp_path):
    model = _model()
    weights = model.state_dict()
    weights.pop("blocks.0.attn.k_proj.weight")
    torch.save({"model_config": model.config.to_dict(), "model": weights}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"m.pt: cannot load a model \(missing tensor "
                                              r"'blocks.0.attn.k_proj.weight'\)$"):
        load_model(tmp_path / "m.pt")
    weights = model.state_dict()
    weights["embed.weight"] = weights["embed.weight"][:10]
    torch.save({"model_config": model.config.to_dict(), "model": weights}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"'embed.weight' has shape \(10, 16\) where the "
                                              r"model has \(256, 16\)"):
        load_model(tmp_path / "m.pt")
