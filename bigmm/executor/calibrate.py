"""What the executor's host work costs on this machine, for the predicted time: copying
between the user's arrays and staging buffers on the reader and writer threads, one step's
fixed cost where the gemm runs on the host, the issuing thread's work per step and per staged
load where it does not, one read of a panel from a source.

Each figure is measured once per process and size (cached), in a few milliseconds, within
the bytes it is given, and kept for later processes where the machine was quiet
(:mod:`bigmm.calibration`), so that one job gets the same plan in every process.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import time

import numpy as np

from ..calibration import on_measuring, remembered
from ..io import hostcopy
from ..io.sink import ArraySink
from ..io.source import ArraySource, Source
from ..planner import make_plan
from ..planner.schedule import PIECE_BYTES
from ..units import common_dtype, dtype_name, numpy_dtype
from .run import execute


#: Sources whose read cost and decoding rate are kept at most (the newest).
SOURCES_KEPT = 256
#: Bytes each side of the timed host copy holds at most (beyond the caches).
COPY_BYTES = 256 << 20
#: The narrow rows of the timed copy of a region, and the rows of the array it is cut from.
ROW_BYTES, PITCH_BYTES = 3 << 10, 16 << 10
#: The job (m, n, k) that times the executor's fixed cost per step, and its tile edge.
STEP_JOB, STEP_TILE = (64, 64, 64), 16
#: The jobs (m = n, and two depths k: in place, staged) whose runs time the issuing thread
#: of a staging backend, their tile edge (16 and 128 or 64 steps of tiny gemms: the staged
#: steps cost more, so fewer tell them apart), and the rounds of them timed.
ISSUE_EDGE, ISSUE_TILE, ISSUE_ROUNDS = 128, 64, 3
ISSUE_DEPTHS = {True: (256, 2048), False: (256, 1024)}


def copy_rate(threads: int, nbytes: int = COPY_BYTES, piece: int | None = None) -> float:
    """Bytes per second that ``threads`` threads copy between two ordinary (pageable) arrays
    of ``nbytes`` each, in one piece a thread (``piece``: in calls of that many bytes each),
    as the readers copy panels of the user's arrays into staging and the writer copies tiles
    back (:func:`bigmm.io.hostcopy.copy`; the best of three; both arrays' pages touched
    first; kept between processes: :mod:`bigmm.calibration`)."""
    return _kept_copy_rate(threads, int(nbytes), piece, hostcopy.kind())


@functools.lru_cache(maxsize=16)
def _kept_copy_rate(threads: int, nbytes: int, piece: int | None, kind: str) -> float:
    return remembered("copy-rate", [threads, nbytes, piece, kind],
                      lambda: _copy_rate(threads, nbytes, piece))


def _copy_rate(threads: int, nbytes: int, piece: int | None) -> float:
    n = max(threads, int(nbytes) // 8)
    src, dst = np.ones(n), np.zeros(n)
    step = n if piece is None else max(1, int(piece) // 8)

    def copy(a: int, b: int) -> None:
        for i in range(a, b, step):
            hostcopy.copy(dst[i:min(b, i + step)], src[i:min(b, i + step)])

    return src.nbytes / max(_fastest(copy, n, threads), 1e-9)


def piece_rate(nbytes: int = COPY_BYTES, threads: int = 1) -> float:
    """Bytes per second each of ``threads`` reader threads copies while all of them copy at
    once, in pieces of PIECE_BYTES, a call each, as the readers copy a panel's pieces into
    staging (:func:`copy_rate`): they share the host's memory. On an H100 host 16 threads
    copied 3.4 GB/s each, one alone 6.9, and a run's reads came in at 2.7-4.3 GB/s a
    thread (NumPy's copies, before :mod:`bigmm.io.hostcopy` streamed them)."""
    return copy_rate(threads, nbytes, PIECE_BYTES) / threads


def copy_row_seconds(threads: int, nbytes: int = COPY_BYTES) -> float:
    """Seconds per row that ``threads`` threads add, beyond the bytes at :func:`copy_rate`,
    copying a region of narrow rows (ROW_BYTES of each PITCH_BYTES row of an ordinary
    array, as a panel of a wider matrix is copied into staging, row by row), counted over
    all the rows copied (the threads run together). Measured on the H100 host: 150 ns a row
    against 49 GB/s, which the staged reads of its runs bore out (kept between processes)."""
    return _kept_row_seconds(threads, int(nbytes), hostcopy.kind())


@functools.lru_cache(maxsize=16)
def _kept_row_seconds(threads: int, nbytes: int, kind: str) -> float:
    return remembered("copy-row-seconds", [threads, nbytes, kind],
                      lambda: _copy_row_seconds(threads, nbytes))


def _copy_row_seconds(threads: int, nbytes: int) -> float:
    rows = max(threads, int(nbytes) // PITCH_BYTES)
    src = np.ones((rows, PITCH_BYTES // 4), np.float32)
    dst = np.zeros((rows, ROW_BYTES // 4), np.float32)

    def copy(a: int, b: int) -> None:
        hostcopy.copy(dst[a:b], src[a:b, : ROW_BYTES // 4])

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

    def figure(self) -> list:
        """What names its figures in the store (JSON: the dtype by its name)."""
        return [str(x) if isinstance(x, np.dtype) else x for x in self._key()]

    def __eq__(self, other) -> bool:
        return isinstance(other, _Corner) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def load_seconds(src, repeat: int = 3) -> float:
    """Fixed seconds of one read from the source ``src``: the fastest of ``repeat`` reads of
    its first 8 x 8 elements (a chunked source decodes a chunk for it, as every panel does);
    timed once per process and source (label, layout, chunks, shape, dtype), so that
    ``plan`` and ``matmul`` of one job choose the same plan, and kept for later processes."""
    return _load_seconds(_Corner(src, 8, 8), repeat)


@functools.lru_cache(maxsize=64)
def _load_seconds(src: "_Corner", repeat: int) -> float:
    return remembered("load-seconds", src.figure(), lambda: _time_load(src, repeat),
                      limit=SOURCES_KEPT)


def _time_load(src: "_Corner", repeat: int) -> float:
    rows, cols = src.shape
    out = np.empty((rows, cols), src.dtype)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        src.read(0, rows, 0, cols, out)
        best = min(best, time.perf_counter() - t0)
    return best


#: Most rounds :func:`decode_rate` times, the seconds after which it starts no more, and the
#: most bytes of buffers its readers decode into.
DECODE_SAMPLES, DECODE_SECONDS, DECODE_BYTES = 3, 0.25, 256 << 20


def decode_rate(src, threads: int = 1, within: int = DECODE_BYTES) -> float | None:
    """Decoded bytes per second one reader reads and decodes of ``src``'s chunks while
    ``threads`` readers decode at once (as many as the source lets decode at once and
    DECODE_BYTES of buffers and ``within`` hold, at least one; the cores are shared), None
    where it decodes none: the median over rounds of one chunk a reader (its last chunks
    first, those a panel of the first rows meets last), as many rounds as DECODE_SAMPLES or
    DECODE_SECONDS allow, each chunk decoded apart from the run's buffers into a pair
    touched beforehand; timed once per process, source (label, layout, chunks, shape,
    dtype) and readers, and kept for later processes."""
    if not src.decode_bytes or not src.chunks:
        return None
    readers = max(1, min(threads, src.decode_threads or threads,
                         min(within, DECODE_BYTES) // src.decode_bytes))
    return _decode_rate(_Corner(src, *src.chunks), readers)


@functools.lru_cache(maxsize=64)
def _decode_rate(corner: "_Corner", threads: int) -> float | None:
    return remembered("decode-rate", corner.figure() + [threads],
                      lambda: _time_decoding(corner, threads), limit=SOURCES_KEPT)


def _time_decoding(corner: "_Corner", threads: int) -> float | None:
    src = corner.src
    (cr, cc), (m, n) = src.chunks, src.shape
    chunk = cr * cc * src.dtype.itemsize
    cols = -(-n // cc)
    cells = -(-m // cr) * cols
    readers = min(threads, cells)
    # (zeroed: their pages touched before the timing)
    pairs = [(np.zeros(max(1, src.decode_bytes - chunk), np.uint8), np.zeros(chunk, np.uint8))
             for _ in range(readers)]
    rates, start, t = [], time.perf_counter(), cells - 1
    with cf.ThreadPoolExecutor(readers, thread_name_prefix="bigmm-decode-rate") as pool:
        for _ in range(DECODE_SAMPLES):
            cells_now = [(t - i) % cells for i in range(readers)]
            t -= readers
            t0 = time.perf_counter()
            done = list(pool.map(lambda c, pair: src.decode_chunk(c // cols, c % cols, *pair),
                                 cells_now, pairs))
            if any(done):  # (chunks not stored: passed over)
                rates.append(chunk / (time.perf_counter() - t0))
            if time.perf_counter() - start > DECODE_SECONDS:
                break
    if not rates:
        return None
    rates.sort()
    return rates[len(rates) // 2]


def issue_seconds(be, threads: int) -> tuple[float, float, float]:
    """(per step, per staged load, per run): the host seconds the issuing thread of the
    staging backend ``be`` spends on a step (launching its copies and gemm, its bookkeeping)
    and adds for each load it takes over from the reader threads, where the device's work is
    too small to hide them, and a run's own start and end (its slots, streams and threads).
    Timed on runs of tiny tiles at two depths (the difference over the steps between them;
    the shorter run less its steps), the operands in the backend's pinned buffers (copied in
    place; where its buffers are not page-locked, every cost counts per step) and in
    ordinary arrays (staged: two loads a step); the best of ISSUE_ROUNDS, cached per backend
    kind and threads (and kept between processes: :mod:`bigmm.calibration`)."""
    key = (type(be), be.name, threads)
    if key not in _ISSUE:
        _ISSUE[key] = tuple(remembered("issue-seconds", [type(be).__name__, be.name, threads],
                                       lambda: list(_issue_seconds(be, threads))))
    return _ISSUE[key]


_ISSUE: dict[tuple, tuple[float, float, float]] = {}


def _drop_kept() -> None:
    """Forget this process's kept figures (``bigmm calibrate`` measures them again)."""
    _kept_copy_rate.cache_clear()
    _kept_row_seconds.cache_clear()
    _load_seconds.cache_clear()
    _decode_rate.cache_clear()
    _ISSUE.clear()


on_measuring(_drop_kept)


def _issue_seconds(be, threads: int) -> tuple[float, float, float]:
    e = ISSUE_EDGE
    rng = np.random.default_rng(0)

    def operands(k: int, pinned: bool):
        shapes = ((e, k), (k, e), (e, e))
        if not pinned:
            return [rng.standard_normal(s, np.float32) for s in shapes]
        out = [be.view(be.host_buffer(s[0] * s[1], np.dtype(np.float32)), s) for s in shapes]
        for x in out[:2]:
            x[...] = rng.standard_normal(x.shape, np.float32)
        return out

    def per_step(pinned: bool) -> tuple[float, float] | None:
        k0, k1 = ISSUE_DEPTHS[pinned]
        runs = {k: operands(k, pinned) for k in (k0, k1)}
        if pinned and not all(be.host_pinned(x) for x in runs[k0]):
            return None  # nothing to copy in place: staged costs only
        plans = {k: make_plan(e, e, k, "float32", device_budget=64 << 20,
                              host_budget=64 << 20, staging=True, align=8,
                              tile=(ISSUE_TILE,) * 3, order="stream",
                              in_place="ABC" if pinned else "") for k in (k0, k1)}
        best = {k0: float("inf"), k1: float("inf")}
        for _ in range(ISSUE_ROUNDS):
            for k in (k0, k1):
                a, b, c = runs[k]
                t0 = time.perf_counter()
                execute(plans[k], ArraySource(a, "A"), ArraySource(b, "B"),
                        ArraySink(c, "C"), be, io_threads=threads)
                best[k] = min(best[k], time.perf_counter() - t0)
        step = max(0.0, best[k1] - best[k0]) / (plans[k1].n_steps - plans[k0].n_steps)
        return step, max(0.0, best[k0] - step * plans[k0].n_steps)

    (staged, run), direct = per_step(False), per_step(True)
    if direct is None:
        return staged, 0.0, run
    # a step of the stream order loads A and B
    return direct[0], max(0.0, staged - direct[0]) / 2, direct[1]
