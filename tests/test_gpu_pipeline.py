"""The GPU out-of-core pipeline end to end: HDF5 and NumPy operands through the cupy backend.

Every product is checked against a float64 reference on fresh random data, with array outputs
poisoned with NaN first; the budgets force many C tiles and K panels so that slot reuse, the
event ordering between the three streams and edge tiles are all exercised.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace

import h5py
import numpy as np
import pytest

import bigmm
from bigmm.errors import OptionError
from bigmm.planner import make_plan
from bigmm.profile import Profile
from bigmm.testing import (pinned_array, random_matrix, reference_gemm, relative_error, tolerance,
                            wait_for_journaled_tiles)

HOST = "64MiB"  # fixed host staging budget: plans do not depend on the machine's RAM
F32, F64 = np.float32, np.float64

E2E = [
    # (m, n, k, dtype, trans_a, trans_b, alpha, beta, memory, kernel, inputs, output, chunks,
    #  min_tiles, min_panels, order)
    # odd shapes, many tiles and panels (plans, in any order, chosen by predicted time), HDF5
    # in and out
    (1000, 900, 1100, F32, False, False, 1.0, 0.0, 500_000, "bigmm", "h5", "h5", None,
     16, 4, None),
    # tiny budget: tiles of about 100, unaligned views and leading dimensions everywhere
    (1000, 900, 1100, F32, False, False, 1.0, 0.0, 200_000, "bigmm", "h5", "array", None,
     16, 4, None),
    # float64, A transposed, alpha and beta (old C read from the file, replaced in place)
    (777, 1031, 1201, F64, True, False, -1.5, 0.5, 1_000_000, "bigmm", "h5", "h5", None,
     16, 4, "stream"),
    # both transposed, chunked inputs (raw chunks, read in part: tiles need not align), alpha
    # only
    (1297, 613, 1500, F32, True, True, 2.0, 0.0, 1_000_000, "bigmm", "h5", "h5", (100, 128),
     8, 4, "stream"),
    # B transposed, negative beta, NumPy arrays in and out
    (520, 1100, 999, F32, False, True, 1.0, -1.0, 600_000, "bigmm", "array", "array", None,
     16, 4, "stream"),
    # one row of tiles: A (601 x 4001, in K panels) read once, reused across the row (resident
    # or streamed with its panels kept, as the calibrated rates choose)
    (601, 9001, 4001, F32, False, False, 1.0, 0.0, 20_000_000, "bigmm", "h5", "array", None,
     16, 2, ("resident-a", "stream")),
    # cuBLAS for the tile products, float32
    (1000, 900, 1100, F32, False, False, 1.0, 0.0, 800_000, "cublas", "array", "h5", None,
     16, 4, "stream"),
    # cuBLAS, float64, both transposed, beta
    (777, 1031, 1201, F64, True, True, 0.75, 2.0, 1_000_000, "cublas", "h5", "array",
     (100, 128), 16, 4, "stream"),
    # cuBLAS on TF32 tensor cores (looser tolerance)
    (611, 701, 1023, F32, False, False, 1.0, 0.0, 500_000, "cublas-tf32", "array", "array",
     None, 8, 4, "stream"),
]


def _ids(cases):
    return [f"{c[0]}x{c[1]}x{c[2]}-{np.dtype(c[3]).name}-{'T' if c[4] else 'N'}"
            f"{'T' if c[5] else 'N'}-{c[9]}-{c[10]}-{c[11]}-{c[8]}" for c in cases]


def _h5(path, name, array, chunks=None):
    with h5py.File(path, "a") as f:
        if name in f:
            del f[name]
        f.create_dataset(name, data=array, chunks=chunks)
    return f"{path}:/{name}"


def _tol(dtype, k, kernel):
    return 2e-3 if kernel == "cublas-tf32" else tolerance(dtype, k)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,alpha,beta,memory,kernel,inputs,output,chunks,"
                         "min_tiles,min_panels,order", E2E, ids=_ids(E2E))
def test_product_matches_float64_reference(tmp_path, m, n, k, dtype, ta, tb, alpha, beta,
                                           memory, kernel, inputs, output, chunks, min_tiles,
                                           min_panels, order):
    seed = int.from_bytes(os.urandom(4), "little")  # fresh data every run
    a = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c0 = random_matrix((m, n), dtype, seed + 2)
    if inputs == "h5":
        a_in = _h5(tmp_path / "a.h5", "A", a, chunks)
        b_in = _h5(tmp_path / "b.h5", "B", b, chunks)
    else:
        a_in, b_in = a, b
    if output == "h5":
        out = _h5(tmp_path / "c.h5", "C", c0) if beta != 0 else f"{tmp_path / 'c.h5'}:/C"
    else:
        out = c0.copy() if beta != 0 else np.full((m, n), np.nan, dtype)
    kw = dict(alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, memory=memory, host_memory=HOST,
              backend="cupy", kernel=kernel)
    p = bigmm.plan(a_in, b_in, out, **kw)
    # many steps through the pipeline, whichever tiles the calibrated rates choose
    assert p.n_tiles * p.nk >= min_tiles * min_panels and p.n_tiles > 1, str(p)
    assert order is None or p.order in (order if isinstance(order, tuple) else (order,)), str(p)
    if isinstance(order, tuple):
        assert p.a_reads == 1, str(p)
    result, stats = bigmm.matmul(a_in, b_in, out, stats=True, **kw)
    if output == "h5":
        with h5py.File(tmp_path / "c.h5", "r") as f:
            got = f["C"][...]
            assert f["C"].attrs["bigmm_complete"]
    else:
        got = result
        assert result is out
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= _tol(dtype, k, kernel)
    assert stats.tiles_done == p.n_tiles and stats.flops == 2 * m * n * k


@pytest.mark.gpu
def test_new_array_output_and_default_budget():
    a, b = random_matrix((333, 2049), F32, 5), random_matrix((2049, 517), F32, 6)
    c = bigmm.matmul(a, b, backend="cupy")
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(F32, 2049)


@pytest.mark.gpu
def test_inputs_are_copied_out_of_their_maps_in_wide_blocks(tmp_path):
    """The cupy backend names wide blocks for copies out of the input maps; A (2500 x 8000
    float32, 76 MiB) spans more than one and is read in narrow K panels."""
    from bigmm import api
    from bigmm.io import mapped

    a, b = random_matrix((2500, 8000), F32, 11), random_matrix((8000, 300), F32, 12)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    with api._opened(sa, sb, "cupy", None) as (be, A, B, _):
        assert A._map.step == B._map.step == be.map_step == mapped.WIDE_STEP_BYTES
    p = bigmm.plan(sa, sb, backend="cupy", memory=8_000_000, host_memory=HOST)
    assert p.nk > 1 and p.bk < 8000  # A's panels are column ranges: mapped copies
    c = bigmm.matmul(sa, sb, backend="cupy", memory=8_000_000, host_memory=HOST)
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(F32, 8000)


@pytest.mark.device_memory
@pytest.mark.gpu
def test_device_memory_stays_within_the_budget():
    import cupy

    n, budget = 4096, 64 << 20
    a, b = random_matrix((n, n), F32, 7), random_matrix((n, n), F32, 8)
    bigmm.matmul(a[:256, :256], b[:256, :256], backend="cupy", memory="4MiB")  # load kernels
    pool = cupy.get_default_memory_pool()
    pool_before = pool.total_bytes()
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    lowest = [free_before]

    def sample(_):
        lowest.append(cupy.cuda.runtime.memGetInfo()[0])

    p = bigmm.plan(a, b, memory=budget, host_memory=HOST, backend="cupy")
    out, stats = bigmm.matmul(a, b, memory=budget, host_memory=HOST, backend="cupy",
                              progress=sample, stats=True)
    used = free_before - min(lowest)
    assert p.n_tiles >= 4 and stats.tiles_done == p.n_tiles
    assert p.device_bytes <= budget
    assert used <= budget + (32 << 20), (used, budget)  # cudaMalloc rounds to 2 MiB pages
    assert used >= 0.5 * p.device_bytes  # the samples did see the run's buffers
    assert pool.total_bytes() == pool_before  # nothing went through cupy's memory pool
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_before - (8 << 20)  # all freed
    from bigmm.backends.cupy import pinned_bytes_held

    assert pinned_bytes_held() <= p.host_bytes + 4096 * 6  # staging within the host budget
    assert relative_error(out[:64], reference_gemm(a[:64], b)) <= tolerance(F32, n)


@pytest.mark.gpu
def test_a_second_run_is_planned_with_the_staging_the_first_kept():
    from collections import Counter

    from bigmm.backends.cupy import release_pinned
    from bigmm.planner.model import LOCK_SHARE, stage_times

    n = 3000
    a, b = random_matrix((n, n), F32, 21), random_matrix((n, n), F32, 22)
    kw = dict(memory="24MiB", host_memory=HOST, backend="cupy")
    release_pinned()
    first = bigmm.plan(a, b, **kw)
    assert first.rates.kept_pinned == () and first.rates.pin_bytes
    out = bigmm.matmul(a, b, **kw)
    kept = bigmm.plan(a, b, **kw).rates.kept_pinned  # (the plan may move with them)
    staging = Counter(nbytes for *_, nbytes, _ in first.host_slots())
    assert staging and not staging - Counter(kept)  # every buffer the run took is kept
    # the first plan again with those blocks: none pinned before or while it runs
    again = replace(first, rates=replace(first.rates, kept_pinned=kept))
    before, after = stage_times(first, first.rates), stage_times(again, again.rates)
    # the first step's buffers pinned before the run, the others' locking beside it
    pinned = sum(nbytes * (1 if f else LOCK_SHARE) for *_, nbytes, f in first.host_slots())
    assert before.setup - after.setup == pytest.approx(pinned / first.rates.pin_bytes)
    assert after.pinning == 0.0 < before.pinning  # C's buffers at least: never in place here
    assert again.predicted_seconds <= first.predicted_seconds
    assert relative_error(out[:64], reference_gemm(a[:64], b)) <= tolerance(F32, n)


@pytest.mark.gpu
def test_profile_shows_device_timed_stages_overlapping(tmp_path):
    n = 3000
    a, b = random_matrix((n, n), F32, 9), random_matrix((n, n), F32, 10)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    prof = Profile()
    out, stats = bigmm.matmul(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", memory="48MiB",
                              host_memory=HOST, backend="cupy", profile=prof, stats=True)
    assert set(prof.device_stages) == {"copy_in", "compute", "copy_out"}
    for stage in ("copy_in", "compute", "copy_out"):
        ivs = sorted((i.start, i.end) for i in prof.intervals if i.stage == stage)
        assert ivs and all(i.lane.startswith("GPU") for i in prof.intervals if i.stage == stage)
        # one stream per stage: its intervals never overlap one another
        assert all(e0 <= s1 + 1e-6 for (_, e0), (s1, _) in zip(ivs, ivs[1:]))
    busy = prof.busy()
    assert stats.compute_busy == pytest.approx(busy["compute"])
    assert prof.totals("compute")[2] == stats.flops
    assert prof.totals("copy_in")[1] == stats.bytes_read
    comp = prof.merged("compute")
    transfers = prof.merged("read") + prof.merged("copy_in")
    # panels for later steps move while a gemm runs
    assert any(a0 < c1 and c0 < a1 for a0, a1 in transfers for c0, c1 in comp)
    lo, hi = prof.span
    assert all(lo - 1e-3 <= i.start <= i.end <= hi + 1e-3 for i in prof.intervals)
    files = prof.save(tmp_path / "run")
    assert os.path.getsize(files["trace"]) > 0


@pytest.mark.gpu
def test_profile_true_writes_trace_and_png_beside_the_output(tmp_path):
    pytest.importorskip("matplotlib")
    a, b = random_matrix((700, 900), F32, 3), random_matrix((900, 800), F32, 4)
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    bigmm.matmul(a, b, spec_c, memory="1MB", backend="cupy", profile=True)
    assert os.path.exists(tmp_path / "c.h5.profile.trace.json")
    with open(tmp_path / "c.h5.profile.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# ----- pinned user arrays: copied straight to and from the device --------------------------------

PINNED = [
    # (m, n, k, dtype, trans_a, trans_b, alpha, beta, memory, kernel, pinned operands, pitch)
    # all pinned, NaN in C (beta == 0 must not read it); budgets at least 16 tiles x 4 panels
    # whatever the calibration (nothing read or written on the host: larger tiles otherwise)
    (1000, 900, 1100, F32, False, False, 1.0, 0.0, 400_000, "cublas", "ABC", 0),
    # float64, A transposed, old C copied in from the pinned C
    (777, 1031, 1201, F64, True, False, -1.5, 0.5, 500_000, "bigmm", "ABC", 0),
    # both transposed, bigmm kernel, alpha only
    (1297, 613, 1500, F32, True, True, 2.0, 0.0, 400_000, "bigmm", "ABC", 0),
    # mixed: pinned A, pageable B and C, B transposed, negative beta
    (520, 1100, 999, F32, False, True, 1.0, -1.0, 300_000, "bigmm", "A", 0),
    # column slices of wider pinned arrays (row pitch != width, odd offsets), beta
    (1000, 900, 1100, F32, False, False, 1.0, 0.5, 400_000, "cublas", "ABC", 7),
    # pinned B and C as slices, pageable A, cuBLAS float64 both transposed
    (777, 1031, 1201, F64, True, True, 0.75, 2.0, 500_000, "cublas", "BC", 3),
]


def _operand(shape, dtype, seed, pitch, pinned, fill=None):
    """A (rows, cols) array; with ``pitch`` a column slice of a ``pitch`` wider array."""
    wide = (shape[0], shape[1] + pitch)
    x = random_matrix(wide, dtype, seed) if fill is None else np.full(wide, fill, dtype)
    if pinned:
        x = pinned_array(wide, dtype, x)
    return x[:, pitch // 2:pitch // 2 + shape[1]]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,alpha,beta,memory,kernel,which,pitch", PINNED)
def test_pinned_arrays_skip_the_staging(m, n, k, dtype, ta, tb, alpha, beta, memory, kernel,
                                        which, pitch):
    """Operands in page-locked memory are copied straight from and to the user's arrays (no
    host staging for them); the product is the staged run's, bit for bit."""
    seed = int.from_bytes(os.urandom(4), "little")
    a = _operand((k, m) if ta else (m, k), dtype, seed, pitch, "A" in which)
    b = _operand((n, k) if tb else (k, n), dtype, seed + 1, pitch, "B" in which)
    c = _operand((m, n), dtype, seed + 2, pitch, "C" in which, None if beta else np.nan)
    c0 = c.copy()
    kw = dict(alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, memory=memory, host_memory=HOST,
              backend="cupy", kernel=kernel)
    p = bigmm.plan(a, b, c, **kw)
    # the same job from pageable arrays, planned as this one (the staging blocks the runs
    # below keep are taken by later plans without pinning: a plan after them is faster)
    pageable = bigmm.plan(np.array(a), np.array(b), c0.copy(), **kw)
    assert p.n_tiles >= 16 and p.nk >= 4, str(p)
    # the page-locked operands copied in place, unless the planner predicts staging faster,
    # or all of them in place with the others locked for the run where it predicts that faster
    locked = "".join(op for op in p.in_place if op not in which)
    assert (p.in_place in (which, "") and p.registered == "") or (
        set(which) < set(p.in_place) and p.registered == locked), (p.in_place, p.registered)
    # the same tiles staged, from pageable copies of the operands
    staged_out, staged = _run_plan(replace(p, in_place="", registered=""), np.array(a),
                                   np.array(b), c0.copy(), alpha, beta, kernel)
    out, stats = bigmm.matmul(a, b, c, stats=True, **kw)
    assert out is c
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(out, ref) <= _tol(dtype, k, kernel)
    assert np.array_equal(out, staged_out)  # same plan and kernel: bit for bit
    w = np.dtype(dtype).itemsize
    through = {"A": w * p.a_reads * m * k, "B": w * p.b_reads * k * n,
               "C": w * m * n * (2 if beta else 1)}
    assert staged.bytes_staged == sum(through.values())
    assert stats.bytes_staged == sum(v for op, v in through.items() if op not in p.in_place)
    assert stats.bytes_read == staged.bytes_read and stats.bytes_written == w * m * n
    assert stats.tiles_done == p.n_tiles
    if p.in_place == "ABC":
        assert stats.read_busy == 0.0  # nothing read through the staging
    # pinned arrays are never planned slower than the same job from pageable arrays
    assert p.predicted_seconds <= pageable.predicted_seconds * (1 + 1e-9)


def _run_plan(p, a, b, c, alpha, beta, kernel):
    """(C, RunStats) of plan ``p`` run on these arrays by the executor itself."""
    from bigmm import io
    from bigmm.backends import get_backend
    from bigmm.executor import execute

    be = get_backend("cupy", kernel=kernel)
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(p.m, p.n), dtype=p.dtype, inputs=[A, B], job={},
                          overwrite=True, reads_c=p.reads_c)
    try:
        stats = execute(p, A, B, sink, be, alpha=alpha, beta=beta)
    finally:
        for x in (sink, A, B):
            x.close()
        be.close()
    return c, stats


LOCKED = [
    # (m, n, k, dtype, ta, tb, beta, kernel, order, tile, in place, locked)
    # pageable A, B and C locked for the run, own kernel, poisoned C
    (1000, 900, 1100, F32, False, False, 0.0, "bigmm", "stream", (256, 256, 512), "ABC", "ABC"),
    # float64, both transposed, beta: old C read from the locked C, cuBLAS
    (777, 1031, 1201, F64, True, True, 0.5, "cublas", "stream", (256, 512, 384), "ABC", "ABC"),
    # inputs locked, C staged, every C strip resident (order resident-c), TF32 cuBLAS
    (1300, 700, 2100, F32, False, False, 0.0, "cublas-tf32", "resident-c", (256, 700, 512),
     "AB", "AB"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,beta,kernel,order,tile,in_place,locked", LOCKED)
def test_pageable_arrays_locked_for_the_run(m, n, k, dtype, ta, tb, beta, kernel, order, tile,
                                            in_place, locked):
    """A plan that locks the user's pageable arrays for the run (cudaHostRegister): the
    copies use them in place, nothing goes through staging for them, the product is the
    staged run's bit for bit, and the arrays are released (no longer page-locked) after."""
    from bigmm.backends import get_backend

    seed = int.from_bytes(os.urandom(4), "little")
    a = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c0 = random_matrix((m, n), dtype, seed + 2) if beta else np.full((m, n), np.nan, dtype)
    args = dict(trans_a=ta, trans_b=tb, reads_c=beta != 0, device_budget=1 << 30,
                host_budget=1 << 30, tile=tile, order=order, tail=2 if order == "resident-c"
                else None)
    p = make_plan(m, n, k, np.dtype(dtype).name, **args, in_place=in_place, registered=locked)
    staged_out, staged = _run_plan(make_plan(m, n, k, np.dtype(dtype).name, **args,
                                             in_place=""), a, b, c0.copy(), 1.5, beta, kernel)
    c = c0.copy()
    out, stats = _run_plan(p, a, b, c, 1.5, beta, kernel)
    ref = reference_gemm(a, b, alpha=1.5, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(out, ref) <= _tol(dtype, k, kernel)
    assert np.array_equal(out, staged_out)  # same plan and kernel: bit for bit
    assert stats.notes == () and stats.bytes_locked >= sum(
        x.nbytes for op, x in (("A", a), ("B", b), ("C", c)) if op in locked)
    w = np.dtype(dtype).itemsize
    through = {"A": w * p.a_reads * m * k, "B": w * p.b_reads * k * n,
               "C": w * m * n * (2 if beta else 1)}
    assert stats.bytes_staged == sum(v for op, v in through.items() if op not in in_place)
    assert staged.bytes_locked == 0 and staged.bytes_staged == sum(through.values())
    be = get_backend("cupy")
    try:  # released: a fresh backend finds them pageable
        assert not any(be.host_pinned(x) for x in (a, b, c))
    finally:
        be.close()


WIDE_A = [
    # (m, n, k, beta, kernel, tile, tail, a_span, pitch, pinned operands)
    # TF32 cuBLAS, pinned A: pairs of 512-deep panels, ragged K (the last load one panel)
    (1300, 700, 2100, 0.0, "cublas-tf32", (256, 700, 512), 1, 2, 0, "A"),
    # own kernel on strided views of A's slot, A a pinned slice (pitch), old C read
    (1000, 900, 2100, 0.5, "bigmm", (256, 900, 384), 2, 2, 6, "AC"),
    # cuBLAS, three panels a load, the tail's three in one
    (777, 1031, 1201, -1.0, "cublas", (128, 1031, 256), 3, 3, 0, "ABC"),
    # one strip, an odd head: a load of one panel, then one of two in the same slots
    (59, 463, 2245, -0.5, "cublas", (59, 463, 256), 2, 2, 0, ""),
    # all of K in the tail, old C staged: strips' C read while others are copied out
    (1000, 300, 700, 1.0, "bigmm", (128, 300, 384), 2, 1, 0, "AB"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,beta,kernel,tile,tail,a_span,pitch,which", WIDE_A)
def test_resident_c_loads_a_several_panels_at_a_time(m, n, k, beta, kernel, tile, tail,
                                                    a_span, pitch, which):
    """Resident-c with A's loads spanning several K panels (one pitched copy of a strip's
    rows from the pinned A, the gemms on column ranges of its slot): right against float64,
    A read once."""
    seed = int.from_bytes(os.urandom(4), "little")
    a = _operand((m, k), F32, seed, pitch, "A" in which)
    b = _operand((k, n), F32, seed + 1, pitch, "B" in which)
    c = _operand((m, n), F32, seed + 2, pitch, "C" in which, None if beta else np.nan)
    c0 = c.copy()
    p = make_plan(m, n, k, "float32", reads_c=beta != 0, device_budget=1 << 30,
                  host_budget=1 << 30, tile=tile, order="resident-c", tail=tail,
                  a_span=a_span, in_place=which)
    out, stats = _run_plan(p, a, b, c, 0.75, beta, kernel)
    ref = reference_gemm(a, b, alpha=0.75, beta=beta, c=c0)
    assert p.a_span == a_span and relative_error(out, ref) <= _tol(F32, k, kernel)
    assert stats.bytes_read == p.bytes_read  # each load of A once


@pytest.mark.gpu
def test_read_only_mapped_input_is_locked_read_only_or_staged(tmp_path):
    """A read-only memory map (the process may not write its pages) is locked with the
    read-only flag where the driver takes it, else staged with a note; the product is right
    either way."""
    m, n, k = 700, 600, 900
    a = random_matrix((m, k), F32, 1)
    path = tmp_path / "a.bin"
    a.tofile(path)
    mapped = np.memmap(path, dtype=F32, mode="r", shape=(m, k))
    b = random_matrix((k, n), F32, 2)
    p = make_plan(m, n, k, "float32", device_budget=1 << 30, tile=(256, 256, 512),
                  order="stream", in_place="AB", registered="AB")
    out, stats = _run_plan(p, mapped, b, np.full((m, n), np.nan, F32), 1.0, 0.0, "cublas")
    assert relative_error(out, reference_gemm(a, b)) <= tolerance(F32, k)
    assert stats.bytes_locked > 0  # B at least
    assert all(note.startswith("A staged") for note in stats.notes)


RAMPED = [
    # (m, n, k, dtype, trans_a, trans_b, alpha, beta, kernel, tile, pinned operands, pitch)
    # own kernel, staged: the K pieces of A's panels are column ranges, staged contiguously
    (1000, 900, 2100, F32, False, False, 1.0, 0.0, "bigmm", (500, 450, 1100), "", 0),
    # own kernel, pinned column slices, both transposed, beta: pieces from the user's arrays
    (1000, 900, 2100, F32, True, True, 1.5, 0.5, "bigmm", (500, 450, 1100), "ABC", 7),
    # cuBLAS float64, one step: K pieces, the last of them in row pieces, old C read first
    (777, 1031, 1201, F64, True, False, -1.0, 2.0, "cublas", (777, 1031, 1201), "", 0),
    # cuBLAS, B transposed, pinned B and C slices, pageable A
    (1000, 900, 2100, F32, False, True, 1.0, 0.0, "cublas", (500, 450, 1100), "BC", 3),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,ta,tb,alpha,beta,kernel,tile,which,pitch", RAMPED)
def test_first_step_in_k_pieces_and_last_tile_in_row_pieces(m, n, k, dtype, ta, tb, alpha,
                                                            beta, kernel, tile, which, pitch):
    """The run's first step in K pieces and its last tile's last gemm in row pieces, through
    the cupy backend's strided views and pitched copies: right against float64."""
    from bigmm import io
    from bigmm.backends import get_backend
    from bigmm.executor import execute
    from bigmm.executor.tuning import DRAIN, RAMP, split_range

    seed = int.from_bytes(os.urandom(4), "little")
    a = _operand((k, m) if ta else (m, k), dtype, seed, pitch, "A" in which)
    b = _operand((n, k) if tb else (k, n), dtype, seed + 1, pitch, "B" in which)
    c = _operand((m, n), dtype, seed + 2, pitch, "C" in which, None if beta else np.nan)
    c0 = c.copy()
    p = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb, reads_c=beta != 0,
                  device_budget=1 << 30, host_budget=1 << 30, staging=True, tile=tile,
                  order="stream")
    be = get_backend("cupy", kernel=kernel)
    shapes, gemm = [], be.gemm
    be.gemm = lambda a_, b_, c_, *args, **kw: (shapes.append((a_.shape, c_.shape)),
                                               gemm(a_, b_, c_, *args, **kw))
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(m, n), dtype=p.dtype, inputs=[A, B], job={},
                          overwrite=True, reads_c=p.reads_c)
    try:
        execute(p, A, B, sink, be, alpha=alpha, beta=beta)
    finally:
        for x in (sink, A, B):
            x.close()
        be.close()
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(c, ref) <= _tol(dtype, k, kernel)
    ramp = split_range(min(p.bk, k), RAMP)
    drain = split_range(p.tile(p.ni - 1, p.nj - 1).shape[0], DRAIN)
    assert len(ramp) > 1 and len(drain) > 1
    depth = [(sa[0] if ta else sa[1]) for sa, _ in shapes[:len(ramp)]]
    assert depth == [q1 - q0 for q0, q1 in ramp]  # the first pieces, before any whole step
    assert [sc[0] for _, sc in shapes[-len(drain):]] == [r1 - r0 for r0, r1 in drain]


@pytest.mark.gpu
def test_page_locked_arrays_are_copied_in_place_by_every_call():
    """bigmm.page_locked: the arrays stay page-locked over the calls in the block (each
    plans them in place or staged, as it predicts faster; none locks them again), released
    after."""
    m, n, k = 1100, 900, 1300
    a, b = random_matrix((m, k), F32, 3), random_matrix((k, n), F32, 4)
    c = np.full((m, n), np.nan, F32)
    kw = dict(memory=2_000_000, host_memory=HOST, kernel="cublas")
    with bigmm.page_locked(a, b, c) as locked:
        assert locked.nbytes >= a.nbytes + b.nbytes + c.nbytes and locked.notes() == ()
        for _ in range(2):
            assert _pinned(a, b, c) == [True] * 3
            c[...] = np.nan
            p = bigmm.plan(a, b, c, **kw)
            _, stats = bigmm.matmul(a, b, c, stats=True, **kw)
            # in place unless staging is predicted faster (tiny pitched panels, staging
            # blocks that earlier runs of the process kept pinned)
            assert p.in_place in ("ABC", "") and p.registered == "" and p.n_tiles > 1
            assert stats.bytes_locked == 0
            assert (stats.bytes_staged == 0) == (p.in_place == "ABC")
            assert relative_error(c, reference_gemm(a, b)) <= _tol(F32, k, "cublas")
    assert _pinned(a, b, c) == [False] * 3


def _pinned(*xs) -> list[bool]:
    """Whether a fresh backend (no addresses remembered) sees each array as page-locked."""
    from bigmm.backends import get_backend

    be = get_backend("cupy")
    try:
        return [be.host_pinned(x) for x in xs]
    finally:
        be.close()


@pytest.mark.gpu
def test_pinned_output_tiles_are_in_place_when_reported():
    """Each tile is in the pinned output when its progress is reported (its copy-out done)."""
    m, n, k = 900, 800, 700
    a, b = random_matrix((m, k), F32, 11), random_matrix((k, n), F32, 12)
    c = pinned_array((m, n), F32, np.nan)
    seen = []
    bigmm.matmul(a, b, c, memory=350_000, host_memory=HOST, backend="cupy",
                 progress=lambda pr: seen.append((pr.tiles_done, int(np.isfinite(c).sum()))))
    p = bigmm.plan(a, b, c, memory=350_000, host_memory=HOST, backend="cupy")
    assert len(seen) == p.n_tiles >= 16
    smallest = min(t.shape[0] * t.shape[1] for t in p.tiles())
    assert all(finite >= done * smallest for done, finite in seen)
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(F32, k)


# ----- kill and resume on the GPU path -------------------------------------------------------

M, N, K = 700, 650, 900
MEMORY = "600KB"
SCRIPT = textwrap.dedent("""
    import sys, time, bigmm
    d = sys.argv[1]
    bigmm.matmul(d + "/a.h5:/A", d + "/b.h5:/B", d + "/c.h5:/C", memory="{memory}",
                 host_memory="{host}", backend="cupy", progress=lambda p: time.sleep(0.05))
""")


def _wait_for_journaled_tiles(tmp_path, proc):
    return wait_for_journaled_tiles(tmp_path, proc, timeout=120.0)


@pytest.mark.gpu
def test_killed_gpu_run_resumes_bit_identical(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    a, b = random_matrix((M, K), F32, seed), random_matrix((K, N), F32, seed + 1)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    kw = dict(memory=MEMORY, host_memory=HOST, backend="cupy")
    full = bigmm.matmul(spec_a, spec_b, np.full((M, N), np.nan, F32), **kw)
    assert relative_error(full, reference_gemm(a, b)) <= tolerance(F32, K)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(memory=MEMORY, host=HOST), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = _wait_for_journaled_tiles(tmp_path, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert not f["C"].attrs["bigmm_complete"]
    # the schedule the killed run journaled (each process calibrates its own plan): the
    # uninterrupted run of it is the reference
    p = bigmm.plan(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", resume=True, **kw)
    same, _ = _run_plan(p, a, b, np.full((M, N), np.nan, F32), 1.0, 0.0, "bigmm")
    _, stats = bigmm.matmul(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", resume=True, stats=True,
                            **kw)
    assert stats.tiles_skipped > 0
    assert stats.tiles_done + stats.tiles_skipped == stats.tiles_total
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f["C"].attrs["bigmm_complete"]
        assert np.array_equal(f["C"][...], same)  # same tiles, same kernel: bit for bit
    assert not os.path.exists(journal)


# ----- options (no GPU needed) ----------------------------------------------------------------

BAD_OPTIONS = [
    # (kwargs, error, message)
    (dict(backend="numpy", kernel="cublas"), OptionError, "GPU backend"),  # kernel needs a GPU
    (dict(backend="numpy", profile=3), OptionError, "profile"),  # not a flag, path or Profile
]


@pytest.mark.parametrize("kwargs,err,match", BAD_OPTIONS)
def test_bad_options_are_refused(kwargs, err, match):
    a, b = random_matrix((20, 30), F64, 1), random_matrix((30, 10), F64, 2)
    with pytest.raises(err, match=match):
        bigmm.matmul(a, b, **kwargs)


def test_plans_of_the_table_are_what_the_cases_claim():
    """The case tables' budgets give the tile counts they state (checked without a GPU)."""
    for m, n, k, dtype, ta, tb, _alpha, beta, memory, *_ in PINNED:
        p = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb,
                      device_budget=memory, host_budget=64 << 20, staging=True,
                      reads_c=beta != 0)
        assert p.n_tiles >= 16 and p.nk >= 4, (m, n, k, str(p))
    for (m, n, k, dtype, ta, tb, _alpha, beta, memory, _kernel, inputs, _output, chunks,
         tiles, panels, order) in E2E:
        chunked = chunks if inputs == "h5" else None
        p = make_plan(m, n, k, np.dtype(dtype).name, trans_a=ta, trans_b=tb,
                      device_budget=memory, host_budget=64 << 20, staging=True,
                      reads_c=beta != 0, a_chunks=chunked, b_chunks=chunked)
        orders = order if isinstance(order, tuple) else (order,)
        assert p.n_tiles >= tiles and p.nk >= panels, (m, n, k, str(p))
        assert order is None or p.order in orders, (m, n, k, str(p))
