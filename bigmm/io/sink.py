"""The output C: :func:`open_output` validates, creates or resumes it and returns a :class:`Sink`.

File outputs are created **unfiltered, with storage allocated at creation**
(``ALLOC_TIME_EARLY``, ``FILL_TIME_NEVER``): every element then has a fixed byte offset before
the first tile is computed, writes need no HDF5 chunk index, and a resumed run may write any
subset of tiles. Given the run's tile shape (bm, bn), the dataset is **chunked by the tiles**
(:func:`tile_chunks`: the tile clipped to the dataset): each tile is then one sequential byte
range of the file, one copy and one ``msync`` range, where in a contiguous dataset a tile
narrower than C is bm strided rows across the whole file (measured: 0.26 GB/s mapped into a
contiguous 16384^2 float32 C in 16384 x 2048 tiles against 1.37 GB/s into the tile-chunked
one). It stays **contiguous** where that is as good or chunks would not do: no tile given,
full-width tiles (already one range), tiles under ``MIN_CHUNK_BYTES``; a tile over HDF5's
4 GiB chunk limit is chunked by its largest row divisor that fits. Both layouts are read back
on the io layer's mapped fast path. Writes to regions that cut across chunks (a dataset chunked
for other tiles) are split per chunk. h5py's handle on the file is closed while raw writes
happen; the file is reopened with h5py only to create datasets and to set the completion
attribute.

Raw writes: when the output is opened, its bytes are reserved with ``os.posix_fallocate`` (a
full disk is a DiskFullError then, naming the bytes needed and free, before anything is
computed, and no later write can meet ENOSPC), and the dataset's byte range is mapped shared
and writable (:mod:`.mapped`): a tile is one NumPy copy into the mapping per stored block it
overlaps (no system call per row, GIL released), made durable in :meth:`Sink.commit` by
``msync`` of the page-aligned ranges written since the last commit (merged where they touch).
Each copy releases the pages it wrote from the process's RSS as it goes (:meth:`.FileMap.copy`);
they stay dirty in the page cache, and ``msync`` writes the file range all the same.
Where ``posix_fallocate`` is not supported (EOPNOTSUPP, EINVAL) or the file cannot be mapped,
tiles are written with ``os.pwritev`` per row (per chunk: one write) and ``fsync``, and ENOSPC
on a write is the DiskFullError.

Writes from other processes: while a file output is written raw, :meth:`Sink.raw_region`
describes where a region lies in the file (path, dtype, the byte pieces of the stored blocks it
overlaps) in a small picklable :class:`RawRegion`, and another process (a dask worker) writes
it there: :class:`RegionSink` is the region as a Sink (the executor writes its sub-tiles with
``pwritev`` as they finish, ``fdatasync`` makes them durable), :func:`write_region` writes it
whole. The sink's owner then journals the region with :meth:`Sink.commit` as if it had written
it. Only the owner touches HDF5
metadata (it creates the dataset, reserves its bytes, sets the completion attribute and swaps
the partial dataset), so no two processes ever write one HDF5 file's structures. On one host the
owner's shared mapping and the writers' ``pwritev`` go through the same page cache, and the owner
never writes the regions it hands out, so no stale page can overwrite a tile; on a file system
shared between hosts, the writer's ``fdatasync`` before it reports the tile makes the bytes
durable and visible to the owner's later opens. An output written through h5py has no raw
regions (None): its tiles must come back to the owner.

Crash safety: the journal (see :mod:`.journal`) is written before the dataset, tiles are
journaled only after their bytes are durable, and the dataset carries ``bigmm_complete = False``
until :meth:`Sink.finish`. When old C must be read (beta != 0) the new values go to a dataset
``<name>.bigmm-partial`` beside it; ``finish`` journals the swap, then replaces the original.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from dataclasses import dataclass

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t

from ..errors import BigmmError, DiskFullError, ShapeError, WriteError
from ._h5 import COMPLETE_ATTR, H5LOCK, JOB_ATTR
from .base import Matrix
from .identity import fingerprint
from .journal import Journal, finished_job
from .lock import h5_open_retry
from ..units import format_bytes
from .layout import chunk_cells, probe_layout
from .mapped import FileMap, reserve
from .rawio import write_block
from .source import DEFAULT_THREADS, H5Source, open_input, release_h5_handles
from .spec import Spec

PARTIAL_SUFFIX = ".bigmm-partial"
#: HDF5 limits a chunk to less than 4 GiB.
MAX_CHUNK_BYTES = (1 << 32) - 1
#: Tiles smaller than this keep a contiguous output (a chunk index of many tiny chunks buys
#: nothing: their strided rows are short runs anyway).
MIN_CHUNK_BYTES = 1 << 20
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
#: posix_fallocate errors that mean "not supported here": write with pwritev instead.
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
                 getattr(errno, "ENOSYS", errno.EOPNOTSUPP)}
#: Makes a file's data durable, with what reading it back needs (not its timestamps).
_fdatasync = getattr(os, "fdatasync", os.fsync)


class Sink(Matrix):
    """The output matrix C. Tiles are written from any thread; see :func:`open_output`."""

    done: frozenset = frozenset()
    result = None
    layout: str = "array"
    mapped: bool = False  # tiles are copied into a memory map of the output
    #: Pieces of one tile may be written from several threads at once (memory copies).
    parallel_writes: bool = False
    #: An interrupted run into this output can be resumed (it is journaled).
    resumable: bool = False
    #: The output is already the finished product of this job (nothing to compute).
    complete: bool = False
    #: The output's :class:`.lock.OutputLock`, released by :meth:`close`.
    lock = None

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

    def commit(self, tiles) -> None:
        pass

    def finish(self) -> None:
        pass

    def raw_region(self, r0, r1, c0, c1) -> RawRegion | None:
        """Where rows r0:r1, columns c0:c1 lie in the output file, for another process to
        write them with :func:`write_region`; None where only this sink can write them."""
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
            f"Finished tiles are kept; free space and rerun with --resume (resume=True).")
    return WriteError(f"Expected to write {region}. Got {type(exc).__name__}: {exc}.")


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
    GIL, and the disk, not the copy into the page cache, bounds the rate."""
    for base, (_, bc), (ra, _rb, ca, _cb), (a, b, c, d) in pieces:
        write_block(fd, base + (ra * bc + ca) * itemsize, bc * itemsize, src, a, b, c, d)


class MappedWrites:
    """Writes of stored pieces (:func:`clip_pieces`) through a shared writable
    :class:`.FileMap`, and their ``msync``: the byte ranges written since the last sync are
    kept merged where they touch. Writes of disjoint pieces may come from several threads."""

    def __init__(self, fmap: FileMap, dtype):
        self.map, self.dtype = fmap, np.dtype(dtype)
        self._dirty: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def write(self, pieces, src) -> None:
        """Copy ``src`` to ``pieces`` (each a copy into the map; the pages leave the process's
        RSS and stay dirty in the page cache)."""
        w = self.dtype.itemsize
        self.map.check()  # a page past the end of the file would raise SIGBUS
        ranges = []
        for base, (_, bc), (ra, rb, ca, cb), (a, b, c, d) in pieces:
            view = self.map.array(base + ra * bc * w, (rb - ra, bc), self.dtype)[:, ca:cb]
            self.map.copy(view, src[a:b, c:d], view=view)
            ranges.append((base + (ra * bc + ca) * w, base + ((rb - 1) * bc + cb) * w))
        self._mark(ranges)

    def _mark(self, ranges) -> None:
        with self._lock:
            merged = []
            for lo, hi in sorted(self._dirty + list(ranges)):
                if merged and lo <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
                else:
                    merged.append((lo, hi))
            self._dirty = merged

    def sync(self) -> None:
        """``msync`` what was written since the last sync; OSError on failure (what was not
        synced is synced again next time)."""
        with self._lock:
            dirty, self._dirty = self._dirty, []
        try:
            while dirty:
                self.map.sync(*dirty[0])
                dirty.pop(0)
        except BaseException:
            self._mark(dirty)
            raise


def write_region(where: RawRegion, src) -> None:
    """Write ``src`` to ``where`` from any process, durably: open the file for writing, copy
    the pieces into a map of them (``pwritev`` where that cannot be), ``msync``
    (``fdatasync``), close (a :class:`RegionSink` written whole).
    Touches only the region's bytes (the storage exists and is reserved; no HDF5 metadata is
    read or written), so several processes may write disjoint regions of one output while the
    sink's owner journals them after this returns. Errors are WriteError (DiskFullError when
    the disk is full)."""
    _check_tile(np.dtype(where.dtype), where.shape, src)
    with RegionSink(where) as sink:
        sink.write(0, where.shape[0], 0, where.shape[1], src)
        sink.finish()


class RegionSink(Sink):
    """A region of a raw-writable output (:class:`RawRegion`) as a Sink of the region's shape,
    written from any process (a dask worker computing one C tile with the executor).

    ``write`` of a sub-region copies it at its byte offsets (:func:`clip_pieces` of the
    region's pieces; no HDF5) into a shared writable map of the rows the region spans, or
    ``pwritev``s it where the output's storage is not reserved or the file cannot be mapped,
    so the executor's writer thread writes each sub-tile while the next is computed. Copies
    into a map let the workers that write regions of one file do so at once (each ``pwritev``
    to a file holds the file's lock: two workers writing C on tmpfs took twice as long each),
    and several threads of one worker (``parallel_writes``). ``commit`` and ``finish``
    ``msync`` (``fdatasync``) what was written, so when ``execute`` returns every byte written
    is durable. ``read`` reads old C (beta != 0) from ``old``, a Source of the region's old
    values in region coordinates. Nothing is journaled
    here: the output's owner journals the whole region once its writer reports it."""

    layout = "region"
    resumable = True  # the output's owner journals the region

    def __init__(self, where: RawRegion, old=None):
        self.where, self.old = where, old
        self.shape, self.dtype = where.shape, np.dtype(where.dtype)
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
                self._writes = MappedWrites(self._map, self.dtype)
                self.parallel_writes = self.mapped = True
            except (OSError, ValueError, OverflowError):  # cannot map here: pwritev instead
                pass

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

    def commit(self, tiles) -> None:
        """Make every write so far durable (``msync`` of the map, else ``fdatasync``)."""
        if not self._dirty:
            return
        try:
            if self._writes is not None:
                self._writes.sync()
            else:
                _fdatasync(self._fd)
        except OSError as exc:
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc
        self._dirty = False

    def finish(self) -> None:
        self.commit([])

    def close(self) -> None:
        self._close_raw_handles()
        self._release()

    def _write_error(self, r0, r1, c0, c1, exc) -> WriteError:
        return _write_error(self.where.label, self._r0 + r0, self._r0 + r1, self._c0 + c0,
                            self._c0 + c1, exc)


class ArraySink(Sink):
    """A NumPy array written in place (old C, for beta != 0, is read tile by tile first)."""

    parallel_writes = True

    def __init__(self, array: np.ndarray, label: str):
        self.array = self.result = array
        self.shape, self.dtype, self.label = tuple(array.shape), array.dtype, label

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        out[...] = self.array[r0:r1, c0:c1]

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        self.array[r0:r1, c0:c1] = src


class CompleteSink(Sink):
    """An output that already holds this job's finished product (a resumed run that had
    finished): nothing is read or written."""

    layout = "done"
    complete = resumable = True

    def __init__(self, label: str, shape, dtype, result):
        self.label, self.shape, self.dtype, self.result = label, tuple(shape), np.dtype(dtype), result


# ----- file outputs ---------------------------------------------------------------------------
def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tile_chunks(shape, tile, itemsize: int) -> tuple[int, int] | None:
    """The chunk shape for an output written in ``tile`` = (bm, bn) tiles, or None for a
    contiguous dataset (see the module docstring for the choice)."""
    if tile is None:
        return None
    m, n = (int(d) for d in shape)
    bm, bn = min(int(tile[0]), m), min(int(tile[1]), n)
    if bm <= 0 or bn <= 0 or bn == n:  # full-width tiles: already one range when contiguous
        return None
    rows = bm
    while rows * bn * itemsize > MAX_CHUNK_BYTES:  # the largest divisor of bm that fits
        rows = max((d for d in range(1, rows) if bm % d == 0 and d <= rows // 2), default=0)
        if rows == 0:
            return None
    if rows * bn * itemsize < MIN_CHUNK_BYTES:
        return None
    return rows, bn


def create_dataset(f: h5py.File, name: str, shape, dtype, chunks=None) -> h5py.Dataset:
    """An unfiltered dataset with storage allocated now and never filled: contiguous, or
    chunked with ``chunks`` (every chunk then has its byte offset from the start)."""
    dcpl = h5p.create(h5p.DATASET_CREATE)
    if chunks is None:
        dcpl.set_layout(h5d.CONTIGUOUS)
    else:
        dcpl.set_chunk(tuple(int(c) for c in chunks))
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    lcpl = h5p.create(h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    dsid = h5d.create(f.id, name.encode(), h5t.py_create(np.dtype(dtype), logical=True),
                      h5s.create_simple(tuple(shape)), dcpl=dcpl, lcpl=lcpl)
    dset = h5py.Dataset(dsid)
    dset.attrs[COMPLETE_ATTR] = False
    return dset


class FileSink(Sink):
    """An HDF5 dataset named by a spec, written raw at byte offsets (or via h5py if it must)."""

    resumable = True

    def __init__(self, spec: Spec, shape, dtype, journal: Journal, target: str,
                 reads_c: bool, threads: int = DEFAULT_THREADS, result=None):
        self.spec, self.shape, self.dtype = spec, tuple(shape), np.dtype(dtype)
        self.label, self.result = f"C ({spec})", str(spec) if result is None else result
        self.path = os.path.realpath(spec.path)
        self.journal, self.target, self.reads_c = journal, target, reads_c
        self.done = frozenset(journal.tiles)
        self._threads = threads
        self._fd = self._file = self._dset = self._old = self._map = self._lay = None
        self._writes: MappedWrites | None = None  # copies into the map and their msync
        self._finished = False
        if journal.swap:  # all tiles are durable; finish() completes the swap
            self.layout = "done"
            return
        self._open_target()
        if reads_c:
            self._old = self._open_old()

    def _open_target(self) -> None:
        with H5LOCK:
            release_h5_handles(self.path)
            f = self._h5("r")
            try:
                lay = probe_layout(f[self.target])
            finally:
                f.close()
            raw = lay.kind == "contiguous" or (lay.kind == "chunked"
                                               and bool((lay.chunk_offsets >= 0).all()))
            if raw and not lay.swap:
                self._lay = lay
                self._fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                self.layout = lay.kind
            else:  # an existing dataset we did not create: write through h5py
                self._file = self._h5("r+")
                self._dset = self._file[self.target]
                self.layout = "h5py"
        if self._fd is not None:
            try:
                self._map_target()
            except BaseException:
                self._close_handles()
                raise

    def _extent(self) -> tuple[int, int]:
        """The file bytes [start, stop) holding the dataset's elements (all its chunks)."""
        lay, w = self._lay, self.dtype.itemsize
        if lay.kind == "contiguous":
            return lay.offset, lay.offset + self.shape[0] * self.shape[1] * w
        if lay.chunk_offsets.size == 0:
            return 0, 0
        cr, cc = lay.chunks
        return (int(lay.chunk_offsets.min()),
                int(lay.chunk_offsets.max()) + cr * cc * w)

    def _map_target(self) -> None:
        """Reserve the dataset's bytes on disk, then map them (else leave pwritev to write)."""
        start, stop = self._extent()
        nbytes = stop - start
        if nbytes <= 0 or not hasattr(os, "posix_fallocate"):
            return
        try:
            reserve(self._fd, start, nbytes,  # gives back a failed attempt's blocks
                    release=() if self.done else self._lay.data_ranges(
                        self.shape, self.dtype.itemsize))
        except OSError as exc:
            if exc.errno in _FULL:
                raise self._full_at_creation(nbytes, exc) from exc
            if exc.errno in _NO_FALLOCATE:
                return
            raise WriteError(f"Expected to reserve {format_bytes(nbytes)} for {self.label} in "
                             f"'{self.path}'. Got {type(exc).__name__}: {exc}.") from exc
        try:
            self._map = FileMap(self._fd, start, stop, path=self.path, writable=True)
        except (OSError, ValueError, OverflowError):  # cannot map here: pwritev instead
            return
        self._writes = MappedWrites(self._map, self.dtype)
        self.mapped = True

    def _full_at_creation(self, nbytes: int, exc: OSError) -> DiskFullError:
        try:
            st = os.statvfs(self.path)
            free = format_bytes(st.f_bavail * st.f_frsize)
        except OSError:
            free = "unknown"
        return DiskFullError(
            f"Expected {format_bytes(nbytes)} ({nbytes} bytes) free on the file system of "
            f"'{self.path}' for {self.label}. Got {free} free ({exc.strerror}). Nothing was "
            f"computed; free space and rerun with --resume (resume=True), or choose another "
            f"output.")

    def _open_old(self):
        if self._file is not None:  # h5py writer: read old C through the same handle
            return None
        return _old_source(self.path, self.spec.dataset, self.label, self._threads)

    # ----- tiles --------------------------------------------------------------------------
    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        if not self.reads_c:
            raise BigmmError(f"Expected a sink opened with reads_c=True to read old C. "
                             f"Got reads_c=False for {self.label}.")
        if self._old is not None:
            self._old.read(r0, r1, c0, c1, out)
            return
        with H5LOCK:
            self._file[self.spec.dataset].read_direct(out, np.s_[r0:r1, c0:c1])

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        if r0 == r1 or c0 == c1:
            return
        try:
            if self._fd is None:
                with H5LOCK:
                    self._dset.write_direct(np.ascontiguousarray(src),
                                            dest_sel=np.s_[r0:r1, c0:c1])
                return
            pieces = self._pieces(r0, r1, c0, c1)
            if self._map is not None:
                self._writes.write(pieces, src)
                return
            write_pieces(self._fd, pieces, np.ascontiguousarray(src), self.dtype.itemsize)
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc

    def raw_region(self, r0, r1, c0, c1) -> RawRegion | None:
        """The region's place in the file while it is written raw (None through h5py)."""
        self._check_region(r0, r1, c0, c1)
        if self._fd is None:
            return None
        return RawRegion(self.path, self.label, self.dtype.str, (r0, r1), (c0, c1),
                         tuple(self._pieces(r0, r1, c0, c1)), reserved=self._map is not None)

    def _pieces(self, r0, r1, c0, c1) -> list:
        """Where region [r0:r1, c0:c1] lies in the file, per stored block it overlaps (the
        whole dataset when contiguous, each chunk when chunked), as :func:`clip_pieces` gives
        them: each block is a piece of the whole dataset, clipped to the region."""
        lay = self._lay
        if lay.kind == "contiguous":
            m, n = self.shape
            blocks = [(lay.offset, self.shape, (0, m, 0, n), (0, m, 0, n))]
        else:
            cr, cc = lay.chunks
            blocks = [(int(lay.chunk_offsets[ci, cj]), (cr, cc), (0, cr, 0, cc),
                       (ci * cr, (ci + 1) * cr, cj * cc, (cj + 1) * cc))
                      for ci, cj, *_ in chunk_cells((cr, cc), r0, r1, c0, c1)]
        return clip_pieces(blocks, r0, r1, c0, c1)

    def _sync(self) -> None:
        try:
            if self._map is not None:
                self._writes.sync()  # what fails to sync is synced again next time
            elif self._fd is not None:
                os.fsync(self._fd)
            elif self._file is not None:
                with H5LOCK:
                    self._file.flush()
                _fsync_path(self.path)
        except OSError as exc:
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def commit(self, tiles) -> None:
        """Make the tiles' bytes durable, then journal them (a crash loses no journaled tile)."""
        tiles = [[int(i), int(j)] for i, j in tiles]
        self._sync()
        if tiles:
            try:
                self.journal.append({"tiles": tiles})
            except OSError as exc:
                raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def finish(self) -> None:
        """Flush, swap in the partial dataset (beta != 0), mark complete, drop the journal."""
        if self._finished:
            return
        self._sync()
        self._close_handles()
        if self.reads_c:
            if not self.journal.swap:
                self.journal.append({"swap": True})
            with H5LOCK:  # idempotent: a crash during an earlier swap is finished here
                release_h5_handles(self.path)
                with self._h5("r+") as f:
                    _swap(f, self.spec.dataset, self.target)
            _fsync_path(self.path)
        record = finished_job(self.journal.header.get("job") or {})
        record["result"] = self._fingerprint()
        with H5LOCK:
            release_h5_handles(self.path)
            with self._h5("r+") as f:
                attrs = f[self.spec.dataset].attrs
                attrs[JOB_ATTR] = json.dumps(record, sort_keys=True)
                attrs[COMPLETE_ATTR] = True
        _fsync_path(self.path)
        self.journal.remove()
        self._finished = True
        self.layout = "done"

    def _h5(self, mode: str) -> h5py.File:
        return h5_open_retry(lambda: h5py.File(self.path, mode), self.path, self.label)

    def _fingerprint(self) -> str:
        """The finished product's fingerprint (before it is marked complete)."""
        with H5LOCK:
            f = self._h5("r")
            try:
                src = H5Source(f[self.spec.dataset], self.label, own_file=f,
                               threads=self._threads)
            except BaseException:
                f.close()
                raise
        try:
            return fingerprint(src)
        finally:
            src.close()

    def _close_handles(self) -> None:
        if self._old is not None:
            self._old.close()
            self._old = None
        self._close_raw_handles()
        if self._file is not None:
            with H5LOCK:
                self._file.close()
            self._file = self._dset = None

    def close(self) -> None:
        """Release everything; an unfinished output stays marked incomplete and resumable."""
        try:
            self._close_handles()
            self.journal.close()
        finally:
            self._release()


def _old_source(path: str, dataset: str, label: str, threads: int):
    return open_input(Spec(path, dataset), name="old " + label, threads=threads)


def _swap(f: h5py.File, name: str, partial: str) -> None:
    """Replace ``name`` by ``partial`` (idempotent: safe to repeat after a crash midway)."""
    if partial in f:
        if name in f:
            for key, value in f[name].attrs.items():
                if key != COMPLETE_ATTR:
                    f[partial].attrs[key] = value
            del f[name]
        f.move(partial, name)
