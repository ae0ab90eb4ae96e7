"""The thread policy of the compiled passes (linattn.ops.native: threads_for, run_parts): small
work stays on the calling thread, every job runs once, and a helper that is late (its core held
by another process) is not waited for and makes the next small passes single-threaded."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn.ops import dispatch, native
from linattn.ops.delta import native as delta_native
from linattn.ops.linear import native as linear_native
from linattn.ops.linear import passes as linear_passes


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(native.threads, "_late_until", 0.0)


def test_small_work_stays_on_the_calling_thread(two_threads):
    m = native.PARALLEL_MIN
    assert native.threads_for(m - 1, 16) == 1  # a decoding step, a short prefill
    assert native.threads_for(m, 16) == 1  # one threshold's worth: not worth a second thread
    assert native.threads_for(2 * m, 16) == 2
    assert native.threads_for(100 * m, 1) == 1  # one part cannot be split
    assert native.threads_for(10, 16, min_work=5) == 2  # the op's own threshold


def test_one_torch_thread_means_one(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert native.threads_for(1 << 40, 64) == 1


def test_back_off_after_a_late_helper(two_threads, monkeypatch):
    m = native.PARALLEL_MIN
    monkeypatch.setattr(native.threads, "_late_until", float("inf"))
    assert native.threads_for(4 * m, 16) == 1
    assert native.threads_for(native.BACKOFF_WORK * m, 16) == 2  # large work: threads anyway


def test_every_job_runs_once_and_errors_come_after_all(two_threads):
    done, slots = [], set()
    lock = threading.Lock()

    def part(slot, i):
        with lock:
            done.append(i)
            slots.add(slot)
        if i == 3:
            raise RuntimeError("job 3")

    with pytest.raises(RuntimeError, match="job 3"):
        native.run_parts(part, [(i,) for i in range(10)], 2)
    assert sorted(done) == list(range(10))
    assert slots <= {0, 1}
    done.clear()
    native.run_parts(lambda slot, i: done.append((slot, i)), [(0,), (1,)], 1)
    assert done == [(0, 0), (0, 1)]  # one thread: in order, on the calling thread


def test_each_thread_walks_its_own_run_of_jobs_then_takes_from_the_back():
    """Jobs next to each other (neighbouring heads, whose states are neighbours in memory) go
    to one thread in order; a thread done with its run takes from the back of the longest run
    left, so that the threads meet without interleaving."""
    from linattn.ops.native.threads import _next_job, _runs

    runs = _runs(8, 2)
    assert runs == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [_next_job(runs, 1) for _ in range(4)] == [4, 5, 6, 7]
    assert [_next_job(runs, 1) for _ in range(2)] == [3, 2]  # thread 1 done: the back of run 0
    assert [_next_job(runs, 0) for _ in range(3)] == [0, 1, None]
    runs = _runs(5, 3)
    assert runs == [[0], [1, 2], [3, 4]]
    assert [_next_job(runs, slot) for slot in (2, 2, 2, 0, 1, 1)] == [3, 4, 2, 0, 1, None]


def test_a_late_helper_is_not_waited_for(two_threads, monkeypatch):
    """On Python's pool (a build without OpenMP, a forked child), every pool thread blocked (as
    if descheduled): the calling thread runs every job alone, returns without waiting, and
    small passes then stay on one thread for a while."""
    monkeypatch.setattr(native.threads, "_on_omp_threads", lambda worker, threads: False)
    pool = native.pool(1)
    release = threading.Event()
    blockers = [pool.submit(release.wait, 30) for _ in range(pool._max_workers)]
    try:
        ran = []
        native.run_parts(lambda slot, i: ran.append((slot, i)), [(i,) for i in range(6)], 2)
        assert sorted(ran) == [(0, i) for i in range(6)]
        assert native.threads_for(2 * native.PARALLEL_MIN, 16) == 1
    finally:
        release.set()
        for b in blockers:
            b.result(timeout=30)


def _meet(names: dict):
    """A part for run_parts that records which thread ran each slot and holds the first thread
    to take a job until the other has taken one too (whichever starts first: a helper awake
    already may take the first job before the calling thread does)."""
    arrived = {0: threading.Event(), 1: threading.Event()}

    def part(slot, i):
        names[slot] = threading.current_thread().name
        arrived[min(slot, 1)].set()
        arrived[1 - min(slot, 1)].wait(2)

    return part


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_helpers_share_real_work(two_threads):
    """With a free pool, a helper takes jobs too (slot 1 appears) when jobs take a while."""
    names: dict = {}
    native.run_parts(_meet(names), [(i,) for i in range(4)], 2)
    assert set(names) == {0, 1}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_helpers_are_torchs_openmp_threads(two_threads):
    """Where a loaded build has OpenMP, the helpers are the threads torch's own operations run
    on (la_run_threads), not Python's pool: after torch's parallel operations those spin for a
    while, and a pool thread then shared a core with one."""
    linear_native.kernels()  # a build loaded
    if not native.threads._on_omp_threads(lambda slot: None, 2):
        pytest.skip("the loaded build has no OpenMP")
    names: dict = {}
    native.run_parts(_meet(names), [(i,) for i in range(4)], 2)
    assert set(names) == {0, 1}
    assert not names[1].startswith("linattn"), names  # not the pool's


def test_a_split_pass_in_a_forked_child_does_not_wait_for_the_parents_threads(
        forked_child_exit):
    """A pass split over threads in a forked child runs on Python's pool there: OpenMP's
    threads, which the parent's passes ran on, stayed in the parent."""
    setup = (
        "import os, threading, torch\n"
        "from linattn.ops import native\n"
        "from linattn.ops.linear import native as linear_native\n"
        "torch.set_num_threads(2)\n"
        "linear_native.kernels()\n"
        "def part(slot, i):\n"
        "    threading.Event().wait(0.01)\n"
        "for _ in range(3):\n"
        "    native.run_parts(part, [(i,) for i in range(8)], 2)\n"
    )
    child = (
        "ran = []\n"
        "native.run_parts(lambda slot, i: ran.append(i), [(i,) for i in range(8)], 2)\n"
        "os._exit(7 if sorted(ran) == list(range(8)) else 3)\n"
    )
    assert forked_child_exit(setup, child) == 7


@pytest.fixture
def torch_threads():
    """Torch's thread count, restored after the test whatever it did."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_torch_on_one_thread_narrows_and_restores(torch_threads):
    torch.set_num_threads(2)
    with native.torch_on_one_thread(True):
        assert torch.get_num_threads() == 1
        with native.torch_on_one_thread(True):  # nested: the inner one restores nothing
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with native.torch_on_one_thread(False):  # work worth the threads: left alone
        assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), native.torch_on_one_thread(True):
        raise RuntimeError("the call failed")
    assert torch.get_num_threads() == 2  # restored after an error too


def _run_threads(*targets):
    """Run each target in a thread of its own, re-raising the first error here."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_overlapping_narrowings_in_two_threads_each_narrow_and_restore_their_own(
        torch_threads):
    """Torch's OpenMP count is per thread: each of two overlapping calls narrows its own
    thread and gives its own thread the count back, whichever ends first. (One count for the
    process, "the first narrows, the last restores", left the first thread on 1 thread for
    good when the second ended last, and never narrowed the second.)"""
    torch.set_num_threads(2)
    ready, a_in, b_in, a_out, b_out = (threading.Event() for _ in range(5))
    seen = {}

    def first():
        assert torch.get_num_threads() == 2
        assert ready.wait(10)
        with native.torch_on_one_thread(True):
            seen["first inside"] = torch.get_num_threads(), native.torch_threads()
            a_in.set()
            assert b_in.wait(10)
        a_out.set()
        assert b_out.wait(10)
        seen["first after"] = torch.get_num_threads(), native.torch_threads()

    def second():
        assert torch.get_num_threads() == 2  # this thread's count, taken before any narrowing
        ready.set()
        assert a_in.wait(10)
        with native.torch_on_one_thread(True):
            seen["second inside"] = torch.get_num_threads(), native.torch_threads()
            b_in.set()
            assert a_out.wait(10)  # the first one ends while this one is still narrowed
        b_out.set()
        seen["second after"] = torch.get_num_threads(), native.torch_threads()

    _run_threads(first, second)
    assert seen == {"first inside": (1, 2), "second inside": (1, 2),
                    "first after": (2, 2), "second after": (2, 2)}
    assert torch.get_num_threads() == 2


def test_a_thread_starting_during_a_narrowing_keeps_the_users_count(torch_threads):
    """A thread whose torch count is first set while another thread is narrowed copies the
    user's count, not the narrowing's 1 (it kept 1 for good, and a calibration it triggered
    was keyed, and measured again, for 1 thread)."""
    torch.set_num_threads(2)
    narrowed, started = threading.Event(), threading.Event()
    seen = {}

    def narrowing():
        with native.torch_on_one_thread(True):
            narrowed.set()
            assert started.wait(10)

    def starting():
        assert narrowed.wait(10)
        seen["during"] = torch.get_num_threads()  # as any first parallel operation would
        started.set()

    _run_threads(narrowing, starting)
    assert seen == {"during": 2}

    def later():  # and nothing the narrowing did is left behind for threads after it
        seen["later"] = torch.get_num_threads(), native.torch_threads()

    _run_threads(later)
    assert seen["later"] == (2, 2)


def test_a_small_call_runs_torch_on_one_thread_and_gives_the_count_back(torch_threads,
                                                                          monkeypatch):
    """The compiled linear attention runs its torch operations on one thread for small calls
    (each of them would otherwise wait for the other OpenMP thread), forward and backward, and
    gives the count back; a large call keeps torch's threads."""
    if linear_native.kernels() is None:
        pytest.skip(f"compiled path: {linear_native.unavailable()}")
    torch.set_num_threads(2)
    seen = []
    for name in ("_causal_forward", "_causal_backward"):
        real = getattr(linear_passes, name)

        def spy(*a, real=real, name=name):
            seen.append((name, torch.get_num_threads()))
            return real(*a)

        monkeypatch.setattr(linear_passes, name, spy)
    q, k, v = (torch.randn(1, 2, 16, 16, requires_grad=True) for _ in range(3))
    with dispatch.use(impl="native"):
        linattn.linear_attention(q, k, v, is_causal=True).sum().backward()
        assert seen == [("_causal_forward", 1), ("_causal_backward", 1)]
        assert torch.get_num_threads() == 2
        seen.clear()
        monkeypatch.setattr(native.threads, "_late_until", 0.0)
        big = linear_native.PARALLEL_MIN  # a call of 16 heads worth threads
        T = 2 * big // (16 * 16 * 16)
        q, k, v = (torch.randn(1, 16, T, 16) for _ in range(3))
        linattn.linear_attention(q, k, v, is_causal=True)
        assert seen == [("_causal_forward", 2)]


def test_torch_threads_reads_through_a_narrowing(torch_threads):
    """The policy, the dispatcher's memo and the calibration's cache key read the user's count,
    not the 1 of a small call running in another thread (which made a second calibration)."""
    torch.set_num_threads(2)
    with native.torch_on_one_thread(True):
        assert torch.get_num_threads() == 1 and native.torch_threads() == 2
    assert native.torch_threads() == 2


@pytest.mark.parametrize("op", ["gated", "delta"])
def test_small_gated_and_delta_calls_run_torch_on_one_thread(op, torch_threads, monkeypatch):
    """The same for GLA's and the delta rule's compiled forward and backward (their custom
    ops say what is small: linattn.ops._library.KernelOp's ``small``)."""
    from linattn.ops.delta import native as delta_native
    from linattn.ops.gated import native as gated_native

    mod = gated_native if op == "gated" else delta_native
    if mod.kernels() is None:
        pytest.skip(f"compiled path: {mod.unavailable()}")
    torch.set_num_threads(2)
    seen = []
    names = (("_forward_span", "_backward_span") if op == "gated"
             else ("_forward", "_backward_heads"))
    for name in names:
        real = getattr(mod, name)

        def spy(*a, real=real, name=name, **kw):
            seen.append(torch.get_num_threads())
            return real(*a, **kw)

        monkeypatch.setattr(mod, name, spy)
    q, k, v = (torch.randn(1, 2, 16, 16, requires_grad=True) for _ in range(3))
    with dispatch.use(impl="native"):
        if op == "gated":
            gk = F.logsigmoid(torch.randn(1, 2, 16, 16))
            out = linattn.gated_linear_attention(q, k, v, gk=gk)
        else:
            out = linattn.delta_rule(q, k, v, torch.rand(1, 2, 16))
        out.sum().backward()
    assert seen and set(seen) == {1}, seen
    assert torch.get_num_threads() == 2


def test_the_runtime_probe_ignores_a_replaced_torch_get_num_threads(monkeypatch):
    """The OpenMP probe's answer is kept for the process: a fake torch.get_num_threads in
    force when it first runs (tests faking core counts) must not turn narrowing off."""
    real = native._find_omp_setter()
    if real is None:
        pytest.skip("no OpenMP runtime that torch reads its count from")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert native._find_omp_setter() is not None


def test_value_checks_reduce_on_the_calling_thread(torch_threads, monkeypatch):
    """Every value check (log-gates, β, γ) runs its reduction on one thread (on two, torch
    handed each to its second OpenMP thread, whose wake-up cost more than the check: 2.3 ms of
    a 13.6 ms GLA forward), and torch's count comes back."""
    torch.set_num_threads(2)
    seen = []
    real = torch.Tensor.aminmax

    def spy(x, *a, **kw):
        seen.append(torch.get_num_threads())
        return real(x, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "aminmax", spy)
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, 2, 64))
    linattn.gated_linear_attention(q, k, v, g=g)
    linattn.delta_rule(q, F.normalize(k, dim=-1), v, torch.rand(1, 2, 64), g)
    linattn.decay_linear_attention(q, k, v, torch.full((1, 2), 0.9))
    assert seen == [1] * 4, seen  # g; β and g; γ
    assert torch.get_num_threads() == 2


# ----------------------------------------------------- the kernels' own splitting (la_parallel)
def test_native_threads_policy(two_threads, monkeypatch):
    m = native.NATIVE_PARALLEL_MIN
    assert native.native_threads(m - 1, 16) == 1  # a few heads' step: not worth a thread
    assert native.native_threads(2 * m, 16) == 2
    assert native.native_threads(100 * m, 1) == 1  # one part
    assert native.native_threads(10, 16, min_work=5) == 2
    monkeypatch.setattr(native.threads, "_late_in_a_row", 0)
    for _ in range(native.threads.LATE_IN_A_ROW - 1):  # once or twice: threads asleep, no more
        native.note_late()
        assert native.native_threads(2 * m, 16) == 2
    native.note_on_time()  # on time: the count starts again
    for _ in range(native.threads.LATE_IN_A_ROW - 1):
        native.note_late()
    assert native.native_threads(2 * m, 16) == 2
    native.note_late()  # late in a row: small calls back off
    assert native.native_threads(2 * m, 16) == 1
    assert native.native_threads(native.BACKOFF_WORK * m, 16) == 2
    monkeypatch.setattr(native.threads, "_late_until", 0.0)
    monkeypatch.setattr(native.threads, "_forked", True)  # a forked child: never
    assert native.native_threads(1 << 40, 16) == 1


def _gated_step_inputs(H: int, K: int = 64, V: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(2, H, K, generator=g), dim=-1)
    k = F.normalize(torch.randn(2, H, K, generator=g), dim=-1)
    v = torch.randn(2, H, V, generator=g)
    beta = torch.rand(2, H, generator=g)
    gate = -torch.rand(2, H, generator=g)
    S = torch.randn(2, H, K, V, generator=g) * 0.1
    return q, k, v, beta, gate, S


@pytest.mark.skipif(delta_native.unavailable() is not None,
                    reason="no compiled kernels here")
@pytest.mark.parametrize("threads", [2, 3])
def test_a_decoding_step_split_over_threads_is_the_one_thread_step(threads, torch_threads,
                                                                   monkeypatch):
    """Each head runs the same code whichever thread takes it (la_parallel's parts), so the
    split step gives the one-thread step's values (compared within float32's rounding, not bit
    for bit: the rule for results across thread counts)."""
    q, k, v, beta, gate, S = _gated_step_inputs(H=24)
    torch.set_num_threads(1)
    o1, S1 = linattn.delta_rule_step(q, k, v, beta, S, g_t=gate)
    torch.set_num_threads(threads)
    monkeypatch.setattr(native.threads, "NATIVE_PARALLEL_MIN", 1)  # split even this
    monkeypatch.setattr(native.threads, "_late_until", 0.0)
    for _ in range(3):  # (the first call may find the other threads asleep)
        o2, S2 = linattn.delta_rule_step(q, k, v, beta, S, g_t=gate)
        tol = dict(rtol=4 * torch.finfo(torch.float32).eps, atol=4 * torch.finfo(torch.float32).eps)
        torch.testing.assert_close(o2, o1, **tol)
        torch.testing.assert_close(S2, S1, **tol)


@pytest.mark.skipif(delta_native.unavailable() is not None,
                    reason="no compiled kernels here")
def test_a_decoding_step_in_a_forked_child_does_not_wait_for_the_parents_threads(
        forked_child_exit):
    """GNU OpenMP's threads do not survive a fork: a parallel region in the child of a process
    that ran one waits for them for ever. The kernels' splitting stays off in a forked child."""
    setup = (
        "import os, torch, linattn\n"
        "from linattn.ops import native\n"
        "torch.set_num_threads(2)\n"
        "native.threads.NATIVE_PARALLEL_MIN = 1\n"
        "q = torch.nn.functional.normalize(torch.randn(1, 32, 64), dim=-1)\n"
        "v, b, S = torch.randn(1, 32, 64), torch.rand(1, 32), torch.zeros(1, 32, 64, 64)\n"
        "for _ in range(3):\n"
        "    linattn.delta_rule_step(q, q, v, b, S)\n"
    )
    child = (
        "linattn.delta_rule_step(q, q, v, b, S)\n"
        "os._exit(7)\n"
    )
    assert forked_child_exit(setup, child) == 7
