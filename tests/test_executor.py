"""The executor on real HDF5 files: NumPy backend and an asynchronous staging backend.

``AsyncBackend`` behaves like a GPU backend as the executor sees it: device memory the host
cannot touch, copies and gemms queued on streams that run later in their own threads (with
random delays), events that complete only when the stream reaches them. Any missing event or
slot reused too early then shows up as a wrong product.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time

import h5py
import numpy as np
import pytest

from bigmm import io
from bigmm.backends.numpy import NumpyBackend
from bigmm.errors import Interrupted, ReadError, ShapeError, WriteError
from bigmm.executor import STAGES, Progress, RunStats, _pieces, execute
from bigmm.plan import make_plan
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance


# ----- a GPU-like backend -------------------------------------------------------------------

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

    def gemm(self, a, b, c, alpha, beta, trans_a, trans_b, stream):
        assert all(isinstance(x, _Dev) for x in (a, b, c))
        # the NumPy gemm takes C-contiguous operands; a K piece of a panel is a column range
        stream.q.put(lambda: self.cpu.gemm(np.ascontiguousarray(a.arr),
                                           np.ascontiguousarray(b.arr), c.arr, alpha, beta,
                                           trans_a, trans_b, None))

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


# ----- helpers ------------------------------------------------------------------------------

def _h5(path, name, array, **kw) -> str:
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


def _job(plan, alpha, beta):
    return {"plan": plan.key(), "alpha": alpha, "beta": beta}


def _run(tmp_path, backend, *, m, n, k, dtype=np.float64, ta=False, tb=False, alpha=1.0,
         beta=0.0, order=None, budget_tiles=(16, 16, 24), layout=None, seed=0, **exec_kw):
    """Write A, B (and C) to HDF5, run the executor, return (C read back, reference, stats)."""
    a = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c0 = random_matrix((m, n), dtype, seed + 2)
    kw = layout or {}
    spec_a = _h5(tmp_path / "a.h5", "A", a, **kw)
    spec_b = _h5(tmp_path / "b.h5", "B", b, **kw)
    spec_c = _h5(tmp_path / "c.h5", "C", c0) if beta else str(tmp_path / "c.h5") + ":/C"
    bm, bn, bk = budget_tiles
    w = np.dtype(dtype).itemsize
    plan = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb, reads_c=beta != 0,
                     device_budget=w * (2 * bm * bn + 2 * (bm + bn) * bk) * 4,
                     staging=backend.staging, align=8, tile=(bm, bn, bk), order=order)
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    sink = io.open_output(spec_c, shape=(m, n), dtype=dtype, inputs=[A, B],
                          job=_job(plan, alpha, beta), reads_c=beta != 0)
    try:
        stats = execute(plan, A, B, sink, backend, alpha=alpha, beta=beta, **exec_kw)
    finally:
        sink.close(), A.close(), B.close(), backend.close()
    with h5py.File(tmp_path / "c.h5", "r") as f:
        out = f["C"][...]
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    return out, ref, stats, plan


BACKENDS = {"numpy": lambda: NumpyBackend(), "async": lambda: AsyncBackend(seed=1)}

CASES = [
    # (m, n, k, dtype, trans_a, trans_b, alpha, beta, order)
    (1, 1, 1, np.float64, False, False, 1.0, 0.0, None),  # 1x1x1: one tile, one panel
    (1, 45, 1, np.float32, False, True, 2.0, 0.0, None),  # one row, depth 1
    (45, 1, 7, np.float64, True, False, 1.0, 0.0, None),  # one column
    (37, 41, 97, np.float64, False, False, -1.5, 0.0, "stream"),  # primes, many K panels
    (37, 41, 97, np.float32, True, True, 1.0, 0.5, "stream"),  # both transposed, beta != 0
    (53, 29, 61, np.float64, True, False, 0.75, -2.0, "resident-a"),  # A row panel resident
    (29, 53, 61, np.float64, False, True, 1.0, 1.0, "resident-b"),  # B column panel resident
    (101, 3, 67, np.float32, False, False, 1.0, 0.0, "resident-a"),  # tall-skinny
]


@pytest.mark.parametrize("bname", list(BACKENDS))
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,alpha,beta,order", CASES)
def test_product_matches_reference(tmp_path, bname, m, n, k, dtype, ta, tb, alpha, beta, order):
    out, ref, stats, plan = _run(tmp_path, BACKENDS[bname](), m=m, n=n, k=k, dtype=dtype,
                                 ta=ta, tb=tb, alpha=alpha, beta=beta, order=order,
                                 io_threads=3)
    assert relative_error(out, ref) <= tolerance(dtype, k)
    assert stats.tiles_done == plan.n_tiles and stats.tiles_skipped == 0
    assert stats.flops == plan.flops
    assert stats.bytes_written == plan.bytes_written


LAYOUTS = [
    # (description, dataset keywords)
    ("contiguous", {}),
    ("chunked, chunks not dividing the tiles", {"chunks": (7, 11)}),
    ("gzip-compressed chunks", {"chunks": (16, 9), "compression": "gzip"}),
]


@pytest.mark.parametrize("what,layout", LAYOUTS, ids=[x[0] for x in LAYOUTS])
@pytest.mark.parametrize("bname", list(BACKENDS))
def test_input_layouts(tmp_path, bname, what, layout):
    out, ref, _, _ = _run(tmp_path, BACKENDS[bname](), m=43, n=38, k=71, ta=True,
                          layout=layout, io_threads=4)
    assert relative_error(out, ref) <= tolerance(np.float64, 71)


def test_stats_and_progress(tmp_path):
    seen: list[Progress] = []
    out, ref, stats, plan = _run(tmp_path, NumpyBackend(), m=40, n=33, k=50,
                                 progress=seen.append)
    assert relative_error(out, ref) <= tolerance(np.float64, 50)
    assert [p.tiles_done for p in seen] == list(range(1, plan.n_tiles + 1))
    assert all(p.tiles_total == plan.n_tiles for p in seen)
    assert seen[-1].flops_done == plan.flops and seen[-1].bytes_written == plan.bytes_written
    assert all(x.elapsed <= y.elapsed for x, y in zip(seen, seen[1:]))
    assert isinstance(stats, RunStats) and set(stats.busy) == set(STAGES)
    assert stats.read_busy > 0 and stats.compute_busy > 0 and stats.write_busy > 0
    assert all(0 <= u <= 1.0 + 1e-9 for u in stats.utilisation().values())
    assert stats.bytes_read == plan.bytes_read
    assert stats.to_dict()["flops_per_second"] > 0


class _FailingSource:
    """A real source whose reads fail after ``ok`` successful ones."""

    def __init__(self, src, ok):
        self.src, self.ok, self.lock = src, ok, threading.Lock()
        self.shape, self.dtype, self.label = src.shape, src.dtype, src.label
        self.chunks = src.chunks

    def read(self, r0, r1, c0, c1, out):
        with self.lock:
            self.ok -= 1
            fail = self.ok < 0
        if fail:
            raise OSError(5, "Input/output error")
        self.src.read(r0, r1, c0, c1, out)


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_reader_error_surfaces_and_output_resumes(tmp_path, bname):
    m, n, k = 48, 40, 30
    a, b = random_matrix((m, k), np.float64, seed=3), random_matrix((k, n), np.float64, seed=4)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(16, 16, 10))
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B],
                          job=_job(plan, 1.0, 0.0))
    with pytest.raises(ReadError, match="rows .* of A"):
        execute(plan, _FailingSource(A, ok=2 * 3 * 4), B, sink, BACKENDS[bname](),
                io_threads=2)
    sink.close()
    assert io.read_journal(spec_c) is not None  # resumable
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B],
                          job=_job(plan, 1.0, 0.0), resume=True)
    done = len(sink.done)
    stats = execute(plan, A, B, sink, BACKENDS[bname](), io_threads=2)
    sink.close(), A.close(), B.close()
    assert 0 < done < plan.n_tiles and stats.tiles_skipped == done
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert relative_error(f["C"][...], a @ b) <= tolerance(np.float64, k)


def test_truncated_input_file_is_a_read_error(tmp_path):
    m, n, k = 64, 16, 64
    spec_a = _h5(tmp_path / "a.h5", "A", random_matrix((m, k), np.float64, seed=1))
    spec_b = _h5(tmp_path / "b.h5", "B", random_matrix((k, n), np.float64, seed=2))
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False,
                     tile=(16, 16, 16))
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    os.truncate(tmp_path / "a.h5", os.path.getsize(tmp_path / "a.h5") - m * k * 8 // 2)
    sink = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    with pytest.raises(ReadError, match="A"):
        execute(plan, A, B, sink, NumpyBackend())
    A.close(), B.close()


class _FailingSink:
    """A real sink whose third write fails with a disk error."""

    def __init__(self, sink):
        self.sink, self.writes = sink, 0
        self.shape, self.dtype, self.label, self.done = sink.shape, sink.dtype, sink.label, sink.done

    def write(self, r0, r1, c0, c1, src):
        self.writes += 1
        if self.writes == 3:
            raise OSError(28, "No space left on device")
        self.sink.write(r0, r1, c0, c1, src)

    def commit(self, tiles):
        self.sink.commit(tiles)

    def finish(self):
        self.sink.finish()


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_writer_error_surfaces(tmp_path, bname):
    m, n, k = 40, 40, 12
    a, b = random_matrix((m, k), np.float64), random_matrix((k, n), np.float64, seed=1)
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(8, 8, 12))
    A, B = io.open_input(a), io.open_input(b)
    sink = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    with pytest.raises(WriteError, match="rows"):
        execute(plan, A, B, _FailingSink(sink), BACKENDS[bname]())


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_stop_interrupts_and_resume_is_bit_identical(tmp_path, bname):
    m, n, k = 50, 44, 36
    a, b = random_matrix((m, k), np.float64, seed=7), random_matrix((k, n), np.float64, seed=8)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(8, 16, 12))
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    full = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    execute(plan, A, B, full, BACKENDS[bname]())
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    stop = threading.Event()

    def on_tile(p: Progress):
        if p.tiles_done == 5:
            stop.set()

    job = _job(plan, 1.0, 0.0)
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B], job=job)
    with pytest.raises(Interrupted, match="resumable"):
        execute(plan, A, B, sink, BACKENDS[bname](), progress=on_tile, stop=stop)
    sink.close()
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B], job=job,
                          resume=True)
    assert len(sink.done) >= 5
    stats = execute(plan, A, B, sink, BACKENDS[bname]())
    sink.close(), A.close(), B.close()
    assert stats.tiles_skipped >= 5 and stats.tiles_done == plan.n_tiles - stats.tiles_skipped
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert np.array_equal(f["C"][...], full.result)


def test_operands_must_match_the_plan():
    plan = make_plan(10, 12, 14, "float64", device_budget=1 << 20, staging=False)
    A = io.open_input(random_matrix((10, 15), np.float64))
    B = io.open_input(random_matrix((14, 12), np.float64))
    sink = io.open_output(None, shape=(10, 12), dtype=np.float64, inputs=[A, B], job={})
    with pytest.raises(ShapeError, match=r"Expected A of shape \(10, 14\)"):
        execute(plan, A, B, sink, NumpyBackend())


PIECES = [
    # (r0, r1, cols, threads, chunks, expected pieces)
    (0, 10, 4, 4, None, [(0, 10)]),  # small: one piece
    (0, 100, 1 << 20, 4, None, [(0, 25), (25, 50), (50, 75), (75, 100)]),  # even split
    (5, 1000, 1 << 20, 4, (64, 64), [(5, 256), (256, 512), (512, 768), (768, 1000)]),  # chunks
    (0, 3, 1 << 20, 8, None, [(0, 1), (1, 2), (2, 3)]),  # at most one piece per row
]


@pytest.mark.parametrize("r0,r1,cols,threads,chunks,expected", PIECES)
def test_panel_reads_split_on_chunk_rows(r0, r1, cols, threads, chunks, expected):
    assert _pieces(r0, r1, cols, 4, threads, chunks) == expected


# ----- pinned user arrays: copied directly, no staging ------------------------------------------

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


def _array_run(backend, a, b, c, plan, alpha, beta):
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(plan.m, plan.n), dtype=plan.dtype, inputs=[A, B],
                          job={}, reads_c=beta != 0)
    try:
        return execute(plan, A, B, sink, backend, alpha=alpha, beta=beta, io_threads=3)
    finally:
        backend.close()


PINNED = [
    # (pinned operands, m, n, k, dtype, trans_a, trans_b, alpha, beta, order, pitch)
    ("ABC", 37, 41, 97, np.float64, False, False, 1.0, 0.0, "stream", 0),  # all, NaN in C
    ("ABC", 37, 41, 97, np.float32, True, True, -1.5, 0.5, "stream", 0),  # old C from pinned C
    ("A", 53, 29, 61, np.float64, True, False, 0.75, -2.0, "resident-a", 0),  # mixed: A only
    ("BC", 29, 53, 61, np.float64, False, True, 1.0, 1.0, "resident-b", 0),  # B and C pinned
    ("ABC", 45, 38, 71, np.float64, False, False, 2.0, 0.5, "stream", 5),  # column slices
    ("C", 45, 38, 71, np.float32, True, False, 1.0, 0.0, "stream", 3),  # only C, a slice
]


@pytest.mark.parametrize("which,m,n,k,dtype,ta,tb,alpha,beta,order,pitch", PINNED)
def test_pinned_arrays_skip_the_staging_bit_identically(which, m, n, k, dtype, ta, tb, alpha,
                                                        beta, order, pitch):
    """Pinned operands are copied straight from (and C straight into) the user's arrays, also
    through views with a row pitch; the product is bit-identical to the staged run's."""
    def operand(shape, seed):  # a column slice of a wider array when pitch > 0
        x = random_matrix((shape[0], shape[1] + pitch), dtype, seed)
        return x[:, pitch // 2:pitch // 2 + shape[1]]

    a = operand((k, m) if ta else (m, k), 1)
    b = operand((n, k) if tb else (k, n), 2)
    c0 = operand((m, n), 3) if beta else np.full((m, n), np.nan, dtype)
    if pitch and not beta:
        c0 = np.full((m, n + pitch), np.nan, dtype)[:, 1:n + 1]
    w = np.dtype(dtype).itemsize
    bm, bn, bk = 16, 16, 24
    plan = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb, reads_c=beta != 0,
                     device_budget=w * (2 * bm * bn + 2 * (bm + bn) * bk) * 4, staging=True,
                     align=8, tile=(bm, bn, bk), order=order)
    staged_c = c0.copy()
    staged = _array_run(PinnedAsyncBackend(1), a.copy(), b.copy(), staged_c, plan, alpha, beta)
    be = PinnedAsyncBackend(2)
    ops = {"A": a, "B": b, "C": c0.copy()}
    for name, x in (("A", a), ("B", b), ("C", c0)):
        if name in which:
            be.pin(x.base if x.base is not None else x)
    direct = _array_run(be, a, b, c0, plan, alpha, beta)
    assert np.array_equal(c0, staged_c)  # same plan, same gemms: bit for bit
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=ops["C"] if beta else None,
                         trans_a=ta, trans_b=tb)
    assert relative_error(c0, ref) <= 10 * tolerance(dtype, k)
    assert direct.bytes_read == staged.bytes_read == plan.bytes_read
    assert direct.bytes_written == staged.bytes_written == plan.bytes_written
    assert staged.bytes_staged == plan.bytes_read + plan.bytes_written
    w = np.dtype(dtype).itemsize
    through = {"A": w * plan.a_reads * m * k, "B": w * plan.b_reads * k * n,
               "C": plan.bytes_written + (w * m * n if beta else 0)}
    assert direct.bytes_staged == sum(v for op, v in through.items() if op not in which)
    if which == "ABC":
        assert direct.read_busy == 0.0 and be.staging_bytes == 0  # no reads, no host slots


def test_pinned_but_not_row_contiguous_or_cpu_falls_back_to_staging():
    """A pinned array whose rows are not contiguous (a transposed view) is staged as before;
    the NumPy backend reports nothing pinned and stages nothing."""
    m, n, k = 30, 20, 40
    a = np.asfortranarray(random_matrix((m, k), np.float64, 1))  # rows strided
    b = random_matrix((k, n), np.float64, 2)
    plan = make_plan(m, n, k, "float64", device_budget=8 * (2 * 16 * 16 + 2 * 32 * 24) * 4,
                     staging=True, align=8, tile=(16, 16, 24), order="stream")
    be = PinnedAsyncBackend(3)
    be.pin(a), be.pin(b)
    c = np.full((m, n), np.nan)
    stats = _array_run(be, a, b, c, plan, 1.0, 0.0)
    assert stats.bytes_staged == 8 * plan.a_reads * m * k + plan.bytes_written
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)
    cpu = NumpyBackend()
    assert cpu.host_pinned(b) is False
    cpu_plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False)
    stats = _array_run(cpu, a, b, np.full((m, n), np.nan), cpu_plan, 1.0, 0.0)
    assert stats.bytes_staged == 0 and stats.bytes_read == cpu_plan.bytes_read


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_large_tiles_into_an_array_are_written_in_pieces(bname):
    """A tile of 8 MiB or more goes into a NumPy output in row pieces on several threads
    (one thread copies at a few GB/s); with staging, the run's last tile is copied out and
    written in the drain's row pieces, each as soon as its gemm is done. Every element lands
    once, in the right place."""
    from bigmm.io.sink import ArraySink
    from bigmm.executor import DRAIN, split_range

    class Recording(ArraySink):
        def __init__(self, array):
            super().__init__(array, "C")
            self.calls, self.threads = [], {}

        def write(self, r0, r1, c0, c1, src):
            self.calls.append((r0, r1, c0, c1))
            self.threads[r0] = threading.current_thread().name
            super().write(r0, r1, c0, c1, src)

    m, n, k = 2200, 1030, 40
    a, b = random_matrix((m, k), np.float64, seed=3), random_matrix((k, n), np.float64, seed=4)
    plan = make_plan(m, n, k, "float64", device_budget=64 << 20, staging=bname == "async",
                     tile=(1100, 1030, 40), order="stream")  # two 8.6 MiB tiles
    out = np.full((m, n), np.nan)
    sink = Recording(out)
    execute(plan, io.open_input(a), io.open_input(b), sink, BACKENDS[bname](), io_threads=4)
    assert np.allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    rows = sorted((r0, r1) for r0, r1, _, _ in sink.calls)
    assert rows[0][0] == 0 and rows[-1][1] == m
    assert all(x[1] == y[0] for x, y in zip(rows, rows[1:]))  # every row once
    first = [r for r in rows if r[0] < 1100]
    assert len(first) == 2  # 8.6 MiB: two pieces of at least 4 MiB
    assert all(sink.threads[r0].startswith("bigmm-copy") for r0, _ in first)  # writer's pool
    last = [(r0 - 1100, r1 - 1100) for r0, r1 in rows if r0 >= 1100]
    if bname == "async":  # the drain's row pieces, each under 4 MiB: one write each
        assert last == split_range(1100, DRAIN) and len(last) == 4
    else:
        assert len(last) == 2


# ----- the fill and the drain: the run's first step in K pieces, its last in row pieces -------

class RecordingAsyncBackend(PinnedAsyncBackend):
    """PinnedAsyncBackend that records every gemm's shapes and beta, in issue order."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.gemms: list[tuple] = []

    def gemm(self, a, b, c, alpha, beta, trans_a, trans_b, stream):
        self.gemms.append((a.shape, b.shape, c.shape, beta))
        super().gemm(a, b, c, alpha, beta, trans_a, trans_b, stream)


def _depth(call, ta):
    a_shape = call[0]
    return a_shape[0] if ta else a_shape[1]


RAMPED = [
    # (m, n, k, dtype, trans_a, trans_b, beta, order, tile)
    (600, 530, 1100, np.float64, False, False, 0.0, "stream", (300, 265, 600)),  # plain
    (600, 530, 1100, np.float32, True, True, 0.5, "stream", (300, 265, 600)),  # both transposed,
    # old C read with the first piece
    (600, 530, 1100, np.float64, True, False, -1.0, "resident-a", (300, 265, 600)),  # A row
    # panel resident: later tiles reuse the panel the pieces landed in
    (600, 530, 1100, np.float64, False, True, 0.0, "resident-b", (300, 265, 600)),  # B resident
    (777, 300, 1300, np.float64, False, False, 0.0, "stream", (777, 300, 1300)),  # one step: K
    # pieces, the last of them in row pieces
]


@pytest.mark.parametrize("m,n,k,dtype,ta,tb,beta,order,tile", RAMPED)
def test_first_step_in_k_pieces_and_last_tile_in_row_pieces(tmp_path, m, n, k, dtype, ta, tb,
                                                            beta, order, tile):
    """With staging, the run's first step is multiplied in RAMP's K pieces (each copied in on
    its own, a column range of a panel staged contiguously) and the last tile's last gemm in
    DRAIN's row pieces (each copied out and written on its own); the product is right, the
    bytes moved are the plan's."""
    from bigmm.executor import DRAIN, RAMP, split_range

    be = RecordingAsyncBackend(seed=4)
    out, ref, stats, plan = _run(tmp_path, be, m=m, n=n, k=k, dtype=dtype, ta=ta, tb=tb,
                                 alpha=1.5, beta=beta, order=order, budget_tiles=tile,
                                 io_threads=3)
    assert relative_error(out, ref) <= 10 * tolerance(dtype, k)
    assert stats.bytes_read == plan.bytes_read and stats.bytes_written == plan.bytes_written
    ramp = split_range(min(plan.bk, k), RAMP)
    drain = split_range(plan.tile(plan.ni - 1, plan.nj - 1).shape[0], DRAIN)
    assert len(ramp) > 1 and len(drain) > 1
    head = be.gemms[:len(ramp)]
    assert [_depth(g, ta) for g in head] == [b - a for a, b in ramp]
    assert [g[3] for g in head] == [beta] + [1.0] * (len(ramp) - 1)
    tail = be.gemms[-len(drain):]
    assert [g[2][0] for g in tail] == [b - a for a, b in drain]
    assert len(be.gemms) == plan.n_tiles * plan.nk + len(ramp) - 1 + len(drain) - 1


def test_pinned_arrays_take_the_pieces_from_the_users_arrays():
    """Pinned operands: the K pieces are copied in from regions of the user's arrays and the
    row pieces out into the user's C, bit for bit the staged run's result."""
    m, n, k = 600, 530, 1100
    a, b = random_matrix((m, k), np.float64, 1), random_matrix((k, n), np.float64, 2)
    plan = make_plan(m, n, k, "float64", device_budget=64 << 20, staging=True, align=8,
                     tile=(300, 265, 600), order="stream")
    staged_c = np.full((m, n), np.nan)
    _array_run(RecordingAsyncBackend(1), a.copy(), b.copy(), staged_c, plan, 1.0, 0.0)
    be = RecordingAsyncBackend(2)
    c = np.full((m, n), np.nan)
    for x in (a, b, c):
        be.pin(x)
    stats = _array_run(be, a, b, c, plan, 1.0, 0.0)
    assert stats.bytes_staged == 0 and be.staging_bytes == 0
    assert np.array_equal(c, staged_c)
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)
