"""linattn.lm.data: the stdlib corpus, byte ids, training and validation windows."""

from __future__ import annotations

import pytest
import torch

from linattn.lm.data import byte_ids, stdlib_corpus, training_windows, validation_windows


def test_corpus_is_the_stdlib_split_by_file():
    tr, va, info = stdlib_corpus(300_000)
    assert 0 < len(va) < len(tr) and len(tr) + len(va) <= 300_000
    assert b"def " in tr and info["files"] > 1
    assert (info["train_bytes"], info["val_bytes"]) == (len(tr), len(va))


def test_corpus_skips_tests_and_needs_source(tmp_path):
    for i in range(10):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("skipped\n")
    tr, va, info = stdlib_corpus(root=str(tmp_path))
    assert info["files"] == 10 and va == b"x = 9\n\n" and b"skipped" not in tr
    with pytest.raises(ValueError, match="no Python source"):
        stdlib_corpus(root=str(tmp_path / "tests" / "none"))


def test_training_windows_are_seeded_by_seed_and_step():
    ids = byte_ids(bytes(range(200)))
    assert ids.dtype == torch.int64 and ids[5] == 5
    a = training_windows(ids, 16, 3, seed=0, step=4)
    assert a.shape == (3, 17) and (a.diff(dim=1) == 1).all()  # contiguous windows
    assert torch.equal(a, training_windows(ids, 16, 3, seed=0, step=4))
    assert not torch.equal(a, training_windows(ids, 16, 3, seed=0, step=5))
    with pytest.raises(ValueError, match="context"):
        training_windows(ids, 199, 1, 0, 0)


def test_validation_windows_cover_the_first_tokens_without_overlap():
    ids = torch.arange(100)
    batches = list(validation_windows(ids, 10, 45, batch_size=3))
    assert [len(b) for b in batches] == [3, 1]  # 45 targets: 4 windows of 10
    w = torch.cat(batches)
    assert torch.equal(w[:, 0], torch.arange(0, 40, 10)) and w.shape[1] == 11


def test_a_budget_without_a_validation_file_names_corpus_bytes():
    """Said 'no Python source found' of a stdlib full of it."""
    with pytest.raises(ValueError, match=r"^corpus_bytes: 20000 bytes hold \d+ file\(s\), too "
                                         r"few for a validation file"):
        stdlib_corpus(20_000)
