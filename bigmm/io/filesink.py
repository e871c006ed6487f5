"""An HDF5 dataset as the output (:class:`FileSink`), written raw at byte offsets.

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
attribute. An h5py.Dataset written in place is written through h5py: the caller's handle
shares HDF5's caches of its data, which raw writes would leave holding old C.

Raw writes: when the output is opened, its bytes are reserved with ``os.posix_fallocate`` (a
full disk is a DiskFullError then, naming the bytes needed and free, before anything is
computed, and no later write can meet ENOSPC), and tiles are written by the path the file
system suits (:func:`.direct.tile_writes`; ``Sink.writes`` names it):

* ``"direct"`` (a file system on a device): each long sequential run of a tile (a whole chunk
  of a tile-chunked output, a row piece of it) is written with ``O_DIRECT`` straight from the
  tile's buffer, bypassing the page cache; datasets bigmm creates get page-aligned storage
  (:data:`H5_ALIGNMENT`), so the GPU's page-aligned pinned buffers need no copy. Short runs
  (the rows of narrow tiles in a contiguous C) are copied into a shared map as below.
  :meth:`Sink.commit` is one ``fdatasync``. See :mod:`.direct` for the measurements.
* ``"mapped"`` (tmpfs, or where ``O_DIRECT`` does not open): the dataset's byte range is
  mapped shared and writable (:mod:`.mapped`): a tile is one NumPy copy into the mapping per
  stored block it overlaps (no system call per row, GIL released), whose write-back starts at
  once (``sync_file_range``); :meth:`Sink.commit` ``msync``s the page-aligned ranges written
  since the last commit. Each copy releases the pages it wrote from the process's RSS as it
  goes (:meth:`.FileMap.copy`).
* ``"pwritev"``, where ``posix_fallocate`` is not supported (EOPNOTSUPP, EINVAL), or the
  file can be neither mapped nor opened ``O_DIRECT``: ``os.pwritev`` per row (per chunk: one
  write) and ``fsync``; ENOSPC on a write is the DiskFullError.

The first two take a tile's row pieces from several threads at once (``parallel_writes``).

Crash safety: the journal (see :mod:`.journal`) is written before the dataset, tiles are
journaled only after their bytes are durable, and the dataset carries ``bigmm_complete = False``
until :meth:`Sink.finish`. When old C must be read (beta != 0) the new values go to a dataset
``<name>.bigmm-partial`` beside it; ``finish`` journals the swap, then replaces the original.
"""

from __future__ import annotations

import functools
import json
import os

import h5py
import numpy as np
from h5py import h5d, h5p, h5s

from ..errors import BigmmError, DiskFullError, WriteError
from ..units import format_bytes
from ._h5 import (COMPLETE_ATTR, H5LOCK, JOB_ATTR, RUN_ATTR, h5_type, read_region, release_h5_handles,
                  reserve_job_record, write_job_record, write_region)
from .durable import fsync_path
from .h5atomic import opener
from .identity import WrittenFingerprint, fingerprint
from .journal import Journal, finished_job
from .layout import chunk_cells, probe_layout
from .lock import h5_open_retry
from .direct import ALIGN, DIRECT_MIN, tile_writes
from .mapped import NO_FALLOCATE, FileMap, reserve
from .region import RawRegion, clip_pieces, write_pieces
from .sink import _FULL, JournaledSink
from .source import DEFAULT_THREADS, H5Source, open_input
from .spec import Spec

PARTIAL_SUFFIX = ".bigmm-partial"
#: HDF5 limits a chunk to less than 4 GiB.
MAX_CHUNK_BYTES = (1 << 32) - 1
#: Tiles smaller than this keep a contiguous output (a chunk index of many tiny chunks buys
#: nothing: their strided rows are short runs anyway).
MIN_CHUNK_BYTES = 1 << 20
#: h5py.File options under which a dataset bigmm creates gets its storage (each chunk, or the
#: whole contiguous array) at a page-aligned file offset, so that the tiles' pinned buffers
#: (page-aligned) are written with O_DIRECT straight from memory (see :mod:`.direct`).
H5_ALIGNMENT = {"alignment_threshold": DIRECT_MIN, "alignment_interval": ALIGN}


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


def create_dataset(f: h5py.File, name: str, shape, dtype, chunks=None,
                   record_bytes: int = 0) -> h5py.Dataset:
    """An unfiltered dataset with storage allocated now and never filled: contiguous, or
    chunked with ``chunks`` (every chunk then has its byte offset from the start); marked
    incomplete, with room for a job record of ``record_bytes`` (see reserve_job_record)."""
    dcpl = h5p.create(h5p.DATASET_CREATE)
    if chunks is None:
        dcpl.set_layout(h5d.CONTIGUOUS)
    else:
        dcpl.set_chunk(tuple(int(c) for c in chunks))
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    lcpl = h5p.create(h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    dsid = h5d.create(f.id, name.encode(), h5_type(dtype),
                      h5s.create_simple(tuple(shape)), dcpl=dcpl, lcpl=lcpl)
    dset = h5py.Dataset(dsid)
    dset.attrs[COMPLETE_ATTR] = False
    dset.attrs[RUN_ATTR] = os.urandom(8).hex()
    if record_bytes:
        reserve_job_record(dset.attrs, record_bytes)
    return dset


class FileSink(JournaledSink):
    """An HDF5 dataset named by a spec, written raw at byte offsets (or via h5py if it must)."""

    resumable = True
    writes = "pwritev"  # until the storage is reserved (then "direct" or "mapped")

    def __init__(self, spec: Spec, shape, dtype, journal: Journal, target: str,
                 reads_c: bool, threads: int = DEFAULT_THREADS, result=None):
        self.spec, self.shape, self.dtype = spec, tuple(shape), np.dtype(dtype)
        self.label, self.result = f"C ({spec})", str(spec) if result is None else result
        self.path = os.path.realpath(spec.path)
        self.journal, self.target, self.reads_c = journal, target, reads_c
        self.done = frozenset(journal.tiles)
        self._threads = threads
        self._fd = self._file = self._dset = self._old = self._map = self._lay = None
        self._writes = None  # a DirectWrites or MappedWrites, where the storage is reserved
        self._reserved = False
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
                dset = f[self.target]
                lay = probe_layout(dset)
                self._taken = WrittenFingerprint(self.shape, self.dtype, dset.chunks)
                self.done = self._trusted(self.journal, functools.partial(
                    _read_spans, dset, self.dtype))
            finally:
                f.close()
            raw = lay.kind == "contiguous" or (lay.kind == "chunked"
                                               and bool((lay.chunk_offsets >= 0).all()))
            # a dataset written in place shares HDF5's caches of its data (sieve buffer,
            # chunk cache) with the caller's handle, which raw writes would leave stale
            if raw and not lay.swap and isinstance(self.result, str):
                self._lay = lay
                self._fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                self.layout = lay.kind
            else:  # a dataset we did not create, or written in place: through h5py
                self._file = self._h5("r+")
                self._dset = self._file[self.target]
                self.layout = self.writes = "h5py"
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
            if exc.errno in NO_FALLOCATE:  # not supported here: written with pwritev
                return
            raise WriteError(f"Expected to reserve {format_bytes(nbytes)} for {self.label} in "
                             f"'{self.path}'. Got {type(exc).__name__}: {exc}.") from exc
        self._reserved = True
        try:
            self._map = FileMap(self._fd, start, stop, path=self.path, writable=True)
        except (OSError, ValueError, OverflowError):  # cannot map here
            self._map = None
        self._writes = tile_writes(self._fd, self.path, self._map, self.dtype)
        self.mapped = self._map is not None
        if self._writes is not None:
            self.writes = self._writes.kind
            self.parallel_writes = True

    def _full_at_creation(self, nbytes: int, exc: OSError) -> DiskFullError:
        try:
            st = os.statvfs(self.path)
            free = format_bytes(st.f_bavail * st.f_frsize)
        except OSError:
            free = "unknown"
        return DiskFullError(
            f"Expected {format_bytes(nbytes)} ({nbytes} bytes) free on the file system of "
            f"'{self.path}' for {self.label}. Got {free} free ({exc.strerror}). Nothing was "
            f"computed; free space and rerun with resume=True, or choose another "
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
            read_region(self._file[self.spec.dataset], np.s_[r0:r1, c0:c1], out)

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        if r0 == r1 or c0 == c1:
            return
        try:
            if self._fd is None:
                with H5LOCK:
                    write_region(self._dset, np.s_[r0:r1, c0:c1], src)
            elif self._writes is not None:
                self._writes.write(self._pieces(r0, r1, c0, c1), src)
            else:
                write_pieces(self._fd, self._pieces(r0, r1, c0, c1), np.ascontiguousarray(src),
                             self.dtype.itemsize)
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc
        self._taken.add(r0, r1, c0, c1, src)

    def raw_region(self, r0, r1, c0, c1) -> RawRegion | None:
        """The region's place in the file while it is written raw (None through h5py)."""
        self._check_region(r0, r1, c0, c1)
        if self._fd is None:
            return None
        return RawRegion(self.path, self.label, self.dtype.name, (r0, r1), (c0, c1),
                         tuple(self._pieces(r0, r1, c0, c1)), reserved=self._reserved)

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
            if self._writes is not None:
                self._writes.sync()  # what fails to sync is synced again next time
            elif self._fd is not None:
                os.fsync(self._fd)
            elif self._file is not None:
                with H5LOCK:
                    self._file.flush()
                fsync_path(self.path)
        except OSError as exc:
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def finish(self) -> None:
        """Flush; then in one change of the file (all or nothing, see :mod:`.h5atomic`): swap
        in the partial dataset (beta != 0), record the job, mark complete; drop the journal."""
        if self._finished:
            return
        self._sync()
        self._close_handles()
        if self.reads_c and not self.journal.swap:
            self.journal.append({"swap": True})
        record = finished_job(self.journal.header.get("job") or {})
        record["result"] = self._result()
        with H5LOCK:
            release_h5_handles(self.path)
            try:
                with self._change() as f:
                    if self.reads_c:  # idempotent: done already where an earlier finish got
                        _swap(f, self.spec.dataset, self.target)  # this far
                    attrs = f[self.spec.dataset].attrs
                    write_job_record(attrs, json.dumps(record, sort_keys=True))
                    attrs.modify(COMPLETE_ATTR, True)
            except OSError as exc:  # the file as it was: every tile kept, resumable
                raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc
        self.journal.remove()
        self._finished = True
        self.layout = "done"

    def _change(self):
        """The file opened to change its structure: all or nothing (see :mod:`.h5atomic`), or
        plainly where the user's own h5py handle holds it open (a dataset written in place, or
        an input of the same file)."""
        if not isinstance(self.result, str):
            return self._h5("r+")
        return h5_open_retry(opener(self.path, self.journal.path, "r+"), self.path, self.label)

    def _h5(self, mode: str) -> h5py.File:
        return h5_open_retry(lambda: h5py.File(self.path, mode), self.path, self.label)

    def _fingerprint(self) -> str:
        """The finished product's fingerprint (before it is marked complete; the partial
        dataset's where it is not swapped in yet)."""
        with H5LOCK:
            f = self._h5("r")
            try:
                name = self.target if self.reads_c and self.target in f else self.spec.dataset
                src = H5Source(f[name], self.label, own_file=f, threads=self._threads)
            except BaseException:
                f.close()
                raise
        try:
            return fingerprint(src)
        finally:
            src.close()

    def _close_raw_handles(self) -> None:
        if self._writes is not None:
            self._writes.close()
            self._writes = None
        super()._close_raw_handles()

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


def _read_spans(dset, dtype, found) -> list:
    """The spans [row, column, length] of ``dset`` (call holding H5LOCK), in ``dtype``."""
    out = []
    for r, c, n in found:
        x = np.empty((1, n), dtype)
        read_region(dset, np.s_[r:r + 1, c:c + n], x)
        out.append(x)
    return out


def _old_source(path: str, dataset: str, label: str, threads: int):
    return open_input(Spec(path, dataset), name="old " + label, threads=threads)


def _swap(f: h5py.File, name: str, partial: str) -> None:
    """Replace ``name`` by ``partial`` (idempotent: safe to repeat after a crash midway)."""
    if partial in f:
        if name in f:
            for key, value in f[name].attrs.items():
                if key not in (COMPLETE_ATTR, JOB_ATTR):  # the partial's own, reserved
                    f[partial].attrs[key] = value
            del f[name]
        f.move(partial, name)
