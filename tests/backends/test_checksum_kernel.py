"""The checksum kernels (kernels/abft_checksum.cu) against NumPy: weighted sums along axis 0
of strided and transposed views, float32 and float64, with and without weights, overwriting
and accumulating, through each kernel (the two fast paths and the generic fallback, chosen
by layout or forced); and the comparison with its non-finite rules."""

from __future__ import annotations

import numpy as np
import pytest

from bigmm.backends.numpy import NumpyBackend

pytestmark = pytest.mark.gpu

VIEWS = [
    # (stored shape, view (slices, transpose), dtype, weighted)
    # contiguous, column sums of a row-major panel (threads along j)
    ((300, 257), (slice(None), slice(None), False), np.float32, False),
    # transposed: row sums of the stored panel (threads along i, through shared memory)
    ((300, 257), (slice(None), slice(None), True), np.float32, True),
    # a view inside a larger buffer (leading dimension 513), float64, weighted
    ((1000, 513), (slice(7, 900), slice(3, 200), False), np.float64, True),
    # transposed view with a leading dimension, float64
    ((1000, 513), (slice(7, 900), slice(3, 200), True), np.float64, False),
    # neither stride 1: every other row and column
    ((400, 400), (slice(0, 400, 2), slice(1, 400, 3), False), np.float32, True),
    # one column, many rows (one block column, many row blocks and atomics)
    ((70000, 1), (slice(None), slice(None), False), np.float32, True),
    # one row, many columns
    ((1, 70000), (slice(None), slice(None), False), np.float64, False),
    # a long thin transposed panel (K panel of a narrow tile)
    ((20000, 33), (slice(None), slice(None), True), np.float32, True),
]


def _operands(cupy, shape, view, dtype, weighted, seed, big=None):
    """(host view, the same view on the device, weights, absolute weights, starting sums):
    random data of ``shape`` (element [0, 0] set to ``big`` if given), viewed through
    ``view`` = (row slice, column slice, transpose)."""
    rng = np.random.default_rng(seed)
    host = rng.standard_normal(shape).astype(dtype)
    if big is not None:
        host[0, 0] = big
    rows, cols, transpose = view
    x_h, x_d = host[rows, cols], cupy.asarray(host)[rows, cols]
    if transpose:
        x_h, x_d = x_h.T, x_d.T
    r, c = x_h.shape
    w = rng.standard_normal(r) if weighted else None
    wa = None if w is None else np.abs(w) + rng.random(r)
    return x_h, x_d, w, wa, (rng.standard_normal(c), rng.random(c))


@pytest.mark.parametrize("shape, view, dtype, weighted", VIEWS)
@pytest.mark.parametrize("accumulate", [False, True])
def test_weighted_sums_match_numpy(shape, view, dtype, weighted, accumulate):
    import cupy

    from bigmm.backends import get_backend

    x_h, x_d, w, wa, start = _operands(cupy, shape, view, dtype, weighted, sum(shape))
    ref = [v.copy() for v in start]
    NumpyBackend().weighted_sums(x_h, *ref, weights=w, abs_weights=wa, scale=-1.25,
                                 accumulate=accumulate)
    out = [cupy.asarray(v) for v in start]
    wd, wad = (None if v is None else cupy.asarray(v) for v in (w, wa))
    cupy.cuda.runtime.deviceSynchronize()  # the copies ran on the legacy default stream
    be = get_backend("cupy")
    try:
        s = be.stream()
        be.weighted_sums(x_d, *out, weights=wd, abs_weights=wad, scale=-1.25,
                         accumulate=accumulate, stream=s)
        s.synchronize()
        scale = np.abs(x_h.astype(np.float64)).sum() + 1.0
        for got, want in zip(out, ref):
            np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-12 * scale)
    finally:
        be.close()


PATHS = [
    # (stored shape, view (slices, transpose), dtype, weighted, path the layout gets)
    # summed axis contiguous, ragged (1037 rows: a scalar tail after the vectors; 300 columns)
    ((300, 1040), (slice(None), slice(0, 1037), True), np.float32, True, "contig"),
    # the same, float64, view starting 16 bytes in, odd rows
    ((257, 1002), (slice(None), slice(2, 999), True), np.float64, False, "contig"),
    # one long column (sr == sc == 1): the contiguous path split over many block rows
    ((70001, 1), (slice(None), slice(None), False), np.float32, True, "contig"),
    # more column groups than one wave of warps: warps stride over the columns
    ((17003, 68), (slice(None), slice(None), True), np.float32, True, "contig"),
    # columns contiguous, ragged: 1023 columns (a partial vector), 1001 rows, view 16 bytes in
    ((1001, 1028), (slice(None), slice(4, 1027), False), np.float32, False, "strided"),
    # the same, float64, weighted, a window of a larger buffer
    ((3000, 130), (slice(5, 2999), slice(2, 129), False), np.float64, True, "strided"),
    # one row, many columns
    ((1, 70001), (slice(None), slice(None), False), np.float64, True, "strided"),
    # a tall panel (the A panel's column sums): many rows per block
    ((9000, 260), (slice(None), slice(None), False), np.float32, True, "strided"),
    # unaligned start (4 bytes in): the fallback, both orientations
    ((300, 1036), (slice(None), slice(1, None), False), np.float32, True, "generic"),
    ((300, 1036), (slice(None), slice(1, None), True), np.float32, True, "generic"),
    # leading dimension not a multiple of 16 bytes: the fallback
    ((500, 3 * 67), (slice(None), slice(None), True), np.float64, True, "generic"),
    # neither stride 1: the fallback
    ((400, 400), (slice(0, 400, 2), slice(0, 400, 4), False), np.float32, True, "generic"),
]


@pytest.mark.parametrize("shape, view, dtype, weighted, path", PATHS)
@pytest.mark.parametrize("force_generic", [False, True])
def test_each_sums_kernel_matches_numpy(shape, view, dtype, weighted, path, force_generic):
    import cupy

    from bigmm.backends import cuda_checksums

    x_h, x_d, w, wa, start = _operands(cupy, shape, view, dtype, weighted, sum(shape) + 1,
                                       big=1e3)  # magnitudes of different scale
    ref = [v.copy() for v in start]
    NumpyBackend().weighted_sums(x_h, *ref, weights=w, abs_weights=wa, scale=0.5,
                                 accumulate=True)
    out = [cupy.asarray(v) for v in start]
    used = cuda_checksums.weighted_sums(
        x_d, *out, weights=None if w is None else cupy.asarray(w),
        abs_weights=None if wa is None else cupy.asarray(wa), scale=0.5, accumulate=True,
        path="generic" if force_generic else None)
    assert used == ("generic" if force_generic else path)
    scale = np.abs(x_h.astype(np.float64)).sum() + 1.0
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-13 * scale)


def test_fast_path_refused_where_the_layout_forbids_it():
    import cupy

    from bigmm.backends import cuda_checksums
    from bigmm.errors import KernelError

    x = cupy.ones((64, 64), dtype=cupy.float32)[:, 1:]  # 4 bytes in: generic only
    out = cupy.zeros(63)
    for path in ("contig", "strided", "fast"):
        with pytest.raises(KernelError):
            cuda_checksums.weighted_sums(x, out, path=path)
    assert cuda_checksums.weighted_sums(x, out) == "generic"
    assert out.get().tolist() == [64.0] * 63


def test_weighted_sums_without_abs_and_empty():
    import cupy

    from bigmm.backends import get_backend

    be = get_backend("cupy")
    try:
        x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
        out, empty = cupy.full(4, 7.0), cupy.full(4, 7.0)
        cupy.cuda.runtime.deviceSynchronize()  # filled on the legacy default stream
        s = be.stream()
        be.weighted_sums(x, out, stream=s)
        be.weighted_sums(x[:0], empty, stream=s)  # no rows: zeros
        s.synchronize()
        assert out.get().tolist() == [12.0, 15.0, 18.0, 21.0]
        assert empty.get().tolist() == [0.0] * 4
    finally:
        be.close()


def test_compare_sums_matches_numpy():
    import cupy

    from bigmm.backends import get_backend

    rng = np.random.default_rng(5)
    n = 5000
    expected = rng.standard_normal(n)
    magnitude = np.abs(expected) + rng.random(n)
    actual = expected + 1e-9 * rng.standard_normal(n)
    actual[4321] += 1e-3
    cases = [(expected, magnitude, actual)]
    a2 = actual.copy()
    a2[17] = np.nan  # NaN against a finite sum: +inf
    e2 = expected.copy()
    e2[4321] = np.inf  # Inf in the inputs: not checked
    cases.append((e2, magnitude, a2))
    be = get_backend("cupy")
    try:
        s = be.stream()
        for e, m, a in cases:
            want, got = np.zeros(2), cupy.zeros(2)
            NumpyBackend().compare_sums(e, m, a, 1e-6, 1e-30, want)
            ed, md, ad = cupy.asarray(e), cupy.asarray(m), cupy.asarray(a)
            cupy.cuda.runtime.deviceSynchronize()  # copied on the legacy default stream
            be.compare_sums(ed, md, ad, 1e-6, 1e-30, got, s)
            s.synchronize()
            np.testing.assert_allclose(got.get(), want, rtol=1e-12)
        assert want[0] == np.inf and want[1] == 17
    finally:
        be.close()


@pytest.mark.parametrize("accumulate", [
    False,  # overwriting: every launch zeroes the sums first
    True,   # accumulating: every launch adds to them
])
def test_a_launcher_reads_its_views_as_they_are_at_each_launch(accumulate):
    """The checks set a launch up once per slot and issue it at every step, while the slot's
    panel changes: each launch must sum what the buffer holds then."""
    import cupy

    from bigmm.backends import get_backend

    be = get_backend("cupy")
    try:
        rng = np.random.default_rng(5)
        x = cupy.asarray(rng.standard_normal((129, 67)).astype(np.float32))
        w = cupy.asarray(rng.standard_normal(129))
        out, out_abs = cupy.zeros(67), cupy.zeros(67)
        s = be.stream()
        launch = be.sums_launcher(x, out, out_abs, weights=w, scale=0.5, accumulate=accumulate)
        total = np.zeros(67)
        for _ in range(3):
            x[...] = cupy.asarray(rng.standard_normal((129, 67)).astype(np.float32))
            cupy.cuda.runtime.deviceSynchronize()  # written on the legacy default stream
            launch(s)
            s.synchronize()
            want = 0.5 * (w.get() @ x.get().astype(np.float64))
            total = total + want if accumulate else want
            np.testing.assert_allclose(out.get(), total, rtol=1e-12, atol=1e-12)
        res = cupy.zeros(2)
        cupy.cuda.runtime.deviceSynchronize()  # zeroed on the legacy default stream
        compare = be.compare_launcher(out, out_abs, out, 1e-6, 0.0, res)
        compare(s)
        s.synchronize()
        assert res.get().tolist() == [0.0, 0.0]  # equal sums: ratio 0 at column 0
    finally:
        be.close()
