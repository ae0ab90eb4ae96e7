r"""The compiled CPU forward of the (gated) delta rule (``la_gdr_forward`` in ``_native.c``).

:func:`linattn.ops.delta.delta_rule` and :func:`~linattn.ops.delta.delta_rule_step` hand a call
here, after their argument checks, when :func:`applies` / :func:`step_applies` say so: a CPU
call in float32 accumulation (float32 inputs; bfloat16 and float16 are widened first, as the
torch path does), no gradient wanted, V a multiple of 16, no per-key or per-value gate (the
step), the compiled library loaded (:func:`linattn.ops.native.load`), and the compiled path
measured faster than the torch one on this machine (:func:`wins`).

The kernel is the sequential recurrence, per head and token (``a = e^{g_t}``, ``q̃ = s q_t``,
``k̃ = k_t``, both L2-normalised first with ``qk_l2norm``)::

    u = β_t (v_t − a Sᵀk̃),   S ← a S + k̃ uᵀ,   o_t = Sᵀq̃ = a (S_oldᵀq̃) + (q̃·k̃) u

exact in float32 arithmetic (no chunking error to bound), vectorised over the columns of S:
columns are independent, so a block of them stays in L1 through a chunk of tokens, and the
pass that writes token t's state also sums ``Sᵀk̃`` and ``Sᵀq̃`` for token t + 1 — one pass over
S per token, ~4·K·V vector operations (3·K·V multiply-adds and, with a gate, K·V multiplies).
At K = V = 64 that is fewer operations than the chunked WY form of :mod:`linattn.ops.delta`
(≈ 3·K·V + C·(3K/2 + V) multiply-adds per token: 22.5 K at C = 64, 17.4 K at C = 32, against
16.4 K operations here) with no triangular solve, and it runs near the FMA units' rate
(docs/benchmarks.md, "Gated delta rule"). Heads (and, for fewer heads than threads, column
blocks of a head) run in parallel on torch's threads once a call is large enough to pay for the
hand-over; a decoding step runs on the calling thread.

Which path runs: ``LINATTN_NATIVE=0`` never this one (no library is loaded), ``LINATTN_NATIVE=1``
this one wherever it applies; unset, where :func:`wins` measured it faster (a ~0.1 s
calibration at the first eligible call per build variant and thread count, cached beside the
compiled library in ``*.delta-calib.json``). Inside ``dispatch.use(impl=...)``, "torch",
"fused" and "portable" keep the torch path, "native" and "fast" take this one wherever it
applies (as ``LINATTN_NATIVE=1``).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from pathlib import Path

import torch
from torch import Tensor

from linattn import _cbuild
from linattn.ops import dispatch, native
from linattn.ops.gated.op import initial_state_for
from linattn.ops.varlen import check_cu_seqlens
from linattn.profiling import median_time

__all__ = ["applies", "step_applies", "delta_rule", "delta_rule_step", "wins", "calibration",
           "kernel", "unavailable_reason"]

_P, _L, _F, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
#: la_gdr_forward(q, qs, qt, k, ks, kt, v, vs, vt, beta, bs, g, gs, N, T, K, V, v0, v1, scale,
#: l2norm, S_in, S_out, o, os, ot, work) -> 0, or -1 on sizes it does not take.
_ARGTYPES = [_P, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _P, _L, _L, _L, _L, _L, _L, _L, _F, _I,
             _P, _P, _P, _L, _L, _P]
#: la_gdr_step(q, k, v, beta, g, N, K, V, scale, l2norm, S_in, S_out, o, work): the same with
#: T = 1 and contiguous rows, in fewer arguments (each costs time in a ctypes call).
_STEP_ARGTYPES = [_P, _P, _P, _P, _P, _L, _L, _L, _F, _I, _P, _P, _P, _P]
#: V must be a multiple of this (whole vectors of every ISA's width, up to AVX-512's 16).
V_MULTIPLE = 16
#: A call splits across threads from this many state-element updates (N·T·K·V): below it the
#: hand-over to the pool (tens of µs) costs more than it saves. 2^20 is ~0.1 ms of kernel.
PARALLEL_MIN = 1 << 20

_kernels: dict[str, object] = {}
_FLOAT_ACC = (torch.float32, torch.bfloat16, torch.float16)
_tls = threading.local()


def kernel(isa: str | None = None):
    """The ctypes function ``la_gdr_forward`` of one build variant (default: the one in use,
    :func:`linattn.ops.native.selected_isa`), or None where the library cannot be had."""
    isa = native.selected_isa(isa)
    fn = _kernels.get(isa, False)
    if fn is False:
        lib = native.load(isa)
        fn = None
        if lib is not None and hasattr(lib, "la_gdr_forward"):
            fn = lib.la_gdr_forward
            fn.restype, fn.argtypes = _I, _ARGTYPES
            lib.la_gdr_step.restype, lib.la_gdr_step.argtypes = _I, _STEP_ARGTYPES
            lib.la_gdr_work.restype, lib.la_gdr_work.argtypes = _L, [_L]
            fn.step = lib.la_gdr_step  # (ctypes functions take attributes)
        _kernels[isa] = fn
    return fn


def unavailable_reason(isa: str | None = None) -> str | None:
    """Why :func:`kernel` gives None (for skip messages), or None if it loads."""
    if kernel(isa) is not None:
        return None
    return native.unavailable_reason(isa) or "the compiled library has no la_gdr_forward"


_OFF = ("torch", "fused", "portable")
_FORCE = ("native", "fast")
#: (LINATTN_NATIVE, LINATTN_NATIVE_ISA) as set -> (build variant, kernel or None, forced).
_routes: dict[tuple[str, str], tuple[str, object, bool]] = {}


def _route(form: str):
    """The kernel this call takes ("prefill" or "step"), or None: the dispatch policy, then
    ``LINATTN_NATIVE`` (read at every call, as :mod:`linattn.ops.linear` does), then the
    calibration. A few µs: the decoding step is on this path."""
    impl = dispatch.policy().impl
    if impl in _OFF:
        return None
    env = os.environ
    key = (env.get("LINATTN_NATIVE", ""), env.get("LINATTN_NATIVE_ISA", ""))
    route = _routes.get(key)
    if route is None:
        setting = dispatch.native_setting()
        isa = native.selected_isa()  # ValueError for an unknown ISA, as linear_attention
        route = _routes[key] = (isa, None if setting == "0" else kernel(isa), setting == "1")
    isa, fn, forced = route
    if fn is None or forced or impl in _FORCE:
        return fn
    verdicts = _verdicts.get((isa, torch.get_num_threads()))
    if verdicts is None:
        return fn if wins(form) else None
    return fn if verdicts[form]["native"] else None


def _eligible(q: Tensor, v: Tensor, beta: Tensor, tensors: tuple) -> bool:
    """The conditions shared by the prefill and the step. Devices, shapes and dtypes of the
    other arguments were checked by the caller (or are checked by the same functions on the
    compiled path: the initial state); ``tensors``: those autograd could want gradients of."""
    if not q.is_cpu or beta.dtype != torch.float32 or q.dtype not in _FLOAT_ACC:
        return False
    V = v.shape[-1]
    if V == 0 or V % V_MULTIPLE:
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if getattr(t, "requires_grad", False):
                return False
    return not torch.compiler.is_compiling()


def applies(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
            initial_state: object):
    """For :func:`linattn.ops.delta.delta_rule` (arguments checked, beta and g already in
    the accumulation dtype): the compiled kernel to pass to :func:`delta_rule`, or None for
    the torch path."""
    if not _eligible(q, v, beta, (q, k, v, beta, g, initial_state)):
        return None
    return _route("prefill")


def step_applies(q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, S: Tensor,
                 g_t: object):
    """For :func:`linattn.ops.delta.delta_rule_step` (inputs checked, no gk_t / gv_t, S the
    checked state in the accumulation dtype): the compiled kernel to pass to
    :func:`delta_rule_step`, or None for the torch path."""
    if not _eligible(q_t, v_t, beta_t, (q_t, k_t, v_t, beta_t, S, g_t)):
        return None
    return _route("step")


# ------------------------------------------------------------------------------------ the calls


def _work(K: int) -> Tensor:
    """This thread's scratch buffer for head dimension K (la_gdr_work(K) floats)."""
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    buf = bufs.get(K)
    if buf is None:
        buf = bufs[K] = torch.empty(native.load().la_gdr_work(K), dtype=torch.float32)
    return buf


def _jobs(N: int, V: int, threads: int) -> list[tuple[int, int, int, int]]:
    """(h0, h1, v0, v1) parts of the work for ``threads`` threads: about four groups of heads per
    thread (threads take them one at a time, so that a thread slowed by another process on its
    core does not hold the others up), or, with fewer heads than threads, each head's columns
    split in whole blocks of 16 (each part prepares q and k again, so no more parts than
    threads)."""
    if threads <= 1 or N == 0:
        return [(0, N, 0, V)]
    if N >= threads:
        parts = min(N, 4 * threads)
        bounds = [N * i // parts for i in range(parts + 1)]
        return [(bounds[i], bounds[i + 1], 0, V) for i in range(parts)]
    parts = min(threads // N, V // V_MULTIPLE)
    blocks = V // V_MULTIPLE
    cuts = [V_MULTIPLE * (blocks * i // parts) for i in range(parts + 1)]
    return [(h, h + 1, cuts[i], cuts[i + 1]) for h in range(N) for i in range(parts)]


def _run_parts(part, jobs: list, threads: int) -> None:
    """part(*job) for every job, on at most ``threads`` threads, the calling one included:
    each takes the next job when it is done with one (ctypes releases the GIL)."""
    if len(jobs) == 1 or threads <= 1:
        for job in jobs:
            part(*job)
        return
    todo, lock = iter(jobs), threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            part(*job)

    helpers = min(threads, len(jobs)) - 1
    workers = native.pool(helpers)  # the one pool of all compiled passes
    futures = [workers.submit(worker) for _ in range(helpers)]
    try:
        worker()
    finally:
        for f in futures:  # all of them, even if this thread's jobs failed
            f.exception()
    for f in futures:
        f.result()  # re-raise a helper's error


def _forward(fn, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, s: float,
             l2norm: bool, S_in: Tensor, S_out: Tensor, o: Tensor) -> None:
    """The kernel over (N, T, ·) inputs whose last dimension is contiguous (any head and token
    strides), beta and g (N, T) with contiguous rows, S_in, S_out contiguous (N, K, V) (may be
    one tensor), o (N, T, V); in parts on torch's threads when large enough."""
    N, T, K = q.shape
    V = v.shape[2]
    threads = torch.get_num_threads() if N * T * K * V >= PARALLEL_MIN else 1
    gp, gs = (None, 0) if g is None else (g.data_ptr(), g.stride(0))
    args = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            beta.stride(0), gs, o.stride(0), o.stride(1))
    qs, qt, ks, kt, vs, vt, bs, gs, os_, ot = args
    qp, kp, vp, bp, Sp, Op, op = (x.data_ptr() for x in (q, k, v, beta, S_in, S_out, o))
    f4 = 4  # bytes per float32 element

    def part(h0: int, h1: int, v0: int, v1: int) -> None:
        rc = fn(qp + f4 * h0 * qs, qs, qt, kp + f4 * h0 * ks, ks, kt, vp + f4 * h0 * vs, vs, vt,
                bp + f4 * h0 * bs, bs, None if gp is None else gp + f4 * h0 * gs, gs,
                h1 - h0, T, K, V, v0, v1, s, int(bool(l2norm)), Sp + f4 * h0 * K * V,
                Op + f4 * h0 * K * V, op + f4 * h0 * os_, os_, ot, _work(K).data_ptr())
        native._check(rc, "la_gdr_forward")

    _run_parts(part, _jobs(N, V, threads), threads)


def _rows(x: Tensor, N: int) -> Tensor:
    """x (..., T, F) as float32 (N, T, F) with a contiguous last dimension (a view when it is
    one already)."""
    x = x.reshape(N, *x.shape[-2:])
    if x.dtype != torch.float32:
        x = x.float()
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def delta_rule(fn, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
               scale: float, initial_state: object, cu_seqlens: object, qk_l2norm: bool
               ) -> tuple[Tensor, Tensor]:
    """The compiled :func:`linattn.ops.delta.delta_rule` (``fn`` from :func:`applies`) on its
    checked arguments (beta, g in float32, ``scale`` resolved); checks initial_state and
    cu_seqlens as the torch path does. Returns (o in q's dtype, final state float32)."""
    *batch, T, K = q.shape
    V = v.shape[-1]
    if cu_seqlens is None:  # one span over every head
        heads, spans, src = batch, [(0, T)], (q, k, v, beta, g)
        S0 = initial_state_for(initial_state, "initial_state", (*batch, K, V), q)
    else:  # packed sequences (B = 1): one span each, each from its own state
        cu = check_cu_seqlens(cu_seqlens, q)
        heads, src = batch[1:], tuple(None if x is None else x[0] for x in (q, k, v, beta, g))
        spans = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
        S0 = initial_state_for(initial_state, "initial_state", (len(spans), *heads, K, V), q)
    H = math.prod(heads)
    qf, kf, vf = (_rows(x, H) for x in src[:3])
    bf = src[3].reshape(H, T).contiguous()
    gf = None if g is None else src[4].reshape(H, T).contiguous()
    S = S0.reshape(-1, K, V).clone(memory_format=torch.contiguous_format)
    o = native.empty_hugepage(qf, H, T, V)
    for i, (a, b) in enumerate(spans):
        Si = S[i * H:(i + 1) * H]  # updated in place
        _forward(fn, qf[:, a:b], kf[:, a:b], vf[:, a:b], bf[:, a:b],
                 None if gf is None else gf[:, a:b], scale, qk_l2norm, Si, Si, o[:, a:b])
    o = o.view(*batch, T, V)
    return (o if o.dtype == q.dtype else o.to(q.dtype)), S.view(S0.shape)


def _vec(x: Tensor, N: int) -> Tensor:
    """One step's x (..., F) as float32 rows, contiguous: x itself when it is one already
    (the usual case, no reshape), else an (N, F) copy."""
    if x.dtype == torch.float32 and x.is_contiguous():
        return x
    return x.reshape(N, x.shape[-1]).to(torch.float32).contiguous()


def delta_rule_step(fn, q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, S: Tensor,
                    g_t: Tensor | None, scale: float, qk_l2norm: bool
                    ) -> tuple[Tensor, Tensor]:
    """The compiled :func:`linattn.ops.delta.delta_rule_step` (``fn`` from
    :func:`step_applies`) on its checked arguments (S the state (..., K, V), beta_t and g_t
    float32); the state passed in is not modified. Returns (o_t in q_t's dtype, the new state,
    float32 (..., K, V)). Lean on purpose (contiguous inputs are passed as they are, outputs
    allocated in their final shape): this is the whole per-token cost of decoding."""
    K, V = S.shape[-2], S.shape[-1]
    N = beta_t.numel()
    q, k, v = _vec(q_t, N), _vec(k_t, N), _vec(v_t, N)
    b = beta_t if beta_t.is_contiguous() else beta_t.contiguous()  # float32 (checked)
    g = g_t if g_t is None or g_t.is_contiguous() else g_t.contiguous()
    S_in = S if S.is_contiguous() else S.contiguous()
    S_out = torch.empty_like(S_in)
    o = torch.empty(v_t.shape, dtype=torch.float32)  # (..., V), row-major
    if N * K * V >= PARALLEL_MIN and torch.get_num_threads() > 1:  # a large batch: threads
        _forward(fn, q.view(N, 1, K), k.view(N, 1, K), v.view(N, 1, V), b.view(N, 1),
                 None if g is None else g.view(N, 1), scale, qk_l2norm, S_in.view(N, K, V),
                 S_out.view(N, K, V), o.view(N, 1, V))
    else:
        rc = fn.step(q.data_ptr(), k.data_ptr(), v.data_ptr(), b.data_ptr(),
                     None if g is None else g.data_ptr(), N, K, V, scale, 1 if qk_l2norm else 0,
                     S_in.data_ptr(), S_out.data_ptr(), o.data_ptr(), _work(K).data_ptr())
        if rc:
            native._check(rc, "la_gdr_step")
    return (o if o.dtype == q_t.dtype else o.to(q_t.dtype)), S_out


# ------------------------------------------------------------------- does it win on this machine?
#: The calibration problems, float32, K = V = 64, qk_l2norm, gated: a prefill of 4 heads × 512
#: tokens and decoding steps of 16 heads (a few tens of ms in all, medians of 5 and 25 calls).
CALIBRATION = {"prefill": (4, 512, 64), "step": (16, 1, 64)}
_verdicts: dict[tuple[str, int], dict] = {}
_LOCK = threading.Lock()


def wins(form: str) -> bool:
    """Whether the compiled path beat the torch path on this machine for ``form`` ("prefill"
    or "step"), per :func:`calibration`. A failed measurement means the torch path (with a
    warning), never an error in the user's call."""
    verdicts = _verdicts.get((native.selected_isa(), torch.get_num_threads()))
    if verdicts is None:
        try:
            verdicts = calibration()
        except Exception as exc:  # noqa: BLE001 - a failed measurement must not fail the call
            _cbuild.warn_once("delta-calibration", f"linattn: could not measure the compiled "
                              f"delta rule ({type(exc).__name__}: {exc}); using the PyTorch "
                              "path")
            verdicts = _verdicts[native.selected_isa(), torch.get_num_threads()] = {
                f: {"native": False} for f in CALIBRATION}
    return bool(verdicts[form]["native"])


@torch.compiler.disable
def calibration(threads: int | None = None) -> dict[str, dict]:
    """Per form ("prefill", "step"): the median times of the compiled and the torch path on
    :data:`CALIBRATION` and whether the compiled one won. Measured at the first call per build
    variant and thread count and cached beside the compiled library (``*.delta-calib.json``;
    delete it to measure again)."""
    threads = torch.get_num_threads() if threads is None else threads
    key = (native.selected_isa(), threads)
    if key not in _verdicts:
        with _LOCK:
            if key not in _verdicts:
                _verdicts[key] = _calibrate(threads)
    return _verdicts[key]


def _calibrate(threads: int) -> dict[str, dict]:
    lib = native.load()
    if lib is None or kernel() is None:
        raise RuntimeError("linattn: no compiled la_gdr_forward to calibrate")
    entry = f"threads={threads} " + " ".join(
        f"{f}={'x'.join(map(str, shape))}" for f, shape in CALIBRATION.items())
    return native.cached_measurement(
        Path(lib._name).with_suffix(".delta-calib.json"), entry, threads, _measure,
        lambda r: isinstance(r, dict) and set(r) == set(CALIBRATION)
        and all(isinstance(x, dict) and "native" in x for x in r.values()))


def _measure() -> dict[str, dict]:
    from linattn.ops.delta.op import delta_rule, delta_rule_step  # (delta imports this module)

    result = {}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(False), torch.no_grad():
        for form, (N, T, d) in CALIBRATION.items():
            q, k, v = (torch.randn(1, N, T, d, generator=gen) for _ in range(3))
            beta = torch.rand(1, N, T, generator=gen)
            g = -torch.rand(1, N, T, generator=gen)
            if form == "prefill":
                def run(q=q, k=k, v=v, beta=beta, g=g):
                    delta_rule(q, k, v, beta, g, qk_l2norm=True)
                repeats = 5
            else:
                S = torch.randn(1, N, d, d, generator=gen) * 0.1
                x = [t[:, :, 0] for t in (q, k, v, beta, g)]

                def run(x=x, S=S):
                    delta_rule_step(*x[:4], S, g_t=x[4], qk_l2norm=True)
                repeats = 25
            ms = {}
            for impl in ("native", "torch"):
                with dispatch.use(impl=impl):
                    ms[impl] = 1e3 * median_time(run, repeats)  # after a warm-up call
            result[form] = {"native_ms": round(ms["native"], 4), "torch_ms": round(ms["torch"], 4),
                            "native": ms["native"] < ms["torch"]}
    return result
