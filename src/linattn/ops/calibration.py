"""Does a compiled backend win on this machine? Measured once per CPU, kernels, torch and thread
count, and remembered.

:func:`linattn.ops.dispatch.select` asks :func:`winner` before it lets ``auto`` take a compiled
backend for a form ("causal fwd+bwd", "step", ...). The measurement times the backends'
functions directly on the op's calibration problem (registered with
:func:`~linattn.ops.dispatch.register_calibration`): every ISA build the CPU can run (on an
AVX-512 CPU, the 16-float and the 8-float build: on AMD Zen 4 the narrower one can be as fast)
against every torch backend: the fastest of a few calls each, interleaved in rotating order,
after a warm-up. The native build is kept
unless another build takes at most :data:`ISA_MARGIN` of its time (closer results swap places
from run to run); the chosen build wins if it beats the fastest torch backend, otherwise the
op's torch rule applies.

It runs in a fresh thread (so the user's grad mode, inference mode, autocast or a trace in
progress do not leak in) with the caller's thread count, and the result is written atomically
to ``calibration-<machine>-<cpu>.json`` in the cache folder, keyed by a fingerprint of the
kernels' source and torch's version: delete the file to measure again. A failed measurement
means the torch path, with a warning, never an error in the user's call.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from linattn import _cbuild
from linattn._io import user_cache_dir, write_atomic
from linattn.ops import native

__all__ = ["Choice", "winner", "verdict", "cache_path", "forget"]


class Choice(NamedTuple):
    """What the dispatcher decides for a call: a backend's name and, for a compiled one, the
    ISA build (None for torch backends). Here, where the candidates are measured, because the
    dispatcher (which decides) imports this module and this module must not import it."""

    backend: str
    isa: str | None = None

#: the fastest of this many calls per candidate counts, after one warm-up call
REPEATS = 5
#: another ISA build replaces the first ("native") only when it takes at most this fraction of
#: its time. On an AMD Zen 4 the 16- and 8-float builds differ by a few per cent either way,
#: and which is faster changes with the shape (measured: the AVX2 build 13 % faster on the
#: calibration problem's causal forward, 6 % slower at T = 65536): only a clear win switches.
ISA_MARGIN = 0.75

_verdicts: dict[tuple, dict] = {}
_LOCK = threading.Lock()


def cache_path() -> Path:
    return user_cache_dir() / f"calibration-{platform.machine()}-{_cbuild.cpu_tag()}.json"


def _fingerprint() -> str:
    try:
        src = native.source()
    except OSError:
        src = b""
    return hashlib.sha256(src + torch.__version__.encode()).hexdigest()[:12]


def forget() -> None:
    """Drop the verdicts held in memory (the file stays): the next call reads or measures."""
    with _LOCK:
        _verdicts.clear()


def winner(op: str, form: str, backend: str, isas: list[str], torch_backends: list[str],
           problem: Callable) -> str | None:
    """The ISA build of the compiled ``backend`` that wins ``form`` on this machine, or None
    where a torch backend is faster (or the measurement failed)."""
    win = verdict(op, form, backend, isas, torch_backends, problem)["winner"]
    return None if win == "torch" else win


def verdict(op: str, form: str, backend: str, isas: list[str], torch_backends: list[str],
            problem: Callable) -> dict:
    """``{"ms": {candidate: median ms}, "winner": isa or "torch"}`` for ``form``: from memory,
    else from the cache file, else measured (and written there)."""
    threads = native.torch_threads()
    key = (op, form, backend, tuple(isas), tuple(torch_backends), threads)
    found = _verdicts.get(key)
    if found is not None:
        return found
    with _LOCK:  # concurrent first calls measure once, not against each other
        found = _verdicts.get(key)
        if found is None:
            found = _verdicts[key] = _cached_or_measured(
                op, form, backend, isas, torch_backends, problem, threads)
    return found


def _valid(result: object, isas: list[str], candidates: list[str]) -> bool:
    if not isinstance(result, dict) or set(result) != {"ms", "winner"}:
        return False
    ms, win = result["ms"], result["winner"]
    return (isinstance(ms, dict) and set(ms) == set(candidates)
            and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                    for x in ms.values())
            and win in [*isas, "torch"])


def _cached_or_measured(op, form, backend, isas, torch_backends, problem, threads) -> dict:
    candidates = [f"{backend}:{isa}" for isa in isas] + list(torch_backends)
    fp = _fingerprint()
    entry = f"{fp}|{op}|{form}|{','.join(candidates)}|threads={threads}"
    path = cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    result = cached.get(entry)
    if _valid(result, isas, candidates):
        return result
    try:
        result = _in_clean_thread(lambda: _measure(backend, isas, torch_backends, problem),
                                  threads)
    except Exception as exc:  # noqa: BLE001 - a failed measurement must not fail the user's call
        _cbuild.warn_once(f"calibration:{op}", f"linattn: could not measure the compiled "
                          f"{op} ({type(exc).__name__}: {exc}); using the PyTorch path")
        return {"ms": {}, "winner": "torch"}  # for this process only, not written
    kept = {k: v for k, v in cached.items() if isinstance(k, str) and k.startswith(fp + "|")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({**kept, entry: result}, indent=1).encode())
    except OSError:
        pass  # an unwritable cache only means measuring again in the next process
    return result


def _measure(backend: str, isas: list[str], torch_backends: list[str],
             problem: Callable) -> dict:
    run = problem()  # the inputs, built once
    thunks = {f"{backend}:{isa}": run(Choice(backend, isa)) for isa in isas}
    thunks.update({name: run(Choice(name)) for name in torch_backends})
    ms = _interleaved_ms(thunks)
    # The first build ("native", the CPU's own) unless another beats it clearly: builds within
    # a few per cent of each other trade places from one run to the next, and a choice made on
    # noise at the calibration shape need not hold at other shapes.
    first = ms[f"{backend}:{isas[0]}"]
    best_isa = min(isas, key=lambda isa: ms[f"{backend}:{isa}"])
    if ms[f"{backend}:{best_isa}"] > ISA_MARGIN * first:
        best_isa = isas[0]
    best_torch = min(ms[name] for name in torch_backends) if torch_backends else math.inf
    win = best_isa if ms[f"{backend}:{best_isa}"] < best_torch else "torch"
    return {"ms": ms, "winner": win}


def _interleaved_ms(thunks: dict[str, Callable[[], object]]) -> dict[str, float]:
    """The fastest of :data:`REPEATS` calls of each thunk, in ms, after one warm-up call each.
    The calls are interleaved in rounds, in rotating order: a call pays for what the previous
    one left behind (freed pages, a cold cache), and a fixed order would charge it always to
    the same candidate (measured: 30 % on one form). The minimum, not the median: noise on a
    shared machine only ever adds time."""
    names = list(thunks)
    for name in names:
        thunks[name]()  # warm-up: kernels built, buffers and pages first touched
    best = dict.fromkeys(names, math.inf)
    for rnd in range(REPEATS):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            best[name] = min(best[name], _seconds(thunks[name]))
    return {name: round(1e3 * t, 4) for name, t in best.items()}


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _in_clean_thread(fn, threads: int):
    """fn() in a new thread with ``threads`` torch threads, whose autograd state (grad mode,
    inference mode, autocast, saved-tensor hooks, a checkpoint or a trace being recorded) and
    dispatch policy are the defaults, not those of the user's call that triggered it."""
    box: dict = {}

    def run():
        # Only this thread's count: torch.set_num_threads would also set the default that
        # threads starting meanwhile copy (a user's thread started during the measurement kept
        # the calibration's count for good, and a second cache key with it), and restoring
        # the "before" it read could write back another thread's narrowed 1.
        try:
            with (native.torch_threads_in_this_thread(threads), torch.inference_mode(False),
                  torch.enable_grad()):
                box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="linattn-calibration")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
