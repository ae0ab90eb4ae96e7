"""How far FAVOR+'s estimate of exp(q·k/√d) strays, with orthogonal and independent features.

For fixed pairs (q, k) at a few norms, draws the random projection ``draws`` times and prints
the relative RMS error of φ(q)·φ(k)·e^{c_q + c_k} against exp(q·k/√d), and the mean relative
error (bias check: near 0 for an unbiased estimator). docs/theory.md §9 quotes this output.

    .venv/bin/python benchmarks/favor_variance.py [--draws 400]
"""

from __future__ import annotations

import argparse
import math

import torch

from linattn.feature_maps import FavorPlus


def estimates(q: torch.Tensor, k: torch.Tensor, m: int, orthogonal: bool, draws: int):
    """(draws,) unstabilised FAVOR+ estimates of exp(q·k/√d) for one pair, float64."""
    d = q.numel()
    out = []
    for seed in range(draws):
        W = FavorPlus(d, m, orthogonal=orthogonal, seed=seed).W.double()
        qs, ks = q / d**0.25, k / d**0.25
        fq = torch.exp(W @ qs - qs.square().sum() / 2) / math.sqrt(m)
        fk = torch.exp(W @ ks - ks.square().sum() / 2) / math.sqrt(m)
        out.append(fq @ fk)
    return torch.stack(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=400)
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(args.dim, generator=g, dtype=torch.float64)
    w = torch.randn(args.dim, generator=g, dtype=torch.float64)
    print(f"d = {args.dim}, {args.draws} draws per cell; relative RMS error (mean relative error)")
    print("| ‖q‖ = ‖k‖ | m | independent rows | orthogonal rows |")
    print("|---|---|---|---|")
    for norm in (1.0, 2.0, 4.0):
        q, k = u / u.norm() * norm, w / w.norm() * norm
        exact = torch.exp(q @ k / math.sqrt(args.dim))
        for m in (16, 64, 256):
            cells = []
            for orthogonal in (False, True):
                rel = estimates(q, k, m, orthogonal, args.draws) / exact - 1
                cells.append(f"{rel.square().mean().sqrt():.3f} ({rel.mean():+.3f})")
            print(f"| {norm:g} | {m} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
