"""``linattn lm train|generate``: a byte-level language model on the Python standard library.

``train`` fits :class:`~linattn.nn.LinearTransformerLM` (or, with ``--attention softmax``, the
same model with SDPA attention and a KV cache; with ``--attention hybrid``, exact softmax over
a sliding window of ``--window`` tokens plus linear attention before it; with ``--attention
gated_delta``, Gated DeltaNet layers) on the ``.py`` source
of the running interpreter's standard library — a corpus every machine with Python has offline.
Every 10th file is held out for validation; the figure reported is validation bits per byte
(= bits per character for this almost entirely ASCII text). Training stops at ``--steps`` or after
``--max-time`` seconds of training (evaluation excluded), whichever comes first, so two models
can be given the same wall time. Training runs on :class:`~linattn.train_loop.TrainLoop`: the
checkpoint ``OUT/checkpoint.pt`` is written atomically every ``--checkpoint-every`` seconds, at
the end and on Ctrl-C; ``--resume`` continues it to the result of an uninterrupted run.
``generate`` streams sampled text to the terminal token by token.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import math
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from linattn.cli import UserError
from linattn.train_loop import CHECKPOINT_FILE, CheckpointError, Stopped, TrainLoop, first_line

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions: every `linattn` command builds this parser, and the
# light ones (`linattn solve`, `--help`) should not pay for importing torch.

DEFAULT_OUT = "runs/lm"
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}


# -- the corpus --------------------------------------------------------------------------------
def stdlib_corpus(max_bytes: int = 4_000_000, root: str | None = None) -> tuple[bytes, bytes, dict]:
    """(train, val, info): the stdlib's ``*.py`` files (tests and site-packages excluded) in
    sorted order, whole files until ``max_bytes``; file i goes to val when i % 10 == 9."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in base.rglob("*.py")
                   if not SKIP_DIRS.intersection(p.relative_to(base).parts[:-1]))
    train, val, total, used = [], [], 0, 0
    for i, p in enumerate(files):
        try:
            data = p.read_bytes() + b"\n"
        except OSError:
            continue
        if total + len(data) > max_bytes and total:
            break
        (val if i % 10 == 9 else train).append(data)
        total += len(data)
        used += 1
    tr, va = b"".join(train), b"".join(val)
    if not tr or not va:
        raise UserError(f"no Python source found under {base}")
    info = {"root": str(base), "python": sys.version.split()[0], "files": used,
            "train_bytes": len(tr), "val_bytes": len(va),
            "sha256": hashlib.sha256(tr + va).hexdigest()[:16]}
    return tr, va, info


def _tensor(b: bytes) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


# -- checkpoints ---------------------------------------------------------------------------------
def load_model(path: Path):
    """The model stored in a run folder (or a checkpoint file), in eval mode, and the
    checkpoint dict."""
    import torch

    from linattn.nn import LinearTransformerLM

    f = path / CHECKPOINT_FILE if path.is_dir() else path
    try:
        ck = torch.load(f, weights_only=True)
        # the loop's checkpoints keep the configuration under "meta"; earlier ones at the top
        model = LinearTransformerLM(**ck.get("meta", ck)["model_config"])
        model.load_state_dict(ck["model"])
    except (OSError, KeyError, RuntimeError, EOFError, TypeError, ValueError,
            AttributeError) as err:
        raise UserError(f"{f}: cannot load a model ({first_line(err)})") from None
    return model.eval(), ck


def evaluate(model, val: torch.Tensor, context: int, max_tokens: int, batch: int = 32) -> float:
    """Bits per byte over non-overlapping windows of ``context`` targets (first ``max_tokens``
    of the validation text); every window starts from an empty state, as in training."""
    import torch

    with torch.no_grad():
        return _evaluate(model, val, context, max_tokens, batch)


def _evaluate(model, val: torch.Tensor, context: int, max_tokens: int, batch: int) -> float:
    import torch
    import torch.nn.functional as F

    was = model.training
    model.eval()
    n = max(1, min(len(val) - 1, max_tokens) // context)
    starts = torch.arange(n) * context
    total, count = 0.0, 0
    for i in range(0, n, batch):
        idx = starts[i : i + batch, None] + torch.arange(context + 1)
        w = val[idx]
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train(was)
    return total / count / math.log(2)


# -- train ---------------------------------------------------------------------------------------
class LMTraining(TrainLoop):
    """The language model's loop: step s trains on ``batch_size`` random windows of
    ``context + 1`` bytes drawn by a generator seeded by (seed, s), so a resumed run draws the
    same data; warm-up then cosine decay to 10 % over the budget (steps, training seconds or
    the first of both); validation every ``eval_every`` steps."""

    # the budget and the evaluation cadence may change to extend a run
    FREE = ("steps", "max_time", "eval_every")

    def __init__(self, model, args: argparse.Namespace, train_ids: torch.Tensor,
                 val_ids: torch.Tensor, meta: dict) -> None:
        import torch

        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                      weight_decay=args.weight_decay, betas=(0.9, 0.95))
        self.timed = args.steps is None  # the bar counts seconds
        super().__init__(
            model, optimizer, clip=1.0, checkpoint_dir=args.out,
            checkpoint_every=args.checkpoint_every, metrics_path=Path(args.out) / "metrics.jsonl",
            meta=meta, progress=not args.quiet, desc=f"lm {args.attention}",
            bar_total=int(args.max_time) if self.timed else args.steps,
            bar_unit="s" if self.timed else "step",
            on_step=self._stop_after)
        self.args, self.train_ids, self.val_ids = args, train_ids, val_ids
        self.loss_ema: float | None = None

    def _stop_after(self, loop: TrainLoop) -> None:  # the tests' stand-in for Ctrl-C
        if self.step == self.args.stop_after:
            self.request_stop()

    def budget_used(self) -> float:
        """Fraction of the budget used (drives the cosine schedule)."""
        a = self.args
        fr = [self.step / a.steps] if a.steps else []
        if a.max_time:
            fr.append(self.elapsed / a.max_time)
        return min(1.0, max(fr))

    def finished(self) -> bool:
        return self.budget_used() >= 1.0

    def learning_rate(self) -> float:
        a = self.args
        warm = min(1.0, (self.step + 1) / a.warmup)
        return a.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * self.budget_used())))

    def loss(self) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        a = self.args
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + self.step)
        starts = torch.randint(0, len(self.train_ids) - a.context - 1, (a.batch_size,),
                               generator=g)
        w = self.train_ids[starts[:, None] + torch.arange(a.context + 1)]
        logits = self.model(w[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())

    def after_step(self, loss: torch.Tensor) -> dict | None:
        value = loss.item()
        self.loss_ema = value if self.loss_ema is None else 0.95 * self.loss_ema + 0.05 * value
        if self.step % self.args.eval_every:
            return None
        bpc = evaluate(self.model, self.val_ids, self.args.context, self.args.val_tokens)
        return {"step": self.step, "time_s": round(self.elapsed, 2),
                "train_bpc": self.loss_ema / math.log(2), "val_bpc": bpc}

    def extra_state(self) -> dict:
        return {"loss_ema": self.loss_ema}

    def load_extra_state(self, state: dict) -> None:
        self.loss_ema = state["loss_ema"]

    def check_meta(self, saved: dict, path: Path) -> None:
        def fixed(meta: dict) -> dict:
            train = meta.get("train_config")
            if isinstance(train, dict):
                train = {k: v for k, v in train.items() if k not in self.FREE}
            return {**meta, "train_config": train}

        if fixed(saved) != fixed(self.meta):
            raise CheckpointError(f"{path}: made with other options or another corpus; "
                                  "use the same options or a new --out")

    def bar_position(self) -> int:
        return int(self.elapsed) if self.timed else self.step  # whole seconds on a timed bar

    def postfix(self) -> dict:
        bpc = float("nan") if self.loss_ema is None else self.loss_ema / math.log(2)
        return {"bpc": f"{bpc:.3f}", "step": self.step}

    def describe(self, record: dict) -> str:
        return (f"step {record['step']} ({record['time_s']:.0f} s): "
                f"val {record['val_bpc']:.4f} bits/byte")


@contextmanager
def flushed_denormals() -> Iterator[None]:
    """Flush subnormal floats to 0 inside the block (this thread's FTZ/DAZ), then restore.

    Subnormals (e.g. exp of scores ~90 below a row's max) run through microcode on x86: they
    made the softmax baseline's SDPA backward 2–3× slower at context 4,096 (docs/lm.md).
    Flushing changes values below 1.2e-38 only. Restored on exit: the mode is process state,
    and Python's own float parsing obeys it."""
    import torch

    was_on = (torch.tensor(2e-38, dtype=torch.float32) / 4).item() == 0.0  # 5e-39: subnormal
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was_on)


def train(args: argparse.Namespace) -> int:
    import torch

    from linattn._io import write_json
    from linattn.nn import LinearTransformerLM
    from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    ck_path = out / CHECKPOINT_FILE
    if ck_path.exists() and not args.resume:
        raise UserError(f"{out} already holds a run; pass --resume or choose a new --out")
    if args.resume and not ck_path.exists():
        raise UserError(f"--resume: no checkpoint in {out}")
    if args.steps is None and args.max_time is None:
        raise UserError("give --steps, --max-time or both")
    out.mkdir(parents=True, exist_ok=True)
    tr_b, va_b, info = stdlib_corpus(args.corpus_bytes)
    train_ids, val_ids = _tensor(tr_b), _tensor(va_b)
    chunk_size = DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
    model_config = dict(vocab_size=256, d_model=args.d_model, num_layers=args.num_layers,
                        num_heads=args.num_heads, feature_map=args.feature_map,
                        dropout=args.dropout, attention=args.attention, chunk_size=chunk_size)
    if args.window is not None:
        if args.attention != "hybrid":
            raise UserError("--window: only with --attention hybrid")
        if args.window < 1:
            raise UserError(f"--window: expected a positive integer, got {args.window}")
        model_config["window"] = args.window
    train_config = {k: getattr(args, k) for k in (
        "context", "batch_size", "lr", "weight_decay", "warmup", "steps", "max_time", "seed",
        "val_tokens", "eval_every", "corpus_bytes")}
    torch.manual_seed(args.seed)
    model = LinearTransformerLM(**model_config)
    loop = LMTraining(model, args, train_ids, val_ids, {
        "model_config": model_config, "train_config": train_config, "corpus": info})
    if args.resume:
        try:
            loop.load_checkpoint()
        except CheckpointError as err:
            raise UserError(str(err)) from None
    n_params = model.num_parameters()
    print(f"corpus: {info['files']} stdlib files of Python {info['python']}, "
          f"{info['train_bytes']:,} train / {info['val_bytes']:,} val bytes; "
          f"model: {args.attention}, {n_params:,} parameters", file=sys.stderr)
    try:
        with flushed_denormals():
            loop.run()
    except Stopped:
        print(f"saved {ck_path} at step {loop.step}; continue with --resume", file=sys.stderr)
        raise
    bpc = evaluate(model, val_ids, args.context, args.val_tokens)
    result = {"attention": args.attention, "val_bpc": round(bpc, 4), "parameters": n_params,
              "train_time_s": round(loop.elapsed, 1), "steps": loop.step,
              "tokens_seen": loop.step * args.batch_size * args.context, "threads":
              torch.get_num_threads(), "model": model_config, "train": train_config,
              "corpus": info}
    write_json(out / "result.json", result)
    print(json.dumps({k: result[k] for k in ("attention", "val_bpc", "parameters",
                                             "train_time_s", "steps")}))
    return 0


# -- generate ------------------------------------------------------------------------------------
def generate(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(Path(args.model))
    prompt = args.prompt.encode("utf-8")
    if not prompt:
        raise UserError("--prompt: give at least one character")
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for tok in model.stream(ids, args.max_new_tokens, args.temperature, args.top_k, g):
        sys.stdout.write(dec.decode(bytes([int(tok[0])])))
        sys.stdout.flush()
    sys.stdout.write(dec.decode(b"", final=True) + "\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm", help="train and sample the byte-level language model",
                       description=__doc__.split("\n\n")[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    t = actions.add_parser("train", help="train on the standard library's source")
    t.add_argument("--out", default=DEFAULT_OUT, help="run folder (default: %(default)s)")
    t.add_argument("--attention", choices=("linear", "softmax", "hybrid", "gated_delta"),
                   default="linear",
                   help="linear (recurrent state), softmax (SDPA baseline), hybrid (exact "
                        "softmax over the last --window tokens, linear attention before them) "
                        "or gated_delta (Gated DeltaNet: the gated delta rule)")
    t.add_argument("--window", type=int, help="hybrid only: exact-softmax window (default 64)")
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--num-layers", "--layers", dest="num_layers", type=int, default=4)
    t.add_argument("--num-heads", "--heads", dest="num_heads", type=int, default=4)
    t.add_argument("--feature-map", default="elu")
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
