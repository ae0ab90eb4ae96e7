"""fla's 340M GLA and Gated DeltaNet on CPU (linattn.fla_models) beside a transformers Llama of
the same width and depth (issue 48). Shares benchmarks/models.py's profile and CPU report.

Models (random weights, no download):

* ``gla``: fla's ``gla_340M`` training config (flame's configs/gla_340M.json): hidden 1024, 24
  layers, 4 heads, expand_k 0.5 (K = 128), expand_v 1 (V = 256), MLP 2,816 (fla's rounding of
  hidden_ratio 4), vocabulary 32,000, untied head.
* ``gated_deltanet``: flame's configs/gated_deltanet_340M.json: hidden 1024, 21 layers, 6 heads
  of K = 256, expand_v 2 (V = 512), width-4 short convolutions, gated RMSNorm, MLP 2,816.
* ``llama``: transformers' LlamaForCausalLM with the same hidden size, depth (24 or 21 layers),
  MLP width and vocabulary, 16 heads of 64 (flame's transformer_340M), SDPA, its KV cache.

For each dtype (``--dtypes``) and thread count (``--threads``), in one process, the fla model
and its Llama interleaved (prefills alternating, decoding steps alternating):

* prefill of ``--prefill`` tokens (batch 1, the cache built, logits of the last position as
  ``generate`` asks): median of ``--repeats``;
* decode per token at each context of ``--contexts``: the context is *established by filling
  the caches with random states of the right size* (the recurrent states and convolution
  windows of the fla model, which do not grow; Llama's keys and values, C per layer), not by
  prefilling C tokens; median of ``--decode-tokens`` greedy steps;
* memory per context: the bytes of each cache (what grows with the context) and the process's
  peak resident memory after the run.

Then, on 1 thread, a profile of the prefill and of decoding steps at the first context, per
model (medians of three alternating rounds): recurrence (linattn's GLA / delta-rule kernels),
convolution (the short convolutions), gated norm (the mixers' RMSNorms, gated or not), LA other
(the mixers' remaining work), projections (every nn.Linear but the LM head), softmax layers
(Llama's attention, projections excluded), LM head, other. "LA own" = recurrence + convolution
+ gated norm: issue 48's target is at most 15 % of prefill-2048 and of decode.

Full grid (the coordinator's run, about an hour on 2 cores):
``python benchmarks/fla_models.py``; ``--quick``: one model (gla), float32, 1 thread, 4
layers, prefill 256, contexts 256 and 1,024.

Needs transformers (``pip install 'transformers>=5.23'``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import resource
import statistics
import sys
import time
from pathlib import Path

import torch


def _load_shared():
    """benchmarks/models.py (Profile, shares, prefill, cpu_name), loaded by path under a
    private name: the benchmarks folder is no package, and "models" is too common a name to
    put into sys.modules."""
    path = Path(__file__).resolve().with_name("models.py")
    spec = importlib.util.spec_from_file_location("_linattn_bench_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shared = _load_shared()

# ----------------------------------------------------------------------------- models

FLA_340M = {
    "gla": dict(hidden_size=1024, num_hidden_layers=24, num_heads=4, expand_k=0.5, expand_v=1,
                hidden_ratio=4, vocab_size=32000, tie_word_embeddings=False),
    "gated_deltanet": dict(hidden_size=1024, num_hidden_layers=21, num_heads=6, head_dim=256,
                           expand_v=2, conv_size=4, use_gate=True, use_short_conv=True,
                           hidden_ratio=4, vocab_size=32000, tie_word_embeddings=False),
}


def build_fla(name: str, layers: int | None, dtype: torch.dtype):
    from linattn.fla_models import MODELS

    config_cls, _, causal_cls = MODELS[name]
    kwargs = dict(FLA_340M[name])
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    torch.manual_seed(0)
    model = causal_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # decays that matter, not fla's near-neutral initial values
        for pname, p in model.named_parameters():
            if pname.endswith(("A_log", "dt_bias")):
                p.normal_(0.0, 0.5)
    return model.to(dtype)


def build_llama(fla_model, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    c = fla_model.config
    mlp = fla_model.model.layers[0].mlp.intermediate_size
    config = LlamaConfig(hidden_size=c.hidden_size, intermediate_size=mlp,
                         num_hidden_layers=c.num_hidden_layers, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=c.vocab_size,
                         max_position_embeddings=65536, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(dtype)


# ----------------------------------------------------------------------------- caches


def cache_bytes(cache) -> int:
    """Bytes of the tensors a cache holds (views of one tensor counted once)."""
    seen, total = set(), 0

    def add(x) -> None:
        nonlocal total
        if isinstance(x, torch.Tensor):
            key = x.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += x.untyped_storage().nbytes()
        elif isinstance(x, (tuple, list)):
            for y in x:
                add(y)
        elif isinstance(x, dict):
            for y in x.values():
                add(y)

    for layer in cache.layers:
        add(getattr(layer, "state", None))
        add(getattr(layer, "keys", None))
        add(getattr(layer, "values", None))
    return total


def context_cache(model, context: int, dtype: torch.dtype):
    """A cache as after ``context`` tokens, its contents random: an fla model's states (a
    2-token prefill's, refilled), a Llama's keys and values (``context`` per layer)."""
    gen = torch.Generator().manual_seed(context)
    if hasattr(model.model, "embeddings"):  # fla
        with torch.no_grad():
            cache = model(torch.randint(3, 1000, (1, 2), generator=gen),
                          use_cache=True).past_key_values
        for layer in cache.layers:
            state = layer.state
            rec = state["recurrent_state"]
            rec.copy_(0.05 * torch.randn(rec.shape, generator=gen))
            for conv in state["conv_state"] or ():
                conv.copy_(torch.randn(conv.shape, generator=gen))
            layer.seen = context
        return cache
    from transformers import DynamicCache

    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    cache = DynamicCache(config=c)
    for i in range(c.num_hidden_layers):
        k, v = (torch.randn(1, c.num_key_value_heads, context, head_dim, generator=gen,
                            dtype=torch.float32).to(dtype) for _ in range(2))
        cache.update(k, v, i)
    return cache


def step(model, token: torch.Tensor, cache):
    with torch.no_grad():
        out = model(token, past_key_values=cache, use_cache=True)
    return out.logits[:, -1:].argmax(-1)


# ----------------------------------------------------------------------------- timing


def interleaved_prefill(models: dict, ids: torch.Tensor, repeats: int) -> dict[str, float]:
    for m in models.values():  # warm: kernels, calibration, first allocations
        shared.prefill(m, ids[:, :64])
    times: dict[str, list[float]] = {n: [] for n in models}
    names = list(models)
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            out = shared.prefill(models[n], ids)
            times[n].append(time.perf_counter() - t0)
            del out
    return {n: statistics.median(t) for n, t in times.items()}


def interleaved_decode(models: dict, context: int, steps: int, dtype: torch.dtype
                       ) -> dict[str, tuple[float, int]]:
    """Per model (median step seconds, cache bytes) at ``context``."""
    caches = {n: context_cache(m, context, dtype) for n, m in models.items()}
    tokens = {n: torch.tensor([[5]]) for n in models}
    for n, m in models.items():  # warm
        tokens[n] = step(m, tokens[n], caches[n])
    times: dict[str, list[float]] = {n: [] for n in models}
    names = list(models)
    for r in range(steps):
        for n in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            tokens[n] = step(models[n], tokens[n], caches[n])
            times[n].append(time.perf_counter() - t0)
    return {n: (statistics.median(times[n]), cache_bytes(caches[n])) for n in models}


class FLAProfile(shared.Profile):
    """benchmarks/models.py's profile for linattn.fla_models (and a Llama): the recurrences are
    linattn's kernel calls (``_kernels.ops``), the convolution the ShortConvolution modules,
    the gated norm the mixers' RMSNorms."""

    def __init__(self, model) -> None:
        self.model = model
        self.own = shared.defaultdict(float)
        self.stack, self.undo = [], []

    def _category(self, name: str, module) -> str | None:
        from linattn.fla_models import layers, modules

        if isinstance(module, torch.nn.Linear):
            return "LM head" if name == "lm_head" else "projections"
        if isinstance(module, modules.ShortConvolution):
            return "convolution"
        if isinstance(module, (modules.FusedRMSNormGated, modules.RMSNorm)) and ".attn." in name:
            return "gated norm"
        if isinstance(module, layers.Attention) or type(module).__name__ == "LlamaAttention":
            return "softmax layers"
        if type(module).__module__.startswith(layers.__name__ + ".") and name.endswith(".attn"):
            return "LA other"
        return None

    def _functions(self) -> list[tuple[object, str, str]]:
        from linattn.fla_models._kernels import ops

        if not hasattr(self.model.model, "embeddings"):
            return []
        impl = ops.impl  # instance attributes shadow the methods while profiling
        return [(impl, name, "recurrence") for name in ("gla", "delta", "linear")]

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        from linattn.fla_models._kernels import ops

        for name in ("gla", "delta", "linear"):  # drop the instance attributes left behind
            ops.impl.__dict__.pop(name, None)


def profiled(models: dict, ids: torch.Tensor, context: int, steps: int, dtype: torch.dtype,
             rounds: int = 3) -> dict[str, tuple[dict, dict]]:
    runs: dict[str, tuple[list, list]] = {n: ([], []) for n in models}
    names = list(models)
    for r in range(rounds + 1):  # round 0 warms
        for n in names if r % 2 == 0 else names[::-1]:
            m = models[n]
            with FLAProfile(m) as p:
                out = shared.prefill(m, ids)
            del out
            cache, token = context_cache(m, context, dtype), torch.tensor([[5]])
            with FLAProfile(m) as d:
                for _ in range(steps):
                    token = step(m, token, cache)
            if r:
                runs[n][0].append(dict(p.own))
                runs[n][1].append(dict(d.own))
    return {n: (shared.shares(pre), shared.shares(dec)) for n, (pre, dec) in runs.items()}


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gla,gated_deltanet")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--contexts", default="2048,8192,32768")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=None,
                    help="depth of both models (default: the 340M configs' 24 / 21)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="gla, float32, 1 thread, 4 layers, prefill 256, contexts 256,1024")
    a = ap.parse_args(argv)
    if a.quick:
        a.models, a.dtypes, a.threads, a.layers = "gla", "float32", "1", 4
        a.prefill, a.contexts, a.decode_tokens, a.repeats = 256, "256,1024", 6, 1
    try:
        import transformers
    except ImportError:
        print("benchmarks/fla_models.py: needs transformers (pip install 'transformers>=5.23')",
              file=sys.stderr)
        return 2
    contexts = [int(x) for x in a.contexts.split(",")]
    print(f"CPU: {shared.cpu_name()}; torch {torch.__version__}; transformers "
          f"{transformers.__version__}; prefill median of {a.repeats}, decode median of "
          f"{a.decode_tokens} steps; decode contexts established by random cache contents "
          f"(fla: recurrent states and convolution windows; Llama: {contexts} random keys and "
          f"values per layer), not by prefilling")
    rows, profiles = [], []
    for name in a.models.split(","):
        for dtype_name in a.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            fla_model = build_fla(name, a.layers, dtype)
            models = {name: fla_model, "llama": build_llama(fla_model, dtype)}
            depth = fla_model.config.num_hidden_layers
            for threads in (int(x) for x in a.threads.split(",")):
                torch.set_num_threads(threads)
                ids = torch.randint(3, 1000, (1, a.prefill),
                                    generator=torch.Generator().manual_seed(1))
                pre = interleaved_prefill(models, ids, a.repeats)
                row = {"model": name, "layers": depth, "dtype": dtype_name,
                       "threads": threads, "prefill": pre, "decode": {}}
                for context in contexts:
                    row["decode"][context] = interleaved_decode(models, context,
                                                                a.decode_tokens, dtype)
                row["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
                rows.append(row)
                print_row(row)
                if threads == 1:
                    torch.set_num_threads(1)
                    for n, (p, d) in profiled(models, ids, contexts[0],
                                              min(a.decode_tokens, 8), dtype).items():
                        profiles.append((n, depth, dtype_name, p, d))
            del models, fla_model
    print()
    print_tables(rows, contexts)
    print()
    print(f"Where the time goes, 1 thread: a prefill of {a.prefill} tokens and decoding steps "
          f"at context {contexts[0]} (each part's own time, % of the total)")
    print()
    head = " | ".join(shared.PARTS)
    print(f"| model | layers | dtype | run | total | {head} | LA own |")
    print("|---|--:|---|---|--:|" + "--:|" * (len(shared.PARTS) + 1))
    for n, depth, dtype_name, p, d in profiles:
        for what, s in (("prefill", p), ("decode step", d)):
            cells = " | ".join(f"{100 * s[part]:.1f}" for part in shared.PARTS)
            own = 100 * sum(s[part] for part in shared.LA_OWN)
            print(f"| {n} | {depth} | {dtype_name} | {what} | {s['total']:.3f} s | {cells} | "
                  f"{own:.1f} |")
    return 0


def print_row(row: dict) -> None:
    name = row["model"]
    pre = row["prefill"]
    parts = [f"  {name} {row['dtype']} {row['threads']}t: prefill {pre[name]:.3f} s vs llama "
             f"{pre['llama']:.3f} s"]
    for context, res in row["decode"].items():
        parts.append(f"decode@{context} {1e3 * res[name][0]:.1f} vs {1e3 * res['llama'][0]:.1f}"
                     f" ms ({res['llama'][0] / res[name][0]:.2f}x)")
    print(", ".join(parts), file=sys.stderr, flush=True)


def print_tables(rows: list[dict], contexts: list[int]) -> None:
    head = " | ".join(f"decode @{c} (ms/token) | vs Llama" for c in contexts)
    print(f"| model | layers | dtype | threads | prefill (s) | Llama prefill (s) | {head} |")
    print("|---|--:|---|--:|--:|--:|" + "--:|--:|" * len(contexts))
    for row in rows:
        name, pre = row["model"], row["prefill"]
        cells = " | ".join(f"{1e3 * res[name][0]:.1f} | {res['llama'][0] / res[name][0]:.2f}x"
                           for res in row["decode"].values())
        print(f"| {name} | {row['layers']} | {row['dtype']} | {row['threads']} | "
              f"{pre[name]:.3f} | {pre['llama']:.3f} | {cells} |")
    print()
    print("Memory: cache bytes per context (what grows with the context), and the process's "
          "peak resident memory after each row")
    print()
    head = " | ".join(f"@{c} (MiB) | Llama @{c} (MiB)" for c in contexts)
    print(f"| model | dtype | threads | {head} | peak RSS (GiB) |")
    print("|---|---|--:|" + "--:|--:|" * len(contexts) + "--:|")
    for row in rows:
        name = row["model"]
        cells = " | ".join(f"{res[name][1] / 2**20:.1f} | {res['llama'][1] / 2**20:.1f}"
                           for res in row["decode"].values())
        print(f"| {name} | {row['dtype']} | {row['threads']} | {cells} | {row['rss']:.2f} |")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
