"""Train and evaluate a 2-layer :class:`~linattn.nn.lm.LinearTransformerLM` on MQAR.

The protocol (Zoology's, scaled to a CPU; docs/recall.md lists the deviations): train,
validation and test sets generated from three different seeds; cross-entropy at the query
positions only; AdamW (weight decay 0.1), a linear warm-up over 5 % of the steps, then a cosine
schedule from ``lr`` to 0;
a learning-rate sweep whose best rate is chosen on the *validation* accuracy, never on the test
set; test accuracy is the fraction of query positions whose most likely token is the target.
A run stops after the first epoch whose validation accuracy reaches ``stop_at`` (Zoology's
early stopping at 0.99). The decoding state size is measured on the trained model: the bytes
of the :class:`~linattn.nn.lm.LMState` after one test sequence (the recurrent state, or the KV
cache of all ``seq_len`` tokens for softmax).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn._config import torch_threads
from linattn.nn.lm import LinearTransformerLM
from linattn.recall.data import IGNORE_INDEX, mqar
from linattn.recall.options import RecallConfig, check_cell_memory, model_kwargs

__all__ = ["build_model", "query_logits", "accuracy", "state_bytes", "train_one", "run_cell",
           "splits", "cpu_name"]

#: split → offset of its generator seed (seed·3 + offset): different seeds never share a split.
_SPLITS = {"train": 0, "val": 1, "test": 2}
#: the seeds of the ``train_mix`` sets start here.
_MIX_SEED = 1_000_000_007


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one), for every reported time."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def splits(cfg: RecallConfig) -> dict[str, tuple[Tensor, Tensor]]:
    """The train / val / test (inputs, targets) of ``cfg``, each (N, seq_len) int64, and
    ``mix<i>`` for each set of ``cfg.train_mix`` (N_i, T_i)."""
    sizes = {"train": cfg.train_examples, "val": cfg.val_examples, "test": cfg.test_examples}
    data = {name: mqar(n, cfg.seq_len, cfg.num_kv_pairs, cfg.vocab_size, cfg.power_a,
                       seed=3 * cfg.seed + _SPLITS[name])
            for name, n in sizes.items()}
    for i, (T, P, n) in enumerate(cfg.train_mix):
        # seeds far from every split's (3·seed + 0…2): a mixed-in set never repeats one
        data[f"mix{i}"] = mqar(n, T, P, cfg.vocab_size, cfg.power_a,
                               seed=_MIX_SEED + 1000 * cfg.seed + i)
    return data


def _batches(sets: list[tuple[Tensor, Tensor]], batch_size: int,
             gen: torch.Generator) -> Iterator[tuple[Tensor, Tensor]]:
    """One epoch of batches over every training set: each set shuffled and cut into batches of
    ``batch_size`` (one shape per batch), then all the batches in one random order. The plan
    is indices; each batch is gathered when it is reached (not a second copy of the data)."""
    plan = [(i, idx) for i, (x, _) in enumerate(sets)
            # a batch is at most the set (torch's split takes no size past 2**63)
            for idx in torch.randperm(len(x), generator=gen).split(min(batch_size, len(x) or 1))]
    if len(sets) > 1:  # one set keeps its shuffled order (the draw of runs before train_mix)
        plan = [plan[j] for j in torch.randperm(len(plan), generator=gen).tolist()]
    for i, idx in plan:
        x, y = sets[i]
        yield x[idx], y[idx]


def build_model(cfg: RecallConfig) -> LinearTransformerLM:
    """The model of ``cfg``, its weights drawn from ``cfg.seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return LinearTransformerLM(cfg.vocab_size, **model_kwargs(cfg))


def query_logits(model: LinearTransformerLM, ids: Tensor, targets: Tensor) -> Tensor:
    """The logits at the query positions only: (N, V) for the N entries of ``targets`` (B, T)
    that are not −100, in row-major order. Equal to ``model(ids)[targets != -100]``, but the
    tied output projection runs on P of T positions: at V = 8192 it is the largest matmul of
    the model, and only the queries are scored."""
    model.check_ids(ids)
    h, _ = model.embed_tokens(ids)
    for block in model.blocks:  # the model's forward (LinearTransformerLM.forward), stateless
        h, _ = block(h, None, 0)
    return model.head(model.norm(h[targets != IGNORE_INDEX]))


@torch.no_grad()
def accuracy(model: LinearTransformerLM, inputs: Tensor, targets: Tensor,
             batch_size: int = 256) -> float:
    """Fraction of the query positions of ``inputs`` (N, T) whose arg-max prediction is the
    target (``targets`` (N, T), −100 elsewhere)."""
    was = model.training
    model.eval()
    right = total = 0
    try:
        for i in range(0, len(inputs), batch_size):
            x, y = inputs[i:i + batch_size], targets[i:i + batch_size]
            pred = query_logits(model, x, y).argmax(-1)
            want = y[y != IGNORE_INDEX]
            right += int((pred == want).sum())
            total += want.numel()
    finally:
        model.train(was)
    return right / max(total, 1)


@torch.no_grad()
def state_bytes(model: LinearTransformerLM, ids: Tensor) -> int:
    """Bytes of the decoding state after reading ``ids`` (1, T): the tensors the model returns
    as its :class:`~linattn.nn.lm.LMState` (every layer), what decoding keeps besides the
    weights."""
    _, state = model(ids, return_state=True)
    return state.nbytes()


def train_one(cfg: RecallConfig, lr: float, data: dict[str, tuple[Tensor, Tensor]],
              log: Callable[[str], None] | None = None) -> tuple[LinearTransformerLM, dict]:
    """Train the model of ``cfg`` at learning rate ``lr`` on ``data["train"]``, validating
    after every epoch. Returns (model, record) with the record's ``lr``, ``val_acc`` (last
    epoch), ``epochs`` run, ``steps``, ``train_time_s`` (the optimisation only, evaluations
    excluded) and ``diverged`` (a non-finite loss ends the run; its accuracy is then 0)."""
    model = build_model(cfg)
    sets = [data["train"], *(data[f"mix{i}"] for i in range(len(cfg.train_mix)))]
    steps_per_epoch = sum(math.ceil(len(x) / cfg.batch_size) for x, _ in sets)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    # a linear warm-up over the first 5 % of the steps (AdamW's first updates at the sweep's
    # larger rates otherwise knock a fresh model off), then cosine to 0
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm)
        * 0.5 * (1.0 + math.cos(math.pi * min(s, total) / total)))
    gen = torch.Generator().manual_seed(cfg.seed)
    record: dict[str, Any] = {"lr": lr, "val_acc": 0.0, "epochs": 0, "steps": 0,
                              "train_time_s": 0.0, "diverged": False, "history": []}
    for epoch in range(cfg.epochs):
        losses = []
        t0 = time.perf_counter()
        for xb, yb in _batches(sets, cfg.batch_size, gen):
            loss = F.cross_entropy(query_logits(model, xb, yb).float(), yb[yb != IGNORE_INDEX])
            if not torch.isfinite(loss):
                record["diverged"] = True
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            record["steps"] += 1
            losses.append(loss.item())  # a float: a kept tensor held 2 MB of its step
        record["train_time_s"] += time.perf_counter() - t0
        record["epochs"] = epoch + 1
        if record["diverged"]:
            record["val_acc"] = 0.0
            break
        record["val_acc"] = accuracy(model, *data["val"])
        mean_loss = sum(losses) / max(len(losses), 1)  # the epoch's mean training loss
        record["history"].append({"epoch": epoch + 1, "loss": mean_loss,
                                  "val_acc": record["val_acc"]})
        if log is not None:
            log(f"{cfg.mixer} d={cfg.d_model} lr={lr:g} epoch {epoch + 1}: loss "
                f"{mean_loss:.3f}, val acc {record['val_acc']:.4f} "
                f"({record['train_time_s']:.0f} s)")
        if record["val_acc"] >= cfg.stop_at:
            break
    return model, record


def run_cell(cfg: RecallConfig, log: Callable[[str], None] | None = None) -> dict:
    """One table cell: train at ``cfg.lr``, or at each of ``cfg.lrs`` keeping the best
    validation accuracy; evaluate that model on the test set and measure its state. Runs on
    ``cfg.threads`` torch threads (restored after). Returns a JSON-able dict: ``config``,
    ``sweep`` (one record per rate), ``lr`` (chosen), ``val_acc``, ``test_acc``,
    ``state_bytes``, ``eval_at`` (``seq_len``, ``num_kv_pairs``, ``test_acc``, ``state_bytes``
    at each of ``cfg.eval_at``), ``parameters``, ``train_time_s`` (the chosen run's) and
    ``sweep_time_s`` (all runs'), ``cpu``, ``torch``."""
    check_cell_memory(cfg)  # absurd sizes refused before anything is allocated
    # capped at the CPUs available, as every command's --threads (OpenMP crashes on 100,000)
    with torch_threads(cfg.threads, "threads") as threads:
        data = splits(cfg)
        best: tuple[LinearTransformerLM, dict] | None = None
        sweep = []
        for lr in ((cfg.lr,) if cfg.lr is not None else cfg.lrs):
            model, rec = train_one(cfg, lr, data, log)
            sweep.append(rec)
            if best is None or rec["val_acc"] > best[1]["val_acc"]:
                best = (model, rec)
        assert best is not None  # at least one rate (RecallConfig checks lrs)
        model, rec = best
        test_acc = accuracy(model, *data["test"])
        nbytes = state_bytes(model, data["test"][0][:1])
        more = []
        for T, P in cfg.eval_at:  # the test split's seed, at each other shape
            x, y = mqar(cfg.test_examples, T, P, cfg.vocab_size, cfg.power_a,
                        seed=3 * cfg.seed + _SPLITS["test"])
            more.append({"seq_len": T, "num_kv_pairs": P, "test_acc": accuracy(model, x, y),
                         "state_bytes": state_bytes(model, x[:1])})
    return {"config": cfg.to_dict(), "sweep": sweep, "lr": rec["lr"], "val_acc": rec["val_acc"],
            "test_acc": test_acc, "state_bytes": nbytes, "eval_at": more,
            "parameters": model.num_parameters(), "train_time_s": rec["train_time_s"],
            "sweep_time_s": sum(r["train_time_s"] for r in sweep), "cpu": cpu_name(),
            "threads": threads, "torch": torch.__version__}
