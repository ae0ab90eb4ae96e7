"""A grid of MQAR cells (mixers × widths at one sequence length and pair count) and its table.

Each cell's result is written to ``OUT/<cell name>.json`` (atomically) as soon as it is done,
and a grid run again reuses the cells whose saved configuration equals the one asked for, so an
interrupted grid resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from linattn._io import write_json
from linattn.recall.options import RecallConfig

__all__ = ["cell_name", "run_grid", "format_table", "load_cell"]


def cell_name(cfg: RecallConfig) -> str:
    """``<mixer>[-<feature map>]-d<d_model>-T<seq_len>-P<pairs>``: the cell's file stem."""
    fmap = f"-{cfg.feature_map}" if cfg.feature_map else ""
    return f"{cfg.mixer}{fmap}-d{cfg.d_model}-T{cfg.seq_len}-P{cfg.num_kv_pairs}"


def load_cell(path: Path, cfg: RecallConfig) -> dict | None:
    """The result saved at ``path`` if it was made with ``cfg``; None otherwise (missing,
    unreadable or another configuration)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("config") != cfg.to_dict():
        return None
    return saved


def run_grid(base: RecallConfig, mixers: Sequence[str], d_models: Sequence[int],
             out: str | Path | None = None, log: Callable[[str], None] | None = None
             ) -> list[dict]:
    """Every (mixer, d_model) cell of ``base`` (mixer names of
    :data:`~linattn.recall.options.MIXER_PRESETS`, optionally ``name:feature_map``, e.g.
    ``linear:taylor``); results in grid order, each saved under ``out`` when given."""
    from linattn.recall.harness import run_cell

    results = []
    for mixer in mixers:
        name, _, fmap = mixer.partition(":")
        for d in d_models:
            cfg = dataclasses.replace(base, mixer=name, d_model=d, feature_map=fmap or None)
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


def _row(r: dict[str, Any]) -> list[str]:
    c = r["config"]
    fmap = f" ({c['feature_map']})" if c.get("feature_map") else ""
    return [f"{c['mixer']}{fmap}", f"({c['seq_len']}, {c['num_kv_pairs']})", str(c["d_model"]),
            f"{100 * r['test_acc']:.1f}",
            f"{r['state_bytes']:,}", f"{r['lr']:g}", f"{r['train_time_s']:.0f}",
            f"{r['sweep_time_s']:.0f}"]


def format_table(results: Iterable[dict]) -> str:
    """A Markdown table: mixer, (seq_len, pairs), d_model, test accuracy %, decoding state
    bytes, chosen lr, training seconds of the chosen run and of the whole sweep."""
    head = ["mixer", "(T, pairs)", "d_model", "test acc %", "state bytes", "lr", "train s",
            "sweep s"]
    rows = [head, ["---"] * len(head), *(_row(r) for r in results)]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)
