"""``linattn lm train|generate``: a byte-level language model on the Python standard library.

``train`` fits :class:`~linattn.nn.LinearTransformerLM` with the token mixer of
``--attention`` (the kinds of :data:`linattn.nn.mixers.MIXERS`: decayed linear attention, the
softmax baseline with a KV cache, the sliding-window hybrid, Gated DeltaNet) on the ``.py``
source of the running interpreter's standard library — a corpus every machine with Python has
offline. Every 10th file is held out for validation; the figure reported is validation bits
per byte (= bits per character for this almost entirely ASCII text). Training stops at
``--steps`` or after ``--max-time`` seconds of training (evaluation excluded), whichever comes
first, so two models can be given the same wall time. The checkpoint ``OUT/checkpoint.pt`` is
written atomically every ``--checkpoint-every`` seconds, at the end and on Ctrl-C;
``--resume`` continues it to the result of an uninterrupted run. ``generate`` streams sampled
text to the terminal token by token.

This module only parses the options, calls the library (:mod:`linattn.lm`: the corpus, the
training loop, checkpoints, generation) and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from linattn.cli import UserError
from linattn.nn.mixers import DEFAULT_WINDOW, MIXERS  # torch-free

# torch and the library are imported inside the functions: every `linattn` command builds this
# parser, and the light ones (`linattn solve`, `--help`) should not pay for importing torch.

DEFAULT_OUT = "runs/lm"

#: parsed names that are not options of the library's configurations
_NOT_OPTIONS = {"command", "action", "func", "out", "model"}


def _user_error(err: Exception, args: argparse.Namespace) -> UserError:
    """The library's one-line error, its leading option names (``window: ...``,
    ``steps, max_time: ...``) spelled as this command's flags (``--window: ...``)."""
    msg = str(err)
    head, sep, rest = msg.partition(": ")
    names = head.split(", ")
    options = set(vars(args)) - _NOT_OPTIONS
    if sep and all(n in options for n in names):
        msg = ", ".join("--" + n.replace("_", "-") for n in names) + sep + rest
    return UserError(msg)


# -- train ---------------------------------------------------------------------------------------
def train(args: argparse.Namespace) -> int:
    import torch

    from linattn.lm.training import TrainConfig, Trainer
    from linattn.nn.lm import LMConfig
    from linattn.train_loop import CheckpointError, Stopped

    if args.threads:
        torch.set_num_threads(args.threads)

    def stop_after(loop) -> None:  # the tests' stand-in for Ctrl-C
        if loop.step == args.stop_after:
            loop.request_stop()

    try:
        model_config = LMConfig(
            vocab_size=256, d_model=args.d_model, num_layers=args.num_layers,
            num_heads=args.num_heads, feature_map=args.feature_map, dropout=args.dropout,
            attention=args.attention, chunk_size=args.chunk_size, window=args.window)
        train_config = TrainConfig(**{k: getattr(args, k) for k in (
            "context", "batch_size", "lr", "weight_decay", "warmup", "steps", "max_time",
            "seed", "val_tokens", "eval_every", "corpus_bytes")})
        trainer = Trainer(model_config, train_config, out=args.out, resume=args.resume,
                          checkpoint_every=args.checkpoint_every, progress=not args.quiet,
                          on_step=stop_after)
    except FileExistsError:
        raise UserError(f"{args.out} already holds a run; pass --resume or choose a new "
                        "--out") from None
    except (ValueError, FileNotFoundError) as err:  # CheckpointError is a ValueError
        raise _user_error(err, args) from None
    info = trainer.corpus_info
    print(f"corpus: {info['files']} stdlib files of Python {info['python']}, "
          f"{info['train_bytes']:,} train / {info['val_bytes']:,} val bytes; "
          f"model: {args.attention}, {trainer.model.num_parameters():,} parameters",
          file=sys.stderr)
    try:
        result = trainer.run()
    except Stopped:
        print(f"saved {trainer.checkpoint_path} at step {trainer.loop.step}; continue with "
              "--resume", file=sys.stderr)
        raise
    except CheckpointError as err:
        raise UserError(str(err)) from None
    print(json.dumps({k: result[k] for k in ("attention", "val_bpc", "parameters",
                                             "train_time_s", "steps")}))
    return 0


# -- generate ------------------------------------------------------------------------------------
def generate(args: argparse.Namespace) -> int:
    import torch

    from linattn.lm.generation import generate_text, load_model
    from linattn.train_loop import CheckpointError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, _ = load_model(Path(args.model))
        pieces = generate_text(model, args.prompt, args.max_new_tokens, args.temperature,
                               args.top_k, args.seed)
    except (CheckpointError, ValueError) as err:
        raise _user_error(err, args) from None
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm", help="train and sample the byte-level language model",
                       description=__doc__.split("\n\n")[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    t = actions.add_parser("train", help="train on the standard library's source")
    t.add_argument("--out", default=DEFAULT_OUT, help="run folder (default: %(default)s)")
    t.add_argument("--attention", choices=tuple(MIXERS), default=next(iter(MIXERS)),
                   help="the token mixer: " + "; ".join(
                       f"{name}: {spec.summary}" for name, spec in MIXERS.items()))
    takes = {opt: "/".join(k for k, s in MIXERS.items() if opt in s.options)
             for opt in ("window", "feature_map")}
    t.add_argument("--window", type=int, help=f"{takes['window']} only: exact-softmax window "
                                              f"(default {DEFAULT_WINDOW})")
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--num-layers", "--layers", dest="num_layers", type=int, default=4)
    t.add_argument("--num-heads", "--heads", dest="num_heads", type=int, default=4)
    t.add_argument("--feature-map", default="elu",
                   help=f"{takes['feature_map']} only: φ (default: %(default)s)")
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--chunk-size", type=int,
                   help="causal chunk length (default: linattn.ops.dispatch.DEFAULT_CHUNK_SIZE)")
    t.add_argument("--context", type=int, default=256, help="training window (default 256)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--warmup", type=int, default=30, help="warm-up steps")
    t.add_argument("--steps", type=int, help="stop after this many steps")
    t.add_argument("--max-time", type=float, help="stop after this many training seconds")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--corpus-bytes", type=int, default=4_000_000)
    t.add_argument("--val-tokens", type=int, default=65_536, help="validation bytes scored")
    t.add_argument("--eval-every", type=int, default=100, help="steps between validations")
    t.add_argument("--checkpoint-every", type=float, default=60.0, help="seconds")
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--threads", type=int, help="torch threads (default: torch's default)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--stop-after", type=int, help=argparse.SUPPRESS)  # tests: Ctrl-C at step N
    t.set_defaults(func=train)
    g = actions.add_parser("generate", help="stream sampled text from a trained model")
    g.add_argument("--model", default=DEFAULT_OUT, help="run folder (default: %(default)s)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=300)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int)
    g.set_defaults(func=generate)
    p.set_defaults(func=lambda args: p.print_help() or 0)
