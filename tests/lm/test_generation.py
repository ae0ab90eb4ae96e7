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
