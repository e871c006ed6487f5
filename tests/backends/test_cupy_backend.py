"""The cupy backend: gemm with each kernel, pinned staging, direct device buffers, streams and
events, device-timed profile intervals, rates. Needs a GPU (module skipped without cupy)."""

from __future__ import annotations

import time

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from bigmm.backends import (Backend, Calibrates, Checksums, Describes, HostHints,  # noqa: E402
                            Profiles, get_backend)
from bigmm.errors import DtypeError, OptionError, ShapeError  # noqa: E402
from bigmm.profile import Profile  # noqa: E402
from bigmm.units import numpy_dtype  # noqa: E402
from bigmm.testing import (pinned_array, random_matrix, reference_gemm, relative_error,  # noqa: E402
                           tolerance)

pytestmark = pytest.mark.gpu

KERNELS = ["bigmm", "cublas"]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
GEMM_CASES = [
    # (m, n, k, dtype, alpha, beta)
    (1, 1, 1, np.float64, 1.0, 0.0),  # scalar product
    (7, 13, 29, np.float32, 1.0, 0.0),  # primes, below one block tile
    (129, 257, 33, np.float32, -2.5, 0.0),  # one past the tile edges, negative alpha
    (300, 1, 517, np.float64, 0.5, 1.0),  # one column, accumulate
    (531, 389, 1000, np.float32, 1.25, -0.75),  # odd sizes, general alpha/beta
    (1024, 768, 512, np.float64, 1.0, 2.0),  # aligned float64
]


def _backend(kernel="bigmm", **kw):
    be = get_backend("cupy", kernel=kernel, **kw)
    assert be.name == "cupy" and be.staging
    return be


def _operands(m, n, k, dtype, ta, tb, seed):
    a = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c = random_matrix((m, n), dtype, seed + 2)
    return a, b, c


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k,dtype,alpha,beta", GEMM_CASES)
def test_gemm_on_buffer_views_matches_reference(kernel, m, n, k, dtype, alpha, beta, ta, tb):
    be = _backend(kernel)
    try:
        a, b, c0 = _operands(m, n, k, dtype, ta, tb, seed=m * 7 + n + k)
        # operands as prefix views of larger buffers, the way the executor hands them over
        da = be.view(be.device_buffer(a.size + 3, dtype), a.shape)
        db = be.view(be.device_buffer(b.size + 5, dtype), b.shape)
        cbuf = be.device_buffer(m * n + 7, dtype)
        cbuf[:] = np.nan
        dc = be.view(cbuf, (m, n))
        da.set(a)
        db.set(b)
        if beta != 0:
            dc.set(c0)
        cupy.cuda.runtime.deviceSynchronize()  # the fill ran on the legacy default stream
        s = be.stream()
        be.gemm(da, db, dc, alpha, beta, ta, tb, s)
        be.synchronize(be.record(s))
        ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
        assert relative_error(dc.get(), ref) <= tolerance(dtype, k)
        assert bool(cupy.isnan(cbuf[m * n:]).all())  # nothing written past the view
    finally:
        be.close()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_a_gemm_launcher_multiplies_its_views_as_they_are_at_each_launch(kernel, ta, tb):
    """Set up once, issued again after the operands changed (the executor reusing a slot):
    each launch multiplies what the buffers hold then, with the beta given at set-up."""
    be = _backend(kernel)
    try:
        m, n, k = 300, 257, 130
        s = be.stream()
        da, db, dc = (cupy.empty(shape, np.float32) for shape in
                      ((k, m) if ta else (m, k), (n, k) if tb else (k, n), (m, n)))
        launch = be.gemm_launcher(da, db, dc, 2.0, 0.5, ta, tb)
        for seed in (1, 2):
            a, b, c0 = _operands(m, n, k, np.float32, ta, tb, seed=seed)
            for d, h in ((da, a), (db, b), (dc, c0)):
                d.set(h)
            cupy.cuda.runtime.deviceSynchronize()  # set() ran on the legacy default stream
            launch(s)
            be.synchronize(be.record(s))
            ref = reference_gemm(a, b, alpha=2.0, beta=0.5, c=c0, trans_a=ta, trans_b=tb)
            assert relative_error(dc.get(), ref) <= tolerance(np.float32, k)
    finally:
        be.close()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
def test_beta_zero_never_reads_c(kernel, ta, tb):
    be = _backend(kernel)
    try:
        m, n, k = 150, 70, 90
        a, b, _ = _operands(m, n, k, np.float32, ta, tb, seed=3)
        da, db = cupy.asarray(a), cupy.asarray(b)
        c = cupy.full((m, n), np.nan, np.float32)
        c[::3, ::2] = np.inf
        cupy.cuda.runtime.deviceSynchronize()  # copies, fills: on the legacy default stream
        be.gemm(da, db, c, 1.0, 0.0, ta, tb, be.stream())
        cupy.cuda.runtime.deviceSynchronize()
        out = c.get()
        assert np.isfinite(out).all()
        ref = reference_gemm(a, b, trans_a=ta, trans_b=tb)
        assert relative_error(out, ref) <= tolerance(np.float32, k)
    finally:
        be.close()


def test_tf32_kernel_is_close_but_not_exact():
    be = _backend("cublas-tf32")
    try:
        err = _cublas_error(be, 11)
        assert FLOAT32_BOUND < err <= 2e-3  # TF32: 10-bit mantissa products, float32 sums
    finally:
        be.close()


#: The float32 error bound of :func:`_cublas_error`'s product, which TF32's rounding exceeds.
FLOAT32_BOUND = tolerance(np.float32, 2048)


def _cublas_error(be, seed: int) -> float:
    """Relative error of one cuBLAS float32 product through ``be`` (512 x 384 x 2048)."""
    m, n, k = 512, 384, 2048
    a, b, _ = _operands(m, n, k, np.float32, False, False, seed=seed)
    da, db, c = cupy.asarray(a), cupy.asarray(b), cupy.empty((m, n), np.float32)
    cupy.cuda.runtime.deviceSynchronize()  # the copies ran on the legacy default stream
    be.gemm(da, db, c, 1.0, 0.0, False, False, be.stream())
    cupy.cuda.runtime.deviceSynchronize()
    return relative_error(c.get(), reference_gemm(a, b))


def test_cublas_handles_are_kept_between_backends_in_their_math_mode(monkeypatch):
    from bigmm.backends import cupy_handles
    from bigmm.backends.cupy import _HANDLES

    monkeypatch.setattr(cupy_handles, "KEEP_PER_DEVICE", 64)  # room whatever earlier tests kept
    tf32 = _backend("cublas-tf32")
    assert _cublas_error(tf32, 12) > FLOAT32_BOUND
    handle = tf32._cublas_handle()
    alive = _backend("cublas")  # a backend alive beside it has a handle of its own
    assert _cublas_error(alive, 13) <= FLOAT32_BOUND
    assert alive._cublas_handle() != handle
    tf32.close()
    assert handle in _HANDLES.kept(tf32.device_id)
    full = _backend("cublas")
    try:  # the kept handle again, back in full float32
        assert _cublas_error(full, 14) <= FLOAT32_BOUND
        assert full._cublas_handle() == handle
        assert handle not in _HANDLES.kept(full.device_id)
        full.close()
        again = _backend("cublas-tf32")  # and in TF32 again
        assert _cublas_error(again, 15) > FLOAT32_BOUND
        again.close()
    finally:
        alive.close()
        full.close()


HALF_CASES = [
    # (m, n, k, alpha, beta)
    (7, 13, 29, 1.0, 0.0),  # primes, below one tensor-core tile
    (531, 389, 1000, 1.25, -0.75),  # odd sizes and leading dimensions, general alpha/beta
    (1024, 768, 4096, 1.0, 1.0),  # aligned, deep, accumulate
]


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k,alpha,beta", HALF_CASES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_gemm_on_tensor_cores_from_staged_panels(dtype, m, n, k, alpha, beta, ta, tb):
    """cublasGemmEx on 16-bit panels copied in as stored (bfloat16 as uint16 bits), float32
    accumulation into a float32 C (see bigmm.testing.tolerance for the bound)."""
    be = _backend()
    try:
        dt = numpy_dtype(dtype)
        a, b, _ = _operands(m, n, k, dt, ta, tb, seed=m + k)
        c0 = random_matrix((m, n), np.float32, 5)
        s = be.stream()
        views = []
        for x in (a, b):
            host = be.view(be.host_buffer(x.size, dt), x.shape)
            host[...] = x
            dev = be.view(be.device_buffer(x.size + 3, dt), x.shape)
            assert dev.dtype == (np.uint16 if dtype == "bfloat16" else dt)
            be.copy_in(host, dev, s)
            views.append(dev)
        cbuf = be.device_buffer(m * n + 7, np.float32)
        cbuf[:] = np.nan
        dc = be.view(cbuf, (m, n))
        if beta != 0:
            dc.set(c0)
        cupy.cuda.runtime.deviceSynchronize()  # the fills ran on the legacy default stream
        be.gemm(views[0], views[1], dc, alpha, beta, ta, tb, s)
        back = be.view(be.host_buffer(a.size, dt), a.shape)
        be.copy_out(views[0], back, s)  # the bits went in and come back unchanged
        be.synchronize(be.record(s))
        assert back.tobytes() == a.tobytes()
        ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
        assert relative_error(dc.get(), ref) <= tolerance(dtype, k)
        assert bool(cupy.isnan(cbuf[m * n:]).all())  # nothing written past the view
    finally:
        be.close()


def test_half_rates_and_rounding():
    be = _backend()
    try:
        r = be.rates("bfloat16", 64 << 20)
        assert r.flops > 1e12 and r.h2d_bytes > 1e9
        assert be.rounding(numpy_dtype("bfloat16")).eps == float(np.finfo(np.float32).eps)
    finally:
        be.close()


def test_rates_time_the_link_both_ways_at_once():
    from bigmm.planner.model import MIN_DUPLEX

    be = _backend()
    try:
        r = be.rates("float32", 256 << 20)
        assert MIN_DUPLEX <= r.duplex <= 1.0 and r.h2d_bytes > 1e9
    finally:
        be.close()


BAD_GEMM = [
    # (description, a shape, b shape, c shape, dtypes, error)
    ("inner dims differ", (4, 5), (6, 3), (4, 3), ("f4", "f4", "f4"), ShapeError),
    ("c has the wrong shape", (4, 5), (5, 3), (3, 4), ("f4", "f4", "f4"), ShapeError),
    ("mixed dtypes", (4, 5), (5, 3), (4, 3), ("f4", "f8", "f8"), DtypeError),
    ("integer dtype", (4, 5), (5, 3), (4, 3), ("i4", "i4", "i4"), DtypeError),
    ("half c for half operands", (4, 5), (5, 3), (4, 3), ("f2", "f2", "f2"), DtypeError),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("what,sa,sb,sc,dts,err", BAD_GEMM, ids=[c[0] for c in BAD_GEMM])
def test_gemm_rejects_bad_operands(kernel, what, sa, sb, sc, dts, err):
    be = _backend(kernel)
    try:
        a, b, c = (cupy.ones(s, dtype=d) for s, d in zip((sa, sb, sc), dts))
        with pytest.raises(err, match="Expected"):
            be.gemm(a, b, c, 1.0, 0.0, False, False, None)
    finally:
        be.close()


def test_bad_kernel_name_is_refused():
    with pytest.raises(OptionError, match="kernel"):
        get_backend("cupy", kernel="magma")


def test_auto_picks_cupy_where_a_gpu_answers():
    be = get_backend("auto")
    try:
        assert be.name == "cupy" and be.kernel == "bigmm"
    finally:
        be.close()


# ----- buffers ------------------------------------------------------------------------------

def test_device_buffers_of_one_block_are_disjoint_aligned_and_freed():
    from bigmm.backends import DeviceBlocks
    from bigmm.backends.cupy import BLOCK_ALIGN

    be = _backend()
    try:
        assert isinstance(be, DeviceBlocks)
        size, count = 1000003, 5  # multiples of nothing
        free0 = cupy.cuda.runtime.memGetInfo()[0]
        bufs = be.device_buffers(size, count, np.float32)
        assert be.device_bytes >= size * count * 4 and len(bufs) == count
        ptrs = [x.data.ptr for x in bufs]
        assert all(p % BLOCK_ALIGN == 0 for p in ptrs)
        assert all(q - p >= size * 4 for p, q in zip(ptrs, ptrs[1:]))
        for i, x in enumerate(bufs):
            assert x.shape == (size,) and x.dtype == np.float32
            x[...] = i
        cupy.cuda.runtime.deviceSynchronize()
        assert [float(x.min()) for x in bufs] == [float(x.max()) for x in bufs] == [
            float(i) for i in range(count)]
    finally:
        be.close()
    assert be.device_bytes == 0
    assert cupy.cuda.runtime.memGetInfo()[0] >= free0 - (64 << 20)  # given back


def test_host_buffers_are_pinned_and_reused_across_runs():
    from bigmm.backends.cupy import pinned_bytes_held, release_pinned

    release_pinned()
    be = _backend()
    h = be.host_buffer(1 << 20, np.float32)
    attrs = cupy.cuda.runtime.pointerGetAttributes(h.ctypes.data)
    assert attrs.type == 1  # cudaMemoryTypeHost: page-locked, not pageable
    assert be.is_pinned(h) and be.is_pinned(be.view(h, (512, 1024)))
    assert not be.is_pinned(np.empty(16, np.float32))
    ptr = h.ctypes.data
    del h
    be.close()
    assert pinned_bytes_held() >= 4 << 20
    be = _backend()
    try:
        assert be.host_buffer(1 << 20, np.float32).ctypes.data == ptr  # same block again
    finally:
        be.close()
    release_pinned()
    assert pinned_bytes_held() == 0


@pytest.mark.parametrize("nbytes", [
    1,  # one byte: one page, touched on the calling thread
    (16 << 20) - 5,  # just below the size touched by several threads
    (48 << 20) + 4099,  # several threads, the last part not a whole page
])
def test_locked_blocks_are_page_locked_whole_and_carry_data(nbytes):
    from bigmm.backends.cupy_pinned import LockedBlock

    block = LockedBlock(nbytes)
    assert block.size == nbytes and block.bytes.nbytes >= nbytes
    for at in {0, nbytes // 2, nbytes - 1}:  # every part of it locked, not only the start
        attrs = cupy.cuda.runtime.pointerGetAttributes(block.ptr + at)
        assert attrs.type == 1  # cudaMemoryTypeHost
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    host = block.bytes[:nbytes]
    host[:] = data
    dev = cupy.empty(nbytes, np.uint8)
    dev.set(host)
    host[:] = 0
    dev.get(out=host)
    assert np.array_equal(host, data)


def test_copies_refuse_pageable_host_memory():
    be = _backend()
    try:
        dev = be.view(be.device_buffer(64, np.float32), (8, 8))
        with pytest.raises(ShapeError, match="pinned"):
            be.copy_in(np.ones((8, 8), np.float32), dev, be.stream())
        with pytest.raises(ShapeError, match="pinned"):
            be.copy_out(dev, np.ones((8, 8), np.float32), be.stream())
    finally:
        be.close()


def test_user_arrays_in_pinned_memory_are_recognised():
    be = _backend()
    try:
        x = pinned_array((64, 80), np.float32)
        assert be.host_pinned(x) and be.host_pinned(x[3:9, 5:45]) and be.host_pinned(x.T)
        assert be.host_pinned(be.host_buffer(128, np.float32))  # its own staging too
        assert not be.host_pinned(np.empty((64, 80), np.float32))  # pageable
        assert not be.host_pinned(np.empty((0, 4), np.float32))  # nothing to copy
        assert not be.host_pinned([1.0, 2.0])  # not an array
    finally:
        be.close()


PITCHED = [
    # (rows, cols, host columns, first column, dtype): host side a region of a wider array
    (64, 40, 80, 5, np.float32),  # column slice: row pitch 320 bytes, width 160
    (33, 17, 17, 0, np.float64),  # whole contiguous array: the pitch == width case
    (1, 9, 30, 11, np.float32),  # one row
    (50, 1, 7, 3, np.float64),  # one column: 8-byte rows, 56-byte pitch
]


@pytest.mark.parametrize("rows,cols,wide,c0,dtype", PITCHED)
def test_copies_take_host_regions_with_a_row_pitch(rows, cols, wide, c0, dtype):
    be = _backend()
    try:
        src = pinned_array((rows, wide), dtype, random_matrix((rows, wide), dtype, 1))
        dst = pinned_array((rows, wide), dtype, np.nan)
        dev = be.view(be.device_buffer(rows * cols, dtype), (rows, cols))
        s = be.stream()
        be.copy_in(src[:, c0:c0 + cols], dev, s)
        be.copy_out(dev, dst[:, c0:c0 + cols], s)
        be.synchronize(be.record(s))
        assert np.array_equal(cupy.asnumpy(dev), src[:, c0:c0 + cols])
        assert np.array_equal(dst[:, c0:c0 + cols], src[:, c0:c0 + cols])
        outside = np.ones(wide, bool)
        outside[c0:c0 + cols] = False
        assert np.isnan(dst[:, outside]).all()  # nothing beyond the region touched
        with pytest.raises(ShapeError, match="pinned"):
            be.copy_in(np.ones((rows, wide), dtype)[:, c0:c0 + cols], dev, s)
    finally:
        be.close()


def test_copies_refuse_host_rows_that_are_not_contiguous():
    be = _backend()
    try:
        x = pinned_array((8, 8), np.float32, 1.0)
        dev = be.view(be.device_buffer(32, np.float32), (8, 4))
        with pytest.raises(ShapeError, match="contiguous rows"):
            be.copy_in(x[:, ::2], dev, be.stream())  # every other column
        with pytest.raises(ShapeError, match="contiguous rows"):
            be.copy_out(dev, x[::-1, :4], be.stream())  # rows backwards
    finally:
        be.close()


@pytest.mark.device_memory
def test_device_buffers_bypass_the_pool_and_are_freed_at_close():
    pool = cupy.get_default_memory_pool()
    before_pool = pool.total_bytes()
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    be = _backend()
    nbytes = 256 << 20
    buf = be.device_buffer(nbytes // 4, np.float32)
    buf[:1] = 1.0  # touch it
    assert be.device_bytes == nbytes
    assert pool.total_bytes() == before_pool
    assert free0 - cupy.cuda.runtime.memGetInfo()[0] >= nbytes
    assert abs(be.memory_available() - cupy.cuda.runtime.memGetInfo()[0]) <= 64 << 20
    be.close()
    assert be.device_bytes == 0
    assert cupy.cuda.runtime.memGetInfo()[0] >= free0 - (4 << 20)  # freed although buf lives
    be.close()  # idempotent


def test_split_panels_workspace_is_one_counted_buffer():
    from bigmm.backends import SplitsPanels
    from bigmm.planner import split_workspace_bytes

    be = _backend(precision="tf32x3")
    assert isinstance(be, SplitsPanels)
    try:
        if not be.split_parts:
            pytest.skip("splitting ahead runs on compute capability 9.0 (sm_90a) only")
        assert be.split_parts == 2 and _backend(precision="tf32").split_parts == 1
        assert not _backend().split_parts  # float32 on the CUDA cores: no workspace
        for (m, n, k) in ((2304, 2500, 1000), (2304, 2500, 700), (3000, 2600, 1500)):
            a = cupy.asarray(random_matrix((m, k), np.float32, m + k))
            b = cupy.asarray(random_matrix((k, n), np.float32, n + k))
            c = cupy.full((m, n), np.nan, np.float32)
            be.gemm(a, b, c, 1.0, 0.0, False, False)
            cupy.cuda.Device().synchronize()
            ref = reference_gemm(cupy.asnumpy(a), cupy.asnumpy(b))
            assert relative_error(cupy.asnumpy(c), ref) < 1e-5
        # the largest product's workspace only: the smaller one reused, replaced when too small
        assert be.device_bytes == split_workspace_bytes(3000, 2600, 1500)
    finally:
        be.close()
    assert be.device_bytes == 0


def test_streams_and_events_order_copy_gemm_copy():
    """copy in (stream 1) -> gemm (stream 2) -> copy out (stream 3), ordered only by events."""
    be = _backend()
    try:
        m = n = k = 1536
        a, b, _ = _operands(m, n, k, np.float32, False, False, seed=21)
        s_in, s_c, s_out = be.stream(), be.stream(), be.stream()
        assert all(s.is_non_blocking for s in (s_in, s_c, s_out))
        ha, hb = be.host_buffer(a.size, np.float32), be.host_buffer(b.size, np.float32)
        hc = be.host_buffer(m * n, np.float32)
        hc[:] = np.nan
        ha[:], hb[:] = a.ravel(), b.ravel()
        da, db, dc = (be.view(be.device_buffer(x, np.float32), (m, m))
                      for x in (a.size, b.size, m * n))
        be.copy_in(be.view(ha, (m, k)), da, s_in)
        be.copy_in(be.view(hb, (k, n)), db, s_in)
        be.wait(s_c, be.record(s_in))
        be.gemm(da, db, dc, 1.0, 0.0, False, False, s_c)
        be.wait(s_out, be.record(s_c))
        be.copy_out(dc, be.view(hc, (m, n)), s_out)
        be.synchronize(be.record(s_out))
        ref = reference_gemm(a, b)
        assert relative_error(be.view(hc, (m, n)), ref) <= tolerance(np.float32, k)
    finally:
        be.close()


def test_profile_intervals_follow_the_event_order():
    be = _backend()
    try:
        m = n = k = 2048
        s_in, s_c, s_out = be.stream(), be.stream(), be.stream()
        ha, hc = be.host_buffer(m * k, np.float32), be.host_buffer(m * n, np.float32)
        ha[:] = 1.0
        da = be.view(be.device_buffer(m * k, np.float32), (m, k))
        dc = be.view(be.device_buffer(m * n, np.float32), (m, n))
        prof = Profile()
        t0 = time.perf_counter()
        be.start_profile(prof)
        be.copy_in(be.view(ha, (m, k)), da, s_in)
        be.wait(s_c, be.record(s_in))
        be.gemm(da, da, dc, 1.0, 0.0, False, True, s_c)
        be.wait(s_out, be.record(s_c))
        be.copy_out(dc, be.view(hc, (m, n)), s_out)
        be.synchronize(be.record(s_out))
        t1 = time.perf_counter()
        be.stop_profile()
        by = {i.stage: i for i in prof.intervals}
        assert set(by) == {"copy_in", "compute", "copy_out"}
        assert t0 - 1e-3 <= by["copy_in"].start <= by["copy_in"].end <= by["compute"].start + 1e-4
        assert by["compute"].end <= by["copy_out"].start + 1e-4 <= t1 + 1e-3
        assert by["copy_in"].nbytes == m * k * 4 and by["compute"].flops == 2 * m * n * k
        assert by["compute"].end - by["compute"].start > 0
        assert "GPU" in by["compute"].lane and prof.device
    finally:
        be.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_it_has_every_ability(kernel):
    be = _backend(kernel)
    try:
        assert all(isinstance(be, p) for p in (Backend, Checksums, Calibrates, Profiles,
                                               HostHints, Describes))
        assert be.gemm_threads() is None and be.map_step > 0
        assert be.fuses_checks is (kernel == "bigmm")
    finally:
        be.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_rates_are_measured(kernel):
    be = _backend(kernel)
    try:
        r = be.rates("float32")
        assert r.flops > 1e12 and r.h2d_bytes > 1e9 and r.read_bytes > 0
    finally:
        be.close()


@pytest.mark.parametrize("first", [
    "plan",       # a job's plan keeps what it measured
    "calibrate",  # bigmm calibrate with the job's budgets, measuring on purpose
])
def test_a_second_process_plans_with_the_first_ones_kept_calibration(tmp_path, first):
    """The rates a GPU job times (the backend's, the host's copies, the issuing thread's) are
    kept by a first process and reused by a second one, which measures none of them and
    plans the same."""
    import json
    import os
    import subprocess
    import sys

    from bigmm import calibration

    code = (
        "import json, sys, time, numpy as np, bigmm\n"
        "from bigmm.backends import cupy_rates\n"
        "from bigmm.executor import calibrate\n"
        "def measured(*a, **k):\n"
        "    raise AssertionError('measured again')\n"
        "if sys.argv[1] == 'reuse':\n"
        "    cupy_rates._calibrate = calibrate._copy_rate = measured\n"
        "    if sys.argv[2] == 'plan':\n"
        "        cupy_rates._time_shape = measured\n"
        "    calibrate._copy_row_seconds = calibrate._issue_seconds = measured\n"
        "a = np.ones((2000, 3000), np.float32); b = np.ones((3000, 1000), np.float32)\n"
        "t0 = time.perf_counter()\n"
        "p = bigmm.plan(a, b, memory='64MiB', host_memory='256MiB', backend='cupy')\n"
        "print(json.dumps({'key': str(p.key()), 'rates': repr(p.rates), 'flops': p.rates.flops,\n"
        "                  'h2d': p.rates.h2d_bytes, 'seconds': time.perf_counter() - t0}))\n")
    env = dict(os.environ, **{calibration.MODE_ENV: "fresh",
                              calibration.DIR_ENV: str(tmp_path)})
    if first == "calibrate":
        env[calibration.MODE_ENV] = ""
        out = subprocess.run([sys.executable, "-m", "bigmm", "calibrate", "--backend", "cupy",
                              "--memory", "64MiB", "--host-memory", "256MiB", "--json"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        assert summary["kept"] >= 5, summary  # the backend's, copies, rows, issuing
        figures = summary["figures"]["float32"]
        assert 0 < figures["read_bytes"] < float("inf")  # the host's copies: staged operands
        runs = [{"flops": figures["flops"], "h2d": figures["h2d_bytes"]}]
    else:
        runs = []
    for mode in ("fresh", "reuse")[len(runs):]:
        env[calibration.MODE_ENV] = mode if mode == "fresh" else ""
        out = subprocess.run([sys.executable, "-c", code, mode, first], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    before, second = runs
    assert (second["flops"], second["h2d"]) == (before["flops"], before["h2d"])
    if first == "plan":
        assert second["key"] == before["key"] and second["rates"] == before["rates"]
    # one store for this machine (beside it the host copies' compiled library)
    assert len([f for f in os.listdir(tmp_path) if f.startswith("calibration-")]) == 1


@pytest.mark.parametrize("kernel, dtype", [
    ("bigmm", "float32"),        # its own kernel
    ("cublas-tf32", "float32"),  # cuBLAS on tensor cores
    ("cublas", "bfloat16"),      # half-precision operands (uint16 bits on the device)
    ("cublas", "float64"),
])
def test_the_gemm_is_timed_at_a_steps_shape_once_a_process(kernel, dtype):
    from bigmm.backends import TimesShapes

    be = _backend(kernel)
    try:
        assert isinstance(be, TimesShapes)
        rate = be.shape_flops(1280, 2304, 768, dtype)
        assert 1e11 < rate < 3e15
        t0 = time.perf_counter()
        assert be.shape_flops(1280, 2304, 768, dtype) == rate  # kept for the process
        assert time.perf_counter() - t0 < 0.01
        free = cupy.cuda.runtime.memGetInfo()[0]
        wide = 1 << max(12, (free // 4).bit_length() // 2 + 1)  # C alone beyond what is free
        assert be.shape_flops(wide, wide, 256, dtype) is None
    finally:
        be.close()


def test_steps_of_panels_split_ahead_are_not_timed_alone():
    be = _backend("bigmm", precision="tf32x3")
    try:
        if not be.split_parts:
            pytest.skip("this GPU's TF32 kernels do not split panels ahead")
        assert be.shape_flops(1280, 2304, 768, "float32") is None
    finally:
        be.close()


def test_a_plan_of_many_steps_is_predicted_at_its_shapes_timed_rate():
    """The chosen plan's step is timed at its shape: the plan is predicted at that rate, or
    the rate lies within the tolerance of the model's (or the plan chosen again at a timed
    rate has too few steps to time)."""
    import bigmm
    from bigmm import job
    from bigmm.backends import cupy_rates
    from bigmm.planner.model import snap_rate

    cupy_rates._SHAPES.clear()
    a = random_matrix((8192, 8192), np.float32)
    p = bigmm.plan(a, a, memory="64MiB", backend="cupy", kernel="cublas")
    timed = {key[4:]: f for key, f in cupy_rates._SHAPES.items()
             if key[1:4] == ("cublas", "float32", "float32")}
    assert timed, (p, list(cupy_rates._SHAPES))  # 64 MiB: many steps
    shape = (p.bm, p.bn, p.bk)
    recorded = p.rates.shape_flops(*shape)
    if recorded is not None:
        assert recorded == snap_rate(timed[shape])
    elif shape in timed:
        assert abs(timed[shape] / job._modelled(p.rates, p) - 1) <= job.SHAPE_TOLERANCE
    else:
        assert p.n_steps < job.SHAPE_STEPS or len(p.rates.shapes) == job.SHAPE_ROUNDS


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # the tiles' dtypes
def test_nonfinite_counts_on_the_stream_and_scale(dtype):
    be = _backend()
    c = cupy.asarray(random_matrix((301, 257), dtype))
    c[3, 4], c[100, 200], c[300, 0] = np.nan, np.inf, -np.inf
    cupy.cuda.get_current_stream().synchronize()  # the writes ran on the legacy default stream
    s = be.stream()
    ones = cupy.ones((5, 7), dtype)
    pool = cupy.get_default_memory_pool().total_bytes()
    flagged = [be.nonfinite(c, s) for _ in range(5000)]  # more than one block of flags
    clean = be.nonfinite(ones, s)
    be.synchronize(be.record(s))
    assert all(f() == 1 for f in flagged) and clean() == 0
    assert cupy.get_default_memory_pool().total_bytes() == pool  # nothing from cupy's pool
    x = cupy.asarray(random_matrix((33, 17), dtype, 2))
    want = cupy.asnumpy(x) * dtype(-0.5)
    be.scale(x, -0.5, s)
    be.synchronize(be.record(s))
    assert np.array_equal(cupy.asnumpy(x), want)
    x[0, 0] = np.nan
    cupy.cuda.get_current_stream().synchronize()
    be.scale(x, 0.0, s)  # beta == 0 never reads c
    be.synchronize(be.record(s))
    assert not cupy.asnumpy(x).any()
    be.close()
