"""benchmarks/fla_models.py's pieces on tiny models: caches filled to a context, their bytes,
the profile's categories, the tables (the timed grid itself is the coordinator's run)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.23")


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("fla_models")


@pytest.fixture(scope="module")
def tiny(bench):
    from linattn.fla_models import MODELS

    config_cls, _, causal_cls = MODELS["gated_deltanet"]
    torch.manual_seed(0)
    fla = causal_cls(config_cls(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16,
                                vocab_size=1024)).eval()
    return {"gated_deltanet": fla, "llama": bench.build_llama(fla, torch.float32)}


def test_context_caches_have_the_context_s_size(bench, tiny):
    fla, llama = tiny["gated_deltanet"], tiny["llama"]
    small, large = (bench.context_cache(fla, c, torch.float32) for c in (16, 64))
    assert small.get_seq_length() == 16 and large.get_seq_length() == 64
    assert bench.cache_bytes(small) == bench.cache_bytes(large) > 0  # flat in the context
    kv16, kv64 = (bench.context_cache(llama, c, torch.float32) for c in (16, 64))
    assert kv64.get_seq_length() == 64
    assert bench.cache_bytes(kv64) == 4 * bench.cache_bytes(kv16)
    token = bench.step(fla, torch.tensor([[5]]), large)
    assert token.shape == (1, 1) and large.get_seq_length() == 65


def test_timing_and_profile_run(bench, tiny):
    ids = torch.randint(3, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    pre = bench.interleaved_prefill(tiny, ids, repeats=1)
    assert set(pre) == set(tiny) and all(t > 0 for t in pre.values())
    dec = bench.interleaved_decode(tiny, 16, 2, torch.float32)
    assert all(sec > 0 and size > 0 for sec, size in dec.values())
    shares = bench.profiled(tiny, ids, 16, 2, torch.float32, rounds=1)
    prefill, decode = shares["gated_deltanet"]
    for s in (prefill, decode):
        assert s["recurrence"] > 0 and s["convolution"] > 0 and s["gated norm"] > 0
        assert s["projections"] > 0 and s["softmax layers"] == 0
        assert abs(sum(s[p] for p in bench.shared.PARTS) - 1) < 1e-9
    assert shares["llama"][0]["softmax layers"] > 0 and shares["llama"][0]["recurrence"] == 0
    from linattn.fla_models._kernels import ops

    assert "delta" not in vars(ops.impl)  # the profile's wrappers are gone
