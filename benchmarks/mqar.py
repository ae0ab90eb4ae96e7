"""MQAR per mixer: the table and the plot of docs/recall.md, one command.

Runs the grid of ``linattn recall table`` (:func:`linattn.recall.run_grid`) with ``--jobs``
cells at a time, each in its own process on one thread (2 jobs fill a 2-core machine), saves
one JSON per cell in ``--out`` (cells already there with the same configuration are reused, so
an interrupted run resumes), prints the Markdown table and, with matplotlib, plots test
accuracy against d_model and against the decoding state in bytes.

    flock /tmp/linattn-bench.lock .venv/bin/python benchmarks/mqar.py --out runs/recall/mix

The defaults are docs/recall.md's table: the 13 mixers at d_model 64, trained at (256, 16)
with the :data:`~linattn.recall.options.TABLE_MIX` mixture, 2 epochs, lr 3e-3, tested at
(256, 16) and (512, 64). Options shape the grid (``--mixers``, ``--d-models``, ``--settings``,
``--eval-at``) and the training budget (``--train-examples``, ``--train-mix``, ``--epochs``,
``--lrs``); ``--report`` redraws the table and plot of the cells in ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from linattn.cli.recall import parse_eval_at, parse_mix
from linattn.recall.options import TABLE_MIX, RecallConfig
from linattn.recall.table import format_table, mixer_label, run_grid, saved_cells, scores

#: docs/recall.md's table: every mixer the issue names.
TABLE_MIXERS = ("softmax", "gated_delta", "deltanet", "gla", "linear", "linear_plain",
                "linear_plain:relu", "hedgehog", "favor", "cosformer", "flowformer", "taylor",
                "based")


def _cell(base: RecallConfig, mixer: str, d_model: int, out: str) -> dict:
    """One cell in a worker process (one thread, the config's)."""
    return run_grid(base, [mixer], [d_model], out,
                    log=lambda s: print(s, file=sys.stderr, flush=True))[0]


def run(base: RecallConfig, mixers: list[str], d_models: list[int],
        settings: list[tuple[int, int]], out: str, jobs: int,
        seeds: list[int] | None = None) -> list[dict]:
    """Every (setting, mixer, d_model, seed) cell, ``jobs`` at a time; results in grid
    order."""
    cells = [(dataclasses.replace(base, seq_len=T, num_kv_pairs=P, seed=s), m, d)
             for T, P in settings for m in mixers for d in d_models
             for s in (seeds or [base.seed])]
    if jobs == 1:
        return [_cell(c, m, d, out) for c, m, d in cells]
    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(_cell, c, m, d, out) for c, m, d in cells]
        return [f.result() for f in futures]


def _mix_text(mix: tuple[tuple[int, int, int], ...]) -> str:
    return ", ".join(f"{n} of ({T}, {P})" for T, P, n in mix) or "nothing"


def plot(results: list[dict], path: Path) -> None:
    """Accuracy against d_model and against state bytes: one colour per mixer, one line style
    per test setting, seeds averaged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    points: dict[tuple[str, str], dict[int, list[dict]]] = {}
    for r in (view for result in results for view in scores(result)):
        c = r["config"]
        setting = f"({c['seq_len']}, {c['num_kv_pairs']})"
        points.setdefault((mixer_label(c), setting), {}).setdefault(c["d_model"], []).append(r)
    names = list(dict.fromkeys(n for n, _ in points))
    settings = list(dict.fromkeys(t for _, t in points))
    colours = plt.get_cmap("tab20")
    styles = ["o-", "s--", "^:", "d-."]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for (name, setting), by_d in points.items():
        ds = sorted(by_d)
        acc = [100 * sum(r["test_acc"] for r in by_d[d]) / len(by_d[d]) for d in ds]
        state = [by_d[d][0]["state_bytes"] for d in ds]
        style = styles[settings.index(setting) % len(styles)]
        colour = colours(names.index(name) % 20)
        axes[0].plot(ds, acc, style, color=colour)
        axes[1].plot(state, acc, style, color=colour)
    handles = [plt.Line2D([], [], color=colours(i % 20), marker="o", ls="-", label=n)
               for i, n in enumerate(names)]
    handles += [plt.Line2D([], [], color="k", marker=styles[i % len(styles)][0],
                           ls=styles[i % len(styles)][1:], label=f"tested at {t}")
                for i, t in enumerate(settings)]
    widths = sorted({d for by_d in points.values() for d in by_d})
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(widths, [str(d) for d in widths])
    axes[0].set_xlabel("d_model")
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # 2×10⁴ … overlap
    axes[1].set_xlabel("decoding state per sequence (bytes)")
    axes[0].set_ylabel("MQAR test accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mixers", default=",".join(TABLE_MIXERS),
                   help="comma-separated presets, optionally with :feature_map (default: the "
                        "table's 13)")
    p.add_argument("--d-models", default="64")
    p.add_argument("--settings", default="256:16", help="seq_len:pairs, comma-separated")
    p.add_argument("--num-heads", type=int, default=RecallConfig.num_heads)
    p.add_argument("--train-examples", type=int, default=RecallConfig.train_examples)
    p.add_argument("--epochs", type=int, default=RecallConfig.epochs)
    p.add_argument("--batch-size", type=int, default=RecallConfig.batch_size)
    p.add_argument("--lrs", default="3e-3",
                   help="comma-separated rates, the best on validation kept (default 3e-3)")
    p.add_argument("--seeds", default="0", help="comma-separated: data and weights per seed")
    p.add_argument("--short-conv", type=int, default=RecallConfig.short_conv)
    p.add_argument("--mlp-dim", type=int, default=RecallConfig.mlp_dim)
    p.add_argument("--train-mix", type=parse_mix, default=list(TABLE_MIX),
                   help="seq_len:pairs:examples sets trained on beside each cell's own, '' for "
                        "none (default: linattn.recall.TABLE_MIX)")
    p.add_argument("--eval-at", type=parse_eval_at, default=[(512, 64)],
                   help="seq_len:pairs settings each trained model is also tested at "
                        "(default 512:64)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--plot", default=None, help="PNG path (default: OUT/mqar.png)")
    p.add_argument("--report", action="store_true",
                   help="run nothing: the table and plot of every cell saved in --out")
    a = p.parse_args(argv)
    png = Path(a.plot or Path(a.out) / "mqar.png")
    if a.report:
        results = saved_cells(a.out)
        if not results:
            p.error(f"--out: no cell results in {a.out}")
        print(format_table(results))
        _plot_or_say(results, png)
        return 0
    settings = [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")]
    base = RecallConfig(mixer="softmax", num_heads=a.num_heads,
                        train_examples=a.train_examples, epochs=a.epochs,
                        batch_size=a.batch_size, lrs=tuple(float(x) for x in a.lrs.split(",")),
                        short_conv=a.short_conv, mlp_dim=a.mlp_dim, train_mix=a.train_mix,
                        eval_at=a.eval_at)
    results = run(base, a.mixers.split(","), [int(d) for d in a.d_models.split(",")],
                  settings, a.out, a.jobs, [int(s) for s in a.seeds.split(",")])
    c = results[0]
    print(f"MQAR, vocab {base.vocab_size}, {base.train_examples} train examples x "
          f"{base.epochs} epochs, batch {base.batch_size}, lrs {a.lrs}, seeds {a.seeds}, "
          f"token shift {base.short_conv}, MLP {base.mlp_dim or 'none'}, "
          f"mixed in {_mix_text(base.train_mix)}; {c['cpu']}, "
          f"{c['threads']} thread per run, {a.jobs} runs at a time")
    print(format_table(results))
    _plot_or_say(results, png)
    return 0


def _plot_or_say(results: list[dict], path: Path) -> None:
    try:
        plot(results, path)
    except ImportError:
        print("(no matplotlib: no plot)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
