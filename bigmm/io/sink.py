"""The output C: :func:`open_output` validates, creates or resumes it and returns a :class:`Sink`.

File outputs are created **contiguous, unfiltered, with storage allocated at creation**
(``ALLOC_TIME_EARLY``, ``FILL_TIME_NEVER``): every element then has a fixed byte offset before
the first tile is computed, any tile grid maps onto it (the planner's tiles need not match a
chunk shape fixed at creation, and a resumed run may write any subset of tiles), writes need no
HDF5 chunk index, and the finished dataset is the simplest layout for every other reader
(memory-mappable, no chunk cache). h5py's handle on the file is closed while raw writes happen;
the file is reopened with h5py only to create datasets and to set the completion attribute.

Raw writes: when the output is opened, its bytes are reserved with ``os.posix_fallocate`` (a
full disk is a DiskFullError then, naming the bytes needed and free, before anything is
computed, and no later write can meet ENOSPC), and the dataset's byte range is mapped shared
and writable (:mod:`.mapped`): a tile is one NumPy copy into the mapping (no system call per
row, GIL released), made durable in :meth:`Sink.commit` by ``msync`` of the page-aligned range
written since the last commit. Where ``posix_fallocate`` is not supported (EOPNOTSUPP, EINVAL)
or the file cannot be mapped, tiles are written with ``os.pwritev`` per row and ``fsync``, and
ENOSPC on a write is the DiskFullError.

Crash safety: the journal (see :mod:`.journal`) is written before the dataset, tiles are
journaled only after their bytes are durable, and the dataset carries ``bigmm_complete = False``
until :meth:`Sink.finish`. When old C must be read (beta != 0) the new values go to a dataset
``<name>.bigmm-partial`` beside it; ``finish`` journals the swap, then replaces the original.
"""

from __future__ import annotations

import errno
import os
import threading

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t

from ..errors import BigmmError, DiskFullError, ShapeError, WriteError
from ._h5 import COMPLETE_ATTR, H5LOCK
from .journal import Journal
from ..units import format_bytes
from .layout import probe_layout
from .mapped import FileMap
from .rawio import write_block
from .source import DEFAULT_THREADS, open_input, release_h5_handles
from .spec import Spec

PARTIAL_SUFFIX = ".bigmm-partial"
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
#: posix_fallocate errors that mean "not supported here": write with pwritev instead.
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
                 getattr(errno, "ENOSYS", errno.EOPNOTSUPP)}


class Sink:
    """The output matrix C. Tiles are written from any thread; see :func:`open_output`."""

    shape: tuple[int, int]
    dtype: np.dtype
    label: str
    done: frozenset = frozenset()
    result = None
    layout: str = "array"
    mapped: bool = False  # tiles are copied into a memory map of the output

    def read(self, r0, r1, c0, c1, out) -> None:
        raise NotImplementedError

    def write(self, r0, r1, c0, c1, src) -> None:
        raise NotImplementedError

    def commit(self, tiles) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.label} {self.shape} {self.dtype} "
                f"layout={self.layout}>")

    def _check(self, r0, r1, c0, c1, arr) -> None:
        m, n = self.shape
        if not (0 <= r0 <= r1 <= m and 0 <= c0 <= c1 <= n):
            raise ShapeError(f"Expected a region within {self.shape} of {self.label}. "
                             f"Got rows {r0}:{r1}, columns {c0}:{c1}.")
        if arr.shape != (r1 - r0, c1 - c0) or arr.dtype != self.dtype:
            raise ShapeError(f"Expected a {self.dtype} array of shape {(r1 - r0, c1 - c0)}. "
                             f"Got {arr.dtype} {arr.shape}.")

    def _write_error(self, r0, r1, c0, c1, exc) -> WriteError:
        region = f"rows {r0}:{r1}, columns {c0}:{c1} of {self.label}"
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return DiskFullError(
                f"Expected free space to write {region}. Got: disk full ({exc.strerror}). "
                f"Finished tiles are kept; free space and rerun with --resume (resume=True).")
        return WriteError(f"Expected to write {region}. Got {type(exc).__name__}: {exc}.")


class ArraySink(Sink):
    """A NumPy array written in place (old C, for beta != 0, is read tile by tile first)."""

    def __init__(self, array: np.ndarray, label: str):
        self.array = self.result = array
        self.shape, self.dtype, self.label = tuple(array.shape), array.dtype, label

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        out[...] = self.array[r0:r1, c0:c1]

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        self.array[r0:r1, c0:c1] = src


class DatasetSink(Sink):
    """An open h5py.Dataset given by the caller, written in place through h5py (no journal)."""

    layout = "h5py"

    def __init__(self, dset: h5py.Dataset, label: str):
        self.dset = self.result = dset
        self.shape, self.dtype, self.label = tuple(dset.shape), dset.dtype, label

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        with H5LOCK:
            self.dset.read_direct(out, np.s_[r0:r1, c0:c1])

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        try:
            with H5LOCK:
                self.dset.write_direct(np.ascontiguousarray(src), dest_sel=np.s_[r0:r1, c0:c1])
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc

    def commit(self, tiles) -> None:
        with H5LOCK:
            self.dset.file.flush()

    def finish(self) -> None:
        self.commit([])


# ----- file outputs ---------------------------------------------------------------------------
def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_dataset(f: h5py.File, name: str, shape, dtype) -> h5py.Dataset:
    """A contiguous, unfiltered dataset with storage allocated now and never filled."""
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_layout(h5d.CONTIGUOUS)
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

    def __init__(self, spec: Spec, shape, dtype, journal: Journal, target: str,
                 reads_c: bool, threads: int = DEFAULT_THREADS):
        self.spec, self.shape, self.dtype = spec, tuple(shape), np.dtype(dtype)
        self.label, self.result = f"C ({spec})", str(spec)
        self.path = os.path.realpath(spec.path)
        self.journal, self.target, self.reads_c = journal, target, reads_c
        self.done = frozenset(journal.tiles)
        self._threads = threads
        self._fd = self._file = self._dset = self._old = self._map = self._view = None
        self._dirty: tuple[int, int] | None = None  # mapped bytes written since the last sync
        self._dirty_lock = threading.Lock()
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
            f = h5py.File(self.path, "r")
            try:
                lay = probe_layout(f[self.target])
            finally:
                f.close()
            if lay.kind == "contiguous" and not lay.swap:
                self._offset = lay.offset
                self._fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                self.layout = "contiguous"
            else:  # an existing dataset we did not create: write through h5py
                self._file = h5py.File(self.path, "r+")
                self._dset = self._file[self.target]
                self.layout = "h5py"
        if self._fd is not None:
            try:
                self._map_target()
            except BaseException:
                self._close_handles()
                raise

    def _map_target(self) -> None:
        """Reserve the dataset's bytes on disk, then map them (else leave pwritev to write)."""
        m, n = self.shape
        nbytes = m * n * self.dtype.itemsize
        if nbytes == 0 or not hasattr(os, "posix_fallocate"):
            return
        try:
            os.posix_fallocate(self._fd, self._offset, nbytes)
        except OSError as exc:
            if exc.errno in _FULL:
                raise self._full_at_creation(nbytes, exc) from exc
            if exc.errno in _NO_FALLOCATE:
                return
            raise WriteError(f"Expected to reserve {format_bytes(nbytes)} for {self.label} in "
                             f"'{self.path}'. Got {type(exc).__name__}: {exc}.") from exc
        try:
            self._map = FileMap(self._fd, self._offset, self._offset + nbytes, path=self.path,
                                writable=True)
        except (OSError, ValueError, OverflowError):  # cannot map here: pwritev instead
            return
        self._view = self._map.array(self._offset, self.shape, self.dtype)
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
            if self._view is not None:
                self._map.check()  # a page past the end of the file would raise SIGBUS
                self._view[r0:r1, c0:c1] = src
                n, w = self.shape[1], self.dtype.itemsize
                lo = self._offset + (r0 * n + c0) * w
                hi = self._offset + ((r1 - 1) * n + c1) * w
                with self._dirty_lock:
                    d = self._dirty
                    self._dirty = (lo, hi) if d is None else (min(d[0], lo), max(d[1], hi))
                return
            src = np.ascontiguousarray(src)
            if self._fd is None:
                with H5LOCK:
                    self._dset.write_direct(src, dest_sel=np.s_[r0:r1, c0:c1])
                return
            # One thread per tile: row-sized pwrites from many threads contend for the GIL,
            # and the disk, not the copy into the page cache, bounds the rate.
            n, w = self.shape[1], self.dtype.itemsize
            write_block(self._fd, self._offset + (r0 * n + c0) * w, n * w, src, 0, r1 - r0,
                        0, c1 - c0)
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc

    def _sync(self) -> None:
        try:
            if self._map is not None:
                with self._dirty_lock:
                    dirty, self._dirty = self._dirty, None
                if dirty is not None:
                    try:
                        self._map.sync(*dirty)
                    except BaseException:
                        with self._dirty_lock:  # not durable: sync it again next time
                            d = self._dirty
                            self._dirty = dirty if d is None else (min(d[0], dirty[0]),
                                                                   max(d[1], dirty[1]))
                        raise
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
        if self.reads_c and not self.journal.swap:
            self.journal.append({"swap": True})
        with H5LOCK:
            release_h5_handles(self.path)
            with h5py.File(self.path, "r+") as f:
                if self.reads_c:
                    _swap(f, self.spec.dataset, self.target)
                f[self.spec.dataset].attrs[COMPLETE_ATTR] = True
        _fsync_path(self.path)
        self.journal.remove()
        self._finished = True
        self.layout = "done"

    def _close_handles(self) -> None:
        if self._old is not None:
            self._old.close()
            self._old = None
        if self._map is not None:
            self._view = None
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._file is not None:
            with H5LOCK:
                self._file.close()
            self._file = self._dset = None

    def close(self) -> None:
        """Release everything; an unfinished output stays marked incomplete and resumable."""
        self._close_handles()
        self.journal.close()


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
