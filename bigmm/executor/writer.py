"""The writer: one thread that writes finished C tiles in order and commits them to the
output's journal in batches. A tile computed in another dtype than the output's (float32 C of
half-precision operands written as bfloat16, say) is converted piece by piece as it is written.
A tile holding NaN or infinities that its operands do not explain (:mod:`.overflow`) fails
the run before it is journaled. Each written tile's sample (:mod:`..io.tilesums`) is journaled
with it, where the output takes them.

A commit makes the batch's bytes durable (``fsync``, ``fdatasync`` or ``msync`` of the output)
and then journals the batch; it runs on a thread of its own while the writer goes on writing
later tiles, at most one commit in flight (a tile is still journaled only after its bytes are
durable: its write ended before the commit began). The flushes a commit waits for (the
output's, then the journal's) then no longer stall the writes: on a disk whose flush costs
tens of milliseconds, a run of 4 GiB in 256 MiB tiles commits 6-8 times."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time

import ml_dtypes
import numpy as np

from ..errors import BigmmError, OutputOverflowError, WriteError
from ..io import tilesums
from ..planner import Tile
from ..runstats import Tally
from ..units import dtype_name
from ..backends.numpy import nonfinite_count
from . import tuning
from .mirror import fill_lower, transposed
from .overflow import Origins
from .tuning import io_pieces


class Writer(threading.Thread):
    """Writes the tiles handed to :meth:`submit` into ``out`` (an io Sink), in order, on its
    own thread; ``error`` holds the first error (later tiles then fail with it). ``clock``
    times the writes and commits, ``tally`` counts the bytes written (``itemsize``: bytes per
    element of the output). Large tiles go to a sink that takes parallel writes in row pieces
    on ``threads`` threads."""

    def __init__(self, be, out, clock, tally: Tally, threads: int, itemsize: int,
                 symmetric: str | None = None, origins: Origins | None = None,
                 spans: int = 0):
        super().__init__(name="bigmm-write", daemon=True)
        self.be, self.out, self.clock, self.tally = be, out, clock, tally
        #: Spans of each tile's sample (0: none taken).
        self.spans = spans if out.takes_samples else 0
        self.threads, self.itemsize = threads, itemsize
        #: A Gram plan's tiles (i <= j): "mirror" (the lower triangle of a diagonal tile filled
        #: from its upper, an off-diagonal tile written transposed at (j, i) too) or "upper"
        #: (C's strictly lower triangle written as zeros); None: neither.
        self.symmetric = symmetric
        self.origins = origins
        self.q: queue.Queue = queue.Queue()
        #: Tiles written, in order, for the run's progress reports.
        self.finished: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._stopped = False
        self.pool: cf.ThreadPoolExecutor | None = None  # for the pieces of large tiles
        self._committer: cf.ThreadPoolExecutor | None = None  # runs one commit at a time
        self._committing: cf.Future | None = None  # the commit in flight

    def submit(self, tile: Tile, src, marks, check=None, counts=None) -> cf.Future:
        """Queue a tile for writing: ``marks`` lists its row ranges (tile-relative) with the
        event after which each is in ``src``, written range by range. ``check()`` (when given)
        says, once the last event completed, whether to write the tile at all. ``src`` None:
        the tile is copied into the output directly, and done once the last event completed.
        ``counts``: (event, count of its non-finite values, count of its old C's), each count
        a callable to call once the event completed (None: counted here from ``src``)."""
        fut: cf.Future = cf.Future()
        self.q.put((tile, src, marks, fut, check, counts))
        return fut

    def barrier(self) -> cf.Future:
        """A future done once every tile queued before it has been handled."""
        return self.submit(None, None, None)

    def stop(self) -> None:
        """Write and commit what is queued, then end the thread (idempotent)."""
        if not self._stopped:
            self._stopped = True
            self.q.put(None)
        if self.is_alive():
            self.join()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if self._committer is not None:
            self._committer.shutdown(wait=True)

    def run(self) -> None:
        pending: list[tuple[int, int]] = []
        samples: list = []
        last = time.perf_counter()
        while True:
            item = self.q.get()
            if item is None:
                break
            tile, src, marks, fut, check, counts = item
            self._reap()
            if self.error is not None:
                fut.set_exception(self.error)
                continue
            if tile is None:  # a barrier
                fut.set_result(None)
                continue
            try:
                if not self._write(tile, src, marks, check):
                    fut.set_result(None)
                    continue
                self._finite(tile, src, counts)
                pending.append(tile.index)
                samples.append(self._sample(tile, src))
                fut.set_result(None)
                self.finished.put(tile)
                if (time.perf_counter() - last >= tuning.COMMIT_INTERVAL
                        and self._committing is None):
                    self._commit_later(pending, samples)
                    pending, samples = [], []
                    last = time.perf_counter()
            except BaseException as e:
                self.error = e
                if not fut.done():
                    fut.set_exception(e)
        self._reap(wait=True)
        if self.error is None:
            try:
                self._commit(pending, samples)
            except BaseException as e:
                self.error = e

    def _write(self, tile: Tile, src, marks, check) -> bool:
        """Write a tile, each row range of ``marks`` once its event completed; False (nothing
        written) when its check says not to."""
        if check is not None or src is None:
            self.be.synchronize(marks[-1][2])
        if check is not None and not check():
            return False
        if src is None:  # copied out into the output array itself
            self.tally.add(bytes_written=tile.shape[0] * tile.shape[1] * self.itemsize)
            return True
        diagonal = self.symmetric is not None and tile.i == tile.j
        try:
            for r0, r1, event in marks:
                self.be.synchronize(event)
                with self.clock:
                    if diagonal:
                        fill_lower(src, r0, r1, self.symmetric == "upper", self._pool())
                    self._write_rows(tile, tile.r0 + r0, tile.r0 + r1, src[r0:r1])
            if self.symmetric is not None and not diagonal:  # the tile at (j, i)
                below = (transposed(src, self._pool()) if self.symmetric == "mirror"
                         else np.zeros(src.shape[::-1], src.dtype))
                with self.clock:
                    self._put(tile.c0, tile.c1, tile.r0, tile.r1, below)
                self.tally.add(bytes_written=src.size * self.itemsize)
        except BigmmError:
            raise
        except Exception as e:
            raise WriteError(f"Expected to write rows {tile.r0}:{tile.r1}, columns "
                             f"{tile.c0}:{tile.c1} of {self.out.label}. "
                             f"Got {type(e).__name__}: {e}") from e
        self.tally.add(bytes_written=src.size * self.itemsize)
        return True

    def _finite(self, tile: Tile, src, counts) -> None:
        """OutputOverflowError (before the tile is journaled) where the tile's NaN and
        infinities have no non-finite operand behind them."""
        if counts is None or self.origins is None:
            return
        event, counted, old = counts
        if event is not None:
            self.be.synchronize(event)
        if counted is None:  # a diagonal tile of a Gram plan, its lower triangle now filled
            n = nonfinite_count(src) if src is not None else 0
        else:
            n = counted()
        if n:  # traced element by element where the tile is here
            self.origins.check(tile, n, old() if old is not None else 0, src)

    def _sample(self, tile: Tile, src) -> list | None:
        """The tile's sample as written (None: none taken, or copied out directly)."""
        if not self.spans or src is None:
            return None
        mirror = self.symmetric if self.symmetric is not None and tile.i != tile.j else None
        return tilesums.take((tile.r0, tile.r1, tile.c0, tile.c1), src, self.out.dtype,
                             self.spans, mirror)

    def _write_rows(self, tile: Tile, r0: int, r1: int, src) -> None:
        """Write ``src`` to rows [r0, r1) of ``tile``, in row pieces on this writer's threads
        where the sink takes them at once (a NumPy array: one thread copies at a few GB/s, and
        the last tile's write is the run's drain)."""
        pieces = [(r0, r1)]
        if self.out.parallel_writes:
            pieces = io_pieces(r0, r1, tile.c1 - tile.c0, self.itemsize, self.threads)
        if len(pieces) == 1:
            self._put(r0, r1, tile.c0, tile.c1, src)
            return
        futures = [self._pool().submit(self._put, p0, p1, tile.c0, tile.c1,
                                    src[p0 - r0:p1 - r0]) for p0, p1 in pieces]
        for f in futures:
            f.result()

    def _pool(self) -> cf.ThreadPoolExecutor:
        """The writer's threads for the pieces of large tiles (and a Gram plan's mirrors)."""
        if self.pool is None:
            self.pool = cf.ThreadPoolExecutor(self.threads, thread_name_prefix="bigmm-copy")
        return self.pool

    def _put(self, r0: int, r1: int, c0: int, c1: int, src) -> None:
        """One write, ``src`` converted to the output's dtype first where it differs."""
        if src.dtype != self.out.dtype:
            src = converted(src, self.out.dtype,
                            f"rows {r0}:{r1}, columns {c0}:{c1} of {self.out.label}")
        self.out.write(r0, r1, c0, c1, src)

    def _commit(self, pending: list, samples: list) -> None:
        if pending:
            with self.clock:
                self.out.commit(list(pending), list(samples))
            pending.clear()
            samples.clear()

    def _commit_later(self, tiles: list, samples: list) -> None:
        """Commit ``tiles`` (all written) on the committer's thread."""
        if self._committer is None:
            self._committer = cf.ThreadPoolExecutor(1, thread_name_prefix="bigmm-commit")
        self._committing = self._committer.submit(self._commit, tiles, samples)

    def _reap(self, wait: bool = False) -> None:
        """Collect the commit in flight once it is done (``wait``: wait for it); a failed
        commit becomes the writer's error, and every later tile fails with it."""
        fut = self._committing
        if fut is None or not (wait or fut.done()):
            return
        self._committing = None
        exc = fut.exception()
        if exc is not None and self.error is None:
            self.error = exc


def converted(src: np.ndarray, dtype, where: str) -> np.ndarray:
    """``src`` in ``dtype``; OutputOverflowError where a finite value of ``src`` is not finite
    in it (beyond its largest finite value), rather than C written with infinities."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = src.astype(dtype)
    largest = float(ml_dtypes.finfo(dtype).max)
    if largest >= float(ml_dtypes.finfo(src.dtype).max) or src.size == 0:
        return out  # as wide or wider: every finite value fits
    if -largest <= src.min() and src.max() <= largest:  # NaN: looked into
        return out
    lost = np.isfinite(src) & ~np.isfinite(out)
    if not lost.any():  # infinities and NaN of the product itself, kept
        return out
    name, wide = dtype_name(dtype), dtype_name(src.dtype)
    raise OutputOverflowError(
        f"Expected the product to fit C's dtype {name} (largest finite value {largest:.6g}). "
        f"Got {int(lost.sum())} values beyond it in {where} (largest magnitude "
        f"{float(np.abs(src[lost]).max()):.4g}): write C as {wide} (out_dtype={wide} for a "
        f"new C; an output that is kept, in place or holding old C, keeps its dtype: "
        f"convert it to {wide} first).")
