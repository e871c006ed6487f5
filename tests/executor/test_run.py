"""The run loop on real HDF5 files and arrays, with the NumPy backend and an asynchronous
staging backend (``executor_cases.AsyncBackend``): products, layouts, progress, errors and
resume, direct copies of pinned arrays, the fill's and the drain's pieces, hooks."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import h5py
import numpy as np
import pytest
from executor_cases import (BACKENDS, AsyncBackend, BlockAsyncBackend, PinnedAsyncBackend,
                            RecordingAsyncBackend, array_run, h5, job_record, run)

from bigmm import io
from bigmm.backends.numpy import NumpyBackend
from bigmm.errors import Interrupted, ReadError, ShapeError
from bigmm.executor import STAGES, Progress, RunStats, execute
from bigmm.executor import loads
from bigmm.executor.tuning import DRAIN, RAMP, split_range
from bigmm.io.inputs import caller_splits
from bigmm.io.source import ArraySource
from bigmm.planner import make_plan
from bigmm.planner.schedule import MAX_LOOKAHEAD
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance


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
    (37, 41, 97, np.float64, False, False, -1.5, 0.0, "resident-c"),  # every C strip resident
    (53, 29, 61, np.float32, True, True, 1.0, 0.5, "resident-c"),  # old C read into strips
    # through two host C buffers in the first round
    (53, 37, 61, np.float64, False, True, 0.5, 1.0, "whole-a"),  # all of A, columns of tiles
    (37, 53, 61, np.float32, True, False, 1.0, 0.0, "whole-b"),  # all of B, rows of tiles
]


@pytest.mark.parametrize("bname", list(BACKENDS))
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,alpha,beta,order", CASES)
def test_product_matches_reference(tmp_path, bname, m, n, k, dtype, ta, tb, alpha, beta, order):
    out, ref, stats, plan = run(tmp_path, BACKENDS[bname](), m=m, n=n, k=k, dtype=dtype,
                                 ta=ta, tb=tb, alpha=alpha, beta=beta, order=order,
                                 io_threads=3)
    assert relative_error(out, ref) <= tolerance(dtype, k)
    assert stats.tiles_done == plan.n_tiles and stats.tiles_skipped == 0
    assert stats.flops == plan.flops
    assert stats.bytes_written == plan.bytes_written


TAILS = [
    # (m, n, k, beta, tail): K panels of 24, strips of 16 rows
    (70, 33, 97, 0.0, 1),  # one panel finished strip by strip
    (70, 33, 97, 1.0, 3),  # three, old C read
    (70, 33, 97, 0.0, 5),  # all of them: B wholly resident, strips one by one
    (70, 33, 40, 1.0, 2),  # all of them, old C read: a strip's C read into the host buffer
    # the strip two before is still to be copied out through
    (9, 33, 20, -1.0, 1),  # one strip, one panel
]


@pytest.mark.parametrize("bname", list(BACKENDS))
@pytest.mark.parametrize("m,n,k,beta,tail", TAILS)
def test_resident_c_tails(tmp_path, bname, m, n, k, beta, tail):
    out, ref, stats, plan = run(tmp_path, BACKENDS[bname](), m=m, n=n, k=k, beta=beta,
                                 alpha=0.5, order="resident-c", tail=tail, io_threads=2)
    assert plan.order == "resident-c" and plan.tail == tail and plan.c_slots == plan.ni
    assert relative_error(out, ref) <= tolerance(np.float64, k)
    assert stats.bytes_read == plan.bytes_read == 8 * (m * k + k * n + (m * n if beta else 0))


SPANS = [
    # (m, n, k, beta, tail, a_span): K panels of 24, strips of 16 rows
    (70, 33, 97, 0.0, 1, 2),  # rounds in pairs, the last one alone; a one-panel tail
    (70, 33, 97, 1.0, 3, 2),  # old C read; the tail's three panels a pair and one
    (70, 33, 97, 0.0, 2, 3),  # three rounds in one load, the tail's two in one
    (70, 33, 97, 0.5, 5, 2),  # all of K in the tail: strip by strip, pairs of panels
    (9, 33, 20, -1.0, 1, 2),  # one strip, one panel: nothing to pair
    (5, 7, 206, 0.5, 2, 2),  # one strip, an odd head: a load of one panel, later one of two
    # in the same slots (the gemm set up for one must not run on the other's rows)
]


@pytest.mark.parametrize("m,n,k,beta,tail,a_span", SPANS)
def test_resident_c_loads_a_several_panels_at_a_time(tmp_path, m, n, k, beta, tail, a_span):
    out, ref, stats, plan = run(tmp_path, AsyncBackend(seed=1), m=m, n=n, k=k, beta=beta,
                                 alpha=0.5, order="resident-c", tail=tail, a_span=a_span,
                                 io_threads=2)
    assert plan.a_span == a_span and plan.tail == tail
    assert relative_error(out, ref) <= tolerance(np.float64, k)
    # each A load once: no panel of a load read again
    assert stats.bytes_read == plan.bytes_read == 8 * (m * k + k * n + (m * n if beta else 0))


class _SlowPinning(AsyncBackend):
    """AsyncBackend whose host buffers take ``delay`` seconds to pin off the issuing thread
    (and the ``fail``-th such buffer fails), recording which thread pinned each one and
    when, and when the first gemm was issued."""

    def __init__(self, delay=0.05, fail=None):
        super().__init__(seed=2)
        self.delay, self.fail = delay, fail
        self.pins: list[tuple[str, float]] = []  # (thread name, end)
        self.first_gemm = None

    def host_buffer(self, size, dtype):
        name = threading.current_thread().name
        if name.startswith("bigmm-pin"):
            time.sleep(self.delay)
            if self.fail is not None and sum(n.startswith("bigmm-pin")
                                             for n, _ in self.pins) + 1 == self.fail:
                raise MemoryError("Expected pinned host memory. Got none left.")
        self.pins.append((name, time.perf_counter()))
        return super().host_buffer(size, dtype)

    def gemm(self, a, b, c, alpha, beta, trans_a, trans_b, stream):
        if self.first_gemm is None:
            self.first_gemm = time.perf_counter()
        super().gemm(a, b, c, alpha, beta, trans_a, trans_b, stream)


PINNING = [
    # (m, n, k, beta, order)
    (37, 41, 97, 0.0, "stream"),  # A and B's second buffers and C's two pinned in the background
    (53, 29, 61, 0.5, "resident-c"),  # old C read: C's first buffer pinned before the start
    (29, 53, 61, 1.0, "resident-b"),  # B column panel resident
]


@pytest.mark.parametrize("m,n,k,beta,order", PINNING)
def test_staging_pinned_in_the_background_while_the_run_starts(tmp_path, m, n, k, beta, order):
    be = _SlowPinning()
    out, ref, _, plan = run(tmp_path, be, m=m, n=n, k=k, beta=beta, order=order, io_threads=3)
    assert relative_error(out, ref) <= tolerance(np.float64, k)
    slots = plan.host_slots()
    first = sum(1 for *_, f in slots if f)
    assert [name.startswith("bigmm-pin") for name, _ in be.pins] == [
        i >= first for i in range(len(slots))]
    assert first == 2 + (beta != 0) and len(slots) > first
    assert be.first_gemm < be.pins[-1][1]  # computing before the last buffer was pinned


@pytest.mark.parametrize("m,n,k,order", [
    (37, 41, 97, "stream"),  # two slots of each operand
    (53, 29, 61, "resident-c"),  # every C strip on the device
    (29, 53, 61, "whole-b"),  # all of B on the device, one block of its panels
])
def test_equal_device_buffers_come_from_one_block(tmp_path, m, n, k, order):
    be = BlockAsyncBackend(seed=3)
    out, ref, _, plan = run(tmp_path, be, m=m, n=n, k=k, order=order, io_threads=3)
    assert relative_error(out, ref) <= tolerance(np.float64, k)
    slots = {"A": (plan.bm * plan.bk, plan.a_slots), "B": (plan.bk * plan.bn, plan.b_slots),
             "C": (plan.bm * plan.bn, plan.c_slots)}
    assert be.blocks and be.blocks == [v for v in slots.values() if v[1] > 1]
    assert be.singles == sum(1 for _, count in slots.values() if count == 1)


@pytest.mark.parametrize("fail", [
    1,  # A's second buffer: the reader filling it raises
    3,  # C's first buffer: the copy out of the first tile raises
])
def test_a_buffer_that_fails_to_pin_fails_the_run_resumably(tmp_path, fail):
    with pytest.raises(MemoryError, match="pinned host memory"):
        run(tmp_path, _SlowPinning(delay=0.01, fail=fail), m=37, n=41, k=97, order="stream",
            io_threads=3)
    assert io.read_journal(f"{tmp_path / 'c.h5'}:/C") is not None  # resumable


class _FailsToBegin:
    """A hook whose begin raises (after the run's buffers were allocated)."""

    def begin(self, be, plan, alpha, beta):
        raise RuntimeError("Expected to begin. Got refused.")


def test_a_run_failing_as_it_starts_leaves_no_buffer_pinning(tmp_path):
    with pytest.raises(RuntimeError, match="refused"):
        run(tmp_path, _SlowPinning(delay=0.2), m=37, n=41, k=97, order="stream",
            faults=_FailsToBegin())
    assert not [t for t in threading.enumerate() if t.name.startswith("bigmm-pin")]


LAYOUTS = [
    # (description, dataset keywords)
    ("contiguous", {}),
    ("chunked, chunks not dividing the tiles", {"chunks": (7, 11)}),
    ("gzip-compressed chunks", {"chunks": (16, 9), "compression": "gzip"}),
]


@pytest.mark.parametrize("what,layout", LAYOUTS, ids=[x[0] for x in LAYOUTS])
@pytest.mark.parametrize("bname", list(BACKENDS))
def test_input_layouts(tmp_path, bname, what, layout):
    out, ref, _, _ = run(tmp_path, BACKENDS[bname](), m=43, n=38, k=71, ta=True,
                          layout=layout, io_threads=4)
    assert relative_error(out, ref) <= tolerance(np.float64, 71)


def test_stats_and_progress(tmp_path):
    seen: list[Progress] = []
    out, ref, stats, plan = run(tmp_path, NumpyBackend(), m=40, n=33, k=50,
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
        self.chunks, self.panel_chunks = src.chunks, src.panel_chunks

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
    spec_a, spec_b = h5(tmp_path / "a.h5", "A", a), h5(tmp_path / "b.h5", "B", b)
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(16, 16, 10))
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B],
                          job=job_record(plan, 1.0, 0.0))
    with pytest.raises(ReadError, match="rows .* of A"):
        execute(plan, _FailingSource(A, ok=2 * 3 * 4), B, sink, BACKENDS[bname](),
                io_threads=2)
    sink.close()
    assert io.read_journal(spec_c) is not None  # resumable
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B],
                          job=job_record(plan, 1.0, 0.0), resume=True)
    done = len(sink.done)
    stats = execute(plan, A, B, sink, BACKENDS[bname](), io_threads=2)
    sink.close(), A.close(), B.close()
    assert 0 < done < plan.n_tiles and stats.tiles_skipped == done
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert relative_error(f["C"][...], a @ b) <= tolerance(np.float64, k)


def test_truncated_input_file_is_a_read_error(tmp_path):
    m, n, k = 64, 16, 64
    spec_a = h5(tmp_path / "a.h5", "A", random_matrix((m, k), np.float64, seed=1))
    spec_b = h5(tmp_path / "b.h5", "B", random_matrix((k, n), np.float64, seed=2))
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False,
                     tile=(16, 16, 16))
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    os.truncate(tmp_path / "a.h5", os.path.getsize(tmp_path / "a.h5") - m * k * 8 // 2)
    sink = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    with pytest.raises(ReadError, match="A"):
        execute(plan, A, B, sink, NumpyBackend())
    A.close(), B.close()


@pytest.mark.parametrize("order", [
    "stream",   # tiles row by row, panels streamed
    "whole-a",  # all of A kept, tiles column by column
    "whole-b",  # all of B kept, tiles row by row
])
@pytest.mark.parametrize("bname", list(BACKENDS))
def test_stop_interrupts_and_resume_is_bit_identical(tmp_path, bname, order):
    m, n, k = 50, 44, 36
    a, b = random_matrix((m, k), np.float64, seed=7), random_matrix((k, n), np.float64, seed=8)
    spec_a, spec_b = h5(tmp_path / "a.h5", "A", a), h5(tmp_path / "b.h5", "B", b)
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(8, 16, 12), order=order)
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    full = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    execute(plan, A, B, full, BACKENDS[bname]())
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    stop = threading.Event()

    def on_tile(p: Progress):
        if p.tiles_done == 5:
            stop.set()

    job = job_record(plan, 1.0, 0.0)
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
    staged = array_run(PinnedAsyncBackend(1), a.copy(), b.copy(), staged_c, plan, alpha, beta)
    be = PinnedAsyncBackend(2)
    ops = {"A": a, "B": b, "C": c0.copy()}
    for name, x in (("A", a), ("B", b), ("C", c0)):
        if name in which:
            be.pin(x.base if x.base is not None else x)
    direct = array_run(be, a, b, c0, plan, alpha, beta)
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
    stats = array_run(be, a, b, c, plan, 1.0, 0.0)
    assert stats.bytes_staged == 8 * plan.a_reads * m * k + plan.bytes_written
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)
    cpu = NumpyBackend()
    assert cpu.host_pinned(b) is False
    cpu_plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False)
    stats = array_run(cpu, a, b, np.full((m, n), np.nan), cpu_plan, 1.0, 0.0)
    assert stats.bytes_staged == 0 and stats.bytes_read == cpu_plan.bytes_read


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
    be = RecordingAsyncBackend(seed=4)
    out, ref, stats, plan = run(tmp_path, be, m=m, n=n, k=k, dtype=dtype, ta=ta, tb=tb,
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
    array_run(RecordingAsyncBackend(1), a.copy(), b.copy(), staged_c, plan, 1.0, 0.0)
    be = RecordingAsyncBackend(2)
    c = np.full((m, n), np.nan)
    for x in (a, b, c):
        be.pin(x)
    stats = array_run(be, a, b, c, plan, 1.0, 0.0)
    assert stats.bytes_staged == 0 and be.staging_bytes == 0
    assert np.array_equal(c, staged_c)
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)


# ----- hooks and the window ---------------------------------------------------------------------

class _Recorder:
    """A hook that records its points: (point, tile, K panel) in call order."""

    def __init__(self):
        self.calls = []

    def begin(self, be, plan, alpha, beta):
        self.calls.append(("begin", None, None))

    def landed(self, st, a, b, stream):
        assert a.shape == (st.tile.r1 - st.tile.r0, st.k1 - st.k0)  # A not transposed here
        self.calls.append(("landed", st.tile.index, st.kp))

    def finished(self, st, c, stream):
        assert st.last and c.shape == st.tile.shape
        self.calls.append(("finished", st.tile.index, st.kp))


@pytest.mark.parametrize("bname", [
    "numpy",  # host memory: no pieces anyway
    "async",  # staging: a hook turns the fill's and the drain's pieces off
])
def test_a_hook_is_called_at_its_points_for_whole_steps(tmp_path, bname):
    hook = _Recorder()
    be = RecordingAsyncBackend(seed=5) if bname == "async" else NumpyBackend()
    out, ref, stats, plan = run(tmp_path, be, m=60, n=45, k=70, budget_tiles=(32, 32, 24),
                                faults=hook)
    assert relative_error(out, ref) <= tolerance(np.float64, 70)
    want = [("begin", None, None)]
    for st in plan.steps():
        want.append(("landed", st.tile.index, st.kp))
        if st.last:
            want.append(("finished", st.tile.index, st.kp))
    assert hook.calls == want
    if bname == "async":  # one gemm per step: no K or row pieces
        assert len(be.gemms) == plan.n_steps


def test_the_loads_run_at_most_the_schedules_window_ahead():
    assert loads.MAX_LOOKAHEAD is MAX_LOOKAHEAD


class _CallerRecord(io.Source):
    """An array source that records, per read, its rows and whether it ran on the caller's
    thread alone (:func:`bigmm.io.inputs.caller_splits`)."""

    def __init__(self, array, label):
        self.inner = io.open_input(array, name=label)
        self.shape, self.dtype, self.label = self.inner.shape, self.inner.dtype, label
        self.layout, self.reads = "array", []

    def read(self, r0, r1, c0, c1, out) -> None:
        self.reads.append((r1 - r0, c1 - c0, caller_splits(), r0))
        self.inner.read(r0, r1, c0, c1, out)


def _recorded_run(a_source, threads: int, seed: int):
    """A 2048^3 float32 product of 2048 x 1024 A panels (8 MiB: two pieces of PIECE_BYTES)
    and 1024 x 1024 B panels (one piece) from recording sources; returns (A's, B's reads)."""
    m = n = k = 2048
    a, b = random_matrix((m, k), np.float32, seed), random_matrix((k, n), np.float32, seed + 1)
    plan = make_plan(m, n, k, "float32", device_budget=64 << 20, staging=True,
                     tile=(2048, 1024, 1024), order="stream")
    A, B = a_source(a, "A"), _CallerRecord(b, "B")
    sink = io.open_output(None, shape=(m, n), dtype=np.float32, inputs=[A, B], job={})
    be = AsyncBackend(seed=seed)
    try:
        execute(plan, A, B, sink, be, io_threads=threads)
    finally:
        be.close()
    np.testing.assert_allclose(sink.array, a @ b, rtol=1e-4, atol=1e-3)
    return A.reads, B.reads


def test_panels_split_between_readers_are_read_on_their_threads_alone():
    a_reads, b_reads = _recorded_run(_CallerRecord, 4, seed=3)
    halves = [alone for rows, _, alone, _ in a_reads if rows == 1024]  # A's panels, split
    whole = [alone for rows, _, alone, _ in a_reads if rows == 2048]  # the first step's pieces
    assert halves and all(halves) and whole and not any(whole)
    assert b_reads and not any(alone for _, _, alone, _ in b_reads)  # 4 MiB: one piece


class _RawChunks(_CallerRecord):
    """The same, stored in raw chunks of 768 rows (read in part: panels need not align)."""

    chunks = (768, 512)

    @property
    def panel_chunks(self):
        return None


def test_pieces_of_a_raw_chunked_panel_are_whole_chunk_rows():
    a_reads, _ = _recorded_run(_RawChunks, 8, seed=5)
    starts = sorted({r0 for _, _, alone, r0 in a_reads if alone})
    assert starts == [0, 768]  # two pieces of 8 MiB, split on a chunk row (else at 1024)


class _Decoded(ArraySource):
    """An array read as if its chunks were decoded: records the decoders it is limited to."""

    decode_bytes = 1 << 10

    def __init__(self, array, label):
        super().__init__(array, label)
        self.limits = []

    def limit_decoders(self, n: int) -> None:
        self.limits.append(n)


@pytest.mark.parametrize("threads", [
    (1, 3),  # A one decoding reader, B three
    (2, 0),  # B not decoded: left as it is
])
def test_the_run_limits_the_decoding_readers_as_planned(threads):
    from bigmm.planner.decode import Decoding

    a, b = random_matrix((64, 48), np.float32, seed=1), random_matrix((48, 32), np.float32)
    plan = replace(make_plan(64, 32, 48, device_budget=1 << 20, staging=False),
                   decoding=Decoding(tuple(1 << 10 if t else 0 for t in threads), (4, 4),
                                     threads))
    A, B = _Decoded(a, "A"), _Decoded(b, "B")
    c = np.empty((64, 32), np.float32)
    execute(plan, A, B, io.open_output(c, shape=(64, 32), dtype=np.float32, inputs=[], job={}),
            NumpyBackend())
    assert A.limits == [threads[0]] and B.limits == ([threads[1]] if threads[1] else [])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
