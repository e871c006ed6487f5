"""What the executor's host work costs on this machine, for the predicted time: copying
between the user's arrays and staging buffers on the reader and writer threads, one step's
fixed cost where the gemm runs on the host, one read of a panel from a source.

Each figure is measured once per process and size (cached), in a few milliseconds, within
the bytes it is given.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import time

import numpy as np

from ..io.sink import ArraySink
from ..io.source import Source
from ..planner import make_plan
from ..units import common_dtype, dtype_name, numpy_dtype
from .run import execute


#: Bytes each side of the timed host copy holds at most (beyond the caches).
COPY_BYTES = 256 << 20
#: The narrow rows of the timed copy of a region, and the rows of the array it is cut from.
ROW_BYTES, PITCH_BYTES = 3 << 10, 16 << 10
#: The job (m, n, k) that times the executor's fixed cost per step, and its tile edge.
STEP_JOB, STEP_TILE = (64, 64, 64), 16


@functools.lru_cache(maxsize=16)
def copy_rate(threads: int, nbytes: int = COPY_BYTES) -> float:
    """Bytes per second that ``threads`` threads copy between two ordinary (pageable) arrays
    of ``nbytes`` each, in one piece a thread, as the readers copy panels of the user's
    arrays into staging and the writer copies tiles back (the best of three; both arrays'
    pages touched first)."""
    n = max(threads, int(nbytes) // 8)
    src, dst = np.ones(n), np.zeros(n)

    def copy(a: int, b: int) -> None:
        dst[a:b] = src[a:b]

    return src.nbytes / max(_fastest(copy, n, threads), 1e-9)


@functools.lru_cache(maxsize=16)
def copy_row_seconds(threads: int, nbytes: int = COPY_BYTES) -> float:
    """Seconds per row that ``threads`` threads add, beyond the bytes at :func:`copy_rate`,
    copying a region of narrow rows (ROW_BYTES of each PITCH_BYTES row of an ordinary
    array, as a panel of a wider matrix is copied into staging, row by row), counted over
    all the rows copied (the threads run together). Measured on the H100 host: 150 ns a row
    against 49 GB/s, which the staged reads of its runs bore out."""
    rows = max(threads, int(nbytes) // PITCH_BYTES)
    src = np.ones((rows, PITCH_BYTES // 4), np.float32)
    dst = np.zeros((rows, ROW_BYTES // 4), np.float32)

    def copy(a: int, b: int) -> None:
        dst[a:b] = src[a:b, : ROW_BYTES // 4]

    best = _fastest(copy, rows, threads)
    return max(0.0, best - dst.nbytes / copy_rate(threads, nbytes)) / rows


def _fastest(copy, n: int, threads: int) -> float:
    """The best of three timed passes of ``copy(a, b)`` over [0, n) in one even piece per
    thread, on ``threads`` threads, after an untimed pass."""
    edges = np.linspace(0, n, threads + 1).astype(int)
    pieces = list(zip(edges, edges[1:]))
    best = float("inf")
    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: copy(*p), pieces))
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(lambda p: copy(*p), pieces))
            best = min(best, time.perf_counter() - t0)
    return best


def step_seconds(be, threads: int, a, b) -> float:
    """The executor's fixed seconds per step where the gemm runs on the host (its
    bookkeeping, the readers' hand-offs, a BLAS call's start, reading small panels of the
    sources ``a`` and ``b``, on cores the gemm shares): a run of STEP_TILE tiles over the
    first STEP_JOB rows and columns of ``a`` and ``b``, whose arithmetic is negligible, over
    its steps (the best of two; cached per backend kind, threads and sources)."""
    m, k, n = STEP_JOB
    k = min(k, a.shape[1], b.shape[0])  # the corners' inner dimensions agree
    return _step_seconds(type(be), threads, _Corner(a, m, k), _Corner(b, k, n))


@functools.lru_cache(maxsize=16)
def _step_seconds(kind, threads: int, a: "_Corner", b: "_Corner") -> float:
    (m, k), n = a.shape, b.shape[1]
    t = STEP_TILE
    dtype = common_dtype(dtype_name(a.dtype), dtype_name(b.dtype))
    plan = make_plan(m, n, k, dtype, device_budget=1 << 20, staging=False,
                     tile=(t, t, t), order="stream")
    best = float("inf")
    for _ in range(2):
        be = kind()
        try:
            out = ArraySink(np.empty((m, n), numpy_dtype(plan.c_dtype)), "C")
            t0 = time.perf_counter()
            execute(plan, a, b, out, be, io_threads=threads)
            best = min(best, time.perf_counter() - t0)
        finally:
            be.close()
    return best / plan.n_steps


class _Corner(Source):
    """The first ``rows`` x ``cols`` of a source (at most its own), read through it; equal
    (for the cache) where the sources have one label, layout, chunks and shape."""

    def __init__(self, src, rows: int, cols: int):
        self.src, self.dtype, self.label = src, np.dtype(src.dtype), src.label
        self.shape = (min(rows, src.shape[0]), min(cols, src.shape[1]))
        self.chunks, self.layout = src.chunks, src.layout

    def read(self, r0, r1, c0, c1, out) -> None:
        self.src.read(r0, r1, c0, c1, out)

    def _key(self) -> tuple:
        return (self.label, self.layout, self.chunks, self.src.shape, self.shape, self.dtype)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Corner) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def load_seconds(src, repeat: int = 3) -> float:
    """Fixed seconds of one read from the source ``src``: the fastest of ``repeat`` reads of
    its first 8 x 8 elements (a chunked source decodes a chunk for it, as every panel does);
    timed once per process and source (label, layout, chunks, shape, dtype), so that
    ``plan`` and ``matmul`` of one job choose the same plan."""
    return _load_seconds(_Corner(src, 8, 8), repeat)


@functools.lru_cache(maxsize=64)
def _load_seconds(src: "_Corner", repeat: int) -> float:
    rows, cols = src.shape
    out = np.empty((rows, cols), src.dtype)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        src.read(0, rows, 0, cols, out)
        best = min(best, time.perf_counter() - t0)
    return best
