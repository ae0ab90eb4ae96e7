"""transformers' linear-attention models on CPU: transformers' own torch path against the same
model after ``linattn.hf.apply_linattn``, with a profile of where the time goes (issue 47).

Models (random weights, built from transformers' config classes; no download):

* ``qwen3_5``: a Qwen3.5-0.8B-like text model: hidden 1024, MLP 3584, 16 linear heads of
  K = V = 128 (Gated DeltaNet) with a width-4 short convolution and a gated RMSNorm, softmax
  layers of 8 query / 2 key-value heads of 256, vocabulary 248,320 (tied), every fourth layer
  softmax. ``--layers`` (default 8: 6 linear + 2 softmax; the 0.8B model has 24) scales the
  depth; every share in the profile is per layer type, so 8 layers show what 24 do.
* ``kimi_linear``: a KDA model of the same width: 16 KDA heads of 128, MLA softmax layers,
  a dense MLP, vocabulary 163,840, every fourth layer softmax.

For each model, dtype (``--dtypes``) and thread count (``--threads``), both paths run in this
one process on the same weights and inputs, interleaved (prefills alternating, then decoding
steps alternating step by step, each path from its own cache; :func:`compare`):

* prefill of each of ``--prefill`` tokens (batch 1, the model's forward with the cache, logits of
  the last position only, as ``generate`` asks), median of ``--repeats`` (one run from 8,192
  tokens); then ``--decode-tokens`` greedy tokens from that cache (the context is the
  prefill's length): tokens per second from the median step;
* decode at batch ``--batch`` (default 8) after a prefill of ``--batch-context`` tokens.

Then, on 1 thread, a profile of a prefill of ``--profile-tokens`` tokens and of
``--decode-tokens`` decoding steps, per path (medians of three rounds, the paths alternating):
each part's own time (nested parts subtracted), summed over layers: recurrence (the GDN / KDA
functions), convolution, gated norm, the linear-attention layers' other work (projections
excluded: reshapes, gates, l2 norms), projections (every nn.Linear but the LM head), softmax
layers (their own work, projections excluded), LM head, other (embeddings, RMSNorms, MLP
activations, residuals, the cache). "LA own" is recurrence +
convolution + gated norm: issue 47's target is at most 10 % of prefill-2048 and of decode.

Prints markdown tables with the CPU and ISA. The default grid (both models, float32 and
bfloat16, 1 and 2 threads, prefill 512 / 2,048 / 8,192) takes about an hour on a 2-core
machine; ``--quick`` runs a small one (one model, 1 thread, float32, 512 tokens).

Needs transformers (``pip install transformers>=5.23``).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

import linattn.hf as lh

# ----------------------------------------------------------------------------- models


def qwen3_5_config(layers: int):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        hidden_size=1024, intermediate_size=3584, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, vocab_size=248320, tie_word_embeddings=True,
        max_position_embeddings=32768)


def kimi_linear_config(layers: int):
    from transformers import KimiLinearConfig

    return KimiLinearConfig(
        hidden_size=1024, intermediate_size=3584, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=8, linear_num_heads=16, linear_head_dim=128,
        linear_conv_kernel_dim=4, kv_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, vocab_size=163840, tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(layers)],
        mlp_layer_types=["dense"] * layers, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=32768)


MODELS = {"qwen3_5": qwen3_5_config, "kimi_linear": kimi_linear_config}


def build(name: str, layers: int, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MODELS[name](layers)).eval()
    with torch.no_grad():  # decays that matter (the init leaves many gates near 0 or 1)
        for pname, p in model.named_parameters():
            if pname.endswith(("A_log", "dt_bias")):
                p.normal_(0.0, 0.5)
    return model.to(dtype)


# ----------------------------------------------------------------------------- timing


def prefill(model, ids: torch.Tensor):
    with torch.no_grad():
        return model(ids, use_cache=True, logits_to_keep=1)


def decode(model, out, steps: int) -> list[float]:
    """Greedy decoding from a prefill's output: each step's seconds."""
    times = []
    cache = out.past_key_values
    token = out.logits[:, -1:].argmax(-1)
    with torch.no_grad():
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return times


PATHS = ("transformers", "linattn")


def compare(model, ids: torch.Tensor, repeats: int, steps: int) -> dict[str, tuple[float, float]]:
    """Both paths side by side on the same weights and prompt, interleaved so that neither
    always runs after the other (what one leaves in the caches, the allocator and the OpenMP
    pool, the other pays for): ``repeats`` prefills each, alternating, then ``steps`` decoding
    steps each, alternating step by step from each path's own cache. Returns per path (median
    prefill seconds, median step seconds)."""
    for which in PATHS:  # warm: builds, calibrations, first allocations
        with path(model, which):
            prefill(model, ids[:, :64])
    prefills: dict[str, list[float]] = {w: [] for w in PATHS}
    state: dict[str, list] = {}
    for r in range(repeats):
        for which in PATHS if r % 2 == 0 else PATHS[::-1]:
            state.pop(which, None)  # free this path's last cache first
            with path(model, which):
                t0 = time.perf_counter()
                out = prefill(model, ids)
                prefills[which].append(time.perf_counter() - t0)
            state[which] = [out.past_key_values, out.logits[:, -1:].argmax(-1)]
            del out
    decodes: dict[str, list[float]] = {w: [] for w in PATHS}
    with torch.no_grad():
        for r in range(steps):
            for which in PATHS if r % 2 == 0 else PATHS[::-1]:
                cache, token = state[which]
                with path(model, which):
                    t0 = time.perf_counter()
                    out = model(token, past_key_values=cache, use_cache=True)
                    decodes[which].append(time.perf_counter() - t0)
                state[which] = [out.past_key_values, out.logits[:, -1:].argmax(-1)]
    return {w: (statistics.median(prefills[w]), statistics.median(decodes[w])) for w in PATHS}


@contextlib.contextmanager
def path(model, name: str) -> Iterator[None]:
    """Run inside ``name``'s path: "transformers" (its torch fallbacks) or "linattn"."""
    lh.revert_linattn()
    if name == "linattn":
        lh.apply_linattn(model)
    try:
        yield
    finally:
        lh.revert_linattn()


# ----------------------------------------------------------------------------- profile
PARTS = ["recurrence", "convolution", "gated norm", "LA other", "projections", "softmax layers",
         "LM head", "other"]
LA_OWN = ("recurrence", "convolution", "gated norm")


class Profile:
    """Each timed part's own time (its nested parts subtracted), by category: forward hooks on
    modules, wrappers on the family's module-level functions. Inclusive times nest on a
    stack; the top level (the whole forward) is "other" for whatever no part claims."""

    def __init__(self, model, family: str):
        self.model, self.family = model, lh.FAMILIES[family]
        self.own: dict[str, float] = defaultdict(float)
        self.stack: list[list] = []  # [category, start, children's inclusive time]
        self.undo: list = []

    def _enter(self, category: str) -> None:
        self.stack.append([category, time.perf_counter(), 0.0])

    def _exit(self) -> None:
        category, start, children = self.stack.pop()
        inclusive = time.perf_counter() - start
        self.own[category] += inclusive - children
        if self.stack:
            self.stack[-1][2] += inclusive

    def _category(self, name: str, module) -> str | None:
        kind = type(module).__name__
        if isinstance(module, torch.nn.Linear):
            return "LM head" if name == "lm_head" else "projections"
        if kind.endswith(("GatedDeltaNet", "DeltaAttention", "ShortConv")):
            return "LA other"
        if kind.endswith("RMSNormGated"):
            return "gated norm"
        if kind.endswith("Attention"):
            return "softmax layers"
        return None

    def __enter__(self) -> Profile:
        for name, module in self.model.named_modules():
            category = self._category(name, module)
            if category is None:
                continue
            pre = module.register_forward_pre_hook(lambda *_, c=category: self._enter(c))
            post = module.register_forward_hook(lambda *_: self._exit())
            self.undo += [pre.remove, post.remove]
        for owner, fname, category in self._functions():
            fn = getattr(owner, fname)

            def timed(*args, _fn=fn, _c=category, **kwargs):
                self._enter(_c)
                try:
                    return _fn(*args, **kwargs)
                finally:
                    self._exit()

            setattr(owner, fname, timed)
            self.undo.append(lambda m=owner, n=fname, f=fn: setattr(m, n, f))
        self._enter("other")
        return self

    def _functions(self) -> list[tuple[object, str, str]]:
        """(owner, attribute, category) of each function timed by wrapping: here the family's
        module-level functions (benchmarks/fla_models.py times other ones)."""
        import importlib

        mod = importlib.import_module(self.family.module)
        return [(mod, fname, "convolution" if kind.startswith("conv") else "recurrence")
                for fname, kind in self.family.functions.items()]

    def __exit__(self, *exc) -> None:
        self._exit()
        for undo in reversed(self.undo):
            undo()

def shares(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each part's median own time over the runs, as a share of their sum (and the sum)."""
    own = {part: statistics.median(r.get(part, 0.0) for r in runs) for part in PARTS}
    total = sum(own.values())
    return {part: own[part] / total for part in PARTS} | {"total": total}


def profiled(model, family: str, ids: torch.Tensor, steps: int, rounds: int = 3
             ) -> dict[str, tuple[dict, dict]]:
    """Per path, the shares of a profiled prefill and of ``steps`` profiled decoding steps,
    medians over ``rounds`` rounds, the two paths alternating."""
    runs: dict[str, tuple[list, list]] = {w: ([], []) for w in PATHS}
    for r in range(rounds + 1):  # round 0 warms
        for which in PATHS if r % 2 == 0 else PATHS[::-1]:
            with path(model, which):
                with Profile(model, family) as p:
                    out = prefill(model, ids)
                with Profile(model, family) as d:
                    decode(model, out, steps)
                del out
            if r:
                runs[which][0].append(dict(p.own))
                runs[which][1].append(dict(d.own))
    return {w: (shares(pre), shares(dec)) for w, (pre, dec) in runs.items()}


# ----------------------------------------------------------------------------- main


def cpu_name() -> str:
    name = platform.processor()
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    flags = set()
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split())
                break
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_tile", "avx2") if f in flags]
    return f"{name} ({', '.join(isa) or 'no x86 vector flags'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3_5,kimi_linear")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill", default="512,2048,8192")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batch-context", type=int, default=512)
    ap.add_argument("--profile-tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="float32, 1 thread, prefill 512, profile 512, 4 layers")
    a = ap.parse_args(argv)
    if a.quick:
        a.dtypes, a.threads, a.prefill = "float32", "1", "512"
        a.profile_tokens, a.layers, a.decode_tokens, a.batch_context = 512, 4, 8, 128
        a.repeats = 1
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("benchmarks/models.py: needs transformers (pip install 'transformers>=5.23')",
              file=sys.stderr)
        return 2
    lengths = [int(x) for x in a.prefill.split(",")]
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; transformers "
          f"{transformers.__version__}; {a.layers} layers; median of {a.repeats} prefills, "
          f"{a.decode_tokens} decoding steps")
    rows, profiles = [], []
    for name in a.models.split(","):
        for dtype_name in a.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            model = build(name, a.layers, dtype)
            for threads in (int(x) for x in a.threads.split(",")):
                torch.set_num_threads(threads)
                gen = torch.Generator().manual_seed(1)
                for T in lengths:
                    ids = torch.randint(3, 1000, (1, T), generator=gen)
                    # one prefill each from 8,192 tokens (a minute and more on the fallback:
                    # its noise is small beside its length)
                    res = compare(model, ids, a.repeats if T < 8192 else 1, a.decode_tokens)
                    rows.append((name, dtype_name, threads, f"prefill {T} + decode b1",
                                 res["transformers"], res["linattn"]))
                    print_row(rows[-1], flush=True)
                ids = torch.randint(3, 1000, (a.batch, a.batch_context), generator=gen)
                res = compare(model, ids, 1, a.decode_tokens)
                rows.append((name, dtype_name, threads,
                             f"prefill {a.batch}x{a.batch_context} + decode b{a.batch}",
                             res["transformers"], res["linattn"]))
                print_row(rows[-1], flush=True)
                if threads == 1:
                    ids = torch.randint(3, 1000, (1, a.profile_tokens), generator=gen)
                    for which, (pre, dec) in profiled(model, name, ids,
                                                      a.decode_tokens).items():
                        profiles.append((name, dtype_name, which, pre, dec))
            del model
    print()
    print_table(rows)
    print()
    print_profiles(profiles, a.profile_tokens)
    return 0


def print_row(row, flush=False) -> None:
    name, dtype, threads, what, (pt, ps), (lt, ls) = row
    batch = int(what.rsplit("b", 1)[1])
    print(f"  {name} {dtype} {threads}t {what}: prefill {pt:.3f} s -> {lt:.3f} s "
          f"({pt / lt:.2f}x), decode {batch / ps:.1f} -> {batch / ls:.1f} tokens/s "
          f"({ps / ls:.2f}x)",
          file=sys.stderr, flush=flush)


def print_table(rows) -> None:
    print("| model | dtype | threads | run | prefill transformers (s) | prefill linattn (s) | "
          "ratio | decode transformers (tok/s) | decode linattn (tok/s) | ratio |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|--:|")
    for name, dtype, threads, what, (pt, ps), (lt, ls) in rows:
        batch = int(what.rsplit("b", 1)[1])
        print(f"| {name} | {dtype} | {threads} | {what} | {pt:.3f} | {lt:.3f} | {pt / lt:.2f}x | "
              f"{batch / ps:.1f} | {batch / ls:.1f} | {ps / ls:.2f}x |")


def print_profiles(profiles, tokens: int) -> None:
    print(f"Where the time goes, 1 thread: a prefill of {tokens} tokens and decoding steps "
          "(each part's own time, % of the total)")
    print()
    head = " | ".join(PARTS)
    print(f"| model | dtype | path | run | total | {head} | LA own |")
    print("|---|---|---|---|--:|" + "--:|" * (len(PARTS) + 1))
    for name, dtype, which, pre, dec in profiles:
        for what, s in (("prefill", pre), ("decode", dec)):
            cells = " | ".join(f"{100 * s[p]:.1f}" for p in PARTS)
            own = 100 * sum(s[p] for p in LA_OWN)
            print(f"| {name} | {dtype} | {which} | {what} | {s['total']:.3f} s | {cells} | "
                  f"{own:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
