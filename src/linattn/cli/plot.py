"""``linattn plot``: figures that explain the library (needs the ``plot`` extra: matplotlib)."""

from __future__ import annotations

import argparse
from pathlib import Path

from linattn._io import atomic_path
from linattn.cli import path_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw explanatory figures (needs matplotlib)")
    p.add_argument("figure", choices=("feature-maps",), help="which figure")
    p.add_argument("-o", "--output", default="feature_maps.png", type=path_arg,
                   help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from linattn.cli import UserError, probe_output_file

    out = Path(args.output)
    probe_output_file(out, "--output")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("matplotlib is not installed: pip install 'linattn[plot]'") from None
    fig = feature_maps_figure(plt)
    with atomic_path(out, suffix=".png") as tmp:  # no half-written PNG if interrupted
        fig.savefig(tmp, dpi=120)
    print(out)
    return 0


def feature_maps_figure(plt):
    """ELU(x), 1 + ELU(x) and max(x, 0) + 1 over [−4, 4] with the zero line: the two shifted
    maps stay strictly positive, and 1 + ELU joins its two pieces smoothly at 0."""
    import torch
    import torch.nn.functional as F

    x = torch.linspace(-4, 4, 801)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.axhline(0.0, color="black", linewidth=0.8, label="zero")
    ax.plot(x, F.elu(x), "--", label="ELU(x)")
    ax.plot(x, F.elu(x) + 1, label="1 + ELU(x)")
    ax.plot(x, F.relu(x) + 1, label="max(x, 0) + 1")
    ax.set_xlabel("x")
    ax.set_ylabel("φ(x)")
    ax.set_title("Feature maps: strictly positive after the shift")
    ax.set_xlim(-4, 4)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
