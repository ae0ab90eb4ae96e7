"""Score variances at initialisation of MultiheadLinearAttention with relative vectors.

Prints, per (E, H): σ² (the key-coordinate variance the relative vectors are drawn with),
Var(q·k) beside its prediction d·σ_q²·σ_k², Var(q·r), and the variance of the sum q·k + q·r
(twice either term). docs/theory.md §8 quotes this output.

    .venv/bin/python benchmarks/relative_init.py
"""

from __future__ import annotations

import torch

from linattn.nn import MultiheadLinearAttention


def main() -> None:
    print("| E | H | d | σ² | Var(q·k) | d·σ_q²·σ_k² | Var(q·r) | Var(q·k + q·r) |")
    print("|---|---|---|---|---|---|---|---|")
    for E, H in ((64, 4), (512, 8)):
        torch.manual_seed(0)
        m = MultiheadLinearAttention(E, H, max_len=50)
        d = E // H
        with torch.no_grad():
            x = torch.randn(4096, E)  # unit-variance inputs, as after a LayerNorm
            q, k = m.q_proj(x).view(-1, H, d), m.k_proj(x).view(-1, H, d)
            qk = (q * k.roll(1, 0)).sum(-1)  # pairs of different tokens: independent q and k
            qr = (q * m.rel[:, 0]).sum(-1)
        print(f"| {E} | {H} | {d} | {m.key_std() ** 2:.3f} | {qk.var():.2f} | "
              f"{d * q.var() * k.var():.2f} | {qr.var():.2f} | {(qk + qr).var():.2f} |")


if __name__ == "__main__":
    main()
