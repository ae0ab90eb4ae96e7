"""MQAR per mixer: the table and the plot of docs/recall.md, one command.

Runs the grid of ``linattn recall table`` (:func:`linattn.recall.run_grid`) with ``--jobs``
cells at a time, each in its own process on one thread (2 jobs fill a 2-core machine), saves
one JSON per cell in ``--out`` (cells already there with the same configuration are reused, so
an interrupted run resumes), prints the Markdown table and, with matplotlib, plots test
accuracy against d_model and against the decoding state in bytes.

    flock /tmp/linattn-bench.lock .venv/bin/python benchmarks/mqar.py --out runs/recall/mix

The defaults are docs/recall.md's whole table: the 13 mixers at d_model 64 and the
``TABLE_EXTRA`` cells (Gated DeltaNet at d_model 128: one head in two seeds, two heads),
trained at (256, 16) with the :data:`~linattn.recall.options.TABLE_MIX` mixture, 2 epochs,
lr 3e-3, tested at (256, 16) and (512, 64); with two jobs the costliest cells start first.
Options shape the grid (``--mixers``, ``--d-models``, ``--settings``, ``--eval-at``, ``--extra``;
the extra cells are the table's only while neither ``--mixers`` nor ``--d-models`` is given)
and the training budget (``--train-examples``, ``--train-mix``, ``--epochs``, ``--lrs``);
``--report`` redraws the table and plot of the cells in ``--out``.
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
#: The table's cells outside that grid: ``mixer/d_model/heads/seed`` (the best recurrent cell
#: in two seeds, and the same width with the default two heads).
TABLE_EXTRA = ("gated_delta/128/1/0", "gated_delta/128/1/1", "gated_delta/128/2/0")
#: Relative cost of a cell's step (measured: docs/recall.md), to start the long cells first so
#: that two jobs finish together; a mixer not named costs 1, and cost grows with d_model.
_COST = {"based": 8.0, "taylor": 2.0}


def parse_extra(text: str) -> list[tuple[str, int, int, int]]:
    """``mixer/d_model/heads/seed,...`` → cells; '' → none."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split("/")
        try:
            if len(parts) != 4:
                raise ValueError
            mixer, d, h, s = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
            if not mixer or min(d, h) < 1 or s < 0:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not mixer/d_model/heads/seed with positive sizes: {item!r}") from None
        out.append((mixer, d, h, s))
    return out


def submission_order(cells: list[tuple[RecallConfig, str, int]]) -> list[int]:
    """Indices of (config, mixer, d_model) cells, the costliest first (a stable sort: equal
    costs keep the grid's order)."""
    def cost(i: int) -> float:
        _, mixer, d_model = cells[i]
        return _COST.get(mixer.split(":")[0], 1.0) * d_model

    return sorted(range(len(cells)), key=lambda i: -cost(i))


def _cell(base: RecallConfig, mixer: str, d_model: int, out: str) -> dict:
    """One cell in a worker process (one thread, the config's)."""
    return run_grid(base, [mixer], [d_model], out,
                    log=lambda s: print(s, file=sys.stderr, flush=True))[0]


def run(base: RecallConfig, mixers: list[str], d_models: list[int],
        settings: list[tuple[int, int]], out: str, jobs: int,
        seeds: list[int] | None = None,
        extra: list[tuple[str, int, int, int]] | None = None) -> list[dict]:
    """Every (setting, mixer, d_model, seed) cell, then the ``extra`` cells
    (mixer, d_model, heads, seed) at every setting, ``jobs`` at a time, the costliest started
    first; results in that grid order."""
    cells = [(dataclasses.replace(base, seq_len=T, num_kv_pairs=P, seed=s), m, d)
             for T, P in settings for m in mixers for d in d_models
             for s in (seeds or [base.seed])]
    cells += [(dataclasses.replace(base, seq_len=T, num_kv_pairs=P, num_heads=h, seed=s), m, d)
              for T, P in settings for m, d, h, s in (extra or [])]
    if jobs == 1:
        return [_cell(c, m, d, out) for c, m, d in cells]
    with ProcessPoolExecutor(jobs) as pool:
        futures = {i: pool.submit(_cell, *cells[i], out) for i in submission_order(cells)}
        return [futures[i].result() for i in range(len(cells))]


def _grid_position(result: dict) -> tuple[int, int]:
    """Where a saved cell stands in the default command's grid: the 13 mixers in
    ``TABLE_MIXERS`` order, then ``TABLE_EXTRA``, then anything else."""
    c = result["config"]
    extra = f"{c['mixer']}/{c['d_model']}/{c['num_heads']}/{c['seed']}"
    spec = c["mixer"] + (f":{c['feature_map']}" if c.get("feature_map") else "")
    if extra in TABLE_EXTRA:
        return 1, TABLE_EXTRA.index(extra)
    return (0, TABLE_MIXERS.index(spec)) if spec in TABLE_MIXERS else (2, 0)


def schedule_estimate(results: list[dict], jobs: int) -> float:
    """Seconds ``jobs`` workers would take for these cells' ``sweep_time_s``, handed out
    costliest first as :func:`run` does, equal costs in the default command's grid order (a
    list schedule; data generation and evaluation, a minute or two a cell, are not in it)."""
    results = sorted(results, key=_grid_position)
    cells = [(None, r["config"]["mixer"], r["config"]["d_model"]) for r in results]
    free = [0.0] * max(1, jobs)
    for i in submission_order(cells):
        k = free.index(min(free))
        free[k] += results[i]["sweep_time_s"]
    return max(free)


def _times_text(results: list[dict], jobs: int) -> str:
    total = sum(r["sweep_time_s"] for r in results)
    return (f"{len(results)} cells, {total:,.0f} s of training summed; {jobs} jobs started "
            f"costliest first: {schedule_estimate(results, jobs):,.0f} s (arithmetic on the "
            "cells' times, not a timed run)")


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
    p.add_argument("--mixers", default=None,
                   help="comma-separated presets, optionally with :feature_map (default: the "
                        "table's 13)")
    p.add_argument("--d-models", default=None, help="comma-separated (default 64)")
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
    p.add_argument("--extra", type=parse_extra, default=None,
                   help="more cells beside the grid, mixer/d_model/heads/seed comma-separated, "
                        "'' for none (default: the table's gated_delta cells at d_model 128 when "
                        "neither --mixers nor --d-models is given, else none)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--plot", default=None, help="PNG path (default: OUT/mqar.png)")
    p.add_argument("--report", action="store_true",
                   help="run nothing: the table and plot of every cell saved in --out")
    a = p.parse_args(argv)
    if a.extra is None:  # the table's extra cells belong to the table's grid only
        table = a.mixers is None and a.d_models is None
        a.extra = parse_extra(",".join(TABLE_EXTRA)) if table else []
    a.mixers = a.mixers or ",".join(TABLE_MIXERS)
    a.d_models = a.d_models or "64"
    png = Path(a.plot or Path(a.out) / "mqar.png")
    if a.report:
        results = saved_cells(a.out)
        if not results:
            p.error(f"--out: no cell results in {a.out}")
        print(format_table(results))
        print(_times_text(results, a.jobs))
        _plot_or_say(results, png)
        return 0
    settings = [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")]
    base = RecallConfig(mixer="softmax", num_heads=a.num_heads,
                        train_examples=a.train_examples, epochs=a.epochs,
                        batch_size=a.batch_size, lrs=tuple(float(x) for x in a.lrs.split(",")),
                        short_conv=a.short_conv, mlp_dim=a.mlp_dim, train_mix=a.train_mix,
                        eval_at=a.eval_at)
    results = run(base, a.mixers.split(","), [int(d) for d in a.d_models.split(",")],
                  settings, a.out, a.jobs, [int(s) for s in a.seeds.split(",")], a.extra)
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
