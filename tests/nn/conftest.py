"""Fixtures shared by the mixer tests of tests/nn (helpers are fixtures, as in
tests/conftest.py, so that they work under any pytest import mode)."""

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def generates_and_trains():
    """``check(model, prompt, ids)``: greedy generation from ``prompt`` (B, 4) agrees with the
    arg-max of one parallel forward over what it generated, and a next-token loss on ``ids``
    (B, T) gives every parameter a finite gradient. Returns the model, its gradients kept."""

    def check(m, prompt, ids):
        out = m.generate(prompt, 6, temperature=0)
        with torch.no_grad():
            torch.testing.assert_close(m(out[:, :-1])[:, 3:].argmax(-1), out[:, 4:])
        m.train()
        loss = F.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
        return m
    return check
