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
training loop, checkpoints, generation) and prints. The flags are parsed with the library's own
declarations (:data:`linattn.nn.mixers.CONFIG_CHECKS`, :mod:`linattn.lm.options`), and the
whole configuration is checked before torch is imported: a bad option fails at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from linattn._config import POSITIVE_INT, THREADS
from linattn.cli import UserError, describe_os_error, path_arg, probe_output_dir, start_work
from linattn.lm.options import (  # torch-free
    CHECKPOINT_EVERY,
    GENERATE_CHECKS,
    SIZE_DEFAULTS,
    TRAIN_CHECKS,
    check_generate,
    check_train_config,
    check_training_memory,
)
from linattn.nn.mixers import (  # torch-free
    CONFIG_CHECKS,
    DEFAULT_WINDOW,
    MIXERS,
    check_config,
    check_positions,
)

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


#: The model's flags (LMConfig fields) and the training flags (TrainConfig fields).
_MODEL = ("d_model", "num_layers", "num_heads", "feature_map", "dropout", "attention",
          "chunk_size", "window", "short_conv")
_TRAIN = tuple(TRAIN_CHECKS)


# -- train ---------------------------------------------------------------------------------------
def train(args: argparse.Namespace) -> int:
    # the whole configuration first, torch-free: the flags' ranges were checked while parsing,
    # what depends on several flags (a budget, the kind's options, d_model / num_heads) here
    model = {"vocab_size": 256, **{k: getattr(args, k) for k in _MODEL}}
    train = {k: getattr(args, k) for k in _TRAIN}
    try:
        check_config(model)
        check_train_config(train)
        check_training_memory(model, train)  # absurd sizes, before anything is allocated
        check_positions(args.attention, args.context, "context")  # cosFormer's horizon
    except ValueError as err:
        raise _user_error(err, args) from None
    out = Path(args.out)
    if (out / "checkpoint.pt").exists() and not args.resume:
        raise UserError(f"{args.out} already holds a run; pass --resume or choose a new --out")
    if args.resume and not (out / "checkpoint.pt").exists():
        raise UserError(f"--resume: no checkpoint in {args.out}")
    probe_output_dir(out, "--out")

    from linattn._io import FolderInUseError
    from linattn.lm.training import TrainConfig, Trainer
    from linattn.nn.lm import LMConfig
    from linattn.train_loop import Stopped

    def stop_after(loop) -> None:  # the tests' stand-in for Ctrl-C
        if loop.step == args.stop_after:
            loop.request_stop()

    try:
        trainer = Trainer(LMConfig(**model), TrainConfig(**train), out=args.out,
                          resume=args.resume, checkpoint_every=args.checkpoint_every,
                          progress=not args.quiet, on_step=stop_after)
    except FolderInUseError as err:  # another `lm train --out` at work there
        raise UserError(f"--out: {describe_os_error(err)}") from None
    except FileExistsError:
        raise UserError(f"{args.out} already holds a run; pass --resume or choose a new "
                        "--out") from None
    except (ValueError, FileNotFoundError) as err:  # CheckpointError is a ValueError
        raise _user_error(err, args) from None
    start_work(args.threads)  # every check done (the corpus's too): now the warnings, if any
    info = trainer.corpus_info
    if not args.quiet:
        print(f"corpus: {info['files']} stdlib files of Python {info['python']}, "
              f"{info['train_bytes']:,} train / {info['val_bytes']:,} val bytes; "
              f"model: {args.attention}, {trainer.model.num_parameters():,} parameters",
              file=sys.stderr)
    try:
        result = trainer.run()  # a divergence (NonFiniteError) is one line from linattn.cli
    except Stopped:
        print(f"saved {trainer.checkpoint_path} at step {trainer.loop.step}; continue with "
              "--resume", file=sys.stderr)
        raise
    print(json.dumps({k: result[k] for k in ("attention", "val_bpc", "parameters",
                                             "train_time_s", "steps")}))
    return 0


# -- generate ------------------------------------------------------------------------------------
def generate(args: argparse.Namespace) -> int:
    if not args.prompt:
        raise UserError("--prompt: give at least one character")
    try:
        check_generate({k: getattr(args, k) for k in GENERATE_CHECKS})
    except ValueError as err:
        raise _user_error(err, args) from None

    from linattn.lm.generation import generate_text, load_model
    from linattn.train_loop import CheckpointError

    try:
        model, _ = load_model(Path(args.model))
        pieces = generate_text(model, args.prompt, args.max_new_tokens, args.temperature,
                               args.top_k, args.seed)
    except CheckpointError:
        raise  # one line from linattn.cli, naming the file
    except ValueError as err:
        raise _user_error(err, args) from None
    start_work(args.threads)  # every check done: now the warnings, if any
    # a full disk or a reader that left (`| head`): linattn.cli's guarded stdout
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    try:  # the generator runs here: an error of the model's is still one line
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except ValueError as err:
        sys.stdout.write("\n")
        raise _user_error(err, args) from None
    sys.stdout.write("\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm", help="train and sample the byte-level language model",
                       description=__doc__.split("\n\n")[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    t = actions.add_parser("train", help="train on the standard library's source")
    t.add_argument("--out", default=DEFAULT_OUT, type=path_arg,
                   help="run folder (default: %(default)s)")
    t.add_argument("--attention", choices=tuple(MIXERS), default=next(iter(MIXERS)),
                   help="the token mixer: " + "; ".join(
                       f"{name}: {spec.summary}" for name, spec in MIXERS.items()))
    takes = {opt: "/".join(k for k, s in MIXERS.items() if opt in s.options)
             for opt in ("window", "feature_map")}
    m, c, gen = CONFIG_CHECKS, TRAIN_CHECKS, GENERATE_CHECKS  # each flag's type and range
    t.add_argument("--window", type=m["window"].parse,
                   help=f"{takes['window']} only: exact-softmax window (default {DEFAULT_WINDOW})")
    t.add_argument("--short-conv", type=m["short_conv"].parse,
                   default=SIZE_DEFAULTS["short_conv"],
                   help="token-shift width over the embeddings (default 0: none)")
    t.add_argument("--d-model", type=m["d_model"].parse, default=SIZE_DEFAULTS["d_model"])
    t.add_argument("--num-layers", "--layers", dest="num_layers", type=m["num_layers"].parse,
                   default=SIZE_DEFAULTS["num_layers"])
    t.add_argument("--num-heads", "--heads", dest="num_heads", type=m["num_heads"].parse,
                   default=4)
    t.add_argument("--feature-map", default="elu", type=m["feature_map"].parse,
                   help=f"{takes['feature_map']} only: φ, one of "
                        f"{', '.join(m['feature_map'].choices)} (default: %(default)s)")
    t.add_argument("--dropout", type=m["dropout"].parse, default=0.0)
    t.add_argument("--chunk-size", type=m["chunk_size"].parse,
                   help="causal chunk length (default: linattn.ops.dispatch.DEFAULT_CHUNK_SIZE)")
    t.add_argument("--context", type=c["context"].parse, default=SIZE_DEFAULTS["context"],
                   help="training window (default 256)")
    t.add_argument("--batch-size", type=c["batch_size"].parse,
                   default=SIZE_DEFAULTS["batch_size"])
    t.add_argument("--lr", type=c["lr"].parse, default=2e-3)
    t.add_argument("--weight-decay", type=c["weight_decay"].parse, default=0.01)
    t.add_argument("--warmup", type=c["warmup"].parse, default=30, help="warm-up steps")
    t.add_argument("--steps", type=c["steps"].parse, help="stop after this many steps")
    t.add_argument("--max-time", type=c["max_time"].parse,
                   help="stop after this many training seconds")
    t.add_argument("--seed", type=c["seed"].parse, default=0)
    t.add_argument("--corpus-bytes", type=c["corpus_bytes"].parse, default=4_000_000)
    t.add_argument("--val-tokens", type=c["val_tokens"].parse, default=65_536,
                   help="validation bytes scored")
    t.add_argument("--eval-every", type=c["eval_every"].parse, default=100,
                   help="steps between validations")
    t.add_argument("--checkpoint-every", type=CHECKPOINT_EVERY.parse, default=60.0,
                   help="seconds")
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--threads", type=THREADS.parse,
                   help="torch threads (default: torch's default; capped at the CPUs available)")
    t.add_argument("--quiet", action="store_true", help="no progress bar, no corpus line")
    t.add_argument("--stop-after", type=POSITIVE_INT.parse,
                   help=argparse.SUPPRESS)  # tests: Ctrl-C at step N
    t.set_defaults(func=train)
    g = actions.add_parser("generate", help="stream sampled text from a trained model")
    g.add_argument("--model", default=DEFAULT_OUT, help="run folder (default: %(default)s)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=gen["max_new_tokens"].parse, default=300)
    g.add_argument("--temperature", type=gen["temperature"].parse, default=0.8,
                   help="0: greedy (default: %(default)s)")
    g.add_argument("--top-k", type=gen["top_k"].parse, default=None)
    g.add_argument("--seed", type=gen["seed"].parse, default=0)
    g.add_argument("--threads", type=THREADS.parse,
                   help="torch threads (default: torch's default; capped at the CPUs available)")
    g.set_defaults(func=generate)
    p.set_defaults(func=lambda args: p.print_help() or 0)
