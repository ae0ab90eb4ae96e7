"""Threads of the compiled passes (part of :mod:`linattn.ops.native`): the one pool, the one
thread policy (:func:`threads_for`, :func:`is_small`), how a pass is split and run
(:func:`head_jobs`, :func:`run_parts`) and torch's own thread count around a small call
(:func:`torch_on_one_thread`)."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from linattn.ops.native.build import any_loaded

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """A forked child inherits the pool object but not its threads (and maybe a lock held by
    one of them): start new ones there."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pool(workers: int) -> ThreadPoolExecutor:
    """The one thread pool of the compiled passes, with at least ``workers`` threads: a larger
    pool replaces a smaller one; none is shut down under a caller."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < workers:
            _POOL = ThreadPoolExecutor(max(workers, os.cpu_count() or 1),
                                       thread_name_prefix="linattn")
        return _POOL


#: The work (in the callers' unit: multiply-adds, about a nanosecond's worth each ten) below
#: which a compiled pass stays on the calling thread. Handing parts to the pool costs a wake-up
#: and a hand-back, 20-60 µs on a free core (benchmarks/threads.py); a part is worth a thread
#: from about 2^20 state-element updates (~0.1 ms of kernel). Each op may pass its own unit's
#: threshold to :func:`threads_for`; this is the default and the delta rule's.
PARALLEL_MIN = 1 << 20


#: After a helper thread was late (:func:`run_parts`), passes below ``BACKOFF_WORK`` times
#: :data:`PARALLEL_MIN` (2^26 state-element updates, ~6 ms of a recurrence's kernel, whatever
#: the op's own threshold) stay on the calling thread for ``BACKOFF_S`` seconds: another
#: process holds the other core, and every hand-over would wait for the scheduler; a longer
#: pass is worth that wait. The first call after that tries threads again (one slow call a
#: second at most). (Scaled by each op's threshold instead, it kept GLA's and the delta rule's
#: passes of up to ~100 ms on one thread.)
BACKOFF_S = 1.0
BACKOFF_WORK = 64
_late_until = 0.0


def threads_for(work: int, parts: int, min_work: int = PARALLEL_MIN) -> int:
    """The one thread policy of the compiled passes: how many threads (the calling one
    included) a pass of ``work`` units that splits into at most ``parts`` independent parts
    should use. 1 below ``min_work`` (a decoding step, a short prefill: the hand-over would cost
    more than it saves), and 1 below ``BACKOFF_WORK · PARALLEL_MIN`` for ``BACKOFF_S`` after a
    helper was late (another process on the other core); else at most torch's thread count, the
    parts, and one thread per ``min_work`` of work, so that no thread is woken for less than it
    costs."""
    n = torch_threads()
    if n <= 1 or parts <= 1 or work < min_work:
        return 1
    if work < BACKOFF_WORK * PARALLEL_MIN and time.monotonic() < _late_until:
        return 1
    return max(1, min(n, parts, work // max(min_work, 1)))


#: The work below which a kernel that splits itself (``la_parallel`` in common.h: on torch's
#: own OpenMP threads, which watch for work for a while after each parallel operation, so a
#: hand-over costs ~1-2 µs where the Python pool's costs 20-60 µs: why :data:`PARALLEL_MIN`
#: is 32 times larger) stays on the calling thread: a part is worth a thread from about 2^15
#: state-element updates (~2 µs of kernel), measured with the decoding step of
#: benchmarks/peers/ggml_gated_delta.py (docs/bench-recurrences.md).
NATIVE_PARALLEL_MIN = 1 << 15

#: Set in a forked child: GNU OpenMP's threads do not survive a fork (a parallel region in a
#: child of a process that ran one waits for them for ever), so the kernels' own splitting
#: stays off there. (torch's operations in such a child hang the same way at 2 threads.)
_forked = False


def _note_fork() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def native_threads(work: int, parts: int, min_work: int | None = None) -> int:
    """How many threads (the calling one included) a kernel that splits itself
    (``la_parallel``) should use for ``work`` units in at most ``parts`` parts: 1 below
    ``min_work`` (default :data:`NATIVE_PARALLEL_MIN`), in a forked child, and below
    ``BACKOFF_WORK · min_work`` for ``BACKOFF_S`` after the other threads were late (the
    kernel says so: :func:`note_late`); else at most torch's thread count, the parts, and one
    thread per ``min_work``."""
    n = torch_threads()
    least = NATIVE_PARALLEL_MIN if min_work is None else min_work
    if n <= 1 or parts <= 1 or work < least or _forked:
        return 1
    if work < BACKOFF_WORK * least and time.monotonic() < _late_until:
        return 1
    return min(n, parts, work // least)


#: Split calls in a row whose other threads took no part before small calls back off. One is
#: no sign of a busy core: the first call after a pause finds OpenMP's threads asleep, and they
#: wake too late for a few-µs kernel; backing off then kept a decoding loop on one thread for
#: good (each retry a second later found them asleep again). Three in a row, they were awake.
LATE_IN_A_ROW = 3
_late_in_a_row = 0


def note_late() -> None:
    """A call split over threads ran on the calling thread alone: the others were late (asleep,
    or their cores taken by another process). After :data:`LATE_IN_A_ROW` such calls in a row
    small calls stay on one thread for ``BACKOFF_S``, as after a late helper of
    :func:`run_parts`."""
    global _late_until, _late_in_a_row
    _late_in_a_row += 1
    if _late_in_a_row >= LATE_IN_A_ROW:
        _late_in_a_row = 0
        _late_until = time.monotonic() + BACKOFF_S


def split_done(rc: int, threads: int) -> int:
    """A self-splitting kernel's code as its caller reads it: 1 (done, but the other threads
    took no part) is noted (:func:`note_late`) and becomes 0; a split call done on time is
    noted too (:func:`note_on_time`); other codes pass through."""
    if rc == 1:
        note_late()
        return 0
    if rc == 0 and threads > 1:
        note_on_time()
    return rc


def note_on_time() -> None:
    """A call split over threads whose other threads took their parts: the count of late ones
    in a row starts again."""
    global _late_in_a_row
    _late_in_a_row = 0


# Torch's thread count is not one for the process. With its OpenMP backend (the wheels' on
# Linux, macOS and Windows), torch.set_num_threads(n) sets the calling thread's OpenMP count
# (omp_set_num_threads: a per-thread setting) and a default that every other thread copies
# once, at its first parallel operation or get_num_threads() call; get_num_threads() reads the
# calling thread's own count. Narrowing with torch.set_num_threads(1) under one process-wide
# counter ("the first narrows, the last restores") therefore went wrong three ways:
#   - with two calls overlapping in two threads, the last one out restored its own count,
#     not the first one's: that thread stayed on 1 thread for good (and the other was never
#     narrowed at all). Its next call keyed the calibration on 1 thread and measured again:
#     test_calibration_is_isolated_from_the_triggering_call, 1 run in 10 (its three threads
#     overlap, and checkpointing calls the op again in the backward);
#   - while a narrowing lasted, the default was 1: a thread starting then kept 1 for good
#     (the calibration thread's torch.set_num_threads did the same with its own count);
#   - torch_threads() read the counter and then the count without the lock: a narrowing
#     could begin in between.
# So the record is per thread (only its own thread writes it: no lock, no race), and the
# count is set with the OpenMP runtime's own omp_set_num_threads, which changes the calling
# thread's count only, never the default other threads start from. (Unlike
# torch.set_num_threads it leaves MKL's own count alone: what is narrowed here is torch's
# OpenMP loops, the state copies and joins around the kernels.)


class _ThreadCount(threading.local):
    """This thread's narrowing: :func:`torch_on_one_thread` calls in progress in it, and its
    count before the outermost of them (0 outside any)."""
    depth = 0
    saved = 0


_own = _ThreadCount()


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime that torch reads its count from (checked:
    torch.get_num_threads() must see what it sets), or None: not found, another runtime, or a
    torch without OpenMP. Looked up once (two first calls at once may both look: harmless)."""
    return _find_omp_setter()


def _find_omp_setter() -> Callable[[int], None] | None:
    # the process's global symbols (Linux, macOS), then the runtime torch ships beside itself
    # (dlopen of a library already loaded returns that one); another OpenMP runtime loaded
    # first (numpy's BLAS, say) fails the check and the next one is tried
    names: list[str | None] = [None] if os.name != "nt" else []
    names += sorted(str(p) for p in (Path(torch.__file__).parent / "lib").glob("*omp*"))
    for name in names:
        try:
            fn = ctypes.CDLL(name).omp_set_num_threads
            fn.restype = None  # (no argtypes: a Python int goes as a C int, 0.15 µs faster)
            if _torch_reads(fn):
                return fn
        except Exception:  # noqa: BLE001 - no setter only means no narrowing
            continue
    return None


def _torch_reads(fn: Callable[[int], None]) -> bool:
    """Whether torch.get_num_threads() returns what ``fn`` set, tried in a thread of its own
    (what it sets there ends with it)."""
    seen: list[bool] = []
    # torch._C's own function, not the torch attribute: the answer is cached for the process,
    # and a caller that replaced torch.get_num_threads (tests faking a core count do) when the
    # first narrowing came would otherwise turn narrowing off for good (seen in CI)
    count = torch._C.get_num_threads

    def probe():
        n = count()  # torch's own first setting of this thread, done now
        want = 2 if n == 1 else 1
        fn(want)
        seen.append(count() == want)

    t = threading.Thread(target=probe, name="linattn-omp-probe", daemon=True)
    t.start()
    t.join()
    return seen == [True]


def torch_threads() -> int:
    """Torch's thread count as the user set it for the calling thread: inside a
    :func:`torch_on_one_thread` call of this thread, the count it will restore, not its
    temporary 1 (narrowings in other threads never change this thread's count). What the
    thread policy, the dispatcher's memo and the calibration's cache key read."""
    # one thread-local read, no lock (this is on every decoding step): only this thread
    # writes its record
    return _own.saved or torch.get_num_threads()


@contextmanager
def torch_on_one_thread(small: bool) -> Iterator[None]:
    """Torch's own operations inside a small compiled call (zeroing or copying a state,
    joining the final state) on one thread, when ``small``. Torch splits every operation on
    more than 32,768 elements over its OpenMP threads; around a kernel of a fraction of a
    millisecond the hand-over costs more than the operation, and with the other core busy each
    one waits for a descheduled thread: a causal ``linear_attention`` at T = 64 took 29 ms on
    2 threads against 0.95 ms on 1 (benchmarks/threads.py). Only the calling thread's count is
    narrowed (torch's OpenMP count is per thread: see above), nested calls are counted (the
    outermost narrows and restores), and the default other threads start from is never
    touched. Where the OpenMP runtime cannot be reached, nothing is narrowed (slower, never
    wrong: torch.set_num_threads would change that default). Not for traced code (the caller
    checks)."""
    if not small:
        yield
        return
    own = _own
    setter = None
    if own.depth == 0:
        # also torch's first setting of this thread's count if it had none yet, which would
        # otherwise overwrite the 1 set below at the first parallel operation
        saved = torch.get_num_threads()
        if saved > 1:
            setter = _omp_set_num_threads()
        own.saved = saved  # recorded last: nothing above may leave a record without a call
    own.depth += 1
    try:
        if setter is not None:
            setter(1)
        yield
    finally:
        if setter is not None:
            setter(own.saved)
        own.depth -= 1
        if own.depth == 0:
            own.saved = 0


@contextmanager
def torch_threads_in_this_thread(n: int) -> Iterator[None]:
    """The calling thread's torch count set to ``n`` for a block, then restored: for a thread
    that works for another one (the calibration's), to run with that thread's count. Through
    the OpenMP runtime, so that threads starting meanwhile still copy the user's default;
    torch.set_num_threads where it cannot be reached (which sets that default too)."""
    before = torch.get_num_threads()  # and torch's first setting of this thread, done now
    if n == before:
        yield
        return
    setter = _omp_set_num_threads() or torch.set_num_threads
    setter(n)
    try:
        yield
    finally:
        setter(before)


def is_small(q: Tensor, v: Tensor, min_work: int = PARALLEL_MIN) -> bool:
    """Whether a pass over queries q (..., T, K) and values v (..., T, V) stays on one thread
    (:func:`threads_for` with the N·T·K·V state-element updates of a recurrence, the heads as
    its parts): what decides :func:`torch_on_one_thread` for the torch operations around the
    kernels too."""
    heads = q.numel() // max(q.shape[-1] * q.shape[-2], 1) if q.dim() >= 2 else 1
    return threads_for(q.numel() * v.shape[-1], heads, min_work) == 1


def head_jobs(N: int, V: int, threads: int, columns: bool = True, block: int = 16
              ) -> list[tuple[int, int, int, int]]:
    """(h0, h1, v0, v1) parts of a pass over N heads of V value columns for ``threads``
    threads: about four groups of heads per thread (a contiguous run per thread, the rest
    taken as threads finish: :func:`run_parts`, so that a thread slowed by another process
    does not hold the others up), or, with fewer heads than threads
    and ``columns`` (the kernel can split a head's columns), each head's columns in whole
    blocks of ``block`` (each part prepares q and k again, so no more parts than threads)."""
    if threads <= 1 or N == 0:
        return [(0, N, 0, V)]
    if N >= threads or not columns:
        parts = min(N, 4 * threads)
        bounds = [N * i // parts for i in range(parts + 1)]
        return [(bounds[i], bounds[i + 1], 0, V) for i in range(parts)]
    parts = min(threads // N, V // block)
    blocks = V // block
    cuts = [block * (blocks * i // parts) for i in range(parts + 1)]
    return [(h, h + 1, cuts[i], cuts[i + 1]) for h in range(N) for i in range(parts)]


def run_jobs(part: Callable, jobs: list, threads: int) -> None:
    """``part(*job)`` for every job: :func:`run_parts` for a part that needs no thread slot."""
    run_parts(lambda _slot, *job: part(*job), jobs, threads)


def run_parts(part: Callable, jobs: list, threads: int) -> None:
    """``part(slot, *job)`` for every job, on at most ``threads`` threads, the calling one
    included; ``slot`` (0 for the calling thread, 1, 2, ... for helpers) is the index of the
    thread running it, for per-thread scratch buffers. Each thread walks a contiguous run of the
    jobs and, done with it, takes the next job from the back of the longest run left
    (:func:`_next_job`; ctypes releases the GIL), so a thread slowed by another process on its
    core holds no one up. The helpers are the OpenMP threads torch's own operations run on
    (:func:`_on_omp_threads`), else (a build without OpenMP, a forked child) Python threads of
    one pool, where a helper that has not started by the time the calling thread has run out
    of jobs is cancelled, not waited for: with the other core busy, waiting for a descheduled
    helper to wake only to find nothing left costs a scheduler time slice (milliseconds). Either
    way, a call whose helpers took no job (or made it last more than twice the calling thread's
    share) keeps small passes on one thread for a while (``BACKOFF_S``). Every job runs even
    when one fails; the first error is raised after all have."""
    if len(jobs) <= 1 or threads <= 1:
        for job in jobs:
            part(0, *job)
        return
    lock = threading.Lock()
    errors: list[BaseException] = []
    helpers = min(threads, len(jobs)) - 1
    runs = _runs(len(jobs), helpers + 1)
    took = [0] * (helpers + 1)  # jobs run per slot
    mine = [0.0]  # the calling thread's time on its jobs

    def worker(slot: int) -> None:
        if slot > helpers:  # (a team larger than asked for)
            return
        t0 = time.monotonic()
        while True:
            with lock:
                i = _next_job(runs, slot)
            if i is None:
                break
            try:
                part(slot, *jobs[i])
            except BaseException as e:  # noqa: BLE001 -- re-raised below, after every job
                errors.append(e)
            took[slot] += 1
        if slot == 0:
            mine[0] = time.monotonic() - t0

    global _late_until
    start = time.monotonic()
    if not _on_omp_threads(worker, helpers + 1):
        workers = pool(helpers)  # the one pool of all compiled passes
        futures = [workers.submit(worker, slot) for slot in range(1, helpers + 1)]
        worker(0)
        for f in futures:
            if not f.cancel():  # started: it may hold a job, so wait for it
                f.result()
    if sum(took[1:]) == 0 or time.monotonic() - start > 2 * mine[0]:
        _late_until = time.monotonic() + BACKOFF_S
    if errors:
        raise errors[0]


def _runs(jobs: int, threads: int) -> list[list[int]]:
    """The jobs 0 .. jobs-1 cut into one contiguous run per thread."""
    return [list(range(jobs * s // threads, jobs * (s + 1) // threads)) for s in range(threads)]


def _next_job(runs: list[list[int]], slot: int) -> int | None:
    """The next job of thread ``slot``: the front of its own run, else (done with it) the back
    of the longest run left, or None. Neighbouring jobs (heads next to each other, whose states
    and running sums are next to each other in memory) then run on one thread, one after the
    other: run at once on two cores, each write to a head's state invalidated the line that the
    other core's next-line prefetcher had just pulled in beside its own (the causal forward of
    8 heads took 1.50x less time on 2 threads than on 1 when the heads were dealt out in turn,
    1.95x in runs; Intel Xeon with AMX). Taking from the back keeps a thread that another
    process slows from holding the rest up."""
    own = runs[slot]
    if own:
        return own.pop(0)
    longest = max(runs, key=len)
    return longest.pop() if longest else None


_SLOT_FN = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _on_omp_threads(worker: Callable[[int], None], threads: int) -> bool:
    """``worker(slot)`` on each thread of an OpenMP team of ``threads`` (the calling one slot 0;
    ``la_run_threads`` in ops/native/native.c, which says why these threads), or False where
    that cannot be had: no build loaded or one without OpenMP, or a forked child (the runtime's
    threads do not survive a fork). A worker that returns before its helpers start is waited
    for (OpenMP's barrier): those threads are awake after torch's own operations."""
    runner = None if _forked else _omp_runner(any_loaded())
    return runner is not None and runner(_SLOT_FN(worker), threads) > 0


@functools.lru_cache(maxsize=4)
def _omp_runner(lib: ctypes.CDLL | None) -> Callable | None:
    """``la_run_threads`` of a loaded build, typed; None without one (an older build lacks it
    too)."""
    fn = None if lib is None else getattr(lib, "la_run_threads", None)
    if fn is not None:
        fn.argtypes, fn.restype = [_SLOT_FN, ctypes.c_int], ctypes.c_int
    return fn
