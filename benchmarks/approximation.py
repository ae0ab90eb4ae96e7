"""How well each kernel approximates softmax attention, and what it costs.

For every feature map, against exact softmax attention softmax(q kᵀ/√d) v on the same q, k, v:

* RMS error of the attention output divided by std(v);
* mean KL(softmax row ‖ linear-attention row) over queries (T ≤ 1024, rows built explicitly);

on Gaussian q, k at several scales σ (entries N(0, σ²)) and, with ``--model DIR``, on the
queries and keys of a trained FordA model's layers (``models/forda`` by default, if present).
Random maps (FAVOR+, random ReLU) and the learnable Hedgehog map are swept over the number of
features; FAVOR+ and random ReLU errors are averaged over ``--draws`` draws. Hedgehog is
distilled (``fit_hedgehog``) on one sample and scored on another of the same distribution.
Then the time of one ``linear_attention`` call per map (B=1, H=8, T=4096, d=16, float32).

Prints Markdown tables; ``--plot PATH`` writes the error-vs-features figure.

With ``--favor-variance``, instead: how far FAVOR+'s estimate of exp(q·k/√d) strays, with
orthogonal and independent features. For fixed pairs (q, k) at a few norms (d = 16), draws the
random projection ``--draws`` times and prints the relative RMS error of φ(q)·φ(k)·e^{c_q + c_k}
against exp(q·k/√d), and the mean relative error (bias check: near 0 for an unbiased
estimator). docs/theory.md §9 quotes this output.

    python benchmarks/approximation.py [--model models/forda] [--plot docs/img/approximation.png]
    python benchmarks/approximation.py --favor-variance --draws 400
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import linattn
from linattn.feature_maps import (
    EluPlusOne,
    FavorPlus,
    Hedgehog,
    RandomReLU,
    ReluPlusOne,
    Taylor,
    fit_hedgehog,
    linear_attention_weights,
    softmax_attention_weights,
)

FEATURES = (16, 32, 64, 128, 256, 512)


def errors(fmap, q, k, v) -> tuple[float, float]:
    """(RMS error / std(v), mean row KL) of linear attention with ``fmap`` vs softmax."""
    with torch.no_grad():
        exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        approx = linattn.linear_attention(q, k, v, feature_map=fmap)
        rms = ((approx - exact).pow(2).mean().sqrt() / v.std()).item()
        p = softmax_attention_weights(q, k)
        w = linear_attention_weights(fmap, q, k).clamp_min(1e-30)
        kl = (p * (p.clamp_min(1e-30).log() - w.log())).sum(-1).mean().item()
    return rms, kl


def sweep(q, k, v, q_fit, k_fit, draws: int) -> dict[str, list[tuple[int, float, float]]]:
    """Name -> [(features, rms, kl)] for every map on one (q, k, v) sample."""
    d = q.shape[-1]
    rows: dict[str, list[tuple[int, float, float]]] = {}
    for name, fmap in (("1+elu", EluPlusOne()), ("1+relu", ReluPlusOne()), ("taylor", Taylor())):
        rows[name] = [(fmap.num_features(d), *errors(fmap, q, k, v))]
    for name, cls in (("favor+", FavorPlus), ("random-relu", RandomReLU)):
        rows[name] = []
        for m in FEATURES:
            errs = [errors(cls(d, m, seed=s).to(q.dtype), q, k, v) for s in range(draws)]
            rows[name].append((m, *(sum(e[i] for e in errs) / draws for i in (0, 1))))
    rows["hedgehog"] = []
    for m in FEATURES[:4]:
        torch.manual_seed(0)
        h = Hedgehog(d, m).to(q.dtype)
        fit_hedgehog(h, q_fit, k_fit, steps=300, lr=1e-2)
        rows["hedgehog"].append((h.num_features(d), *errors(h, q, k, v)))
    return rows


def trained_qk(model_dir: Path, n: int = 64) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Per attention layer of a saved FordA classifier: (name, q, k) as (B, H, T, d) from the
    first ``n`` training series (FordA's data through linattn.datasets)."""
    from linattn.datasets import load_ucr
    from linattn.tsc import LinearAttentionClassifier

    clf = LinearAttentionClassifier.load(model_dir)
    X = torch.as_tensor(load_ucr("FordA")[0][: 2 * n])
    captured: dict[str, dict[str, torch.Tensor]] = {}
    hooks = []
    for name, mod in clf.model_.named_modules():
        if isinstance(mod, linattn.nn.MultiheadLinearAttention):
            for part in ("q_proj", "k_proj"):
                def hook(_m, _i, out, name=name, part=part, mod=mod):
                    B, T, _ = out.shape
                    heads = out.view(B, T, mod.num_heads, mod.head_dim).transpose(1, 2)
                    captured.setdefault(name, {})[part] = heads.detach()
                hooks.append(getattr(mod, part).register_forward_hook(hook))
    with torch.no_grad():
        clf.model_.eval()(X)
    for h in hooks:
        h.remove()
    return [(name, t["q_proj"], t["k_proj"]) for name, t in captured.items()]


def print_table(title: str, rows: dict) -> None:
    print(f"\n### {title}\n")
    print("| map | features ℓ | RMS err / std(v) | mean KL |")
    print("|---|---|---|---|")
    for name, entries in rows.items():
        for m, rms, kl in entries:
            print(f"| {name} | {m} | {rms:.3f} | {kl:.3f} |")


def time_maps(d: int = 16) -> None:
    print("\n### Time per call: B=1, H=8, T=4096, d=16, float32, forward (median of 5)\n")
    print("| map | ℓ | non-causal | causal |")
    print("|---|---|---|---|")
    q, k, v = (torch.randn(1, 8, 4096, d) for _ in range(3))
    maps = [("1+elu", EluPlusOne()), ("1+relu", ReluPlusOne()), ("taylor", Taylor()),
            ("favor+ m=64", FavorPlus(d, 64, seed=0)), ("favor+ m=256", FavorPlus(d, 256, seed=0)),
            ("random-relu m=256", RandomReLU(d, 256, seed=0)), ("hedgehog m=64", Hedgehog(d, 64))]
    for name, fmap in maps:
        cells = []
        for causal in (False, True):
            ts = []
            with torch.no_grad():
                for _ in range(6):
                    t0 = time.perf_counter()
                    linattn.linear_attention(q, k, v, feature_map=fmap, is_causal=causal)
                    ts.append(time.perf_counter() - t0)
            cells.append(f"{sorted(ts[1:])[2] * 1e3:.1f} ms")
        print(f"| {name} | {fmap.num_features(d)} | {cells[0]} | {cells[1]} |")
    with torch.no_grad():
        ts = []
        for _ in range(6):
            t0 = time.perf_counter()
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
            ts.append(time.perf_counter() - t0)
    print(f"| softmax (SDPA) | — | {sorted(ts[1:])[2] * 1e3:.1f} ms | |")


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), sharey=True)
    for ax, (title, rows) in zip(axes, results.items(), strict=True):
        for name, entries in rows.items():
            ms = [e[0] for e in entries]
            rms = [e[1] for e in entries]
            style = "o-" if len(entries) > 1 else "s"
            ax.plot(ms, rms, style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("features ℓ")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("RMS error / std(v) vs softmax")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


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


def favor_variance(draws: int, dim: int = 16) -> None:
    """The --favor-variance table."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(dim, generator=g, dtype=torch.float64)
    w = torch.randn(dim, generator=g, dtype=torch.float64)
    print(f"d = {dim}, {draws} draws per cell; relative RMS error (mean relative error)")
    print("| ‖q‖ = ‖k‖ | m | independent rows | orthogonal rows |")
    print("|---|---|---|---|")
    for norm in (1.0, 2.0, 4.0):
        q, k = u / u.norm() * norm, w / w.norm() * norm
        exact = torch.exp(q @ k / math.sqrt(dim))
        for m in (16, 64, 256):
            cells = []
            for orthogonal in (False, True):
                rel = estimates(q, k, m, orthogonal, draws) / exact - 1
                cells.append(f"{rel.square().mean().sqrt():.3f} ({rel.mean():+.3f})")
            print(f"| {norm:g} | {m} | {cells[0]} | {cells[1]} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path("models/forda"))
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--favor-variance", action="store_true",
                    help="print FAVOR+'s estimator error table instead")
    args = ap.parse_args()
    if args.favor_variance:
        favor_variance(args.draws)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, T, d = 2, 4, 256, 16
    results: dict[str, dict] = {}
    for sigma in (0.5, 1.0, 2.0):
        q, k, v, q_fit, k_fit = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(5))
        q, k, q_fit, k_fit = (t * sigma for t in (q, k, q_fit, k_fit))
        title = f"Gaussian q, k, σ = {sigma} (B={B}, H={H}, T={T}, d={d})"
        results[title] = sweep(q, k, v, q_fit, k_fit, args.draws)
        print_table(title, results[title])
    if (args.model / "config.json").exists():
        for name, q, k in trained_qk(args.model):
            q, k = q.double(), k.double()
            half = q.shape[0] // 2
            v = torch.randn_like(q[half:])
            title = f"FordA model {name} (B={half}, T={q.shape[-2]}, d={q.shape[-1]})"
            results[title] = sweep(q[half:], k[half:], v, q[:half], k[:half], args.draws)
            print_table(title, results[title])
    else:
        print(f"\n(no trained model at {args.model}: FordA activations skipped)")
    time_maps()
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
