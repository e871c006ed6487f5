"""The NumPy backend: in-place BLAS gemm, beta == 0 never reads C, trivial streams, its
abilities and calibration, registry."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.linalg import blas as scipy_blas

from bigmm.backends import BACKENDS, get_backend, probe_cuda
from bigmm.backends.base import (Backend, Calibrates, Checksums, Describes, HostHints,
                                 Profiles)
from bigmm.backends.numpy import NumpyBackend, memory_available
from bigmm.errors import BackendUnavailable, DtypeError, ShapeError
from bigmm.planner import READ_RATE, WRITE_RATE
from bigmm.testing import magnitude, random_matrix, reference_gemm, relative_error, tolerance
from bigmm.backends import numpy as numpy_backend
from bigmm.backends.numpy import HALF_SCRATCH
from bigmm.units import numpy_dtype

BF16 = numpy_dtype("bfloat16")

TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]

GEMM_CASES = [
    # (m, n, k, dtype, alpha, beta)
    (1, 1, 1, np.float64, 1.0, 0.0),  # scalar product
    (7, 13, 29, np.float32, 1.0, 0.0),  # primes, single precision
    (31, 1, 17, np.float64, -2.5, 0.0),  # one column, negative alpha
    (1, 23, 41, np.float32, 0.5, 1.0),  # one row, accumulate
    (53, 37, 3, np.float64, 1.0, -0.75),  # short depth, negative beta
    (97, 61, 211, np.float32, 1.25, 2.0),  # K larger than M and N, general alpha/beta
]


def _operands(m, n, k, dtype, ta, tb, seed=0):
    a = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c = random_matrix((m, n), dtype, seed + 2)
    return a, b, c


@pytest.fixture(params=["cblas", "scipy"])
def backend(request):
    try:
        return NumpyBackend(blas=request.param)
    except BackendUnavailable:
        pytest.skip("NumPy's BLAS library exposes no CBLAS gemm here")


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k,dtype,alpha,beta", GEMM_CASES)
def test_gemm_matches_reference_in_place(backend, m, n, k, dtype, alpha, beta, ta, tb):
    a, b, c0 = _operands(m, n, k, dtype, ta, tb)
    buf = backend.device_buffer(m * n + 5, dtype)
    buf[:] = np.nan
    c = backend.view(buf, (m, n))
    if beta != 0:
        c[...] = c0
    backend.gemm(a, b, c, alpha, beta, ta, tb, backend.stream())
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(buf[: m * n].reshape(m, n), ref) <= tolerance(dtype, k)
    assert np.isnan(buf[m * n:]).all()  # nothing written past the view


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_beta_zero_never_reads_c(backend, dtype, ta, tb):
    m, n, k = 19, 11, 23
    a, b, _ = _operands(m, n, k, dtype, ta, tb, seed=5)
    c = np.full((m, n), np.nan, dtype)
    c[::3, ::2] = np.inf  # garbage of every kind
    backend.gemm(a, b, c, 1.0, 0.0, ta, tb, None)
    assert np.isfinite(c).all()
    assert relative_error(c, reference_gemm(a, b, trans_a=ta, trans_b=tb)) <= tolerance(dtype, k)


@pytest.mark.parametrize("k", [
    23,  # a rank-23 update
    0,  # depth 0: c = beta * c, zeros for beta == 0
])
@pytest.mark.parametrize("trans", [True, False])  # a^T a, and a a^T
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_syrk_beta_zero_never_reads_c(dtype, trans, k):
    n = 13
    a = random_matrix((k, n) if trans else (n, k), dtype, seed=6)
    c = np.full((n, n), np.nan, dtype)
    c[::3, ::2] = np.inf  # garbage of every kind
    NumpyBackend().syrk(a, c, 1.0, 0.0, trans)
    ref = reference_gemm(a, a, trans_a=trans, trans_b=not trans)
    size = magnitude(a, a, trans_a=trans, trans_b=not trans)
    upper = np.triu(np.ones((n, n), bool))
    assert np.isfinite(c[upper]).all()
    assert (np.abs(c - ref)[upper] <= tolerance(dtype, max(k, 1)) * size[upper]).all()



def test_scale_past_the_dtype_warns_nothing():
    c = np.array([[3e38, 1.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run reports the overflow, not NumPy
        NumpyBackend().scale(c, 2.0)
    assert np.isinf(c[0, 0]) and c[0, 1] == 2.0

@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("dtype,fn", [(np.float32, scipy_blas.sgemm), (np.float64, scipy_blas.dgemm)])
def test_scipy_gemm_on_fortran_views_returns_the_given_memory(dtype, fn, ta, tb):
    m, n, k = 17, 9, 26
    a, b, _ = _operands(m, n, k, dtype, ta, tb, seed=9)
    c = np.full((m, n), np.nan, dtype)
    r = fn(1.0, b.T, a.T, beta=0.0, c=c.T, trans_a=tb, trans_b=ta, overwrite_c=True)
    assert r.ctypes.data == c.ctypes.data and np.shares_memory(r, c)
    assert relative_error(c, reference_gemm(a, b, trans_a=ta, trans_b=tb)) <= tolerance(dtype, k)


BAD_GEMM = [
    # (description, a shape, b shape, c shape, dtypes, error)
    ("inner dims differ", (4, 5), (6, 3), (4, 3), ("f8", "f8", "f8"), ShapeError),
    ("c has the wrong shape", (4, 5), (5, 3), (3, 4), ("f8", "f8", "f8"), ShapeError),
    ("mixed dtypes", (4, 5), (5, 3), (4, 3), ("f4", "f8", "f8"), DtypeError),
    ("integer dtype", (4, 5), (5, 3), (4, 3), ("i8", "i8", "i8"), DtypeError),
    ("half c for half operands", (4, 5), (5, 3), (4, 3), ("f2", "f2", "f2"), DtypeError),
    ("float64 c for half operands", (4, 5), (5, 3), (4, 3), ("f2", "f2", "f8"), DtypeError),
    ("bfloat16 with float16", (4, 5), (5, 3), (4, 3), (BF16, "f2", "f4"), DtypeError),
]


HALF_CASES = [
    # (m, n, k, alpha, beta, scratch elements)
    (1, 1, 1, 1.0, 0.0, HALF_SCRATCH),   # scalar product
    (37, 29, 1001, 0.5, -2.0, 1000),     # K in four blocks of the least depth (256)
    (64, 48, 300, 1.0, 1.0, 1 << 20),    # one block, accumulate
]


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k,alpha,beta,scratch", HALF_CASES)
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_half_gemm_in_float32_blocks(backend, monkeypatch, dtype, m, n, k, alpha, beta, scratch,
                                     ta, tb):
    """float16 and bfloat16 a and b into a float32 c, converted a K block at a time."""
    monkeypatch.setattr(numpy_backend, "HALF_SCRATCH", scratch)
    a, b, _ = _operands(m, n, k, dtype, ta, tb, seed=m + k)
    c0 = random_matrix((m, n), np.float32, 3)
    c = c0.copy() if beta else np.full((m, n), np.nan, np.float32)
    backend.gemm(a, b, c, alpha, beta, ta, tb, None)
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(c, ref) <= tolerance(dtype, k)


@pytest.mark.parametrize("trans", [True, False])  # a^T a, and a a^T
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_half_syrk_in_float32_blocks(dtype, trans):
    """A half-precision panel's syrk converts it a K block at a time, as the gemm does: the
    copy in float32 holds at most HALF_SCRATCH elements, not the whole panel."""
    import tracemalloc

    n, k = 8, 1 << 20  # the panel: 32 MiB in float32, twice HALF_SCRATCH's
    a = random_matrix((k, n) if trans else (n, k), np.float32, seed=9).astype(dtype)
    c0 = random_matrix((n, n), np.float32, seed=10)
    c = c0.copy()
    tracemalloc.start()
    try:
        NumpyBackend().syrk(a, c, 0.5, -2.0, trans)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 4 * HALF_SCRATCH + (1 << 20)  # one block of float32 (and change)
    ref = reference_gemm(a, a, alpha=0.5, beta=-2.0, c=c0, trans_a=trans, trans_b=not trans)
    upper = np.triu(np.ones((n, n), bool))
    assert relative_error(c[upper], ref[upper]) <= tolerance(dtype, k)


def test_half_rates_time_a_half_gemm():
    r = NumpyBackend().rates("bfloat16", 1 << 20)
    assert r.flops > 0


@pytest.mark.parametrize("what,sa,sb,sc,dts,err", BAD_GEMM, ids=[c[0] for c in BAD_GEMM])
def test_gemm_rejects_bad_operands(what, sa, sb, sc, dts, err):
    be = NumpyBackend()
    a, b, c = (np.ones(s, dtype=d) for s, d in zip((sa, sb, sc), dts))
    with pytest.raises(err, match="Expected"):
        be.gemm(a, b, c, 1.0, 0.0, False, False, None)


def test_gemm_rejects_strided_views():
    be = NumpyBackend()
    a = random_matrix((8, 12), np.float64)[:, ::2]  # not contiguous
    with pytest.raises(ShapeError, match="C-contiguous"):
        be.gemm(a, np.ones((6, 3)), np.empty((8, 3)), 1.0, 0.0, False, False, None)


def test_view_is_a_prefix_of_the_buffer_and_bounded():
    be = NumpyBackend()
    buf = be.host_buffer(30, np.float32)
    v = be.view(buf, (4, 7))
    assert v.shape == (4, 7) and v.flags.c_contiguous and np.shares_memory(v, buf)
    v[...] = 3.0
    assert (buf[:28] == 3.0).all()
    with pytest.raises(ShapeError, match="at most 30"):
        be.view(buf, (4, 8))


def test_streams_events_and_copies_are_synchronous():
    be = NumpyBackend()
    s = be.stream()
    host = random_matrix((5, 6), np.float64, 3)
    dev = np.full((5, 6), np.nan)
    be.copy_in(host, dev, s)
    ev = be.record(s)
    be.wait(s, ev)
    be.synchronize(ev)
    back = np.full((5, 6), np.nan)
    be.copy_out(dev, back, s)
    assert np.array_equal(back, host)
    assert be.staging is False and be.name == "numpy"


def test_memory_available_agrees_with_psutil():
    psutil = pytest.importorskip("psutil")
    have = memory_available()
    ref = psutil.virtual_memory().available
    assert have > 0
    assert abs(have - ref) <= 0.2 * ref


REGISTRY = [
    # (name, expected backend name or error)
    ("numpy", "numpy"),  # explicit CPU backend
    ("NumPy", "numpy"),  # names are case-insensitive
    ("auto", "cupy" if probe_cuda() else "numpy"),  # auto: cupy only where a GPU answers
]


@pytest.mark.parametrize("name,expected", REGISTRY)
def test_registry_selects_by_name(name, expected):
    try:
        be = get_backend(name)
    except BackendUnavailable:
        assert expected == "cupy"  # GPU present but no cupy backend in this build
        return
    assert be.name == expected
    assert isinstance(be, Backend)


@pytest.mark.parametrize("name", ["torch", "", "opencl"])
def test_registry_rejects_unknown_names_listing_the_known(name):
    with pytest.raises(BackendUnavailable) as e:
        get_backend(name)
    assert all(n in str(e.value) for n in BACKENDS) and repr(name) in str(e.value)


@pytest.mark.skipif(probe_cuda(), reason="a GPU is usable here")
def test_cupy_backend_without_a_gpu_is_unavailable():
    with pytest.raises(BackendUnavailable, match="Expected"):
        get_backend("cupy")


def test_the_cblas_search_runs_once_a_process(monkeypatch):
    first = NumpyBackend()
    if first.blas != "cblas":
        pytest.skip("no CBLAS library loaded by NumPy here")
    searched = []
    monkeypatch.setattr(numpy_backend, "_blas_libraries",
                        lambda: searched.append(1) or [])  # a search now would find none
    second = NumpyBackend()
    assert second.blas == "cblas" and not searched
    a, b = random_matrix((9, 5), np.float32, 1), random_matrix((5, 4), np.float32, 2)
    c = np.full((9, 4), np.nan, np.float32)
    second.gemm(a, b, c, 1.0, 0.0, False, False, None)
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float32, 5)


def test_unknown_blas_mode_is_rejected():
    with pytest.raises(BackendUnavailable, match="'mkl'"):
        NumpyBackend(blas="mkl")


@pytest.mark.parametrize("env, want", [
    ({"OPENBLAS_NUM_THREADS": "3"}, 3),                       # OpenBLAS's own setting wins
    ({"OPENBLAS_NUM_THREADS": "", "OMP_NUM_THREADS": "5,2"}, 5),  # else OpenMP's first level
    ({"OPENBLAS_NUM_THREADS": "x", "OMP_NUM_THREADS": "0"}, None),  # nonsense: the CPUs
])
def test_gemm_threads_follows_the_blas_settings(monkeypatch, env, want):
    import os

    from bigmm.backends.numpy import NumpyBackend

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    got = NumpyBackend().gemm_threads()
    assert got == (want if want is not None else len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("ability, has", [
    (Backend, True),      # the core: buffers, copies, gemm, events
    (Checksums, True),    # the reductions of verify="checksum", in NumPy
    (Calibrates, True),   # its own rates: a short gemm timing
    (HostHints, True),    # two readers per file beside the BLAS threads
    (Profiles, False),    # nothing of its own to time: the host clocks do
    (Describes, False),   # reports say "CPU" and its cores themselves
])
def test_abilities_are_protocols_it_meets(ability, has):
    assert isinstance(NumpyBackend(), ability) is has


class _Bare:
    """A backend of the core alone, as a test of the executor may write one."""

    name, staging = "bare", False


@pytest.mark.parametrize("ability", [
    Checksums,   # no reductions
    Calibrates,  # no rates
    Profiles,    # no profiling
    HostHints,   # no hints
    Describes,   # no words for what it runs on
])
def test_an_ability_is_absent_unless_all_of_it_is_there(ability):
    assert not isinstance(_Bare(), ability)


@pytest.mark.parametrize("dtype, limit, n", [
    ("float32", None, 1024),     # no limit: 1024^2 operands
    ("float64", 1 << 20, 256),   # two 256^2 float64 operands fill 1 MiB
    ("float32", 100, 16),        # a tiny limit still times 16^2
])
def test_rates_time_a_gemm_within_the_limit_once_a_process(monkeypatch, dtype, limit, n):
    monkeypatch.setattr(numpy_backend, "_TIMED", {})  # nothing timed yet in this process
    be = NumpyBackend()
    sizes, gemm = [], be.gemm

    def timed(a, *rest):
        sizes.append(a.shape)
        gemm(a, *rest)

    monkeypatch.setattr(be, "gemm", timed)
    r = be.rates(dtype, limit)
    assert sizes == [(n, n)] * 3  # the best of three
    assert r.flops > 0 and (r.read_bytes, r.write_bytes) == (READ_RATE, WRITE_RATE)
    assert r.h2d_bytes is None  # host memory is the compute memory
    # later calls, of this backend or another, take the same timing; other threads time anew
    assert be.rates(dtype, limit) is r and NumpyBackend().rates(dtype, limit) is r
    assert len(sizes) == 3
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(be.gemm_threads() + 1))
    assert be.rates(dtype, limit) is not r and len(sizes) == 6
