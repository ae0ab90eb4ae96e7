"""The MQAR generator (linattn.recall.data) and harness (.harness, .options, .table) on tiny
problems."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from linattn.recall import (
    IGNORE_INDEX,
    RecallConfig,
    accuracy,
    build_model,
    gap_distribution,
    mqar,
    query_logits,
    state_bytes,
)
from linattn.recall.harness import _batches, run_cell, splits, train_one
from linattn.recall.options import MIXER_PRESETS, model_kwargs
from linattn.recall.table import cell_name, format_table, run_grid

TINY = {"d_model": 16, "num_heads": 2, "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32,
        "train_examples": 64, "val_examples": 16, "test_examples": 16, "epochs": 1,
        "batch_size": 32, "lr": 1e-3, "train_mix": ()}


def tol(dtype: torch.dtype) -> float:
    return 100 * torch.finfo(dtype).eps


@pytest.mark.parametrize("mixer", list(MIXER_PRESETS))
def test_query_logits_are_the_models_logits(mixer):
    """The harness's shortcut (the head at query positions only) equals the model's forward."""
    cfg = RecallConfig(mixer=mixer, **TINY)
    model = build_model(cfg).eval()
    x, y = mqar(3, 16, 2, vocab_size=32, seed=0)
    with torch.no_grad():
        full = model(x)[y != -100]
        part = query_logits(model, x, y)
    assert part.shape == (6, 32)
    torch.testing.assert_close(part, full, rtol=tol(part.dtype), atol=tol(part.dtype))


def test_presets_reach_the_model():
    cfg = RecallConfig(mixer="based", **TINY)
    assert model_kwargs(cfg)["attention"] == "hybrid"
    assert model_kwargs(cfg)["feature_map"] == "taylor"
    assert model_kwargs(cfg)["num_heads"] == 1  # Based's 16-dimensional heads: d_model / 16
    assert model_kwargs(RecallConfig(mixer="based", **{**TINY, "d_model": 64}))["num_heads"] == 4
    plain = build_model(RecallConfig(mixer="linear_plain", **TINY))
    assert bool((plain.blocks[0].attn.decay == 1).all())
    fm = RecallConfig(mixer="linear", feature_map="relu", **TINY)
    assert model_kwargs(fm)["feature_map"] == "relu"


def test_decay_reaches_the_model():
    cfg = RecallConfig(mixer="softmax", decay=(0.05, 0.998), **TINY)
    assert build_model(cfg).blocks[1].attn.decay.tolist() == pytest.approx([0.05, 0.998])
    assert cfg.to_dict()["decay"] == [0.05, 0.998]


def test_accuracy_counts_query_positions():
    """A model that predicts every query right scores 1; the score is over queries only."""
    cfg = RecallConfig(mixer="softmax", **TINY)
    model = build_model(cfg)
    x, y = mqar(8, 16, 2, vocab_size=32, seed=1)
    acc = accuracy(model, x, y, batch_size=3)
    assert 0.0 <= acc <= 1.0

    class Oracle(torch.nn.Module):  # stands in for the head: logits peaked at the targets
        def forward(self, h):
            return torch.nn.functional.one_hot(want, 32).float()

    want = y[y != -100]
    model.head = Oracle()
    assert accuracy(model, x, y, batch_size=8) == 1.0


@pytest.mark.parametrize("mixer, expect", [
    ("softmax", lambda c: 2 * c.num_layers * c.seq_len * c.d_model * 4),  # K and V, float32
    ("gated_delta", lambda c: c.num_layers * c.num_heads * (c.d_model // c.num_heads) ** 2 * 4),
])
@pytest.mark.parametrize("short_conv", [0, 4])
def test_state_bytes_from_the_states_tensors(mixer, expect, short_conv):
    cfg = RecallConfig(mixer=mixer, short_conv=short_conv, **TINY)
    model = build_model(cfg)
    x, _ = mqar(1, 16, 2, vocab_size=32)
    shift = max(short_conv - 1, 0) * cfg.d_model * 4  # the token shift's last k − 1 embeddings
    assert state_bytes(model, x) == expect(cfg) + shift


def test_training_learns_and_is_recorded():
    """A short run lowers the query loss; the record holds what the table reports."""
    cfg = RecallConfig(mixer="softmax", **{**TINY, "epochs": 3, "stop_at": 1.0})
    data = splits(cfg)
    model, rec = train_one(cfg, 3e-3, data)
    assert rec["epochs"] == 3 and rec["steps"] == 3 * 2 and not rec["diverged"]
    assert rec["train_time_s"] > 0
    losses = [h["loss"] for h in rec["history"]]
    assert losses[-1] < losses[0]


def test_divergence_is_recorded_not_raised(monkeypatch):
    """A non-finite loss ends that rate's run with accuracy 0; the sweep goes on."""
    import linattn.recall.harness as h

    def broken(cfg):
        model = build_model(cfg)
        with torch.no_grad():
            model.norm.weight.fill_(float("nan"))
        return model

    monkeypatch.setattr(h, "build_model", broken)
    cfg = RecallConfig(mixer="linear", **TINY)
    _, rec = train_one(cfg, 1e-3, splits(cfg))
    assert rec["diverged"] and rec["val_acc"] == 0.0 and rec["steps"] == 0


def test_sweep_picks_the_best_validation_rate(monkeypatch):
    import linattn.recall.harness as h

    scores = {1e-3: 0.2, 5e-3: 0.7, 1e-2: 0.4}

    def fake(cfg, lr, data, log=None):
        return build_model(cfg), {"lr": lr, "val_acc": scores[lr], "train_time_s": 1.0,
                                  "epochs": 1, "steps": 1, "diverged": False, "history": []}

    monkeypatch.setattr(h, "train_one", fake)
    cfg = RecallConfig(mixer="gated_delta", **{**TINY, "lr": None, "lrs": (1e-3, 5e-3, 1e-2)})
    r = run_cell(cfg)
    assert r["lr"] == 5e-3 and r["val_acc"] == 0.7 and r["sweep_time_s"] == 3.0
    assert 0.0 <= r["test_acc"] <= 1.0 and r["state_bytes"] > 0
    json.dumps(r)  # JSON-able


def test_splits_are_disjoint_seeds():
    cfg = RecallConfig(mixer="softmax", **TINY)
    d = splits(cfg)
    assert not torch.equal(d["train"][0][:16], d["val"][0])
    assert not torch.equal(d["val"][0], d["test"][0])


def test_grid_saves_and_reuses_cells(tmp_path, monkeypatch):
    import linattn.recall.harness as h

    calls = []

    def fake(cfg, log=None):
        calls.append(cell_name(cfg))
        return {"config": cfg.to_dict(), "test_acc": 0.5, "state_bytes": 1024, "lr": 1e-3,
                "train_time_s": 2.0, "sweep_time_s": 8.0, "cpu": "x"}

    monkeypatch.setattr(h, "run_cell", fake)
    base = RecallConfig(mixer="softmax", **TINY)
    res = run_grid(base, ["softmax", "linear:relu"], [16], tmp_path)
    assert calls == ["softmax-d16-T16-P2", "linear-relu-d16-T16-P2"]
    assert (tmp_path / "linear-relu-d16-T16-P2.json").exists()
    run_grid(base, ["softmax"], [16], tmp_path)
    assert len(calls) == 2  # reused
    run_grid(dataclasses.replace(base, epochs=2), ["softmax"], [16], tmp_path)
    assert len(calls) == 3  # another configuration: run again
    table = format_table(res)
    assert "| linear (relu) | (16, 2) | 16 | 50.0 | 1,024 |" in table
    one_head = run_grid(dataclasses.replace(base, num_heads=1), ["softmax"], [16], tmp_path)
    assert calls[-1] == "softmax-d16-T16-P2-h1"  # its own file: the 2-head cell is kept
    assert "| softmax, 1 head | (16, 2) | 16 |" in format_table(one_head)


def test_train_mix_sets_are_drawn_and_batched_by_shape():
    """Each mixed-in set has its own shape and seed; an epoch holds every example of every set
    once, one shape per batch, the shapes interleaved."""
    cfg = RecallConfig(mixer="softmax", **{**TINY, "train_mix": ((8, 1, 40), (12, 2, 24))})
    d = splits(cfg)
    assert d["mix0"][0].shape == (40, 8) and d["mix1"][0].shape == (24, 12)
    assert ((d["mix0"][1] != -100).sum(1) == 1).all() and ((d["mix1"][1] != -100).sum(1) == 2).all()
    assert not torch.equal(d["mix1"][0][:16, :12], d["train"][0][:16, :12])
    sets = [d["train"], d["mix0"], d["mix1"]]
    batches = list(_batches(sets, 16, torch.Generator().manual_seed(0)))
    assert len(batches) == 4 + 3 + 2  # ceil(64/16) + ceil(40/16) + ceil(24/16)
    shapes = [x.shape[1] for x, _ in batches]
    assert shapes != sorted(shapes) and sorted(set(shapes)) == [8, 12, 16]
    for T, (x, _) in zip((16, 8, 12), sets, strict=True):
        seen = torch.cat([xb for xb, _ in batches if xb.shape[1] == T])
        assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, x.tolist()))


def test_train_mix_steps_and_round_trip():
    cfg = RecallConfig(mixer="linear", **{**TINY, "train_mix": [[8, 1, 40]]})
    assert cfg.train_mix == ((8, 1, 40),)
    assert RecallConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    _, rec = train_one(cfg, 1e-3, splits(cfg))
    assert rec["steps"] == 2 + 2  # 64 and 40 examples in batches of 32


def test_eval_at_scores_the_model_at_other_settings(tmp_path):
    """``eval_at``: the trained model tested at other shapes, each a row of the table."""
    cfg = RecallConfig(mixer="softmax", **TINY, eval_at=((24, 3),))
    r = run_cell(cfg)
    (e,) = r["eval_at"]
    assert (e["seq_len"], e["num_kv_pairs"]) == (24, 3) and 0.0 <= e["test_acc"] <= 1.0
    # the KV cache grows with the length (2 layers, K and V, float32) plus the token shift's
    assert e["state_bytes"] - r["state_bytes"] == 2 * 2 * (24 - 16) * 16 * 4
    rows = format_table([r]).splitlines()[2:]
    assert rows[0].startswith("| softmax | (16, 2) | 16 |")
    assert rows[1].startswith(f"| softmax | (24, 3) via (16, 2) | 16 | {100 * e['test_acc']:.1f} |")


def test_saved_cells_reads_a_grid_back(tmp_path, monkeypatch):
    import linattn.recall.harness as h
    from linattn.recall.table import saved_cells

    def fake(cfg, log=None):
        return {"config": cfg.to_dict(), "test_acc": 0.5, "state_bytes": 64, "lr": 1e-3,
                "train_time_s": 2.0, "sweep_time_s": 2.0, "cpu": "x"}

    monkeypatch.setattr(h, "run_cell", fake)
    base = RecallConfig(mixer="softmax", **TINY)
    res = run_grid(base, ["softmax", "linear"], [16], tmp_path, seeds=[0, 1])
    (tmp_path / "notes.json").write_text("[1, 2]")  # not a cell: skipped
    back = saved_cells(tmp_path)
    assert format_table(back) == format_table(sorted(res, key=lambda r: r["config"]["mixer"]))


def test_old_cell_files_read_as_the_defaults(tmp_path):
    """A cell saved before ``train_mix`` existed was trained without one: it is the same
    configuration as one with none, not as one with today's default mixture."""
    from linattn.recall.table import load_cell

    cfg = RecallConfig(mixer="softmax", **TINY)
    old = {k: v for k, v in cfg.to_dict().items() if k != "train_mix"}
    (tmp_path / "c.json").write_text(json.dumps({"config": old, "test_acc": 0.5}))
    assert load_cell(tmp_path / "c.json", cfg)["test_acc"] == 0.5
    assert load_cell(tmp_path / "c.json", dataclasses.replace(cfg, train_mix=((8, 1, 8),))) is None
    assert RecallConfig(mixer="softmax").train_mix  # the default is a mixture


@pytest.mark.parametrize("kwargs, name", [
    ({"mixer": "bogus"}, "mixer"),
    ({"d_model": 0}, "d_model"),
    ({"lr": -1.0}, "lr"),
    ({"lrs": ()}, "lrs"),
    ({"lrs": (1e-3, float("nan"))}, "lrs"),
    ({"stop_at": 0.0}, "stop_at"),
    ({"num_heads": 3}, "num_heads"),
    ({"window": 4}, "window"),           # softmax takes no window
    ({"seq_len": 6}, "seq_len"),         # too short for 2 pairs
    ({"feature_map": "bogus"}, "feature_map"),
    ({"decay": (0.5,)}, "decay"),        # one per head
    ({"decay": (0.5, 1.5)}, "decay"),
    ({"mixer": "gated_delta", "decay": (0.5, 0.9)}, "decay"),  # a kind without decays
    ({"train_mix": ((8, 1),)}, "train_mix"),
    ({"train_mix": ((6, 2, 8),)}, "train_mix"),   # too short for 2 pairs
    ({"train_mix": ((8, 1, 0),)}, "train_mix"),
    ({"train_mix": 3}, "train_mix"),
    ({"eval_at": ((8, 1, 2),)}, "eval_at"),
    ({"eval_at": ((7, 1),)}, "eval_at"),          # odd length
])
def test_bad_config_names_the_field(kwargs, name):
    args = {**TINY, "mixer": "softmax", **kwargs}
    with pytest.raises(ValueError, match=f"^{name}: ") as err:
        RecallConfig(**args)
    assert "\n" not in str(err.value)


def test_grid_seeds_are_cells_and_one_row_of_the_table(tmp_path, monkeypatch):
    import linattn.recall.harness as h

    def fake(cfg, log=None):  # accuracy 0.25 for seed 0, 0.75 for seed 1
        return {"config": cfg.to_dict(), "test_acc": 0.25 + 0.5 * cfg.seed,
                "state_bytes": 64, "lr": 1e-3, "train_time_s": 2.0, "sweep_time_s": 2.0,
                "cpu": "x"}

    monkeypatch.setattr(h, "run_cell", fake)
    base = RecallConfig(mixer="softmax", **TINY)
    res = run_grid(base, ["softmax"], [16], tmp_path, seeds=[0, 1])
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "softmax-d16-T16-P2-s1.json", "softmax-d16-T16-P2.json"]
    rows = format_table(res).splitlines()[2:]
    assert rows == ["| softmax | (16, 2) | 16 | 50.0 | 64 | 25.0–75.0 | 2 | 0.001 | 2 | 2 |"]


def test_threads_are_capped_at_the_cpus(monkeypatch):
    """``threads`` above the CPUs available is capped with one warning, as every command's
    ``--threads`` is (torch's OpenMP crashed on 100,000 threads: SIGSEGV); the caller's count
    is restored after."""
    from linattn._config import available_cpus

    asked = []
    real = torch.set_num_threads
    before = torch.get_num_threads()

    def record(n: int) -> None:  # an absurd count is recorded, never passed on (a crash)
        asked.append(n)
        real(n if n <= available_cpus() or n == before else available_cpus())

    monkeypatch.setattr(torch, "set_num_threads", record)
    with pytest.warns(RuntimeWarning, match="threads: 100000 threads asked for"):
        run_cell(RecallConfig(mixer="softmax", **{**TINY, "threads": 100_000}))
    # every count set is capped, but the caller's own restored at the end (another test may
    # have left more threads than CPUs)
    assert asked and all(n <= available_cpus() for n in asked[:-1]) and asked[-1] == before
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("change, name", [
    ({"train_mix": ((10**9, 2, 1),)}, "train_mix"), ({"eval_at": ((10**9, 2),)}, "eval_at"),
    ({"vocab_size": 10**9}, "vocab_size"), ({"d_model": 10**9}, "d_model"),
    ({"mlp_dim": 10**9}, "mlp_dim"), ({"short_conv": 10**9}, "short_conv"),
])
def test_absurd_cells_are_refused_before_anything_is_allocated(change, name):
    from linattn.recall.options import check_cell_memory

    cfg = RecallConfig(mixer="softmax", **{**TINY, **change})
    with pytest.raises(ValueError, match=rf"^{name}: this cell needs about "):
        check_cell_memory(cfg)
    with pytest.raises(ValueError, match=rf"^{name}: this cell needs about "):
        run_cell(cfg)
    check_cell_memory(RecallConfig(mixer="softmax", **TINY))  # a small one fits


def test_a_cell_file_nested_too_deeply_is_no_cell(tmp_path):
    """Was a RecursionError out of `recall table` (forda's run.json already said 'nested too
    deeply'): such a file is read as no result, and the cell is run again."""
    from linattn.recall.table import load_cell, saved_cells

    cfg = RecallConfig(mixer="softmax", **TINY)
    path = tmp_path / f"{cell_name(cfg)}.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert load_cell(path, cfg) is None
    assert saved_cells(tmp_path) == []


# -------------------- the MQAR generator (linattn.recall.data)
# The MQAR generator (linattn.recall.data): Zoology's layout and distributions.


T, P, V = 64, 8, 256


@pytest.fixture(scope="module")
def batch():
    return mqar(400, T, P, vocab_size=V, seed=3)


def test_shapes_and_dtypes(batch):
    x, y = batch
    assert x.shape == y.shape == (400, T)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < V


def test_pairs_at_the_start_keys_and_values_disjoint_and_unique(batch):
    x, _ = batch
    keys, values = x[:, 0:2 * P:2], x[:, 1:2 * P:2]
    assert bool(((keys >= 1) & (keys < V // 2)).all())
    assert bool(((values >= V // 2) & (values < V)).all())
    for row_k, row_v in zip(keys.tolist(), values.tolist(), strict=True):
        assert len(set(row_k)) == P and len(set(row_v)) == P


def test_every_key_queried_once_and_target_is_its_value(batch):
    x, y = batch
    for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
        pairs = dict(zip(xi[0:2 * P:2], xi[1:2 * P:2], strict=True))
        queries = [t for t, target in enumerate(yi) if target != IGNORE_INDEX]
        assert len(queries) == P
        assert all(t >= 2 * P and (t - 2 * P) % 2 == 0 for t in queries)  # even slots
        assert sorted(xi[t] for t in queries) == sorted(pairs)  # each key exactly once
        for t in queries:
            assert yi[t] == pairs[xi[t]]  # the value paired with that key earlier


def test_targets_ignored_outside_queries(batch):
    _, y = batch
    assert bool((y[:, :2 * P] == IGNORE_INDEX).all())
    assert int((y != IGNORE_INDEX).sum()) == 400 * P


def test_fillers_random_or_zero():
    x, y = mqar(200, T, P, vocab_size=V, seed=0, random_non_queries=False)
    free = y == IGNORE_INDEX
    free[:, :2 * P] = False
    assert bool((x[free] == 0).all())
    xr, _ = mqar(200, T, P, vocab_size=V, seed=0)
    fill = xr[free]
    # uniform over the whole vocabulary: both halves present, mean near (V - 1) / 2
    assert fill.float().mean().item() == pytest.approx((V - 1) / 2, rel=0.05)
    assert int((fill < V // 2).sum()) > 0 and int((fill >= V // 2).sum()) > 0


def test_gap_distribution_is_the_power_law():
    p = gap_distribution(T, P, 0.01)
    space = (T - 2 * P) // 2
    assert p.shape == (space,)
    assert float(p.sum()) == pytest.approx(1.0)
    g = torch.arange(1, space + 1, dtype=torch.float64)
    ratio = p / g ** (0.01 - 1)
    assert float(ratio.max() / ratio.min()) == pytest.approx(1.0)


def test_query_gaps_follow_the_power_law():
    """The first key's gap is drawn from p itself (later keys from what is left): its
    empirical frequencies match p within a 5-sigma binomial bound, and a = 1 is uniform."""
    n, T2, P2 = 4000, 40, 4
    for a in (0.01, 1.0):
        x, y = mqar(n, T2, P2, vocab_size=V, power_a=a, seed=11)
        first_key = x[:, 0]
        pos = (x == first_key[:, None]) & (y != IGNORE_INDEX)
        gaps = (pos.float().argmax(dim=1) - 2 * P2) // 2
        freq = torch.bincount(gaps, minlength=(T2 - 2 * P2) // 2).double() / n
        p = gap_distribution(T2, P2, a)
        bound = 5 * torch.sqrt(p * (1 - p) / n) + 1e-3
        assert bool(((freq - p).abs() <= bound).all()), (a, freq, p)


def test_power_law_puts_queries_early():
    _, y = mqar(500, 256, 16, seed=0)
    pos = (y != IGNORE_INDEX).nonzero()[:, 1].double()
    _, yu = mqar(500, 256, 16, power_a=1.0, seed=0)
    pos_u = (yu != IGNORE_INDEX).nonzero()[:, 1].double()
    assert pos.mean() < pos_u.mean()


def test_deterministic_per_seed():
    a = mqar(50, T, P, vocab_size=V, seed=5)
    b = mqar(50, T, P, vocab_size=V, seed=5)
    c = mqar(50, T, P, vocab_size=V, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    # the global RNG is untouched
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    mqar(5, T, P, vocab_size=V, seed=1)
    assert torch.equal(torch.rand(1), before)


def test_chunking_does_not_change_the_rows():
    """More rows than one internal block: every row still well formed, and zero rows work."""
    x, y = mqar(1100, 16, 2, vocab_size=32, seed=0)
    assert x.shape == (1100, 16) and int((y != IGNORE_INDEX).sum()) == 2200
    x0, y0 = mqar(0, 16, 2, vocab_size=32)
    assert x0.shape == y0.shape == (0, 16)


@pytest.mark.parametrize("kwargs, name", [
    ({"seq_len": 30}, "seq_len"),               # 4P > T
    ({"seq_len": 65}, "seq_len"),               # odd
    ({"num_kv_pairs": 0}, "num_kv_pairs"),
    ({"num_examples": -1}, "num_examples"),
    ({"num_examples": 2.0}, "num_examples"),
    ({"vocab_size": 16}, "vocab_size"),         # 7 keys < 8 pairs
    ({"power_a": 0.0}, "power_a"),
    ({"power_a": math.nan}, "power_a"),
    ({"power_a": True}, "power_a"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {"num_examples": 2, "seq_len": T, "num_kv_pairs": P, "vocab_size": V, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}: ") as err:
        mqar(**args)
    assert "\n" not in str(err.value)


def test_bad_flag_and_seed_types():
    with pytest.raises(TypeError, match="^random_non_queries: "):
        mqar(2, T, P, vocab_size=V, random_non_queries=1)
    with pytest.raises(TypeError, match="^seed: "):
        mqar(2, T, P, vocab_size=V, seed=1.5)


def test_a_batch_size_past_a_tensor_size_is_one_batch_of_everything():
    """--batch-size 10**30 passed the memory estimate (a batch is at most the training set)
    and then failed in torch's split: "Overflow when unpacking long long" (issue 51)."""
    x = torch.arange(10).view(5, 2)
    batches = list(_batches([(x, x[:, 0])], 10**30, torch.Generator().manual_seed(0)))
    assert len(batches) == 1 and sorted(batches[0][1].tolist()) == x[:, 0].tolist()
    cfg = RecallConfig(mixer="softmax", **{**TINY, "batch_size": 10**30})
    assert 0 <= run_cell(cfg)["test_acc"] <= 1
