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


@pytest.fixture
def decode_three_ways():
    """``run(mixer, x, split=7)`` for a mixer (``mixer(x, state, position) -> (out, state)``)
    and x (B, T, E), without gradients: the whole sequence at once, one token at a time, and
    two pieces cut at ``split``. Returns a dict: ``full``, ``want`` (its output and state),
    ``steps``, ``state`` (token by token, outputs concatenated) and ``pieces``, ``st`` (the two
    pieces)."""

    def run(m, x, split=7):
        with torch.no_grad():
            full, want = m(x)
            state, steps = None, []
            for t in range(x.shape[1]):
                o, state = m(x[:, t:t + 1], state, t)
                steps.append(o)
            a, st = m(x[:, :split])
            b, st = m(x[:, split:], st, split)
        return {"full": full, "want": want, "steps": torch.cat(steps, 1), "state": state,
                "pieces": torch.cat([a, b], 1), "st": st}
    return run
