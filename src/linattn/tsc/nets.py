"""The nets of :class:`~linattn.tsc.ConvAttentionClassifier`: their training
(:func:`fit_net`: AdamW, one-cycle, label smoothing), their probabilities (:func:`net_proba`),
the token net's and the stem net's forms of both, and a net's weights as named tensors and back
(:func:`net_state`, :func:`loaded_net`), which the estimator's saved files hold."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from linattn.tsc.conv_tokens import TokenNet
from linattn.tsc.stem import StemNet

__all__ = ["NET_STEPS", "fit_net", "net_proba", "train_token_net", "token_net_proba",
           "train_stem_net", "stem_net_proba", "net_state", "loaded_net"]

#: The nets' optimiser steps: 1,800 since round 7 of the TRAIN-only study (600 before; three
#: times as many scored 0.8361 against 0.8359 on validation, 12 sets won and 10 lost, by the
#: rule written before the round ran; docs/experiments.md, round 7).
NET_STEPS = 1800


def fit_net(net: torch.nn.Module, inputs: list[torch.Tensor | None], y: np.ndarray, *,
            steps: int = NET_STEPS, batch_size: int = 32, lr: float = 2e-3,
            weight_decay: float = 0.05) -> torch.nn.Module:
    """Train ``net`` (called as ``net(*batch of each input)``, a None input passed as None)
    on labels 0..n_classes−1: ``ceil(steps / batches per epoch)`` epochs of shuffled batches,
    AdamW, one-cycle lr, label smoothing 0.1; returned in eval mode. The caller seeds torch
    before building the net, so that one seed fixes both the weights and the batches."""
    t = torch.from_numpy(np.asarray(y, dtype=np.int64))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    batch = min(batch_size, len(t))
    per_epoch = math.ceil(len(t) / batch)
    epochs = max(1, math.ceil(steps / per_epoch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * per_epoch)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(t))
        for i in range(0, len(t), batch):
            b = order[i:i + batch]
            logits = net(*(None if x is None else x[b] for x in inputs))
            loss = F.cross_entropy(logits, t[b], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


def net_proba(net: torch.nn.Module, inputs: list[torch.Tensor | None],
              batch: int = 512) -> np.ndarray:
    """Class probabilities (n, n_classes) of a trained net over its inputs, ``batch`` rows at
    a time (a None input passed as None)."""
    n = len(next(x for x in inputs if x is not None))
    with torch.no_grad():
        return torch.cat([net(*(None if x is None else x[i:i + batch] for x in inputs))
                          .softmax(1) for i in range(0, n, batch)]).numpy()


def train_token_net(tokens: np.ndarray, y: np.ndarray, n_classes: int, *, num_layers: int = 2,
                    d_model: int = 64, num_heads: int = 4, dropout: float = 0.1, seed: int = 0,
                    global_features: np.ndarray | None = None, **training) -> TokenNet:
    """A :class:`TokenNet` fitted on tokens (n, S, F) float32 (and, when given, global
    features (n, G) float32 for a global token) and labels 0..n_classes−1 by
    :func:`fit_net` (``training``: its ``steps``, ``batch_size``, ``lr``,
    ``weight_decay``)."""
    torch.manual_seed(seed)
    x = torch.from_numpy(tokens)
    g = None if global_features is None else torch.from_numpy(global_features)
    net = TokenNet(x.shape[2], x.shape[1], n_classes, d_model=d_model, num_layers=num_layers,
                   num_heads=num_heads, dropout=dropout,
                   global_features=0 if g is None else g.shape[1])
    return fit_net(net, [x, g], y, **training)


def token_net_proba(net: TokenNet, tokens: np.ndarray, batch: int = 512,
                    global_features: np.ndarray | None = None) -> np.ndarray:
    """Class probabilities (n, n_classes) of tokens (n, S, F) (and global features (n, G) for
    a net with a global token)."""
    g = None if global_features is None else torch.from_numpy(global_features)
    return net_proba(net, [torch.from_numpy(tokens), g], batch)


def train_stem_net(X: np.ndarray, y: np.ndarray, n_classes: int, *, num_layers: int = 2,
                   d_model: int = 64, num_heads: int = 4, dropout: float = 0.1, seed: int = 0,
                   **training) -> StemNet:
    """A :class:`~linattn.tsc.stem.StemNet` fitted on series X (n, L) float32 and labels
    0..n_classes−1 by :func:`fit_net`, the token nets' training (``training``: its
    ``steps``, ``batch_size``, ``lr``, ``weight_decay``)."""
    torch.manual_seed(seed)
    net = StemNet(X.shape[1], n_classes, d_model=d_model, num_layers=num_layers,
                  num_heads=num_heads, dropout=dropout)
    return fit_net(net, [torch.from_numpy(X)], y, **training)


def stem_net_proba(net: StemNet, X: np.ndarray, batch: int = 512) -> np.ndarray:
    """Class probabilities (n, n_classes) of series X (n, L) float32."""
    return net_proba(net, [torch.from_numpy(X)], batch)


def net_state(net: torch.nn.Module, prefix: str) -> dict:
    """A net's weights and buffers as named tensors, each name behind ``prefix``."""
    return {prefix + k: v.detach().contiguous() for k, v in net.state_dict().items()}


def loaded_net(net: torch.nn.Module, t: dict, prefix: str) -> torch.nn.Module:
    """``net`` with the weights file's tensors ``prefix`` + each of its state's names, in
    eval mode; ValueError naming the first tensor that is missing, does not fit or is not of
    such a net."""
    want = net.state_dict()
    for k, v in want.items():  # name the first tensor that does not fit
        got = t.get(prefix + k)
        if got is None or got.shape != v.shape or got.dtype != v.dtype:
            raise ValueError(f"{prefix + k}: expected {v.dtype} of shape {tuple(v.shape)}, got "
                             + ("nothing" if got is None else
                                f"{got.dtype} of shape {tuple(got.shape)}"))
    extra = sorted(k for k in t if k.startswith(prefix) and k[len(prefix):] not in want)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")
    net.load_state_dict({k: t[prefix + k] for k in want})
    return net.eval()
