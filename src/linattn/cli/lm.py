"""``linattn lm train|generate``: a byte-level language model on the Python standard library.

``train`` fits :class:`~linattn.nn.LinearTransformerLM` (or, with ``--attention softmax``, the
same model with SDPA attention and a KV cache) on the ``.py`` source of the running
interpreter's standard library — a corpus every machine with Python has offline. Every 10th file
is held out for validation; the figure reported is validation bits per byte (= bits per
character for this almost entirely ASCII text). Training stops at ``--steps`` or after
``--max-time`` seconds of training (evaluation excluded), whichever comes first, so two models
can be given the same wall time. A checkpoint is written atomically every
``--checkpoint-every`` seconds, at the end and on Ctrl-C; ``--resume`` continues it.
``generate`` streams sampled text to the terminal token by token.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import math
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from linattn._io import atomic_path
from linattn.cli import UserError

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
def save_atomic(obj: dict, path: Path) -> None:
    """torch.save into a temp file in the same folder, then rename (never half-written)."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def load_model(path: Path):
    """The model stored in a run folder (or a checkpoint file), in eval mode."""
    import torch

    from linattn.nn import LinearTransformerLM

    f = path / "checkpoint.pt" if path.is_dir() else path
    try:
        ck = torch.load(f, weights_only=True)
        model = LinearTransformerLM(**ck["model_config"])
        model.load_state_dict(ck["model"])
    except (OSError, KeyError, RuntimeError, EOFError, TypeError, ValueError) as err:
        raise UserError(f"{f}: cannot load a model ({str(err).splitlines()[0]})") from None
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
def train(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from linattn.nn import LinearTransformerLM
    from linattn.tsc.training import write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    ck_path = out / "checkpoint.pt"
    if ck_path.exists() and not args.resume:
        raise UserError(f"{out} already holds a run; pass --resume or choose a new --out")
    if args.resume and not ck_path.exists():
        raise UserError(f"--resume: no checkpoint in {out}")
    if args.steps is None and args.max_time is None:
        raise UserError("give --steps, --max-time or both")
    out.mkdir(parents=True, exist_ok=True)
    tr_b, va_b, info = stdlib_corpus(args.corpus_bytes)
    train_ids, val_ids = _tensor(tr_b), _tensor(va_b)
    model_config = dict(vocab_size=256, d_model=args.d_model, num_layers=args.layers,
                        num_heads=args.heads, feature_map=args.feature_map,
                        dropout=args.dropout, attention=args.attention,
                        chunk_size=args.chunk_size)
    train_config = {k: getattr(args, k) for k in (
        "context", "batch_size", "lr", "weight_decay", "warmup", "steps", "max_time", "seed",
        "val_tokens", "eval_every", "corpus_bytes")}
    torch.manual_seed(args.seed)
    model = LinearTransformerLM(**model_config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            betas=(0.9, 0.95))
    step, elapsed, history = 0, 0.0, []
    if args.resume:
        ck = torch.load(ck_path, weights_only=True)
        # the budget (steps, max_time) and the evaluation cadence may change to extend a run
        free = ("steps", "max_time", "eval_every")
        same = {k: v for k, v in ck["train_config"].items() if k not in free} == \
            {k: v for k, v in train_config.items() if k not in free}
        if ck["model_config"] != model_config or not same or ck["corpus"] != info:
            raise UserError(f"{ck_path}: made with other options or another corpus; "
                            "use the same options or a new --out")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        step, elapsed, history = ck["step"], ck["elapsed"], json.loads(ck["history"])

    def save() -> None:
        save_atomic({"model_config": model_config, "train_config": train_config,
                     "corpus": info, "model": model.state_dict(), "optimizer": opt.state_dict(),
                     "torch_rng": torch.get_rng_state(), "step": step, "elapsed": elapsed,
                     "history": json.dumps(history)}, ck_path)

    def progress() -> float:  # fraction of the budget used: drives the cosine schedule
        fr = [step / args.steps] if args.steps else []
        if args.max_time:
            fr.append(elapsed / args.max_time)
        return min(1.0, max(fr))

    stop = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *a: stop.set()) if main else None
    n_params = model.num_parameters()
    print(f"corpus: {info['files']} stdlib files of Python {info['python']}, "
          f"{info['train_bytes']:,} train / {info['val_bytes']:,} val bytes; "
          f"model: {args.attention}, {n_params:,} parameters", file=sys.stderr)
    timed = args.steps is None
    bar = tqdm(total=int(args.max_time) if timed else args.steps,
               initial=int(elapsed) if timed else step, unit="s" if timed else "step",
               desc=f"lm {args.attention}", dynamic_ncols=True, disable=args.quiet)
    model.train()
    last_save = time.perf_counter()
    loss_ema = None
    interrupted = False
    try:
        while progress() < 1.0:
            t0 = time.perf_counter()
            p = progress()
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.45 * (1 + math.cos(
                math.pi * p)))
            for group in opt.param_groups:
                group["lr"] = lr
            # batch b of step s depends on (seed, s) only: a resumed run draws the same data
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            starts = torch.randint(0, len(train_ids) - args.context - 1, (args.batch_size,),
                                   generator=g)
            w = train_ids[starts[:, None] + torch.arange(args.context + 1)]
            logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            dt = time.perf_counter() - t0
            elapsed += dt
            loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
            bar.update(int(elapsed) - bar.n if timed else 1)  # whole seconds on the bar
            bar.set_postfix(bpc=f"{loss_ema / math.log(2):.3f}", step=step, refresh=False)
            if step % args.eval_every == 0:
                bpc = evaluate(model, val_ids, args.context, args.val_tokens)
                history.append({"step": step, "time_s": round(elapsed, 2),
                                "train_bpc": loss_ema / math.log(2), "val_bpc": bpc})
                with open(out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(history[-1]) + "\n")
                bar.write(f"step {step} ({elapsed:.0f} s): val {bpc:.4f} bits/byte")
            if stop.is_set() or step == args.stop_after:  # Ctrl-C (or its test stand-in)
                interrupted = True
                break
            if time.perf_counter() - last_save > args.checkpoint_every:
                save()
                last_save = time.perf_counter()
    finally:
        bar.close()
        if main:
            signal.signal(signal.SIGINT, previous)
    save()
    if interrupted:
        print(f"saved {ck_path} at step {step}; continue with --resume", file=sys.stderr)
        raise KeyboardInterrupt
    bpc = evaluate(model, val_ids, args.context, args.val_tokens)
    result = {"attention": args.attention, "val_bpc": round(bpc, 4), "parameters": n_params,
              "train_time_s": round(elapsed, 1), "steps": step,
              "tokens_seen": step * args.batch_size * args.context, "threads":
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
    t.add_argument("--attention", choices=("linear", "softmax"), default="linear",
                   help="linear (recurrent state) or softmax (SDPA baseline)")
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--feature-map", default="elu")
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--chunk-size", type=int, default=64)
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
