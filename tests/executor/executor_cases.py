"""Shared cases of the executor's tests: a staging backend on threads, HDF5 operands, runs.

``AsyncBackend`` behaves like a GPU backend as the executor sees it: device memory the host
cannot touch, copies and gemms queued on streams that run later in their own threads (with
random delays), events that complete only when the stream reaches them. Any missing event or
slot reused too early then shows up as a wrong product.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import h5py
import numpy as np

from bigmm import io
from bigmm.backends.numpy import NumpyBackend
from bigmm.errors import RegisterError
from bigmm.executor import execute
from bigmm.planner import make_plan
from bigmm.testing import random_matrix, reference_gemm


class _Dev:
    """Device memory: only the streams may read or write it. Slices like an array."""

    def __init__(self, arr):
        self.arr = arr

    def __getitem__(self, index):
        return _Dev(self.arr[index])

    @property
    def shape(self):
        return self.arr.shape


class _Stream(threading.Thread):
    def __init__(self, rng):
        super().__init__(daemon=True)
        self.q: queue.Queue = queue.Queue()
        self.rng = rng
        self.start()

    def run(self):
        while (op := self.q.get()) is not None:
            time.sleep(self.rng.random() * 0.002)
            op()


class AsyncBackend:
    name = "async-test"
    staging = True

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.streams: list[_Stream] = []
        self.cpu = NumpyBackend()

    def host_buffer(self, size, dtype):
        return np.full(size, np.nan, dtype=dtype)

    def device_buffer(self, size, dtype):
        return _Dev(np.full(size, np.nan, dtype=dtype))

    def view(self, buf, shape):
        if isinstance(buf, _Dev):
            return _Dev(self.cpu.view(buf.arr, shape))
        return self.cpu.view(buf, shape)

    def stream(self):
        s = _Stream(random.Random(self.rng.random()))
        self.streams.append(s)
        return s

    def copy_in(self, host, dev, stream):
        assert isinstance(dev, _Dev) and isinstance(host, np.ndarray)
        stream.q.put(lambda: np.copyto(dev.arr, host))

    def copy_out(self, dev, host, stream):
        assert isinstance(dev, _Dev) and isinstance(host, np.ndarray)
        stream.q.put(lambda: np.copyto(host, dev.arr))

    def host_pinned(self, arr):
        return False

    def gemm_launcher(self, a, b, c, alpha, beta, trans_a, trans_b):
        return lambda stream: self.gemm(a, b, c, alpha, beta, trans_a, trans_b, stream)

    def gemm(self, a, b, c, alpha, beta, trans_a, trans_b, stream):
        assert all(isinstance(x, _Dev) for x in (a, b, c))
        # the NumPy gemm takes C-contiguous operands; a K piece of a panel is a column range
        stream.q.put(lambda: self.cpu.gemm(np.ascontiguousarray(a.arr),
                                           np.ascontiguousarray(b.arr), c.arr, alpha, beta,
                                           trans_a, trans_b, None))

    def scale(self, c, beta, stream):
        stream.q.put(lambda: self.cpu.scale(c.arr, beta))

    def nonfinite(self, c, stream):
        counted = []
        stream.q.put(lambda: counted.append(self.cpu.nonfinite(c.arr)()))
        return lambda: counted[0]

    def record(self, stream):
        ev = threading.Event()
        stream.q.put(ev.set)
        return ev

    def wait(self, stream, event):
        stream.q.put(event.wait)

    def synchronize(self, event):
        event.wait()

    def memory_available(self):
        return 1 << 30

    def close(self):
        for s in self.streams:
            s.q.put(None)


class PinnedAsyncBackend(AsyncBackend):
    """AsyncBackend that treats the arrays given to ``pin`` (and views into them) as page-locked
    user memory; copies check that their host side is a staging buffer or such memory."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.pinned: list[tuple[int, int]] = []
        self.staging_bytes = 0  # host staging allocated

    def pin(self, x):
        lo = x.ctypes.data
        self.pinned.append((lo, lo + x.nbytes))
        return x

    def host_buffer(self, size, dtype):
        self.staging_bytes += int(size) * np.dtype(dtype).itemsize
        return self.pin(super().host_buffer(size, dtype))

    def host_pinned(self, arr):
        lo = arr.ctypes.data
        hi = lo + sum((n - 1) * s for n, s in zip(arr.shape, arr.strides)) + arr.itemsize
        return any(a <= lo and hi <= b for a, b in self.pinned)

    def copy_in(self, host, dev, stream):
        assert self.host_pinned(host), "a pageable host array reached copy_in"
        super().copy_in(host, dev, stream)

    def copy_out(self, dev, host, stream):
        assert self.host_pinned(host), "a pageable host array reached copy_out"
        super().copy_out(dev, host, stream)


class RegisteringAsyncBackend(PinnedAsyncBackend):
    """PinnedAsyncBackend with the Registers ability: ``register`` page-locks a range (whole
    pages, as the driver does; a range overlapping a locked one is refused, as the driver
    refuses a page locked twice), ``refuse(ptr, nbytes, read_only)`` says which requests the
    driver refuses. ``unregister`` releases a range only while no copy is queued or running;
    a copy that runs on memory no longer locked is recorded in ``violations``."""

    PAGE = 4096

    def __init__(self, seed=0, refuse=None):
        super().__init__(seed)
        self.refuse = refuse
        self.locked: dict[int, int] = {}
        self.calls: list[tuple] = []
        self.violations: list[str] = []
        self.queued = 0  # copies queued and not yet run
        self.lock = threading.Lock()

    def register(self, ptr, nbytes, read_only=False):
        self.calls.append(("register", ptr, nbytes, read_only))
        lo = ptr - ptr % self.PAGE
        hi = -(-(ptr + nbytes) // self.PAGE) * self.PAGE
        if self.refuse is not None and self.refuse(ptr, nbytes, read_only):
            raise RegisterError("Expected the driver to page-lock the range. Got refused.")
        if any(a < hi and lo < b for a, b in self.pinned):
            raise RegisterError("Expected pages not locked yet. Got a page locked twice.")
        self.pinned.append((lo, hi))
        self.locked[ptr] = hi - lo

    def unregister(self, ptr):
        assert self.queued == 0, "a range was released while copies were queued"
        self.calls.append(("unregister", ptr))
        lo = ptr - ptr % self.PAGE
        self.pinned.remove((lo, lo + self.locked.pop(ptr)))

    def _queue(self, stream, op, host):
        with self.lock:
            self.queued += 1

        def run():
            if not self.host_pinned(host):
                self.violations.append(f"copy of {host.shape} from memory not locked")
            op()
            with self.lock:
                self.queued -= 1

        stream.q.put(run)

    def copy_in(self, host, dev, stream):
        assert self.host_pinned(host), "a pageable host array reached copy_in"
        self._queue(stream, lambda: np.copyto(dev.arr, host), host)

    def copy_out(self, dev, host, stream):
        assert self.host_pinned(host), "a pageable host array reached copy_out"
        self._queue(stream, lambda: np.copyto(host, dev.arr), host)


class RecordingAsyncBackend(PinnedAsyncBackend):
    """PinnedAsyncBackend that records every gemm's shapes and beta, in issue order."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.gemms: list[tuple] = []

    def gemm(self, a, b, c, alpha, beta, trans_a, trans_b, stream):
        self.gemms.append((a.shape, b.shape, c.shape, beta))
        super().gemm(a, b, c, alpha, beta, trans_a, trans_b, stream)


class BlockAsyncBackend(AsyncBackend):
    """AsyncBackend that also allocates equal device buffers as one block (DeviceBlocks),
    recording each call's (size, count)."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.blocks: list[tuple[int, int]] = []
        self.singles = 0

    def device_buffer(self, size, dtype):
        self.singles += 1
        return super().device_buffer(size, dtype)

    def device_buffers(self, size, count, dtype):
        self.blocks.append((size, count))
        step = size + 3  # buffers apart, as on a device
        block = np.full(step * count, np.nan, dtype=dtype)
        return [_Dev(block[i * step:i * step + size]) for i in range(count)]


# ----- helpers ------------------------------------------------------------------------------

def h5(path, name, array, **kw) -> str:
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


def job_record(plan, alpha, beta):
    return {"plan": plan.key(), "alpha": alpha, "beta": beta}


def operands(m: int, n: int, k: int, ta: bool = False, tb: bool = False, dtype=np.float64,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A, B and the old C of :func:`run`'s job (stored transposed where ``ta``/``tb``)."""
    return (random_matrix((k, m) if ta else (m, k), dtype, seed),
            random_matrix((n, k) if tb else (k, n), dtype, seed + 1),
            random_matrix((m, n), dtype, seed + 2))


def run(tmp_path, backend, *, m, n, k, dtype=np.float64, ta=False, tb=False, alpha=1.0,
         beta=0.0, order=None, budget_tiles=(16, 16, 24), layout=None, seed=0, tail=None,
         a_span=None, **exec_kw):
    """Write A, B (and C) to HDF5, run the executor, return (C read back, reference, stats).
    Order resident-c takes strips C's width (``budget_tiles``' bn is ignored) and ``tail``."""
    a, b, c0 = operands(m, n, k, ta, tb, dtype, seed)
    kw = layout or {}
    spec_a = h5(tmp_path / "a.h5", "A", a, **kw)
    spec_b = h5(tmp_path / "b.h5", "B", b, **kw)
    spec_c = h5(tmp_path / "c.h5", "C", c0) if beta else str(tmp_path / "c.h5") + ":/C"
    bm, bn, bk = budget_tiles
    w = np.dtype(dtype).itemsize
    budget = w * (2 * bm * bn + 2 * (bm + bn) * bk) * 4
    if order == "resident-c":  # every strip of C on the device
        bn, budget = n, w * ((m + 2 * bm) * n + (m + 2 * bm) * bk + (k + 2 * bk) * n) * 2
        budget *= a_span or 1
    if order in ("whole-a", "whole-b"):  # all of one operand on the device
        budget = w * (2 * bm * bn + (m + bm) * (k + bk) + (k + bk) * (n + bn)) * 2
    plan = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb, reads_c=beta != 0,
                     device_budget=budget, staging=backend.staging, align=8,
                     tile=(bm, bn, bk), order=order, tail=tail, a_span=a_span)
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    sink = io.open_output(spec_c, shape=(m, n), dtype=dtype, inputs=[A, B],
                          job=job_record(plan, alpha, beta), reads_c=beta != 0)
    try:
        stats = execute(plan, A, B, sink, backend, alpha=alpha, beta=beta, **exec_kw)
    finally:
        sink.close(), A.close(), B.close(), backend.close()
    with h5py.File(tmp_path / "c.h5", "r") as f:
        out = f["C"][...]
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    return out, ref, stats, plan


def array_run(backend, a, b, c, plan, alpha, beta, *, close=True):
    """Run ``plan`` on arrays; the backend closed after (``close``: not where what it holds,
    such as arrays locked by the caller, must outlive the run)."""
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(plan.m, plan.n), dtype=plan.dtype, inputs=[A, B],
                          job={}, reads_c=beta != 0)
    try:
        return execute(plan, A, B, sink, backend, alpha=alpha, beta=beta, io_threads=3)
    finally:
        if close:
            backend.close()


BACKENDS = {"numpy": lambda: NumpyBackend(), "async": lambda: AsyncBackend(seed=1)}
