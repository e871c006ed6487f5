"""The NumPy backend: host memory is the compute memory; gemm is a BLAS call in place.

``staging = False``: host and device buffers are the same NumPy arrays, streams and events are
trivial (every call completes before it returns) and copies are plain ``copyto``. Besides the
core :class:`~.base.Backend` it is :class:`~.base.Checksums` (the reductions in NumPy),
:class:`~.base.Calibrates` (a short gemm timing) and :class:`~.base.HostHints` (fewer
readers: they share the cores with the BLAS threads).

``gemm`` calls the row-major CBLAS ``?gemm`` of the BLAS library NumPy itself loaded, through
ctypes: ctypes releases the GIL for the call, so the reader and writer threads keep running
while the BLAS threads compute (SciPy's ``scipy.linalg.blas`` wrappers hold the GIL for the
whole call and would stall them). Where that library cannot be found, ``gemm`` falls back to
``scipy.linalg.blas.{s,d}gemm`` with ``overwrite_c=True`` on the Fortran view of the C-order
arrays (c.T = op(b).T @ op(a).T), which also works in place without temporaries.

float16 and bfloat16 operands are multiplied in float32 into a float32 c: the gemm converts
them a K block at a time (at most ``HALF_SCRATCH`` elements of float32 at once, at least
``HALF_DEPTH`` deep) and calls the float32 gemm per block (beta on the first, then 1). Measured
on this project's 2-core CI machine: converting costs 0.45 ns per bfloat16 element and 3.3 ns per
float16 element, against about 45 ns of SGEMM per element of a 1024-wide tile's panel.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import time
from typing import Any, Callable

import numpy as np

from ..errors import BackendUnavailable, OptionError, ShapeError
from ..planner.model import READ_RATE, WRITE_RATE, Rates
from ..precision import Rounding
from ..units import HALF_DTYPES, accumulate_dtype, numpy_dtype
from .base import check_gemm_dtypes, flat_view, gemm_shape

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_PREFIXES = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}
# Symbols with 64-bit integers (ILP64 builds). All integers are passed as 64-bit, which is also
# correct for an LP64 ``cblas_?gemm`` on x86-64 and aarch64 Linux (every integer argument takes
# a full register or stack slot); the self-test below guards the choice either way.
_SYMBOLS = ("scipy_cblas_{p}gemm64_", "cblas_{p}gemm64_", "cblas_{p}gemm")
BLAS_MODES = ("auto", "cblas", "scipy")
#: Elements of an operand converted to float64 at a time by ``weighted_sums``.
SUMS_BLOCK = 1 << 20
#: The gemm rates :meth:`NumpyBackend.rates` timed in this process.
_TIMED: dict[tuple, Rates] = {}
#: Elements of float32 that the gemm of half-precision operands converts them into at a time
#: (both operands' K block: 16 MiB), and the least depth of a block.
HALF_SCRATCH, HALF_DEPTH = 1 << 22, 256


class _Event:
    """A completed event (NumPy work is synchronous)."""

    __slots__ = ()


_DONE = _Event()


class NumpyBackend:
    """CPU backend. ``blas``: "auto" (CBLAS via ctypes, else SciPy), "cblas" or "scipy"."""

    name = "numpy"
    staging = False

    def __init__(self, *, blas: str = "auto"):
        if blas not in BLAS_MODES:
            raise BackendUnavailable(
                f"Expected blas to be one of {', '.join(BLAS_MODES)}. Got {blas!r}.")
        self._gemm: dict[np.dtype, Callable] = {}
        for dtype in _PREFIXES:
            fn = _cblas_gemm(dtype) if blas in ("auto", "cblas") else None
            if fn is None and blas == "cblas":
                raise BackendUnavailable(
                    "Expected a CBLAS library loaded by NumPy (for the ctypes gemm path). "
                    "Got none; use blas='scipy'.")
            self._gemm[dtype] = fn or _scipy_gemm(dtype)
        self.blas = "cblas" if all(f.__name__ == "cblas" for f in self._gemm.values()) else "scipy"

    # ----- buffers --------------------------------------------------------------------------
    def host_buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(int(size), dtype=dtype)

    def device_buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(int(size), dtype=dtype)

    def view(self, buf: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        return flat_view(buf, shape)

    def host_pinned(self, arr: np.ndarray) -> bool:
        return False  # host memory is the compute memory: nothing to copy through

    # ----- streams and events (trivial) -----------------------------------------------------
    def stream(self) -> None:
        return None

    def copy_in(self, host: np.ndarray, dev: np.ndarray, stream: Any) -> None:
        np.copyto(dev, host)

    def copy_out(self, dev: np.ndarray, host: np.ndarray, stream: Any) -> None:
        np.copyto(host, dev)

    def record(self, stream: Any) -> _Event:
        return _DONE

    def wait(self, stream: Any, event: Any) -> None:
        return None

    def synchronize(self, event: Any) -> None:
        return None

    # ----- host hints -----------------------------------------------------------------------
    #: Reader threads per input file: the copies share the cores with every BLAS thread,
    #: and each reader that runs stalls the BLAS at its next barrier; two keep up with the
    #: gemms (16-core VM, 12288^3 float32 under 256 MiB, 4 interleaved rounds: 0.858 of
    #: in-core numpy.matmul with 4 readers per file, 0.891 with 2, 0.890 with 1).
    reader_threads = 2
    #: Copies out of file maps in the inputs' own blocks.
    map_step = None

    def gemm_threads(self) -> int:
        """The threads the BLAS computes with: OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS,
        else the CPUs this process may run on (OpenBLAS's own default)."""
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            try:
                n = int(os.environ.get(var, "").split(",")[0])
            except ValueError:
                continue
            if n > 0:
                return n
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover (not Linux)
            return os.cpu_count() or 1

    # ----- compute --------------------------------------------------------------------------
    #: gemm does no checksum updates of its own (the checks sum the panels themselves).
    fuses_checks = False

    def gemm(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float, beta: float,
             trans_a: bool, trans_b: bool, stream: Any = None, checks=None) -> None:
        """c = alpha * op(a) @ op(b) + beta * c in place; beta == 0 never reads c. ``checks``
        must be None (see ``fuses_checks``)."""
        self.gemm_launcher(a, b, c, alpha, beta, trans_a, trans_b, checks)()

    def gemm_launcher(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float,
                      beta: float, trans_a: bool, trans_b: bool, checks=None):
        """See :meth:`bigmm.backends.base.Backend.gemm_launcher` (checked once; each call
        multiplies in place)."""
        name, (m, k, n) = _check_gemm(a, b, c, trans_a, trans_b)
        if checks is not None:
            raise OptionError("Expected checks=None: the NumPy backend's gemm does no checksum "
                              f"updates. Got {type(checks).__name__}.")
        run, alpha, beta = self._gemm[c.dtype], float(alpha), float(beta)
        if name in HALF_DTYPES:
            return lambda stream=None: _half_gemm(run, a, b, c, m, n, k, alpha, beta, trans_a,
                                                  trans_b)
        return lambda stream=None: run(a, b, c, m, n, k, alpha, beta, trans_a, trans_b)

    def scale(self, c: np.ndarray, beta: float, stream: Any = None) -> None:
        if beta == 0:
            c[...] = 0
        elif beta != 1:
            with np.errstate(over="ignore"):  # an overflow is the run's OutputOverflowError
                np.multiply(c, c.dtype.type(beta), out=c)

    def nonfinite(self, c: np.ndarray, stream: Any = None) -> Callable[[], int]:
        count = nonfinite_count(c)
        return lambda: count

    def syrk(self, a: np.ndarray, c: np.ndarray, alpha: float, beta: float, trans: bool,
             stream: Any = None) -> None:
        """See :meth:`bigmm.backends.base.Syrk.syrk`: BLAS ``ssyrk``/``dsyrk`` through
        scipy.linalg.blas (half-precision panels converted to float32 first, exactly)."""
        _syrk(a, c, float(alpha), float(beta), bool(trans))

    # ----- calibration ----------------------------------------------------------------------
    def rates(self, dtype: str, limit: int | None = None) -> Rates:
        """Rates for the predicted time: the gemm's flops from the best of three n x n
        products (n at most 1024, and the two operands within ``limit`` bytes; the first
        call also wakes the BLAS threads), nominal disk speeds, no copies. Timed once per
        process for each backend class, BLAS, dtype, size and count of BLAS threads
        (``_TIMED``): the plans of one process compare under one timing, as a GPU's kept
        rates let them."""
        dt, ct = numpy_dtype(str(dtype)), numpy_dtype(accumulate_dtype(str(dtype)))
        n = 1024 if limit is None else max(16, min(1024, math.isqrt(
            limit // (dt.itemsize + ct.itemsize))))
        key = (type(self), self.blas, str(dtype), n, self.gemm_threads())
        if key not in _TIMED:
            _TIMED[key] = self._time_rates(dt, ct, n)
        return _TIMED[key]

    def _time_rates(self, dt: np.dtype, ct: np.dtype, n: int) -> Rates:
        a = self.view(self.host_buffer(n * n, dt), (n, n))
        c = self.view(self.host_buffer(n * n, ct), (n, n))
        a[...] = 1.0
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            self.gemm(a, a, c, 1.0, 0.0, False, False, None)
            best = min(best, time.perf_counter() - t0)
        return Rates(flops=2 * n**3 / max(best, 1e-9), read_bytes=READ_RATE,
                     write_bytes=WRITE_RATE)

    # ----- checksums ------------------------------------------------------------------------
    #: The reductions' cost is not counted in the predicted time (a CPU plans by bytes).
    checksum_rate = None
    checksum_step = 0.0

    def weighted_sums(self, x, out, out_abs=None, *, weights=None, abs_weights=None,
                      scale: float = 1.0, accumulate: bool = False, stream: Any = None) -> None:
        """See :meth:`bigmm.backends.base.Backend.weighted_sums`: float64 sums of blocks of
        about SUMS_BLOCK elements of ``x`` at a time (bounded temporaries)."""
        rows, cols = x.shape
        s = np.zeros(cols)
        sa = np.zeros(cols) if out_abs is not None else None
        step = max(1, SUMS_BLOCK // max(cols, 1))
        with np.errstate(all="ignore"):  # Inf and NaN propagate into the sums, quietly
            self._sums(x, s, sa, weights, abs_weights, step)
        for o, v, f in ((out, s, scale), (out_abs, sa, abs(scale))):
            if o is not None:
                o[...] = (o if accumulate else 0.0) + f * v

    @staticmethod
    def _sums(x, s, sa, weights, abs_weights, step: int) -> None:
        if abs_weights is None and weights is not None:
            abs_weights = np.abs(weights)
        for r0 in range(0, x.shape[0], step):
            r1 = min(x.shape[0], r0 + step)
            xb = x[r0:r1].astype(np.float64)  # a copy, also of float64 input: abs() goes in place
            s += xb.sum(axis=0) if weights is None else weights[r0:r1] @ xb
            if sa is not None:
                np.abs(xb, out=xb)
                sa += xb.sum(axis=0) if abs_weights is None else abs_weights[r0:r1] @ xb

    def sums_launcher(self, x, out, out_abs=None, **options) -> Callable:
        return lambda stream=None: self.weighted_sums(x, out, out_abs, **options)

    def compare_launcher(self, expected, magnitude, actual, rel_tol: float, floor: float,
                         result, limit: float = float("inf")) -> Callable:
        return lambda stream=None: self.compare_sums(expected, magnitude, actual, rel_tol,
                                                     floor, result, limit=limit)

    def compare_sums(self, expected, magnitude, actual, rel_tol: float, floor: float, result,
                     stream: Any = None, limit: float = float("inf")) -> None:
        with np.errstate(invalid="ignore", over="ignore"):
            ratio = np.abs(expected - actual) / (rel_tol * magnitude + floor)
            may_overflow = magnitude * (1.0 + rel_tol) >= limit
        ratio[~np.isfinite(actual)] = np.where(may_overflow, 0.0, np.inf)[~np.isfinite(actual)]
        ratio[~(np.isfinite(expected) & np.isfinite(magnitude))] = 0.0
        at = int(np.argmax(ratio)) if ratio.size else -1
        result[0] = ratio[at] if ratio.size else 0.0
        result[1] = at

    def rounding(self, dtype) -> Rounding:
        """IEEE arithmetic in the dtype (half-precision operands: float32, exact products)
        whatever the precision asked."""
        name = "float32" if str(np.dtype(dtype)) in HALF_DTYPES else np.dtype(dtype)
        return Rounding(float(np.finfo(name).eps))

    def run_on(self, stream: Any):
        return contextlib.nullcontext()

    # ----- resources ------------------------------------------------------------------------
    def memory_available(self) -> int:
        return memory_available()

    def close(self) -> None:
        return None


def memory_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (free physical pages where that is missing)."""
    return _meminfo("MemAvailable:", "SC_AVPHYS_PAGES")


def memory_total() -> int:
    """MemTotal from /proc/meminfo in bytes (all physical pages where that is missing)."""
    return _meminfo("MemTotal:", "SC_PHYS_PAGES")


def _meminfo(field: str, pages: str) -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")


def _check_gemm(a, b, c, trans_a: bool, trans_b: bool) -> tuple[str, tuple[int, int, int]]:
    """(the operands' dtype name, (m, k, n)) after checking dtypes, contiguity and shapes (the
    BLAS call trusts them)."""
    dtype = check_gemm_dtypes(a.dtype, b.dtype, c.dtype)
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.ndim != 2 or not x.flags.c_contiguous:
            raise ShapeError(f"Expected {name} as a C-contiguous 2-D array. "
                             f"Got ndim {x.ndim}, strides {x.strides}.")
    if not c.flags.writeable:
        raise ShapeError("Expected c to be writeable. Got a read-only array.")
    return dtype, gemm_shape(a, b, c, trans_a, trans_b)


def nonfinite_count(x: np.ndarray) -> int:
    """The NaN and infinite elements of ``x``: none where its least and largest are finite
    (NaN carries through both), else counted."""
    if x.size == 0 or (np.isfinite(x.min()) and np.isfinite(x.max())):
        return 0
    return int(x.size - np.count_nonzero(np.isfinite(x)))


def _syrk(a: np.ndarray, c: np.ndarray, alpha: float, beta: float, trans: bool) -> None:
    """Row-major c's upper triangle is the column-major c.T's lower: BLAS syrk on the
    Fortran-ordered views a.T and c.T (no copies), in place; half-precision ``a`` in float32
    K blocks of at most HALF_SCRATCH elements."""
    from scipy.linalg import blas

    n = c.shape[0]
    if c.ndim != 2 or c.shape != (n, n) or not c.flags.c_contiguous:
        raise ShapeError(f"Expected a square C-contiguous c. Got shape {c.shape}, strides "
                         f"{c.strides}.")
    if n == 0:
        return
    k = a.shape[0] if trans else a.shape[1]
    if a.dtype != c.dtype and k:  # float16 or bfloat16 panels of a float32 C: converted a K
        depth = min(k, max(HALF_DEPTH, HALF_SCRATCH // n))  # block at a time, as the gemm's
        for k0 in range(0, k, depth):
            block = a[k0:k0 + depth] if trans else a[:, k0:k0 + depth]
            _syrk(np.array(block, dtype=c.dtype, order="C"), c, alpha,
                  beta if k0 == 0 else 1.0, trans)
        return
    fn = blas.ssyrk if c.dtype == np.float32 else blas.dsyrk
    if (a.shape[0] if trans else a.shape[1]) == 0:  # depth 0: c = beta * c
        if beta == 0:  # never read (NaN * 0 is NaN)
            c[...] = 0
        else:
            c *= beta
        return
    # a^T a = x x^T for x = a.T (n x k, trans=0); a a^T = x^T x for x = a.T (k x n, trans=1)
    out = fn(alpha, a.T, beta=beta, c=c.T, trans=0 if trans else 1, lower=1, overwrite_c=1)
    if not np.shares_memory(out, c):  # scipy copied: write the triangle back
        c.T[...] = np.where(np.tril(np.ones((n, n), bool)), out, c.T)


def _half_gemm(run, a, b, c, m, n, k, alpha, beta, trans_a, trans_b) -> None:
    """c = alpha * op(a) @ op(b) + beta * c for half-precision a and b and a float32 c: K blocks
    of op(a) and op(b) converted to float32 (exactly: float32 holds every float16 and bfloat16
    value), each multiplied by ``run``, the float32 gemm."""
    depth = min(k, max(HALF_DEPTH, HALF_SCRATCH // max(1, m + n)))
    f32 = np.float32
    for k0 in range(0, k, depth):
        k1 = min(k, k0 + depth)
        ap = np.array(a[k0:k1] if trans_a else a[:, k0:k1], dtype=f32, order="C")
        bp = np.array(b[:, k0:k1] if trans_b else b[k0:k1], dtype=f32, order="C")
        run(ap, bp, c, m, n, k1 - k0, alpha, beta if k0 == 0 else 1.0, trans_a, trans_b)


def _blas_libraries() -> list[str]:
    """Paths of the shared libraries with "blas" in their name that this process has loaded."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                path = parts[-1] if len(parts) >= 6 else ""
                name = os.path.basename(path).lower()
                if "blas" in name and ".so" in name and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


#: The CBLAS gemm found for each dtype, kept for the process (the search reads the process's
#: maps and tests the call: milliseconds, against a small product's run).
_FOUND: dict[np.dtype, Callable] = {}


def _cblas_gemm(dtype: np.dtype) -> Callable | None:
    """The CBLAS gemm of NumPy's BLAS library through ctypes, or None when not usable."""
    found = _FOUND.get(dtype)
    if found is None:
        found = _search_cblas(dtype)
        if found is not None:
            _FOUND[dtype] = found
    return found


def _search_cblas(dtype: np.dtype) -> Callable | None:
    p = _PREFIXES[dtype]
    real = ctypes.c_float if p == "s" else ctypes.c_double
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for path in _blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in _SYMBOLS:
            fn = getattr(lib, sym.format(p=p), None)
            if fn is None:
                continue
            fn.argtypes = [i64, i64, i64, i64, i64, i64, real, ptr, i64, ptr, i64, real, ptr, i64]
            fn.restype = None
            gemm = _make_cblas(fn)
            if _self_test(gemm, dtype):
                return gemm
    return None


def _make_cblas(fn) -> Callable:
    def cblas(a, b, c, m, n, k, alpha, beta, trans_a, trans_b):
        fn(_ROW_MAJOR, _TRANS if trans_a else _NO_TRANS, _TRANS if trans_b else _NO_TRANS,
           m, n, k, alpha, a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1],
           beta, c.ctypes.data, c.shape[1])
    return cblas


def _scipy_gemm(dtype: np.dtype) -> Callable:
    from scipy.linalg import blas

    fn = getattr(blas, _PREFIXES[dtype] + "gemm")

    def scipy(a, b, c, m, n, k, alpha, beta, trans_a, trans_b):
        # Fortran sees c.T (n x m) = op(b).T @ op(a).T; every operand is an F-ordered view.
        r = fn(alpha, b.T, a.T, beta=beta, c=c.T, trans_a=trans_b, trans_b=trans_a,
               overwrite_c=True)
        if not np.shares_memory(r, c):  # never expected: the wrapper copies only odd layouts
            np.copyto(c, r.T)
    return scipy


def _self_test(gemm: Callable, dtype: np.dtype) -> bool:
    """Check a small product of every transpose against NumPy (guards the ctypes signature)."""
    rng = np.random.default_rng(0)
    m, n, k = 5, 3, 7
    for ta in (False, True):
        for tb in (False, True):
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            c = np.full((m, n), np.nan, dtype=dtype)
            try:
                gemm(a, b, c, m, n, k, 1.0, 0.0, ta, tb)
            except Exception:
                return False
            ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
            if not np.allclose(c, ref, rtol=1e-4, atol=1e-4):
                return False
    return True
