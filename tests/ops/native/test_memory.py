"""The compiled passes' output memory: large outputs come from recycled buffers, handed out
again only once no tensor refers to them."""

import gc

import pytest
import torch

from linattn.ops.native import memory
from linattn.ops.native.memory import _Recycler, empty_cache, empty_hugepage

LIKE = torch.empty(0)
SHAPE = (4, _Recycler.MIN_BYTES // 16, 4)  # 4 * MIN_BYTES // 4 floats: at the threshold


def test_small_outputs_are_ordinary_tensors():
    t = empty_hugepage(LIKE, 3, 5)
    assert t.shape == (3, 5) and t.dtype == torch.float32 and t.untyped_storage().resizable()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_outputs_have_the_shape_and_dtype_asked(dtype):
    t = empty_hugepage(LIKE.to(dtype), *SHAPE)
    assert t.shape == SHAPE and t.dtype == dtype and t.is_contiguous()
    t.fill_(1.5)
    assert t.sum().item() == pytest.approx(1.5 * t.numel())


def test_a_buffer_in_use_is_never_handed_out_again(monkeypatch):
    monkeypatch.setattr(memory, "_RECYCLER", _Recycler())
    a = empty_hugepage(LIKE, *SHAPE)
    view = a[1:3]  # a view keeps the buffer alive as well
    del a
    gc.collect()
    b = empty_hugepage(LIKE, *SHAPE)
    view.fill_(7.0)
    b.fill_(3.0)
    assert torch.all(view == 7.0) and view.data_ptr() != b.data_ptr()


def test_a_freed_buffer_is_reused(monkeypatch):
    monkeypatch.setattr(memory, "_RECYCLER", _Recycler())
    a = empty_hugepage(LIKE, *SHAPE)
    ptr = a.data_ptr()
    del a
    gc.collect()
    b = empty_hugepage(LIKE, *SHAPE)
    assert b.data_ptr() == ptr


def test_the_pool_holds_at_most_its_cap_and_releases_free_buffers_on_request(monkeypatch):
    pool = _Recycler()
    pool.keep_bytes = 3 * _Recycler.MIN_BYTES
    monkeypatch.setattr(memory, "_RECYCLER", pool)
    one = _Recycler.MIN_BYTES
    a, b = empty_hugepage(LIKE, one // 4), empty_hugepage(LIKE, 2 * one // 4)
    a.fill_(1.0)
    b.fill_(2.0)
    assert sorted(x.numel() for x in pool._bufs) == [one, 2 * one]
    c = empty_hugepage(LIKE, one // 4)  # a's is in use: a new one, over the cap
    c.fill_(3.0)  # so the oldest (a's, in use) is let go: it lives on in its tensor
    assert sorted(x.numel() for x in pool._bufs) == [one, 2 * one]
    assert torch.all(a == 1.0) and torch.all(b == 2.0) and torch.all(c == 3.0)
    del b
    gc.collect()
    empty_cache()  # b's buffer is free: let go; c's is in use: kept
    assert [x.numel() for x in pool._bufs] == [one]
    assert torch.all(c == 3.0) and torch.all(a == 1.0)


def test_python_references_elsewhere_do_not_pin_free_buffers(monkeypatch):
    """Free is the storage's own count of owners: more Python references to the pool's buffer
    objects (a frame held by a stored traceback, a tracer) do not make a free one look used."""
    pool = _Recycler()
    monkeypatch.setattr(memory, "_RECYCLER", pool)
    a = empty_hugepage(LIKE, *SHAPE)
    ptr = a.data_ptr()
    del a
    held = list(pool._bufs)
    assert empty_hugepage(LIKE, *SHAPE).data_ptr() == ptr
    del held


def test_outputs_can_be_resized_and_their_storage_freed(monkeypatch):
    """An output is a tensor like any other (issue 51): ``resize_`` grows it, and one whose
    storage the user resized (grown, or freed with ``untyped_storage().resize_(0)`` as FSDP
    frees memory) is not handed out again: the next output of that size used to be a view of
    a 0-byte storage (a RuntimeError in every later call of that size)."""
    pool = _Recycler()
    monkeypatch.setattr(memory, "_RECYCLER", pool)
    a = empty_hugepage(LIKE, *SHAPE)
    a.fill_(1.0)
    a.resize_(SHAPE[0] + 1, *SHAPE[1:])
    assert a.shape == (SHAPE[0] + 1, *SHAPE[1:]) and torch.all(a[: SHAPE[0]] == 1.0)
    del a
    b = empty_hugepage(LIKE, *SHAPE)
    b.untyped_storage().resize_(0)
    del b
    c = empty_hugepage(LIKE, *SHAPE)
    assert c.untyped_storage().nbytes() == c.numel() * c.element_size()
    c.fill_(2.0)
    assert torch.all(c == 2.0)


def test_an_output_moved_to_shared_memory_is_not_recycled(monkeypatch):
    """``share_memory_`` moves the buffer's storage to shared memory, which another process may
    still read after this one frees the output: its memory is never handed out again (a later
    output would overwrite what the other process reads, and be in shared memory itself)."""
    pool = _Recycler()
    monkeypatch.setattr(memory, "_RECYCLER", pool)
    a = empty_hugepage(LIKE, *SHAPE)
    a.share_memory_()
    ptr = a.data_ptr()
    del a
    b = empty_hugepage(LIKE, *SHAPE)
    assert not b.is_shared() and b.data_ptr() != ptr


def test_float32_rows_views_float32_and_widens_the_rest_exactly():
    x = torch.randn(2, 3, 5, 4)
    assert memory.float32_rows(x, 6).data_ptr() == x.data_ptr()  # a view
    for dtype in (torch.bfloat16, torch.float16):
        y = x.to(dtype)
        got = memory.float32_rows(y, 6)
        assert got.shape == (6, 5, 4) and got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got, y.float().reshape(6, 5, 4))  # widening is exact
    cols = x.transpose(-1, -2)  # last dimension not contiguous: copied
    got = memory.float32_rows(cols, 6)
    assert got.stride(-1) == 1 and torch.equal(got, cols.reshape(6, 4, 5))
    big = torch.randn(4, _Recycler.MIN_BYTES // 16, 2, dtype=torch.bfloat16)  # recycled buffer
    assert torch.equal(memory.float32_rows(big, 4), big.float())


def test_float32_step_rows_passes_contiguous_float32_and_copies_the_rest():
    """The decoding steps' inputs (the GLA and delta-rule natives share this helper)."""
    x = torch.randn(2, 3, 4)
    assert memory.float32_step_rows(x, 6) is x  # as it is: no reshape
    for y in (x.to(torch.bfloat16), x.transpose(0, 1)):
        got = memory.float32_step_rows(y, 6)
        assert got.shape == (6, 4) and got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got, y.float().reshape(6, 4))


@pytest.mark.parametrize("rows", [3, _Recycler.MIN_BYTES // 16])  # an ordinary and a recycled copy
def test_recycled_cast_is_a_differentiable_cast_whose_buffers_come_back(monkeypatch, rows):
    """What bfloat16 with gradients runs: widened inputs, a narrowed output, and their
    gradients cast back, as ``Tensor.to`` gives them; large ones in recycled buffers."""
    monkeypatch.setattr(memory, "_RECYCLER", _Recycler())
    x = torch.randn(2, rows, 2).to(torch.bfloat16).requires_grad_()
    wide = memory.recycled_cast(x, torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, x.detach().float())
    g = torch.randn(wide.shape)
    wide.backward(g)
    assert x.grad.dtype == torch.bfloat16 and torch.equal(x.grad, g.to(torch.bfloat16))
    assert memory.recycled_cast(x, torch.bfloat16) is x  # already that dtype
    if rows > 3:
        ptr = wide.data_ptr()
        del wide
        gc.collect()
        assert memory.recycled_cast(x.detach(), torch.float32).data_ptr() == ptr


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_gets_a_free_pool_lock(monkeypatch):
    """A child forked while another thread holds the pool's lock still gets outputs."""
    import os
    import threading

    pool = _Recycler()
    monkeypatch.setattr(memory, "_RECYCLER", pool)
    held, release = threading.Event(), threading.Event()

    def hold():
        with pool._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: must not wait for a lock no thread of its own holds
        try:
            out = empty_hugepage(LIKE, *SHAPE)
            os._exit(0 if out.shape == SHAPE else 1)
        finally:
            os._exit(2)
    release.set()
    holder.join()
    import signal
    import time

    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:  # still waiting for the lock: a deadlock
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for the pool's lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0
