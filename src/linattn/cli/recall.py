"""``linattn recall train|table``: multi-query associative recall (MQAR) on CPU.

``train`` trains one 2-layer language model (``--mixer``: a kind of the LM's mixer registry or
a named combination, see :data:`linattn.recall.options.MIXER_PRESETS`) on Zoology's MQAR with
a learning-rate sweep chosen on a validation split, and writes ``OUT/result.json``: test
accuracy, decoding state bytes, training time. ``table`` runs a grid of mixers × widths (one
JSON per cell in ``--out``, reused when run again) and prints the table.

This module only parses, calls :mod:`linattn.recall` and prints. Every flag is parsed with the
harness's own declarations (:data:`linattn.recall.options.RECALL_CHECKS`) and the whole
configuration is checked before torch is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from linattn.cli import UserError, describe_os_error, path_arg, probe_output_dir, start_work
from linattn.recall.options import (  # torch-free
    DEFAULT_LRS,
    MIXER_PRESETS,
    RECALL_CHECKS,
    TABLE_MIX,
    RecallConfig,
    check_cell_memory,
)

#: parsed names → RecallConfig fields (the rest are the command's own)
_FIELDS = {"mixer": "mixer", "feature_map": "feature_map", "window": "window",
           "decay": "decay", "d_model": "d_model", "num_layers": "num_layers",
           "num_heads": "num_heads",
           "seq_len": "seq_len", "pairs": "num_kv_pairs", "vocab_size": "vocab_size",
           "power_a": "power_a", "train_examples": "train_examples",
           "val_examples": "val_examples", "test_examples": "test_examples",
           "epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "lrs": "lrs",
           "weight_decay": "weight_decay", "stop_at": "stop_at", "seed": "seed",
           "threads": "threads", "short_conv": "short_conv", "mlp_dim": "mlp_dim",
           "train_mix": "train_mix", "eval_at": "eval_at"}


def _list_of(check_name: str) -> Callable[[str], list]:
    """argparse ``type=`` for a comma-separated list, each item parsed by a Check."""
    check = RECALL_CHECKS[check_name]

    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [check.parse(t) for t in items]
    return parse


def _shapes(size: int, what: str) -> Callable[[str], list[tuple[int, ...]]]:
    """argparse ``type=`` for comma-separated ``a:b[:c]`` integer tuples of ``size`` numbers;
    the shapes themselves are checked by :class:`RecallConfig`."""
    def parse(text: str) -> list[tuple[int, ...]]:
        out = []
        for item in (t.strip() for t in text.split(",") if t.strip()):
            parts = item.split(":")
            try:
                if len(parts) != size:
                    raise ValueError
                out.append(tuple(int(v) for v in parts))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected {what}, comma-separated, got {item!r}") from None
        return out
    return parse


def _mix_flag(mix: tuple[tuple[int, ...], ...]) -> str:
    """``train_mix`` as its flag: ``64:4:40000,128:8:20000``."""
    return ",".join(":".join(str(v) for v in m) for m in mix)


#: ``64:4:20000,128:8:10000``: ``train_mix``'s (seq_len, pairs, examples) triples.
parse_mix = _shapes(3, "seq_len:pairs:examples")
#: ``512:64``: ``eval_at``'s (seq_len, pairs).
parse_eval_at = _shapes(2, "seq_len:pairs")


def _mixer_list(text: str) -> list[str]:
    """``softmax,linear:taylor,...``: presets, each optionally with ``:feature_map``."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        name, _, fmap = item.partition(":")
        RECALL_CHECKS["mixer"].parse(name)
        if fmap:
            RECALL_CHECKS["feature_map"].parse(fmap)
        out.append(item.lower())
    if not out or not all(out):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return out


def _config(args: argparse.Namespace, **override) -> RecallConfig:
    """The RecallConfig of the flags; a bad combination is a UserError naming the flag."""
    values = {field: getattr(args, name) for name, field in _FIELDS.items()
              if hasattr(args, name)}
    values.update(override)
    if values.get("lrs") is None:
        values["lrs"] = DEFAULT_LRS
    try:
        cfg = RecallConfig(**values)
        check_cell_memory(cfg)  # absurd sizes, before anything is allocated
        return cfg
    except ValueError as err:
        msg = str(err)
        head, sep, rest = msg.partition(": ")
        flag = {v: k for k, v in _FIELDS.items()}.get(head)
        raise UserError(f"--{flag.replace('_', '-')}: {rest}" if sep and flag else msg
                        ) from None


def _capped_threads(args: argparse.Namespace) -> None:
    """``--threads`` capped at the CPUs available and the settings read (one warning line
    each, :func:`linattn.cli.start_work`), once everything else is checked: a user error is
    then the only line (the cells are made from ``args``)."""
    args.threads = start_work(args.threads, set_torch=False)


def _own(out: Path):
    """The run folder ``out``, owned (:class:`~linattn._io.FolderLock`) or a UserError naming
    --out when another run holds it."""
    from linattn._io import FolderInUseError, FolderLock

    try:
        return FolderLock(out)
    except FolderInUseError as err:
        raise UserError(f"--out: {describe_os_error(err)}") from None


def _log(args: argparse.Namespace) -> Callable[[str], None] | None:
    return None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def _refuse_a_run(out: Path, replace: bool) -> None:
    if (out / "result.json").exists() and not replace:
        raise UserError(f"--out: {out} already holds a run (result.json); pass --replace to "
                        "run it again or choose another folder")


def train(args: argparse.Namespace) -> int:
    _config(args)
    out = Path(args.out)
    _refuse_a_run(out, args.replace)
    probe_output_dir(out, "--out")
    from linattn._io import write_json

    with _own(out):  # the folder's one owner while the cell trains and writes
        # asked again under the lock: a run that finished into the folder meanwhile
        _refuse_a_run(out, args.replace)
        from linattn.recall.harness import run_cell

        _capped_threads(args)  # every check done (the folder's owner too): the warnings
        result = run_cell(_config(args), _log(args))
        write_json(out / "result.json", result)
    print(json.dumps({k: result[k] for k in ("test_acc", "val_acc", "lr", "state_bytes",
                                             "train_time_s", "sweep_time_s", "parameters",
                                             "eval_at")}))
    return 0


def table(args: argparse.Namespace) -> int:
    base = _config(args, mixer="softmax")
    for mixer in args.mixers:  # each cell's options checked before any training
        name, _, fmap = mixer.partition(":")
        for d in args.d_models:
            _config(args, mixer=name, feature_map=fmap or None, d_model=d)
    probe_output_dir(args.out, "--out")
    from linattn.recall.table import format_table, run_grid

    with _own(Path(args.out)):  # its cells are written (and reused) by one table at a time
        _capped_threads(args)  # every check done (the folder's owner too): the warnings
        base = _config(args, mixer="softmax")
        results = run_grid(base, args.mixers, args.d_models, args.out, _log(args),
                           seeds=args.seeds or None)
    print(f"MQAR seq_len {base.seq_len}, {base.num_kv_pairs} pairs, vocab {base.vocab_size}; "
          f"{base.train_examples} train examples x {base.epochs} epochs; "
          f"{results[0]['cpu']}, {base.threads} thread(s)")
    print(format_table(results))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    c = RECALL_CHECKS
    p.add_argument("--feature-map", type=c["feature_map"].parse,
                   help="φ of the kinds that take one (linear, hybrid)")
    p.add_argument("--window", type=c["window"].parse, help="the hybrid's softmax window")
    p.add_argument("--decay", type=_list_of("decay"),
                   help="per-head decays in (0, 1], comma-separated, one per head (linear, "
                        "softmax, hybrid; default: the LM's)")
    p.add_argument("--short-conv", type=c["short_conv"].parse, default=4,
                   help="token-shift width over the embeddings, 0 for none (default 4)")
    p.add_argument("--mlp-dim", type=c["mlp_dim"].parse, default=0,
                   help="hidden width of each layer's MLP, 0 for none (default 0, as Zoology's)")
    p.add_argument("--train-mix", type=parse_mix, default=list(TABLE_MIX),
                   help="more training sets of other shapes, trained on beside the cell's, "
                        "as seq_len:pairs:examples, comma-separated, '' for none (default "
                        f"{_mix_flag(TABLE_MIX)}: a mixture of short and long sequences, as "
                        "Zoology's); evaluation stays at --seq-len/--pairs")
    p.add_argument("--eval-at", type=parse_eval_at, default=[],
                   help="more seq_len:pairs settings, comma-separated, the trained model is "
                        "also tested at (e.g. 512:64)")
    p.add_argument("--num-layers", type=c["num_layers"].parse, default=2)
    p.add_argument("--num-heads", type=c["num_heads"].parse, default=2)
    p.add_argument("--seq-len", type=c["seq_len"].parse, default=256)
    p.add_argument("--pairs", type=c["num_kv_pairs"].parse, default=16,
                   help="key-value pairs per sequence (default 16)")
    p.add_argument("--vocab-size", type=c["vocab_size"].parse, default=8192)
    p.add_argument("--power-a", type=c["power_a"].parse, default=0.01,
                   help="power law of the query gaps (Zoology: 0.01)")
    p.add_argument("--train-examples", type=c["train_examples"].parse, default=20_000,
                   help="training examples at --seq-len/--pairs (default 20,000), besides "
                        "--train-mix")
    p.add_argument("--val-examples", type=c["val_examples"].parse, default=500)
    p.add_argument("--test-examples", type=c["test_examples"].parse, default=1_000)
    p.add_argument("--epochs", type=c["epochs"].parse, default=2)
    p.add_argument("--batch-size", type=c["batch_size"].parse, default=32)
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--lr", type=c["lr"].parse, help="one learning rate (no sweep)")
    rate.add_argument("--lr-sweep", dest="lrs", type=_list_of("lr"), nargs="?",
                      const=list(DEFAULT_LRS),
                      help="sweep these rates, comma-separated (the default: "
                           f"{','.join(f'{x:g}' for x in DEFAULT_LRS)}), keep the best on "
                           "validation")
    p.add_argument("--weight-decay", type=c["weight_decay"].parse, default=0.1)
    p.add_argument("--stop-at", type=c["stop_at"].parse, default=0.99,
                   help="stop a run once validation accuracy reaches this (default 0.99)")
    p.add_argument("--seed", type=c["seed"].parse, default=0)
    p.add_argument("--threads", type=c["threads"].parse, default=1,
                   help="torch threads per run (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recall", help="multi-query associative recall (MQAR) per mixer",
                       description=__doc__.split("\n\n")[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    mixers = "; ".join(MIXER_PRESETS)
    t = actions.add_parser("train", help="train and evaluate one mixer")
    t.add_argument("--mixer", type=RECALL_CHECKS["mixer"].parse, default="gated_delta",
                   help=f"one of {mixers} (default: %(default)s)")
    t.add_argument("--d-model", type=RECALL_CHECKS["d_model"].parse, default=64)
    t.add_argument("--out", required=True, type=path_arg, help="folder for result.json")
    t.add_argument("--replace", action="store_true",
                   help="run again into an --out that holds a result.json, replacing it")
    _common(t)
    t.set_defaults(func=train)
    g = actions.add_parser("table", help="a grid of mixers x d_model, printed as a table")
    g.add_argument("--mixers", type=_mixer_list, default=["softmax", "gated_delta", "linear"],
                   help=f"comma-separated, each one of {mixers}, optionally "
                        "with :feature_map (e.g. linear:taylor)")
    g.add_argument("--d-models", type=_list_of("d_model"), default=[64])
    g.add_argument("--seeds", type=_list_of("seed"),
                   help="comma-separated seeds, one cell each (default: --seed); the table "
                        "shows their mean and range")
    g.add_argument("--out", required=True, type=path_arg,
                   help="folder for one JSON per cell (reused)")
    _common(g)
    g.set_defaults(func=table)
    p.set_defaults(func=lambda args: p.print_help() or 0)
