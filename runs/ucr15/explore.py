"""Round 15 exploration (validation only, TRAIN series alone, not a decision): a token net
trained on top of the ridge instead of beside it.

The ridge with the differences (round 12's ``ridgeD``) is the strong head; a net joined with
it adds nothing on validation (rounds 13 and 14). Here the net learns a correction to the
ridge: its logits are added to ``5 ·`` the ridge's decision values (the ridge's own
probabilities, ``ridge_proba``), the ridge's leave-one-out values on the training series
(so that the net sees the ridge's out-of-sample mistakes, not its fitted ones) and its plain
values on the validation series. With ``LAYERS`` = 0 the net has no mixer (the ablation).

Usage, from the repository root: ``explore.py SPLIT_SEED LAYERS OUT NAME...``; rows to OUT
(rewritten atomically after every dataset; a rerun skips the sets done), probabilities to
OUT's ``_heads`` folder."""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ucr12"))
import ridge_diff_weights as W  # noqa: E402  (it puts benchmarks/ on the path)

from linattn.tsc.conv_classifier import fit_net, net_proba  # noqa: E402
from linattn.tsc.conv_tokens import ConvTokens, TokenNet  # noqa: E402

U = W.R.U
TEMPERATURE = 5.0


def ridge_targets(codes: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The ±1 targets ``RidgeClassifierCV`` fits: one column for two classes (+1 the second),
    otherwise one per class."""
    if len(present) == 2:
        return np.where(codes == present[1], 1.0, -1.0)[:, None]
    return np.where(codes[:, None] == present[None, :], 1.0, -1.0)


def loo_decision(F: np.ndarray, Y: np.ndarray, alpha: float) -> np.ndarray:
    """Leave-one-out decision values (n, columns) of a ridge with intercept at ``alpha`` on
    features F (n, p), targets Y: ``y − (y − ŷ) / (1 − h_ii)`` from the kernel form's hat
    matrix (the intercept adding 1/n to each h_ii)."""
    F = F.astype(np.float64)
    Fc = F - F.mean(0)
    lam, Q = np.linalg.eigh(Fc @ Fc.T)
    lam = np.clip(lam, 0.0, None)
    shrink = lam / (lam + alpha)
    Yc = Y - Y.mean(0)
    fitted = Y.mean(0) + Q @ (shrink[:, None] * (Q.T @ Yc))
    h = (Q ** 2) @ shrink + 1.0 / len(F)
    return Y - (Y - fitted) / (1.0 - h)[:, None]


class OnTopOfRidge(torch.nn.Module):
    """A TokenNet whose logits are added to given offsets (the ridge's logits) times a learned
    scale ``exp(log_scale)`` (1 at the start). Without the scale, label smoothing asks the
    net to undo the ridge's confidence series by series, and the first try (FordA: 0.86
    against the ridge's 0.956) showed the net's noise then flips its answers; the scale
    tempers the ridge once for all, and weight decay pulls it towards 1, not 0."""

    def __init__(self, net: TokenNet) -> None:
        super().__init__()
        self.net = net
        self.log_scale = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens, global_features, offset):
        return self.net(tokens, global_features) + self.log_scale.exp() * offset


def logits(decision: np.ndarray) -> np.ndarray:
    d = decision if decision.ndim == 2 and decision.shape[1] > 1 else np.c_[-decision.ravel(),
                                                                             decision.ravel()]
    return (TEMPERATURE * d).astype(np.float32)


def study(split_seed: int, layers: int, name: str) -> tuple[dict, dict]:
    torch.set_num_threads(1)
    X, y, classes, tr, va, row = U._inner_data(name, split_seed)
    n_classes = len(classes)
    t0 = time.perf_counter()
    parts = W.ridge_d_parts(X, tr, va)
    G = parts[0]  # the global features: the net's global token reads them too
    ridge, r, d_va = W.ridge_fit(parts, y[tr], n_classes)
    row["ridge_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    if len(r.classes_) < n_classes:  # a class the split's train part lacks: no offsets
        row["skipped"] = "a class missing from the inner train part"
        return row, {"y": y[va], "ridgeD": ridge}
    loo = loo_decision(np.hstack([p[0] for p in parts]), ridge_targets(y[tr], r.classes_), r.alpha_)
    off_tr = torch.from_numpy(logits(loo[:, 0] if loo.shape[1] == 1 else loo))
    off_va = torch.from_numpy(logits(d_va))
    row["loo_s"] = round(time.perf_counter() - t0, 2)
    row["loo_accuracy"] = float((off_tr.argmax(1).numpy() == y[tr]).mean())
    t0 = time.perf_counter()
    T = U._scaled_tokens(ConvTokens(16, 2000, 9, random_state=0), X, tr, va)
    torch.manual_seed(0)
    net = TokenNet(T[0].shape[2], T[0].shape[1], n_classes, num_layers=layers,
                   global_features=G[0].shape[1])
    model = fit_net(OnTopOfRidge(net), [torch.from_numpy(T[0]), torch.from_numpy(G[0]),
                                        off_tr], y[tr])
    on_top = net_proba(model, [torch.from_numpy(T[1]), torch.from_numpy(G[1]), off_va])
    row["net_s"] = round(time.perf_counter() - t0, 2)
    row["ridge_scale"] = round(float(model.log_scale.detach().exp()), 4)
    row["accuracy"] = U._scored({"ridgeD": ridge, "on_top": on_top}, y[va])
    return row, {"y": y[va], "ridgeD": ridge, "on_top": on_top}


def main(argv: list[str]) -> None:
    split_seed, layers = int(argv[0]), int(argv[1])
    W.resumable(argv[2], argv[3:], lambda name: study(split_seed, layers, name))


if __name__ == "__main__":
    main(sys.argv[1:])
