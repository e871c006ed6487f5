"""The output C as a :class:`Sink`: tiles written from any thread, committed (made durable,
then journaled where the output keeps a journal) and finished. :func:`.output.open_output`
chooses the kind: :class:`ArraySink` (a NumPy array), :class:`CompleteSink` (a resumed output
that had already finished), :class:`.filesink.FileSink` (an HDF5 dataset) and, in another
process writing a region of a file output, :class:`.region.RegionSink`.
"""

from __future__ import annotations

import errno

import numpy as np

from ..errors import DiskFullError, ShapeError, WriteError
from . import hostcopy, tilesums
from .base import Matrix

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class Sink(Matrix):
    """The output matrix C. Tiles are written from any thread; see :func:`open_output`."""

    done: frozenset = frozenset()
    #: Tiles an earlier run journaled whose samples read back otherwise from the output
    #: (:mod:`.tilesums`): not in ``done``, so computed again.
    redone: tuple = ()
    #: The writer takes a sample of each tile for :meth:`commit` (journaled outputs).
    takes_samples: bool = False
    result = None
    layout: str = "array"
    mapped: bool = False  # the sink holds a shared writable map of the output
    #: How tiles reach the output: "array", "direct" (O_DIRECT), "mapped" (copies into a map),
    #: "pwritev" or "h5py" (see :mod:`.filesink`); Zarr chunk files "direct" or "cached",
    #: else "zarr" (see :mod:`.zarrfiles`).
    writes: str = "array"
    #: Pieces of one tile may be written from several threads at once (memory copies).
    parallel_writes: bool = False
    #: An interrupted run into this output can be resumed (it is journaled).
    resumable: bool = False
    #: The output is already the finished product of this job (nothing to compute).
    complete: bool = False
    #: The output's :class:`.lock.OutputLock`, released by :meth:`close`.
    lock = None

    def redone_note(self) -> tuple[str, ...]:
        """The note on journaled tiles the output no longer held as written, if any."""
        bad = self.redone
        if not bad:
            return ()
        return (f"{len(bad)} tile{'s' if len(bad) > 1 else ''} an earlier run journaled "
                f"(first: tile {tuple(bad[0])}) no longer held what was written in "
                f"{self.label}: computed again",)

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def interrupted(self, written: int, total: int, beta: float) -> str:
        """What an interruption after ``written`` of ``total`` tiles leaves, for its message."""
        if self.resumable:
            return (f"Interrupted after {written} of {total} tiles; the output {self.label} is "
                    f"resumable (resume=True).")
        applied = ", beta applied to them" if beta != 0 else ""
        return (f"Interrupted after {written} of {total} tiles; {self.label} now holds a "
                f"partial product (the tiles written so far{applied}) and cannot be resumed: "
                f"an in-memory output keeps no journal. Restore C and run again.")

    def read(self, r0, r1, c0, c1, out) -> None:
        raise NotImplementedError

    def write(self, r0, r1, c0, c1, src) -> None:
        raise NotImplementedError

    def commit(self, tiles, samples=None) -> None:
        pass

    def finish(self) -> None:
        pass

    def raw_region(self, r0, r1, c0, c1):
        """Where rows r0:r1, columns c0:c1 lie in the output file (a :class:`.region.RawRegion`),
        for another process to write them; None where only this sink can write them."""
        return None

    def _check(self, r0, r1, c0, c1, arr) -> None:
        self._check_region(r0, r1, c0, c1)
        _check_tile(self.dtype, (r1 - r0, c1 - c0), arr)

    def _write_error(self, r0, r1, c0, c1, exc) -> WriteError:
        return _write_error(self.label, r0, r1, c0, c1, exc)


def _check_tile(dtype, shape, arr) -> None:
    if arr.shape != shape or arr.dtype != dtype:
        raise ShapeError(f"Expected a {dtype} array of shape {shape}. "
                         f"Got {arr.dtype} {arr.shape}.")


def _write_error(label: str, r0, r1, c0, c1, exc) -> WriteError:
    region = f"rows {r0}:{r1}, columns {c0}:{c1} of {label}"
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return DiskFullError(
            f"Expected free space to write {region}. Got: disk full ({exc.strerror}). "
            f"Finished tiles are kept; free space and rerun with resume=True.")
    return WriteError(f"Expected to write {region}. Got {type(exc).__name__}: {exc}.")


class JournaledSink(Sink):
    """A sink whose finished tiles are recorded in its ``journal``: :meth:`commit` makes their
    bytes durable first (``_sync``), so that a crash loses no journaled tile, and a tile's
    sample with it; a resumed sink trusts a journaled tile only where its sample reads back
    (:meth:`_trusted`)."""

    takes_samples = True
    #: C's fingerprint as its tiles are written (:class:`.identity.WrittenFingerprint`), set
    #: where the sink opens its output to write.
    _taken = None

    def _result(self) -> str:
        """The finished product's fingerprint: as written, else read back (``_fingerprint``)
        where this run did not write every sampled element."""
        return (self._taken is not None and self._taken.digest()) or self._fingerprint()

    def _fingerprint(self) -> str:
        raise NotImplementedError

    def _trusted(self, journal, read) -> frozenset:
        """The journal's tiles, less those whose samples ``read`` (see
        :func:`.tilesums.changed`) gives back otherwise (kept in ``redone``)."""
        self.redone = tuple(tilesums.changed(journal.samples, read))
        return frozenset(journal.tiles) - set(self.redone)

    def _sync(self) -> None:
        raise NotImplementedError

    def commit(self, tiles, samples=None) -> None:
        """Make the tiles' bytes durable, then journal them (``samples``: one per tile, or
        None, see :mod:`.tilesums`)."""
        tiles = [[int(i), int(j)] for i, j in tiles]
        self._sync()
        if tiles:
            record: dict = {"tiles": tiles}
            if samples is not None and any(x is not None for x in samples):
                record["samples"] = list(samples)
            try:
                self.journal.append(record)
            except OSError as exc:
                raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc


class ArraySink(Sink):
    """A NumPy array written in place (old C, for beta != 0, is read tile by tile first)."""

    parallel_writes = True

    def __init__(self, array: np.ndarray, label: str):
        self.array = self.result = array
        self.shape, self.dtype, self.label = tuple(array.shape), array.dtype, label

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        hostcopy.copy(out, self.array[r0:r1, c0:c1])

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        hostcopy.copy(self.array[r0:r1, c0:c1], src)


class CompleteSink(Sink):
    """An output that already holds this job's finished product (a resumed run that had
    finished): nothing is read or written."""

    layout = "done"
    complete = resumable = True

    def __init__(self, label: str, shape, dtype, result):
        self.label, self.shape, self.dtype, self.result = label, tuple(shape), np.dtype(dtype), result
