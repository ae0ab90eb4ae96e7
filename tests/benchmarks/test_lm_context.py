"""The protocol of benchmarks/lm_context.py on tiny random models: the same bytes scored at every
context, the pieced prefill equal to one forward over the window, contexts clamped to the text."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linattn.nn import LinearTransformerLM

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("lm_context")


KINDS = [("linear", None), ("hybrid", 3), ("softmax", None), ("gated_delta", None)]


def tiny(attention: str, window: int | None) -> LinearTransformerLM:
    torch.manual_seed(0)
    return LinearTransformerLM(256, 16, 2, 2, attention=attention, window=window,
                               chunk_size=4).eval()


def text(n: int = 200) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(1))


def direct_nll(model, ids: torch.Tensor, a: int, s: int, e: int) -> torch.Tensor:
    """One forward over text[a : e − 1]; the NLL of bytes s … e − 1."""
    with torch.no_grad():
        logits = model(ids[None, a:e - 1])[0, s - a - 1:]
    return F.cross_entropy(logits.double(), ids[s:e], reduction="none")


def test_blocks_spread_and_disjoint(bench):
    blocks = bench.scored_blocks(1000, 96, 4, lo=300)
    assert [e - s for s, e in blocks] == [24] * 4
    assert blocks[0][0] == 300 and blocks[-1][1] == 1000
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(blocks, blocks[1:], strict=False))
    assert bench.scored_blocks(100, 90, 3, lo=500)[0][0] == 10  # lo moved down to fit
    assert bench.scored_blocks(50, 10, 1, lo=0) == [(40, 50)]
    with pytest.raises(ValueError):
        bench.scored_blocks(50, 50, 2, lo=0)  # byte 0 cannot be scored


@pytest.mark.parametrize("context,frac", [(1, 4), (7, 4), (64, 4), (1000, 2)])
def test_plan_covers_each_scored_byte_once(bench, context, frac):
    blocks = [(150, 160), (180, 200)]
    wins = bench.plan(blocks, context, frac)
    scored = sorted(p for _, s, e in wins for p in range(s, e))
    assert scored == [*range(150, 160), *range(180, 200)]
    for a, s, e in wins:
        assert a == max(0, s - context)
        assert e - s <= max(1, context // frac)


@pytest.mark.parametrize("attention,window", KINDS)
def test_same_bytes_scored_at_every_context(bench, attention, window):
    model, ids = tiny(attention, window), text()
    blocks = bench.scored_blocks(len(ids), 24, 3, lo=40)
    ref = None
    for c in (1, 8, 40, 500):
        r = bench.score(model, ids, blocks, c, frac=4, max_tokens=64, piece=16)
        assert torch.isfinite(r["nll"]).all()
        if ref is None:
            ref = r["positions"]
        assert torch.equal(r["positions"], ref)
        seg = max(1, min(8, c // 4))  # byte p: between min(p, c) and min(p, c + S − 1)
        p = r["positions"]
        assert (r["preceding"] >= p.clamp(max=c)).all()
        assert (r["preceding"] <= p.clamp(max=c + seg - 1)).all()
        assert math.isclose(r["bpb"], float(r["nll"].mean()) / math.log(2))


@pytest.mark.parametrize("attention,window", KINDS)
def test_pieces_equal_one_forward(bench, attention, window):
    """Small pieces (for softmax: a KV cache) give the NLL of one forward over each window,
    and batching windows changes nothing."""
    model, ids = tiny(attention, window), text()
    blocks = [(120, 136), (170, 186)]
    r = bench.score(model, ids, blocks, 37, frac=4, max_tokens=100, piece=5)
    expect = torch.cat([direct_nll(model, ids, a, s, e) for a, s, e in bench.plan(blocks, 37, 4)])
    torch.testing.assert_close(r["nll"], expect, rtol=0, atol=1e-5)
    assert torch.equal(r["preceding"], r["positions"] - torch.tensor(
        [a for a, s, e in bench.plan(blocks, 37, 4) for _ in range(s, e)]))


@pytest.mark.parametrize("attention,window", KINDS)
def test_context_longer_than_text_is_clamped(bench, attention, window):
    """A context past the start of the text reads all of it: every byte is predicted from all
    the bytes before it, as in one forward over the whole text."""
    model, ids = tiny(attention, window), text(60)
    blocks = [(50, 60)]
    r = bench.score(model, ids, blocks, 10_000, frac=1, piece=7)
    assert torch.equal(r["preceding"], r["positions"])
    torch.testing.assert_close(r["nll"], direct_nll(model, ids, 0, 50, 60), rtol=0, atol=1e-5)


def test_tables_format(bench):
    res = [{"info": {"attention": "hybrid", "window": 64, "steps": 3, "tokens_seen": 2e6},
            "contexts": {"256": {"bpb": 2.5, "seconds": 1.25}}}]
    out = bench.tables(res, [256])
    assert "| hybrid (w=64) | 3 | 2.0 M | 2.500 |" in out and "| 1.2 |" in out


# -------------------- benchmarks/lm_step.py
# benchmarks/lm_step.py on a tiny model: it times the trainer's own step for every kind in
# interleaved rounds, and records the backends the attention ops took.

TINY = {"d_model": 16, "num_layers": 1, "num_heads": 2}


@pytest.fixture(scope="module")
def step_bench(load_benchmark):
    return load_benchmark("lm_step")


def corpus() -> tuple[bytes, bytes, dict]:
    g = torch.Generator().manual_seed(0)
    text = bytes(torch.randint(32, 127, (4000,), generator=g).tolist())
    return text[:3000], text[3000:], {"files": 0}


def test_a_step_is_the_trainers_optimiser_step(step_bench):
    t = step_bench.trainer("gla", 16, 2, corpus(), TINY)
    before = [p.detach().clone() for p in t.model.parameters()]
    seconds = step_bench.step(t)
    assert seconds > 0 and t.loop.step == 1  # the next step draws the next batch
    # AdamW moved every parameter (all receive gradients in this model)
    assert all(not torch.equal(a, p) for a, p in zip(before, t.model.parameters(), strict=True))
    assert t.model.config.attention == "gla" and t.model.config.d_model == 16


def test_time_shape_reports_every_kind_and_its_backends(step_bench):
    kinds = ["linear", "gated_delta", "gla"]
    cell = step_bench.time_shape(kinds, 16, 2, rounds=3, warmup=1, corpus=corpus(), model=TINY)
    assert list(cell) == kinds
    for k, r in cell.items():
        assert len(r["seconds"]) == 3 and r["min_s"] <= r["median_s"]
        model = step_bench.trainer(k, 16, 2, corpus(), TINY).model
        assert r["parameters"] == model.num_parameters()
    assert cell["linear"]["ratio_to_linear"] == 1.0
    ops = {k: {c[0] for c in r["backends"]} for k, r in cell.items()}
    # the linear LM's decayed attention has one (torch) form; the gated kinds go through the
    # dispatcher with gradients
    assert ops == {"linear": set(), "gated_delta": {"delta_rule"},
                   "gla": {"gated_linear_attention"}}
    assert all(c[1] == "prefill fwd+bwd" for c in cell["gla"]["backends"])


@pytest.mark.parametrize("argv", [["--shapes", "256"], ["--kinds", "nope"],
                                  ["--memory", "0"], ["--rounds", "0"]])
def test_bad_options_exit_2(step_bench, argv):
    with pytest.raises(SystemExit) as err:
        step_bench.main(argv)
    assert err.value.code == 2
