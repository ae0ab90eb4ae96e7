"""benchmarks/lm_step.py on a tiny model: it times the trainer's own step for every kind in
interleaved rounds, and records the backends the attention ops took."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"d_model": 16, "num_layers": 1, "num_heads": 2}


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("lm_step")


def corpus() -> tuple[bytes, bytes, dict]:
    g = torch.Generator().manual_seed(0)
    text = bytes(torch.randint(32, 127, (4000,), generator=g).tolist())
    return text[:3000], text[3000:], {"files": 0}


def test_a_step_is_the_trainers_optimiser_step(bench):
    t = bench.trainer("gla", 16, 2, corpus(), TINY)
    before = [p.detach().clone() for p in t.model.parameters()]
    seconds = bench.step(t)
    assert seconds > 0 and t.loop.step == 1  # the next step draws the next batch
    # AdamW moved every parameter (all receive gradients in this model)
    assert all(not torch.equal(a, p) for a, p in zip(before, t.model.parameters(), strict=True))
    assert t.model.config.attention == "gla" and t.model.config.d_model == 16


def test_time_shape_reports_every_kind_and_its_backends(bench):
    kinds = ["linear", "gated_delta", "gla"]
    cell = bench.time_shape(kinds, 16, 2, rounds=3, warmup=1, corpus=corpus(), model=TINY)
    assert list(cell) == kinds
    for k, r in cell.items():
        assert len(r["seconds"]) == 3 and r["min_s"] <= r["median_s"]
        assert r["parameters"] == bench.trainer(k, 16, 2, corpus(), TINY).model.num_parameters()
    assert cell["linear"]["ratio_to_linear"] == 1.0
    ops = {k: {c[0] for c in r["backends"]} for k, r in cell.items()}
    # the linear LM's decayed attention has one (torch) form; the gated kinds go through the
    # dispatcher with gradients
    assert ops == {"linear": set(), "gated_delta": {"delta_rule"},
                   "gla": {"gated_linear_attention"}}
    assert all(c[1] == "prefill fwd+bwd" for c in cell["gla"]["backends"])


@pytest.mark.parametrize("argv", [["--shapes", "256"], ["--kinds", "nope"],
                                  ["--memory", "0"], ["--rounds", "0"]])
def test_bad_options_exit_2(bench, argv):
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    assert err.value.code == 2
