"""Bits per byte on held-out text against the context a model is given at evaluation.

Issue 16 §3: does a byte-level model (``linattn lm train``) use the context it can hold? Trained
run folders (linear, hybrid, softmax, e.g. all trained at context 4096) are scored on the held-out
bytes of their own corpus at evaluation contexts 256 … 65,536.

Protocol (the same scored bytes for every context and every model):

* Text: the validation bytes of the run's corpus (``stdlib_corpus``, with the run's
  ``--corpus-bytes``; every run must have the same corpus hash), as one concatenation of the
  held-out files, so long contexts reach back into earlier files.
* Scored bytes: ``--scored-bytes`` N (default 16,384) in ``--blocks`` M (default 4) equal blocks
  of B = N / M contiguous bytes, spread evenly over ``[lo, len(text))`` with ``lo`` = the largest
  context evaluated (or less when the text is too short): every scored byte then has that many
  bytes before it, and the blocks sample several files rather than the end of one.
* Context c: each block is cut into segments of ``S = max(1, min(B, c // frac))`` bytes
  (``--segment-frac``, default 4). Segment [s, e) is scored from one window: the model reads
  ``text[a : e − 1]`` from an empty state, ``a = max(0, s − c)``, and its predictions of bytes
  s … e − 1 are scored. Byte p is predicted from exactly ``p − a`` preceding bytes: at least
  ``min(c, s)`` and at most ``min(c, s) + S − 1`` — between c and ``c·(1 + 1/frac)`` when enough
  text precedes it, and all of the text before it when not (the context is *clamped*; never here
  with the defaults). S = 1 would give exactly c bytes to every byte but cost N windows of c
  bytes (10⁹ tokens at 64k); the contexts are a factor 4 apart, so the ranges
  [c, 1.25 c) never overlap. The JSON records the min / mean / max preceding bytes per context
  and the bits per byte of each block.
* Windows go through the model in pieces with the returned state (prefill, then the next piece
  from that state): the chunked parallel form for linear and hybrid (O(L) time and memory), the
  KV cache for softmax (:func:`linattn.ops.decay_softmax.decay_softmax_attention`: blocks of
  queries through the flash kernel, never an (L, L) bias). Tested equal to one forward over the
  whole window (tests/benchmarks/test_lm_context.py).

Prints a markdown table (bits per byte by model × context, and evaluation seconds), writes the
results as JSON and a plot (skipped with a message when matplotlib is absent)::

    python benchmarks/lm_context.py --runs runs/lmctx/linear runs/lmctx/hybrid \\
        runs/lmctx/softmax --threads 1
    python benchmarks/lm_context.py --runs runs/lmctx/linear --contexts 256,1024  # quick look
    python benchmarks/lm_context.py --from-json runs/lmctx/context.json  # tables, plot again

Cost: linear and hybrid read every context in seconds (O(L)); softmax is O(L²): 34 s at 16k
and 8 minutes at 64k (4 windows of 69,631 tokens) on one loaded core of the machine of
docs/lm.md.
The JSON is rewritten after every cell, so a stopped run keeps what it finished
(``--from-json`` shows it, – for the missing cells).

The three runs of docs/lm.md (issue 16 §3), trained one after the other::

    linattn lm train --out runs/lmctx/linear  --attention linear  --context 4096 --batch-size 2 \\
        --max-time 780 --threads 1 --eval-every 50 --val-tokens 16384
    linattn lm train --out runs/lmctx/hybrid  --attention hybrid --window 64 (same options)
    linattn lm train --out runs/lmctx/softmax --attention softmax (same options)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from linattn._io import atomic_path, write_json
from linattn.lm import load_model, stdlib_corpus
from linattn.lm.training import flushed_denormals
from linattn.profiling import cpu_description

DEFAULT_CONTEXTS = (256, 1024, 4096, 16384, 65536)


# -- the protocol --------------------------------------------------------------------------------
def scored_blocks(n_text: int, n_scored: int, blocks: int, lo: int) -> list[tuple[int, int]]:
    """``blocks`` non-overlapping [start, end) blocks of ``n_scored // blocks`` bytes, spread
    evenly over [max(1, min(lo, n_text − n_scored)), n_text); the last ends at n_text. Byte 0
    is never scored (nothing precedes it)."""
    if blocks < 1 or n_scored < blocks:
        raise ValueError(f"need 1 <= blocks <= scored bytes, got {blocks}, {n_scored}")
    size = n_scored // blocks
    if size * blocks > n_text - 1:
        raise ValueError(f"{size * blocks} scored bytes do not fit in a text of {n_text}")
    first = max(1, min(lo, n_text - size * blocks))
    span = n_text - size - first  # room for the block starts
    starts = [first + (span * i) // max(1, blocks - 1) for i in range(blocks)]
    if blocks == 1:
        starts = [n_text - size]
    return [(s, s + size) for s in starts]


def segment_length(context: int, block: int, frac: int) -> int:
    """S: the bytes scored per window at evaluation context ``context``."""
    return max(1, min(block, context // frac))


def plan(blocks: list[tuple[int, int]], context: int, frac: int) -> list[tuple[int, int, int]]:
    """The windows for ``context``: (a, s, e) — the model reads text[a : e − 1] and scores bytes
    s … e − 1, each predicted from its p − a preceding bytes (a = max(0, s − context))."""
    if context < 1:
        raise ValueError(f"context: expected a positive integer, got {context}")
    out = []
    for start, end in blocks:
        seg = segment_length(context, end - start, frac)
        for s in range(start, end, seg):
            out.append((max(0, s - context), s, min(s + seg, end)))
    return out


def window_nll(model, x: torch.Tensor, targets: torch.Tensor, piece: int) -> torch.Tensor:
    """Negative log-likelihoods (nats, float64, (B, S)) of ``targets`` (B, S), the bytes that
    follow the last S positions of ``x`` (B, L): ``x`` read in pieces of ``piece`` tokens, each
    from the state the previous one returned (prefill, then continue)."""
    L, S = x.shape[1], targets.shape[1]
    state, parts = None, []
    for i in range(0, L, piece):
        logits, state = model(x[:, i:i + piece], state, return_state=True)
        keep = max(0, i + logits.shape[1] - max(i, L - S))  # logits of positions >= L − S
        if keep:
            parts.append(logits[:, -keep:])
    logits = torch.cat(parts, 1)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return nll.double().view_as(targets)


def score(model, text: torch.Tensor, blocks: list[tuple[int, int]], context: int, frac: int = 4,
          *, max_tokens: int = 65_536, piece: int = 4096) -> dict:
    """Score the bytes of ``blocks`` at ``context`` (module docstring). Returns a dict:
    ``positions`` (N,) int64 sorted, ``nll`` (N,) float64 nats, ``preceding`` (N,) int64 (the
    bytes each was predicted from), and ``bpb``. Windows of equal shape are batched (at most
    ``max_tokens`` tokens a batch), each window in pieces of ``piece`` tokens."""
    groups: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for a, s, e in plan(blocks, context, frac):
        groups.setdefault((s - a, e - s), []).append((a, s, e))
    pos, nll, pre = [], [], []
    with torch.no_grad():
        for (before, seg), wins in groups.items():
            L = before + seg - 1
            bs = max(1, max_tokens // L)
            for i in range(0, len(wins), bs):
                chunk = wins[i:i + bs]
                x = torch.stack([text[a:e - 1] for a, _, e in chunk])
                t = torch.stack([text[s:e] for _, s, e in chunk])
                nll.append(window_nll(model, x, t, piece).flatten())
                idx = torch.stack([torch.arange(s, e) for _, s, e in chunk])
                pos.append(idx.flatten())
                pre.append((idx - torch.tensor([a for a, _, _ in chunk])[:, None]).flatten())
    pos_t, nll_t, pre_t = torch.cat(pos), torch.cat(nll), torch.cat(pre)
    order = pos_t.argsort()
    nll_t = nll_t[order]
    return {"positions": pos_t[order], "nll": nll_t, "preceding": pre_t[order],
            "bpb": float(nll_t.mean() / math.log(2))}


# -- runs ------------------------------------------------------------------------------------------
def run_info(run: Path, ck: dict) -> dict:
    """What the run folder says about its training (result.json when the run finished)."""
    meta = ck.get("meta", {})
    info = {"run": str(run), "attention": meta.get("model_config", {}).get("attention"),
            "window": meta.get("model_config", {}).get("window"),
            "train_context": meta.get("train_config", {}).get("context")}
    res = run / "result.json"
    if res.is_file():
        r = json.loads(res.read_text())
        info.update({k: r.get(k) for k in ("steps", "train_time_s", "tokens_seen", "val_bpc",
                                           "parameters")})
    else:
        info["steps"] = ck.get("step")
    return info


def label(info: dict) -> str:
    att = info["attention"]
    return f"hybrid (w={info['window'] or 64})" if att == "hybrid" else att


def _cell(result: dict, context: int, key: str, fmt: str) -> str:
    cell = result["contexts"].get(str(context))
    return "–" if cell is None else fmt.format(cell[key])


def tables(results: list[dict], contexts: list[int]) -> str:
    """Two markdown tables: bits per byte, then evaluation seconds, by model × context (– where
    a cell was not run)."""
    head = " | ".join(f"{c:,}" for c in contexts)
    rule = " | ".join("---:" for _ in contexts)
    lines = [f"| model | steps | characters seen | {head} |", f"| --- | ---: | ---: | {rule} |"]
    for r in results:
        seen = r["info"].get("tokens_seen")
        cells = " | ".join(_cell(r, c, "bpb", "{:.3f}") for c in contexts)
        lines.append(f"| {label(r['info'])} | {r['info'].get('steps')} | "
                     f"{'' if seen is None else f'{seen / 1e6:.1f} M'} | {cells} |")
    lines += ["", f"| evaluation seconds | {head} |", f"| --- | {rule} |"]
    for r in results:
        cells = " | ".join(_cell(r, c, "seconds", "{:.1f}") for c in contexts)
        lines.append(f"| {label(r['info'])} | {cells} |")
    return "\n".join(lines)


def plot(results: list[dict], contexts: list[int], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dx) = plt.subplots(1, 2, figsize=(10, 4.0))
    for r, m in zip(results, "osd^v", strict=False):
        xs = [c for c in contexts if str(c) in r["contexts"]]
        ys = [r["contexts"][str(c)]["bpb"] for c in xs]
        name = f"{label(r['info'])}, {r['info'].get('steps')} steps"
        ax.plot(xs, ys, m + "-", label=name)
        if xs:
            dx.plot(xs, [y - ys[0] for y in ys], m + "-", label=name)
    train = {r["info"].get("train_context") for r in results}
    for a in (ax, dx):
        for c in sorted(t for t in train if t):
            a.axvline(c, color="grey", ls=":", lw=1)
            a.annotate(f"training context {c}", (c, 0.7), xycoords=("data", "axes fraction"),
                       ha="right", va="center", fontsize=8, color="grey", rotation=90)
        a.set_xscale("log", base=2)
        a.set_xticks(contexts, [f"{c // 1024}k" if c >= 1024 else str(c) for c in contexts])
        a.set_xlabel("bytes of context at evaluation")
        a.grid(alpha=0.3)
    ax.set_ylabel("held-out bits per byte")
    dx.set_ylabel(f"change from context {contexts[0]} (bits per byte)")
    dx.axhline(0, color="black", lw=0.8)
    dx.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", help="run folders of `linattn lm train`")
    ap.add_argument("--from-json", help="print the tables and redraw the plot of a saved JSON")
    ap.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)))
    ap.add_argument("--scored-bytes", type=int, default=16_384)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--segment-frac", type=int, default=4, help="S = context // frac")
    ap.add_argument("--max-tokens", type=int, default=65_536, help="tokens per batch")
    ap.add_argument("--piece", type=int, default=4096, help="tokens per forward call")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="runs/lmctx/context.json")
    ap.add_argument("--plot", default="docs/img/lm_context.png")
    args = ap.parse_args(argv)
    if args.from_json:
        out = json.loads(Path(args.from_json).read_text())
        return report(out["results"], out["protocol"]["contexts"], out["cpu"], Path(args.plot))
    if not args.runs:
        ap.error("give --runs or --from-json")
    torch.set_num_threads(args.threads)
    contexts = sorted(int(c) for c in args.contexts.split(","))
    models, corpus, corpus_bytes = [], None, None
    for run in map(Path, args.runs):
        model, ck = load_model(run)
        meta = ck.get("meta", {})
        if corpus is None:
            corpus, corpus_bytes = meta["corpus"], meta["train_config"]["corpus_bytes"]
        elif meta["corpus"]["sha256"] != corpus["sha256"]:
            raise SystemExit(f"{run}: trained on another corpus than {args.runs[0]}")
        models.append((model, run_info(run, ck)))
    _, val, info = stdlib_corpus(corpus_bytes)
    if info["sha256"] != corpus["sha256"]:
        raise SystemExit("this interpreter's stdlib gives another corpus than the runs'")
    text = torch.frombuffer(bytearray(val), dtype=torch.uint8).long()
    blocks = scored_blocks(len(text), args.scored_bytes, args.blocks, max(contexts))
    cpu = cpu_description()
    print(f"{len(text):,} held-out bytes; scored: {len(blocks)} blocks of "
          f"{blocks[0][1] - blocks[0][0]:,} bytes, {blocks}; CPU {cpu}, "
          f"{torch.get_num_threads()} thread(s)", file=sys.stderr)
    results = []
    out = {"protocol": {"scored_bytes": sum(e - s for s, e in blocks), "blocks": blocks,
                        "segment_frac": args.segment_frac, "contexts": contexts},
           "corpus": info, "cpu": cpu, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    for model, rinfo in models:
        row = {"info": rinfo, "contexts": {}}
        results.append(row)
        for c in contexts:
            t0 = time.perf_counter()
            with flushed_denormals():  # as in training: subnormals slow the softmax kernel
                r = score(model, text, blocks, c, args.segment_frac, max_tokens=args.max_tokens,
                          piece=args.piece)
            secs = time.perf_counter() - t0
            pre = r["preceding"].double()
            by_block = [round(float(r["nll"][(r["positions"] >= s) & (r["positions"] < e)]
                                    .mean() / math.log(2)), 5) for s, e in blocks]
            row["contexts"][str(c)] = {
                "bpb": round(r["bpb"], 5), "seconds": round(secs, 2),
                "scored": len(r["positions"]), "preceding_min": int(pre.min()),
                "preceding_mean": round(float(pre.mean()), 1), "preceding_max": int(pre.max()),
                "bpb_by_block": by_block, "load_average": round(os.getloadavg()[0], 2)}
            print(f"{label(rinfo)}: context {c}: {r['bpb']:.4f} bits/byte ({secs:.1f} s)",
                  file=sys.stderr)
            write_json(args.json, out)  # after every cell: a stopped run keeps what it did
    return report(results, contexts, cpu, Path(args.plot))


def report(results: list[dict], contexts: list[int], cpu: str, plot_path: Path) -> int:
    print(tables(results, contexts))
    plot(results, contexts, plot_path, f"byte-level LMs on held-out stdlib source; {cpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
