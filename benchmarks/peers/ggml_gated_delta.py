"""linattn's gated delta rule beside ggml's CPU ``ggml_gated_delta_net`` (the op llama.cpp runs
for Qwen3-Next), at the same shapes and thread counts, after a check that both compute the same
function on the same inputs (issue 25 §4).

What is compared (B=1, H=16, K=V=64, float32; ``--heads``, ``--dim``, ``--tokens`` change it):

* ggml: ``ggml_gated_delta_net(ctx, q, k, v, g, beta, state, 1)`` on the CPU backend, called
  here through ctypes (:class:`Ggml`, a few functions of ggml's C API, no other binding). Its
  q/k/v ``[S, H, T, B]`` are fla's (B, T, H, K) in memory, g and β ``[1, H, T, B]`` are
  (B, T, H), the state ``[S_v, S_v, H, B]`` is (B, H, V, K) (linattn's ``state_v_first``); the
  scale is fixed at 1/√V, g is a log gate, β is taken as given and there is no L2 norm inside
  (llama.cpp normalises q and k before calling the op). The graph (one node) is built once per
  shape and reused: the time is that of ``ggml_backend_graph_compute`` alone (graph plan, the
  thread dispatch — OpenMP in a default build, as llama.cpp's — and the op), no graph building,
  no copies in or out.
* linattn direct: :func:`linattn.delta_rule_step` (decode) and :func:`linattn.delta_rule`
  (prefill), head-first (B, H, T, K) tensors, state (B, H, K, V); for decode also with
  ``inplace=True`` (the new state written into the one given: what a decoder keeps, and like
  ggml's reused graph, no memory allocated for it per call).
* linattn's fla front door: :func:`linattn.fla.fused_recurrent_gated_delta_rule` (decode) and
  :func:`linattn.fla.chunk_gated_delta_rule` (prefill) in fla's (B, T, H, K) layout, fla's
  default state layout (B, H, K, V).

The check (first, on every thread count): q, k random and L2-normalised (the same normalised
tensors go to both sides, ``qk_l2norm=False``), v random, β = sigmoid(·) in (0, 1),
g = logsigmoid(· + 2) < 0, a nonzero initial state; ``--tokens`` tokens through ggml, through
``delta_rule``, through the front door (given the state in ggml's (V, K) layout with
``state_v_first=True``), and one token through ggml, ``delta_rule_step`` and
``fused_recurrent_gated_delta_rule``. It prints the max abs difference of the outputs and of
the final states from ggml's, each relative to the largest magnitude of that tensor, and each
side's error against a float64 run of ``delta_rule``. It fails (exit 1) when any float32 result
is further than ``TOL_ULPS`` = 128 float32 epsilons (relative, 2⁻¹⁶ ≈ 1.5e-5) from ggml's;
the agreement seen is ~3e-7, and a state passed in the wrong layout gives ~1.

Timings: interleaved rounds with the order rotating each round, so every call runs after a
different one and pays for what it left behind (caches, spinning OpenMP threads); one call
timed at a time, the median of ``--decode-rounds`` (decode: one token from a state) and of
``--prefill-rounds`` (prefill of ``--tokens`` tokens from a state) per method, after two warm-up
rounds. The thread counts (``--threads``, default 1,2) are set on both sides:
``torch.set_num_threads(n)`` and ``ggml_backend_cpu_set_n_threads(backend, n)``. Both run in
this one process, torch loaded first, so ggml's ``libgomp.so.1`` is torch's copy: one OpenMP
runtime, one pool of worker threads, its waiting policy the environment's (``OMP_WAIT_POLICY``
unset: spin a while, then sleep). Prints a markdown table with the CPU and the ratios
linattn / ggml and front door / linattn direct.

ggml lives outside this repository, in an environment of its own (like MiniRocket for
benchmarks/ucr.py): a build from source, found through ``--ggml DIR`` or ``LINATTN_GGML=DIR``
(a folder holding ``libggml-base.so`` and ``libggml-cpu.so``, or a ggml source tree or build
folder with them under ``build/src``, ``src``, ``lib`` or ``bin``). Without it the script says so
in one line and exits 2. The build the numbers in docs/bench-recurrences.md come from (ggml 0.21.0,
commit d99724f2, gcc 12.2, cmake 3.25, a default Release build: -march=native, OpenMP, shared
libraries; under a minute on 2 cores)::

    git clone https://github.com/ggml-org/ggml /tmp/ggml-src
    git -C /tmp/ggml-src checkout d99724f2b141fed9e1a9f402213506c081433465
    cmake -S /tmp/ggml-src -B /tmp/ggml-src/build -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
    cmake --build /tmp/ggml-src/build -j 2 --target ggml
    .venv/bin/python benchmarks/peers/ggml_gated_delta.py --ggml /tmp/ggml-src/build/src
    .venv/bin/python benchmarks/peers/ggml_gated_delta.py --ggml /tmp/ggml-src/build/src \\
        --check-only                                     # the check alone, a few seconds

(The PyPI bindings ``ggml-python`` 0.0.45 also declare ``ggml_gated_delta_net``, for the ggml
0.15.3 they vendor, but they build that ggml from source too; this script needs only the
libraries, so that build's ``libggml-*.so`` folder should serve as well, the signature being the
same; not tried: the numbers here are from the build above.)
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import statistics
import sys
import time
from pathlib import Path

ENV = "LINATTN_GGML"
LIBS = ("libggml-base.so", "libggml-cpu.so")
SUBDIRS = ("", "build/src", "build/bin", "src", "lib", "lib64", "bin")
TOL_ULPS = 2 ** 7  # the tolerance in float32 epsilons (2^-23 each): 2^-16 ≈ 1.5e-5 relative
GGML_TYPE_F32 = 0
PROG = "ggml_gated_delta.py"


def find_ggml(where: str | None) -> tuple[Path | None, str]:
    """The folder holding ggml's two libraries under ``where``, or None and why not (one line)."""
    if not where:
        return None, (f"{PROG}: no ggml given: pass --ggml DIR or set {ENV}=DIR (a ggml build "
                      "with libggml-base.so and libggml-cpu.so; build commands in the docstring)")
    root = Path(where).expanduser()
    if not root.exists():
        return None, f"{PROG}: ggml not found: {root} does not exist (--ggml / {ENV})"
    for sub in SUBDIRS:
        d = root / sub if sub else root
        if all((d / name).is_file() for name in LIBS):
            for name in LIBS:
                with open(d / name, "rb") as f:
                    if f.read(4) != b"\x7fELF":
                        return None, f"{PROG}: cannot use ggml in {d}: {name} is not an ELF library"
            return d, ""
    return None, (f"{PROG}: ggml not found: no {' and '.join(LIBS)} in {root} or its "
                  f"{', '.join(s for s in SUBDIRS if s)} (--ggml / {ENV})")


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class Ggml:
    """The dozen functions of ggml's C API this benchmark calls, through ctypes."""

    def __init__(self, libdir: Path):
        mode = getattr(os, "RTLD_GLOBAL", 0)
        # base first: libggml-cpu.so needs libggml-base.so.0, found loaded by its soname
        self.base = ctypes.CDLL(str(libdir / LIBS[0]), mode=mode)
        self.cpu = ctypes.CDLL(str(libdir / LIBS[1]), mode=mode)
        P, i64 = ctypes.c_void_p, ctypes.c_int64

        def fn(lib, name, res, *args):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, list(args)
            return f

        b = self.base
        self.init = fn(b, "ggml_init", P, _InitParams)
        self.free = fn(b, "ggml_free", None, P)
        self.new_tensor_4d = fn(b, "ggml_new_tensor_4d", P, P, ctypes.c_int, i64, i64, i64, i64)
        self.get_data = fn(b, "ggml_get_data", P, P)
        self.gated_delta_net = fn(b, "ggml_gated_delta_net", P, P, P, P, P, P, P, P, i64)
        self.new_graph = fn(b, "ggml_new_graph", P, P)
        self.build_forward_expand = fn(b, "ggml_build_forward_expand", None, P, P)
        self.tensor_overhead = fn(b, "ggml_tensor_overhead", ctypes.c_size_t)
        self.graph_overhead = fn(b, "ggml_graph_overhead", ctypes.c_size_t)
        self.graph_compute = fn(b, "ggml_backend_graph_compute", ctypes.c_int, P, P)
        self.backend_free = fn(b, "ggml_backend_free", None, P)
        self.cpu_init = fn(self.cpu, "ggml_backend_cpu_init", P)
        self.set_n_threads = fn(self.cpu, "ggml_backend_cpu_set_n_threads", None, P,
                                ctypes.c_int)
        try:
            self.version = (fn(b, "ggml_version", ctypes.c_char_p)().decode() + " commit "
                            + fn(b, "ggml_commit", ctypes.c_char_p)().decode())
        except AttributeError:
            self.version = "unknown version"
        self.backend = self.cpu_init()
        if not self.backend:
            raise OSError("ggml_backend_cpu_init returned NULL")

    def threads(self, n: int) -> None:
        self.set_n_threads(self.backend, n)


class GatedDeltaNet:
    """One ``ggml_gated_delta_net`` graph for (B, T, H, K=V), its tensors in a ggml context of
    their own and seen from torch without copies: ``q k v`` (B, T, H, K), ``g beta`` (B, T, H),
    ``state`` (B, H, V, K); after :meth:`compute`, ``out`` (B, T, H, V) and ``final``
    (B, H, V, K)."""

    def __init__(self, gg: Ggml, B: int, T: int, H: int, K: int):
        import torch

        self.gg = gg
        n_data = 4 * (3 * B * T * H * K + 2 * B * T * H + B * H * K * K
                      + B * H * K * (T + K))
        size = n_data + 16 * gg.tensor_overhead() + gg.graph_overhead() + (1 << 20)
        self.ctx = gg.init(_InitParams(size, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init({size}) returned NULL")
        new = lambda *ne: gg.new_tensor_4d(self.ctx, GGML_TYPE_F32, *ne)  # noqa: E731
        t = {"q": new(K, H, T, B), "k": new(K, H, T, B), "v": new(K, H, T, B),
             "g": new(1, H, T, B), "beta": new(1, H, T, B), "state": new(K, K, H, B)}
        res = gg.gated_delta_net(self.ctx, t["q"], t["k"], t["v"], t["g"], t["beta"],
                                 t["state"], 1)
        self.graph = gg.new_graph(self.ctx)
        gg.build_forward_expand(self.graph, res)

        def view(ptr, shape, offset=0):
            n = math.prod(shape)
            buf = (ctypes.c_float * n).from_address(gg.get_data(ptr) + 4 * offset)
            return torch.frombuffer(buf, dtype=torch.float32).view(shape)

        shapes = {"q": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, K), "g": (B, T, H),
                  "beta": (B, T, H), "state": (B, H, K, K)}
        self.inputs = {name: view(t[name], shapes[name]) for name in t}
        self.out = view(res, (B, T, H, K))
        self.final = view(res, (B, H, K, K), offset=B * T * H * K)

    def load(self, **tensors) -> None:
        for name, x in tensors.items():
            self.inputs[name].copy_(x)

    def compute(self) -> None:
        rc = self.gg.graph_compute(self.gg.backend, self.graph)
        if rc != 0:
            raise RuntimeError(f"ggml_backend_graph_compute returned status {rc}")

    def close(self) -> None:
        if self.ctx:
            self.gg.free(self.ctx)
            self.ctx = None


def make_inputs(B: int, T: int, H: int, K: int, seed: int):
    """fla-layout float32 inputs: q, k L2-normalised (B, T, H, K), v, β ∈ (0, 1), g < 0 (B, T, H),
    and a nonzero state (B, H, K, V)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = F.normalize(r(B, T, H, K), dim=-1)
    k = F.normalize(r(B, T, H, K), dim=-1)
    v = r(B, T, H, K)
    beta = torch.sigmoid(r(B, T, H))
    g = F.logsigmoid(r(B, T, H) + 2.0)
    state = r(B, H, K, K) / math.sqrt(K)
    return q, k, v, beta, g, state


def head_first(x):
    """(B, T, H, ...) → contiguous (B, H, T, ...)."""
    return x.transpose(1, 2).contiguous()


def _rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def check(gg: Ggml, B: int, T: int, H: int, K: int, threads: int) -> list[tuple[str, float]]:
    """ggml against linattn on the same inputs; the (label, relative max abs difference) rows."""
    import torch

    import linattn
    import linattn.fla as fla

    scale = K ** -0.5
    q, k, v, beta, g, s0 = make_inputs(B, T, H, K, seed=1 + threads)
    s0_vk = s0.transpose(-1, -2).contiguous()
    rows = []
    with torch.no_grad():
        net = GatedDeltaNet(gg, B, T, H, K)
        net.load(q=q, k=k, v=v, g=g, beta=beta, state=s0_vk)
        net.compute()
        o_g, s_g = net.out.clone(), net.final.transpose(-1, -2).clone()  # state → (K, V)
        net.close()
        hf = [head_first(x) for x in (q, k, v, beta, g)]
        o_l, s_l = linattn.delta_rule(*hf, scale=scale, initial_state=s0,
                                      return_state=True, qk_l2norm=False)
        o_l = o_l.transpose(1, 2)
        o_d, s_d = linattn.delta_rule(*[x.double() for x in hf], scale=scale,
                                      initial_state=s0.double(), return_state=True,
                                      qk_l2norm=False)
        o_d = o_d.transpose(1, 2)
        o_f, s_f = fla.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale,
                                              initial_state=s0_vk, output_final_state=True,
                                              state_v_first=True)
        s_f = s_f.transpose(-1, -2)
        rows += [(f"prefill {T}: output, linattn.delta_rule vs ggml", _rel(o_l, o_g)),
                 (f"prefill {T}: final state, linattn.delta_rule vs ggml", _rel(s_l, s_g)),
                 (f"prefill {T}: output, fla.chunk_gated_delta_rule vs ggml", _rel(o_f, o_g)),
                 (f"prefill {T}: final state, fla.chunk_gated_delta_rule vs ggml",
                  _rel(s_f, s_g)),
                 (f"prefill {T}: output, ggml vs float64 delta_rule", _rel(o_g, o_d)),
                 (f"prefill {T}: output, linattn.delta_rule vs float64", _rel(o_l, o_d)),
                 (f"prefill {T}: final state, ggml vs float64", _rel(s_g, s_d)),
                 (f"prefill {T}: final state, linattn.delta_rule vs float64", _rel(s_l, s_d))]

        net = GatedDeltaNet(gg, B, 1, H, K)
        one = [x[:, :1] for x in (q, k, v, g, beta)]
        net.load(q=one[0], k=one[1], v=one[2], g=one[3], beta=one[4], state=s0_vk)
        net.compute()
        o_g, s_g = net.out[:, 0].clone(), net.final.transpose(-1, -2).clone()
        net.close()
        o_s, s_s = linattn.delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], s0,
                                           g_t=g[:, 0], scale=scale, qk_l2norm=False)
        o_r, s_r = fla.fused_recurrent_gated_delta_rule(
            one[0], one[1], one[2], g=one[3], beta=one[4], scale=scale, initial_state=s0,
            output_final_state=True)
        rows += [("decode step: output, linattn.delta_rule_step vs ggml", _rel(o_s, o_g)),
                 ("decode step: state, linattn.delta_rule_step vs ggml", _rel(s_s, s_g)),
                 ("decode step: output, fla.fused_recurrent_gated_delta_rule vs ggml",
                  _rel(o_r[:, 0], o_g)),
                 ("decode step: state, fla.fused_recurrent_gated_delta_rule vs ggml",
                  _rel(s_r, s_g))]
    return rows


def interleaved(calls: dict, rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds of each call, timed one at a time in rounds whose order rotates."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    times = {name: [] for name in names}
    clock = time.perf_counter
    for r in range(rounds):
        i = r % len(names)
        for name in names[i:] + names[:i]:
            f = calls[name]
            t0 = clock()
            f()
            times[name].append(clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(gg: Ggml, B: int, T: int, H: int, K: int, threads: int, decode_rounds: int,
          prefill_rounds: int) -> dict[str, dict[str, float]]:
    import torch

    import linattn
    import linattn.fla as fla

    torch.set_num_threads(threads)
    gg.threads(threads)
    scale = K ** -0.5
    q, k, v, beta, g, s0 = make_inputs(B, T, H, K, seed=100 + threads)
    s0_vk = s0.transpose(-1, -2).contiguous()
    out = {}
    with torch.no_grad():
        # decode: one token from the state s0, the same every call
        net1 = GatedDeltaNet(gg, B, 1, H, K)
        one = [x[:, :1].contiguous() for x in (q, k, v, g, beta)]
        net1.load(q=one[0], k=one[1], v=one[2], g=one[3], beta=one[4], state=s0_vk)
        qt, kt, vt, bt, gt = (x[:, 0].contiguous() for x in (q, k, v, beta, g))
        s_kept = s0.clone()  # the state a decoder keeps, updated in place (evolving, bounded)
        out["decode"] = interleaved({
            "ggml": net1.compute,
            "linattn": lambda: linattn.delta_rule_step(qt, kt, vt, bt, s0, g_t=gt, scale=scale,
                                                       qk_l2norm=False),
            "in place": lambda: linattn.delta_rule_step(qt, kt, vt, bt, s_kept, g_t=gt,
                                                        scale=scale, qk_l2norm=False,
                                                        inplace=True),
            "front door": lambda: fla.fused_recurrent_gated_delta_rule(
                one[0], one[1], one[2], g=one[3], beta=one[4], scale=scale,
                initial_state=s0, output_final_state=True),
        }, decode_rounds)
        net1.close()
        # prefill: T tokens from the state s0
        net = GatedDeltaNet(gg, B, T, H, K)
        net.load(q=q, k=k, v=v, g=g, beta=beta, state=s0_vk)
        hf = [head_first(x) for x in (q, k, v, beta, g)]
        out["prefill"] = interleaved({
            "ggml": net.compute,
            "linattn": lambda: linattn.delta_rule(*hf, scale=scale, initial_state=s0,
                                                  return_state=True, qk_l2norm=False),
            "front door": lambda: fla.chunk_gated_delta_rule(
                q, k, v, g, beta, scale=scale, initial_state=s0, output_final_state=True),
        }, prefill_rounds)
        net.close()
    return out


def table(results: dict[int, dict], B: int, T: int, H: int, K: int, cpu: str,
          version: str, decode_rounds: int, prefill_rounds: int) -> str:
    lines = [f"CPU: {cpu}; ggml {version}; B={B}, H={H}, K=V={K}, float32; medians of "
             f"{decode_rounds} (decode) and {prefill_rounds} (prefill) interleaved rounds. "
             "ggml: the op's graph compute only (graph built once, reused).", "",
             "| operation | threads | ggml op, ms | linattn direct, ms | linattn / ggml | "
             "fla front door, ms | front door / direct | direct in place, ms | "
             "in place / ggml |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    names = {"decode": ("decode step (T=1 from a state)", "delta_rule_step",
                        "fused_recurrent_gated_delta_rule"),
             "prefill": (f"prefill {T:,} tokens from a state", "delta_rule",
                         "chunk_gated_delta_rule")}
    for op in ("decode", "prefill"):
        label, direct, door = names[op]
        for n, res in results.items():
            m = {key: 1e3 * s for key, s in res[op].items()}
            digits = 3 if op == "decode" else 1
            lines.append(f"| {label}: ggml / `{direct}` / `{door}` | {n} | "
                         f"{m['ggml']:.{digits}f} | {m['linattn']:.{digits}f} | "
                         f"{m['linattn'] / m['ggml']:.2f} | {m['front door']:.{digits}f} | "
                         f"{m['front door'] / m['linattn']:.2f} | " + (
                             f"{m['in place']:.3f} | {m['in place'] / m['ggml']:.2f} |"
                             if "in place" in m else "— | — |"))
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--ggml", default=None,
                    help=f"folder with libggml-base.so and libggml-cpu.so (or a ggml tree with "
                         f"build/src); default ${ENV}")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64, help="K = V, the head size")
    ap.add_argument("--tokens", type=int, default=2048, help="prefill length (and the check's)")
    ap.add_argument("--decode-rounds", type=int, default=2000)
    ap.add_argument("--prefill-rounds", type=int, default=21)
    ap.add_argument("--check-only", action="store_true", help="the check, no timings")
    args = ap.parse_args(argv)
    try:
        args.threads = [int(n) for n in args.threads.split(",")]
        if any(n < 1 for n in args.threads):
            raise ValueError
    except ValueError:
        ap.error(f"--threads: positive integers, comma-separated, not {args.threads!r}")
    for name in ("heads", "dim", "tokens", "decode_rounds", "prefill_rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    libdir, why = find_ggml(args.ggml or os.environ.get(ENV))
    if libdir is None:
        print(why, file=sys.stderr)
        return 2
    # torch first: ggml's libgomp.so.1 is then torch's, already loaded (one OpenMP runtime)
    import torch

    from linattn.profiling import cpu_description

    try:
        gg = Ggml(libdir)
    except (OSError, AttributeError) as e:  # not loadable, or a ggml without the op
        print(f"{PROG}: cannot use ggml in {libdir}: {' '.join(str(e).split())}",
              file=sys.stderr)
        return 2

    B, T, H, K = 1, args.tokens, args.heads, args.dim
    cpu = cpu_description()
    import linattn

    print(f"ggml {gg.version} from {libdir}; linattn from {Path(linattn.__file__).parent}; "
          f"torch {torch.__version__}; CPU {cpu}")
    tol = TOL_ULPS * torch.finfo(torch.float32).eps
    worst = 0.0
    for n in args.threads:
        torch.set_num_threads(n)
        gg.threads(n)
        print(f"\ncheck, {n} thread(s) (max abs difference / max abs value; "
              f"tolerance {tol:.1e} for the float32 pairs):")
        for label, d in check(gg, B, T, H, K, n):
            print(f"  {label}: {d:.2e}")
            if "float64" not in label:
                worst = max(worst, d)
    if not worst <= tol:  # nan fails too
        print(f"\nFAIL: ggml and linattn disagree: {worst:.2e} > {tol:.1e}")
        return 1
    print(f"\nagree: largest float32 difference {worst:.2e} <= {tol:.1e}")
    if args.check_only:
        return 0
    results = {n: bench(gg, B, T, H, K, n, args.decode_rounds, args.prefill_rounds)
               for n in args.threads}
    print()
    print(table(results, B, T, H, K, cpu, gg.version, args.decode_rounds, args.prefill_rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
