"""Writes from other processes: while a file output is written raw, :meth:`.sink.Sink.raw_region`
describes where a region lies in the file (path, dtype, the byte pieces of the stored blocks it
overlaps) in a small picklable :class:`RawRegion`, and another process (a dask worker) writes
it there: :class:`RegionSink` is the region as a Sink (the executor writes its sub-tiles as
they finish, with ``O_DIRECT``, copies into a map or ``pwritev``; ``fdatasync`` or ``msync``
makes them durable), :func:`write_region` writes it whole. The sink's owner then journals the
region with :meth:`.sink.Sink.commit` as if it had written it. Only the owner touches HDF5
metadata (it creates the dataset, reserves its bytes, sets the completion attribute and swaps
the partial dataset), so no two processes ever write one HDF5 file's structures. On one host the
owner's shared mapping and the writers' ``pwritev`` go through the same page cache, and the owner
never writes the regions it hands out, so no stale page can overwrite a tile (a writer's
``O_DIRECT`` write drops the cached pages of its range, of which the owner holds none); on a
file system
shared between hosts, the writer's ``fdatasync`` before it reports the tile makes the bytes
durable and visible to the owner's later opens. An output written through h5py has no raw
regions (None): its tiles must come back to the owner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import BigmmError, WriteError
from ..units import numpy_dtype
from .direct import tile_writes
from .mapped import FileMap, start_writeback
from .rawio import write_block
from .sink import Sink, _check_tile, _write_error

#: Makes a file's data durable, with what reading it back needs (not its timestamps).
_fdatasync = getattr(os, "fdatasync", os.fsync)


@dataclass(frozen=True)
class RawRegion:
    """Where a region of a raw-writable output lies in its file: small and picklable, so that
    a process other than the sink's (a dask worker) can write it (:func:`write_region`)."""

    path: str  # the file, as the sink resolved it
    label: str  # the output, for messages
    dtype: str
    rows: tuple[int, int]
    cols: tuple[int, int]
    pieces: tuple  # per stored block it overlaps (clip_pieces), in region coordinates
    #: The output's storage is reserved (``posix_fallocate``): another process may write it
    #: through a map (a write into a hole of a full disk through a map would be a SIGBUS).
    reserved: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows[1] - self.rows[0], self.cols[1] - self.cols[0]


def clip_pieces(pieces, r0, r1, c0, c1) -> list:
    """The parts of ``pieces`` inside rows r0:r1, columns c0:c1 of the region they describe,
    as pieces of that sub-region. A piece is (its stored block's byte offset, the block's
    shape, rows ra:rb and columns ca:cb within the block, rows a:b and columns c:d of the
    region): the one piece arithmetic of raw writes (:meth:`FileSink._pieces` clips whole
    blocks to a region, :class:`RegionSink` a region's pieces to a sub-region)."""
    out = []
    for base, shape, (ra, _rb, ca, _cb), (a, b, c, d) in pieces:
        lo, hi, left, right = max(a, r0), min(b, r1), max(c, c0), min(d, c1)
        if lo < hi and left < right:
            out.append((base, shape, (ra + lo - a, ra + hi - a, ca + left - c, ca + right - c),
                        (lo - r0, hi - r0, left - c0, right - c0)))
    return out


def write_pieces(fd: int, pieces, src, itemsize: int) -> None:
    """Write ``src`` (C-contiguous) to the file at ``pieces`` (:func:`clip_pieces`) with
    ``pwritev``, from this thread only: row-sized pwrites from many threads contend for the
    GIL, and the disk, not the copy into the page cache, bounds the rate. The write-back of
    each piece starts at once (:func:`.mapped.start_writeback`)."""
    for base, (_, bc), (ra, rb, ca, cb), (a, b, c, d) in pieces:
        write_block(fd, base + (ra * bc + ca) * itemsize, bc * itemsize, src, a, b, c, d)
        start_writeback(fd, base + (ra * bc + ca) * itemsize,
                        base + ((rb - 1) * bc + cb) * itemsize)


def write_region(where: RawRegion, src) -> None:
    """Write ``src`` to ``where`` from any process, durably: open the file for writing, copy
    the pieces into a map of them (``pwritev`` where that cannot be), ``msync``
    (``fdatasync``), close (a :class:`RegionSink` written whole).
    Touches only the region's bytes (the storage exists and is reserved; no HDF5 metadata is
    read or written), so several processes may write disjoint regions of one output while the
    sink's owner journals them after this returns. Errors are WriteError (DiskFullError when
    the disk is full)."""
    _check_tile(numpy_dtype(where.dtype), where.shape, src)
    with RegionSink(where) as sink:
        sink.write(0, where.shape[0], 0, where.shape[1], src)
        sink.finish()


class RegionSink(Sink):
    """A region of a raw-writable output (:class:`RawRegion`) as a Sink of the region's shape,
    written from any process (a dask worker computing one C tile with the executor).

    ``write`` of a sub-region writes it at its byte offsets (:func:`clip_pieces` of the
    region's pieces; no HDF5) by the path the file system suits (:func:`.direct.tile_writes`:
    ``O_DIRECT`` on a device, else copies into a shared writable map of the rows the region
    spans), or ``pwritev``s it where the output's storage is not reserved, so the executor's
    writer thread writes each sub-tile while the next is computed. Copies
    into a map let the workers that write regions of one file do so at once (each ``pwritev``
    to a file holds the file's lock: two workers writing C on tmpfs took twice as long each),
    and several threads of one worker (``parallel_writes``). ``commit`` and ``finish``
    ``msync`` / ``fdatasync`` what was written, so when ``execute`` returns every byte written
    is durable. ``read`` reads old C (beta != 0) from ``old``, a Source of the region's old
    values in region coordinates. Nothing is journaled
    here: the output's owner journals the whole region once its writer reports it, with the
    sample ``sampler`` (a :class:`.tilesums.Sampler`, where given) kept of what was written."""

    layout = "region"
    writes = "pwritev"  # until a map or O_DIRECT is opened ("direct" or "mapped")
    resumable = True  # the output's owner journals the region

    def __init__(self, where: RawRegion, old=None, sampler=None):
        self.where, self.old, self.sampler = where, old, sampler
        self.shape, self.dtype = where.shape, numpy_dtype(where.dtype)
        (self._r0, r1), (self._c0, c1) = where.rows, where.cols
        self.label = f"{where.label} rows {self._r0}:{r1}, columns {self._c0}:{c1}"
        self._dirty = False
        self._map = self._writes = None
        try:
            self._fd = os.open(where.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise _write_error(where.label, self._r0, r1, self._c0, c1, exc) from exc
        w = self.dtype.itemsize
        rows = [(base + ra * bc * w, base + rb * bc * w)
                for base, (_, bc), (ra, rb, _ca, _cb), _ in where.pieces]
        if rows and where.reserved:
            try:
                self._map = FileMap(self._fd, min(r[0] for r in rows), max(r[1] for r in rows),
                                    path=where.path, writable=True)
            except (OSError, ValueError, OverflowError):  # cannot map here
                self._map = None
            self._writes = tile_writes(self._fd, where.path, self._map, self.dtype)
            self.mapped = self._map is not None
            if self._writes is not None:
                self.writes, self.parallel_writes = self._writes.kind, True

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        if self.old is None:
            raise BigmmError(f"Expected a source of old C to read {self.label}. Got none.")
        self.old.read(r0, r1, c0, c1, out)

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        pieces = clip_pieces(self.where.pieces, r0, r1, c0, c1)
        try:
            if self._writes is not None:
                self._writes.write(pieces, src)
            else:
                write_pieces(self._fd, pieces, np.ascontiguousarray(src), self.dtype.itemsize)
            self._dirty = True
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc
        if self.sampler is not None:
            self.sampler.add(r0, r1, c0, c1, src)

    def commit(self, tiles, samples=None) -> None:
        """Make every write so far durable (``msync`` of the map, else ``fdatasync``); safe
        beside writes in flight (they are made durable by the next commit)."""
        if not self._dirty:
            return
        self._dirty = False  # a write ending from here on sets it again
        try:
            if self._writes is not None:
                self._writes.sync()
            else:
                _fdatasync(self._fd)
        except OSError as exc:
            self._dirty = True
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def finish(self) -> None:
        self.commit([])

    def close(self) -> None:
        if self._writes is not None:
            self._writes.close()
            self._writes = None
        self._close_raw_handles()
        self._release()

    def _write_error(self, r0, r1, c0, c1, exc) -> WriteError:
        return _write_error(self.where.label, self._r0 + r0, self._r0 + r1, self._c0 + c0,
                            self._c0 + c1, exc)
