"""A grid of MQAR cells (mixers × widths at one sequence length and pair count) and its table.

Each cell's result is written to ``OUT/<cell name>.json`` (atomically) as soon as it is done,
and a grid run again reuses the cells whose saved configuration equals the one asked for, so an
interrupted grid resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from linattn._io import read_json, write_json
from linattn.recall.options import RecallConfig

__all__ = ["cell_name", "run_grid", "format_table", "load_cell", "scores", "saved_cells",
           "mixer_label"]

_HEADS = RecallConfig.num_heads  # the default: unnamed in cell names and labels


def cell_name(cfg: RecallConfig) -> str:
    """``<mixer>[-<feature map>]-d<d_model>-T<seq_len>-P<pairs>[-h<heads>][-s<seed>]``: the
    cell's file stem (the default head count and seed 0 unnamed)."""
    fmap = f"-{cfg.feature_map}" if cfg.feature_map else ""
    heads = f"-h{cfg.num_heads}" if cfg.num_heads != _HEADS else ""
    seed = f"-s{cfg.seed}" if cfg.seed else ""
    return f"{cfg.mixer}{fmap}-d{cfg.d_model}-T{cfg.seq_len}-P{cfg.num_kv_pairs}{heads}{seed}"

#: fields that files saved before them lack, and the value those runs had (no mixture, no
#: other settings), which is not today's default.
_BEFORE = {"train_mix": [], "eval_at": []}


def load_cell(path: Path, cfg: RecallConfig) -> dict | None:
    """The result saved at ``path`` if it was made with ``cfg``; None otherwise (missing,
    unreadable, not JSON, nested too deeply to parse, or another configuration)."""
    try:
        saved = read_json(path)  # RecursionError of a deep file: a ValueError
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        return None
    try:  # through the dataclass: a file from before a field existed reads as its default
        config = {**_BEFORE, **saved["config"]}
        same = RecallConfig.from_dict(config).to_dict() == cfg.to_dict()
    except (TypeError, ValueError):
        return None
    return saved if same else None


def saved_cells(out: str | Path) -> list[dict]:
    """Every cell result saved in ``out`` (files that are not one are skipped), ordered by
    setting, width, mixer and seed: a grid's table redrawn without running anything."""
    results = []
    for path in Path(out).glob("*.json"):
        try:
            r = read_json(path)
            c = r["config"]
            key = (c["seq_len"], c["num_kv_pairs"], c["d_model"], c["mixer"],
                   c.get("feature_map") or "", c["num_heads"], c["seed"])
            float(r["test_acc"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        results.append((key, r))
    return [r for _, r in sorted(results, key=lambda kr: kr[0])]


def run_grid(base: RecallConfig, mixers: Sequence[str], d_models: Sequence[int],
             out: str | Path | None = None, log: Callable[[str], None] | None = None,
             seeds: Sequence[int] | None = None) -> list[dict]:
    """Every (mixer, d_model, seed) cell of ``base`` (mixer names of
    :data:`~linattn.recall.options.MIXER_PRESETS`, optionally ``name:feature_map``, e.g.
    ``linear:taylor``; ``seeds`` default ``base.seed`` alone: each seed draws its own data and
    weights); results in grid order, each saved under ``out`` when given."""
    from linattn.recall.harness import run_cell

    results = []
    for mixer, d, seed in ((m, d, s) for m in mixers for d in d_models
                           for s in (seeds if seeds is not None else (base.seed,))):
        name, _, fmap = mixer.partition(":")
        cfg = dataclasses.replace(base, mixer=name, d_model=d, feature_map=fmap or None,
                                  seed=seed)
        path = None if out is None else Path(out) / f"{cell_name(cfg)}.json"
        result = None if path is None else load_cell(path, cfg)
        if result is None:
            result = run_cell(cfg, log)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, result)
        elif log is not None:
            log(f"{cell_name(cfg)}: reusing {path}")
        results.append(result)
    return results


def scores(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per setting a cell's model was tested at: the cell's own, then each of its
    ``eval_at``; each is the result with ``config``'s ``seq_len``/``num_kv_pairs``,
    ``test_acc`` and ``state_bytes`` of that setting, and ``trained_at`` (the cell's own
    (seq_len, pairs)) on the extra ones. What the table and the plot show."""
    out = [result]
    c = result["config"]
    for e in result.get("eval_at", ()):
        out.append({**result, "config": {**c, "seq_len": e["seq_len"],
                                         "num_kv_pairs": e["num_kv_pairs"]},
                    "test_acc": e["test_acc"], "state_bytes": e["state_bytes"],
                    "trained_at": (c["seq_len"], c["num_kv_pairs"])})
    return out


def _key(r: dict[str, Any]) -> tuple:
    """A cell's configuration without its seed: the seeds of one key make one table row."""
    return (tuple(sorted((k, str(v)) for k, v in r["config"].items() if k != "seed")),
            r.get("trained_at"))


def mixer_label(c: dict[str, Any]) -> str:
    """A cell's mixer as the table and the plot name it, from its saved ``config``:
    ``mixer[ (feature map)][, N heads]`` (the default head count unnamed)."""
    label = c["mixer"] + (f" ({c['feature_map']})" if c.get("feature_map") else "")
    if c.get("num_heads", _HEADS) != _HEADS:
        label += f", {c['num_heads']} head{'s' if c['num_heads'] > 1 else ''}"
    return label


def _row(rs: list[dict[str, Any]]) -> list[str]:
    c = rs[0]["config"]
    acc = [100 * r["test_acc"] for r in rs]
    spread = f"{min(acc):.1f}–{max(acc):.1f}" if len(rs) > 1 else "–"
    lrs = sorted({r["lr"] for r in rs})
    setting = f"({c['seq_len']}, {c['num_kv_pairs']})"
    if rs[0].get("trained_at"):
        setting += " via ({}, {})".format(*rs[0]["trained_at"])
    return [mixer_label(c), setting, str(c["d_model"]),
            f"{sum(acc) / len(acc):.1f}", f"{rs[0]['state_bytes']:,}", spread, str(len(rs)),
            "/".join(f"{lr:g}" for lr in lrs),
            f"{sum(r['train_time_s'] for r in rs) / len(rs):.0f}",
            f"{sum(r['sweep_time_s'] for r in rs) / len(rs):.0f}"]


def format_table(results: Iterable[dict]) -> str:
    """A Markdown table, one row per configuration over its seeds: mixer, (seq_len, pairs),
    d_model, mean test accuracy %, decoding state bytes, the test accuracies' range over the
    seeds, the number of seeds, chosen lr(s), mean training seconds of the chosen run and of
    the whole sweep."""
    head = ["mixer", "(T, pairs)", "d_model", "test acc %", "state bytes", "range %", "seeds",
            "lr", "train s", "sweep s"]
    groups: dict[tuple, list[dict]] = {}
    for r in (view for result in results for view in scores(result)):
        groups.setdefault(_key(r), []).append(r)
    rows = [head, ["---"] * len(head), *(_row(rs) for rs in groups.values())]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)
