r"""A causal time-series classifier that updates its prediction after every incoming patch.

The series is cut into patches of ``patch`` samples (token t = samples ``[t·p, (t+1)·p)``), each
embedded linearly and run through causal :class:`~linattn.nn.lm.DecoderBlock` s — decayed
linear attention (:mod:`linattn.ops.decay`), the blocks of the language model — so token t sees
patches ≤ t only. The prediction after patch t is ``head(LN(mean_{s≤t} h_s))``: a running mean of
the causal features. Everything a new patch needs is a fixed-size state (per layer the
linear-attention state, plus the running sum and count): O(1) memory and time per patch,
whatever the length of the stream.

Training minimises the cross-entropy averaged over *every* prefix, so early predictions are
trained too, not only the one after the whole series.

Note for FordA: the UCR files are z-normalised per whole series, a non-causal preprocessing step
that a real stream would replace by running statistics; we keep the data as published.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn._config import rename_deprecated, renamed_keywords
from linattn.nn.lm import DecoderBlock, LMState
from linattn.train_loop import TrainLoop
from linattn.tsc.model import num_tokens
from linattn.tsc.training import EpochLoop

__all__ = ["StreamingConfig", "StreamingClassifier", "StreamState", "train_streaming",
           "accuracy_by_fraction"]


#: Deprecated spellings of :class:`StreamingConfig` fields -> today's name.
RENAMED: dict[str, str] = {"layers": "num_layers", "heads": "num_heads"}


@dataclass
class StreamingConfig:
    """Architecture of :class:`StreamingClassifier`: ``num_layers`` decoder blocks of
    ``num_heads`` heads on width ``d_model``, MLP width ``mlp_dim``.

    ``layers`` and ``heads`` are deprecated keywords for ``num_layers`` and ``num_heads`` (a
    DeprecationWarning; both spellings with different values is a TypeError)."""

    length: int = 500
    n_classes: int = 2
    patch: int = 10
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_dim: int = 128
    dropout: float = 0.1
    feature_map: str = "elu"
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamingConfig:
        """The config of a saved dict (deprecated names accepted); an unknown key is a
        ValueError."""
        d = rename_deprecated(d, RENAMED, "StreamingConfig")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"StreamingConfig: unknown keys {unknown}")
        return cls(**d)


# the deprecated spellings as constructor keywords (the signature still shows the fields)
StreamingConfig.__init__ = renamed_keywords(RENAMED, "StreamingConfig")(  # type: ignore[method-assign]
    StreamingConfig.__init__)


@dataclass
class StreamState:
    """Everything :meth:`StreamingClassifier.stream` carries between patches (for batch B).

    layers: per-layer linear-attention states; total: (B, d_model) sum of the top features;
    count: patches seen; pending: (B, k < patch) samples of an incomplete patch."""

    layers: LMState | None = None
    total: Tensor | None = None
    count: int = 0
    pending: Tensor | None = None

    def to_dict(self) -> dict[str, Tensor]:
        """A flat dict of tensors (copies) that :meth:`from_dict` restores."""
        d: dict[str, Tensor] = {"count": torch.tensor(self.count)}
        if self.layers is not None:
            d.update({f"lm.{k}": v for k, v in self.layers.to_dict().items()})
        for name in ("total", "pending"):
            t = getattr(self, name)
            if t is not None:
                d[name] = t.detach().clone()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Tensor]) -> StreamState:
        lm = {k[3:]: v for k, v in d.items() if k.startswith("lm.")}
        return cls(layers=LMState.from_dict(lm) if lm else None, total=d.get("total"),
                   count=int(d["count"]), pending=d.get("pending"))


class StreamingClassifier(nn.Module):
    """Causal patch classifier: ``forward(x)`` (B, L) -> logits after every patch (B, T, C),
    T = ceil(L / patch) (a final partial patch is zero padded); :meth:`stream` gives the same
    numbers one patch at a time with an O(1) state."""

    def __init__(self, config: StreamingConfig | None = None, **overrides) -> None:
        super().__init__()
        # overrides may use the deprecated names: they replace the config's value
        overrides = rename_deprecated(overrides, RENAMED, "StreamingClassifier")
        self.config = c = StreamingConfig(**{**(config or StreamingConfig()).to_dict(),
                                             **overrides})
        self.embed = nn.Linear(c.patch, c.d_model)
        self.blocks = nn.ModuleList(
            DecoderBlock(c.d_model, c.num_heads, c.mlp_dim, feature_map=c.feature_map,
                         dropout=c.dropout) for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.n_classes)

    def _run(self, patches: Tensor, state: StreamState) -> Tensor:
        """patches (B, T, p) after ``state`` -> logits (B, T, C); updates ``state`` in place."""
        h = self.embed(patches)
        layers = state.layers.layers if state.layers is not None else [None] * len(self.blocks)
        new = []
        for block, st in zip(self.blocks, layers, strict=True):
            h, s = block(h, st)
            new.append(s)
        prev = h.new_zeros(h.shape[0], 1, h.shape[-1]) if state.total is None \
            else state.total.unsqueeze(1)
        sums = prev + h.cumsum(1)
        counts = state.count + torch.arange(1, h.shape[1] + 1, device=h.device, dtype=h.dtype)
        state.layers = LMState(new, state.count + h.shape[1])
        state.total, state.count = sums[:, -1], state.count + h.shape[1]
        return self.head(self.norm(sums / counts[:, None]))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L) -> logits after each patch (B, ceil(L / patch), n_classes)."""
        if x.dim() != 2 or x.shape[1] == 0:
            raise ValueError(f"x: expected shape (B, L) with L >= 1, got {tuple(x.shape)}")
        p = self.config.patch
        T = num_tokens(x.shape[1], p)
        x = F.pad(x, (0, T * p - x.shape[1]))
        return self._run(x.view(x.shape[0], T, p), StreamState())

    @torch.no_grad()
    def stream(self, chunks: Iterable[Tensor | np.ndarray], state: StreamState | None = None,
               *, flush: bool = True) -> Iterator[Tensor]:
        """Feed samples as they arrive; yield logits (B, n_classes) after each complete patch.

        ``chunks``: tensors (B, n) or (n,) (then B = 1) of any length n. ``state`` (updated in
        place) lets a stream be paused, saved (:meth:`StreamState.to_dict`) and resumed.
        ``flush``: at the end, zero-pad an incomplete last patch and yield for it too, as the
        offline :meth:`forward` does."""
        state = StreamState() if state is None else state
        p = self.config.patch
        was = self.training
        self.eval()
        try:
            for chunk in chunks:
                x = torch.as_tensor(chunk, dtype=self.embed.weight.dtype)
                x = x.unsqueeze(0) if x.dim() == 1 else x
                if x.dim() != 2:
                    raise ValueError(f"chunks: expected (B, n) or (n,), got {tuple(x.shape)}")
                if state.pending is not None:
                    x = torch.cat([state.pending, x], 1)
                n = x.shape[1] // p
                state.pending = x[:, n * p :]
                for t in range(n):  # one recurrent step per patch
                    yield self._run(x[:, None, t * p : (t + 1) * p], state)[:, 0]
            if flush and state.pending is not None and state.pending.shape[1]:
                last = F.pad(state.pending, (0, p - state.pending.shape[1]))
                state.pending = state.pending[:, :0]
                yield self._run(last[:, None], state)[:, 0]
        finally:
            self.train(was)


class _StreamingTraining(EpochLoop):
    """The loop of :func:`train_streaming`."""

    def __init__(self, model: StreamingClassifier, X, y, X_val, y_val, *, epochs: int,
                 batch_size: int, lr: float, weight_decay: float, seed: int,
                 **loop_kwargs) -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        train = {"epochs": epochs, "batch_size": batch_size, "lr": lr,
                 "weight_decay": weight_decay, "seed": seed, "n_train": len(X)}
        super().__init__(model, optimizer, X, epochs=epochs, batch_size=batch_size, seed=seed,
                         clip=1.0, meta={"model": model.config.to_dict(), "train": train},
                         desc="stream", **loop_kwargs)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=lr, total_steps=epochs * self.steps_per_epoch, pct_start=0.2)
        self.y = torch.as_tensor(y, dtype=torch.int64)
        self.X_val, self.y_val = X_val, y_val
        self.best, self.best_state = -1.0, None  # best final-prefix val accuracy, its weights

    def loss(self) -> Tensor:
        idx = self.batch_indices()
        logits = self.model(self.augmented(idx))  # (B, T, C)
        target = self.y[idx, None].expand(-1, logits.shape[1])
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        self.track(loss, len(idx))
        return loss

    def after_step(self, loss: Tensor) -> dict | None:
        if self.batch != 0:  # mid-epoch
            return None
        rec = {"epoch": self.epoch, "train_loss": self.loss_sum / self.n_seen,
               "time_s": round(self.elapsed, 1)}
        self.loss_sum, self.n_seen = 0.0, 0
        if self.X_val is not None:
            acc = accuracy_by_fraction(self.model, self.X_val, self.y_val)
            rec["val_acc_end"] = float(acc[-1])
            rec["val_acc_mean"] = float(acc.mean())
            if acc[-1] > self.best:
                self.best = float(acc[-1])
                self.best_state = {k: v.detach().clone()
                                   for k, v in self.model.state_dict().items()}
        return rec

    def extra_state(self) -> dict:
        return {**super().extra_state(), "best": self.best, "best_state": self.best_state}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.best, self.best_state = state["best"], state["best_state"]


def train_streaming(model: StreamingClassifier, X: np.ndarray, y: np.ndarray, *,
                    X_val: np.ndarray | None = None, y_val: np.ndarray | None = None,
                    epochs: int = 20, batch_size: int = 64, lr: float = 2e-3,
                    weight_decay: float = 0.05, seed: int = 0, progress: bool = True,
                    checkpoint_dir: str | os.PathLike | None = None,
                    metrics_path: str | os.PathLike | None = None, resume: bool = False,
                    on_step: Callable[[TrainLoop], None] | None = None) -> list[dict]:
    """Train on X (n, length), y (n,) integer labels; returns the per-epoch history.

    AdamW + one-cycle (20 % warm-up), loss = cross-entropy averaged over all prefixes,
    circular-shift and scale augmentation (:func:`linattn.tsc.data.augment`), gradient norm
    clipped at 1. Keeps the weights of the epoch with the best final-prefix validation
    accuracy (if a validation set is given).

    ``checkpoint_dir``: a checkpoint after every epoch and on Ctrl-C (which then raises
    KeyboardInterrupt); ``resume``: continue the checkpoint there, to the result an
    uninterrupted run gives. ``metrics_path``: one JSON line per epoch. ``on_step``: called as
    ``on_step(loop)`` after every optimiser step. Runs on
    :class:`~linattn.train_loop.TrainLoop`."""
    torch.manual_seed(seed)
    loop = _StreamingTraining(model, X, y, X_val, y_val, epochs=epochs, batch_size=batch_size,
                              lr=lr, weight_decay=weight_decay, seed=seed, progress=progress,
                              checkpoint_dir=checkpoint_dir, metrics_path=metrics_path,
                              on_step=on_step)
    if resume:
        loop.load_checkpoint()
    history = loop.run()
    if loop.best_state is not None:
        model.load_state_dict(loop.best_state)
    return history


@torch.no_grad()
def accuracy_by_fraction(model: StreamingClassifier, X: np.ndarray, y: np.ndarray,
                         batch_size: int = 256) -> np.ndarray:
    """Accuracy of the prediction after each patch: (T,), entry t after (t+1)/T of the series."""
    was = model.training
    model.eval()
    Xt = torch.as_tensor(X, dtype=torch.float32)
    preds = torch.cat([model(Xt[i : i + batch_size]).argmax(-1)
                       for i in range(0, len(Xt), batch_size)])
    model.train(was)
    return (preds == torch.as_tensor(y)[:, None]).double().mean(0).numpy()
