"""Memory-mapped byte ranges of files: read-only for inputs, shared and writable for outputs.

A :class:`FileMap` maps bytes ``[start, stop)`` of an open file once (from the page boundary at
or before ``start``) and hands out NumPy views at file byte offsets. Copies between those views
and ordinary arrays are plain NumPy assignments, which release the GIL for float dtypes
(measured: a pure-Python counting thread kept 35-96% of its rate alone while another thread
copied 4096 x 640 float32 panels out of a mapped file, native or byte-swapped, against 3% while
it copied by slicing the ``mmap`` object, which holds the GIL), so reader threads copy in
parallel and the cost follows the bytes copied, not the span of the rows they lie in (a
640-wide panel of an 8192-wide row-major dataset: 0.04-0.05 CPU-s per 256 MiB dataset pass,
against 0.30-0.51 for ``preadv`` reading the gaps between rows into scratch).

Touching a mapped page past the end of the file raises SIGBUS, which kills the process. Callers
therefore check the file still covers the mapped range (:meth:`FileMap.check`, one ``fstat``)
before every access, and outputs reserve their blocks with ``posix_fallocate`` before mapping
them, so a page fault never needs a block the file system cannot give. (A file cut short by
another process between the check and the copy can still raise SIGBUS; nothing short of a
signal handler closes that window.)

:meth:`FileMap.sync` is ``msync(MS_SYNC)`` on the page-aligned range, called through libc so
that the GIL is released while the pages are written (``mmap.flush`` holds it: measured, the
counting thread dropped to 13% of its rate during ``mmap.flush`` of 128 MiB of dirty pages,
and kept 100% during the same ``msync`` through ctypes).

Resident memory: every mapped page a process touches counts in its RSS until it is unmapped,
so copies through a map would leave the whole file in RSS by the end of a run (page cache the
kernel can reclaim, but RSS-based limits see it). :meth:`FileMap.copy` therefore copies in
blocks spanning at most its ``step`` of the file (``STEP_BYTES`` by default) and releases the
pages behind each block with ``madvise(MADV_DONTNEED)``, so a copying thread holds at most
``held_bytes`` mapped (``HELD_BYTES`` with the default step): one block
and the ``FAULT_GRAIN`` window at either end (one read fault maps a whole aligned window or
large folio around the byte it touches). For a shared file mapping this only removes the
page-table entries: the pages stay in the page cache, a dirty page-table entry marks its page
dirty as it goes, and ``msync(MS_SYNC)`` still writes the file range whatever is mapped (Linux
runs ``vfs_fsync_range`` over the range's file offsets, as ``fdatasync`` does, for every shared
file mapping in the range), so written tiles are durable when :meth:`FileMap.sync` returns.
Readahead fills the page cache, not the process's RSS, and is left to the kernel: asking for a
dense view's pages at once (``posix_fadvise(WILLNEED)`` before each copy) changed nothing on
the H100 host's disk (read-ahead 8 MiB; cold column panels of a 32768^2 float32 matrix in
4096^2 chunks, 1.57 GB/s with it, 1.58 without), so reads do not ask. Writes through a map
start the write-back of what they copied (:func:`start_writeback`) rather than leave it to
the flusher.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from . import hostcopy

PAGE = mmap.ALLOCATIONGRANULARITY
_MS_SYNC = getattr(mmap, "MS_SYNC", 4)
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _pmd_size() -> int:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


#: The most one page fault maps, aligned: a PMD. A read fault maps the cached pages of an
#: aligned window around it (fault_around_bytes, 64 KiB by default), or a whole PMD-sized
#: folio with one entry where the file system caches the file in large folios (measured:
#: touching one byte of a mapped ext4 file mapped 2 MiB on Linux 6.18). A dropped range is
#: widened to this grain, so that no page a copy mapped stays behind.
FAULT_GRAIN = _pmd_size()
#: The most file bytes one block of :meth:`FileMap.copy` spans, by default. Each block costs a
#: ``madvise`` call and the faults that map its pages again; measured on a 2-core VM, copying
#: 4096 x 640 panels out of an 8192-wide float32 matrix (blocks span 12.8 times the bytes they
#: copy), one thread: 40 ms per 256 MiB pass keeping the pages mapped, 69 ms with 2 MiB blocks,
#: 58 with 4 MiB, 56 with 8 MiB (about 8 ms of it the faults, whatever the block). The
#: ``madvise`` also flushes the TLB of every CPU the process's threads run on, which costs more
#: with many copying threads and a busy process: see ``WIDE_STEP_BYTES``.
STEP_BYTES = 4 << 20
#: Blocks for processes that read with many threads beside many others (a GPU worker: CUDA's
#: threads, dask's): fewer ``madvise`` calls, for up to 64 MiB more of the file in RSS per
#: copying thread. Measured on a 32-core host (2 x H200), 2048 x 4096 panels of a 32768-wide
#: float32 matrix in the page cache, 8 copying threads: 15 GB/s with 4 MiB blocks, 28 GB/s with
#: 64 MiB, 29 GB/s keeping the pages mapped (1024-wide panels: 4.4, 17 and 20 GB/s); the tile
#: tasks of a two-GPU dask job (4 GiB read each) read in 0.57 s instead of 0.71 s.
WIDE_STEP_BYTES = 64 << 20
#: The most file bytes one thread copying through a map holds mapped at once (default blocks).
HELD_BYTES = STEP_BYTES + 2 * FAULT_GRAIN


def libc_function(name: str, argtypes: list, restype=ctypes.c_int):
    """libc's ``name`` through ctypes (errno kept), or None where libc or it is missing."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # pragma: no cover
        return None
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_C_MSYNC = libc_function("msync", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
_C_MADVISE = libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
_C_FALLOCATE = libc_function("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                           ctypes.c_int64])
#: sync_file_range(2): start write-back of dirty pages in a range, without waiting for it.
_C_SYNC_FILE_RANGE = libc_function("sync_file_range", [ctypes.c_int, ctypes.c_int64,
                                                       ctypes.c_int64, ctypes.c_uint])
_SYNC_FILE_RANGE_WRITE = 2
#: fallocate(2) mode giving blocks back without changing the file's size.
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


def start_writeback(fd: int, lo: int, hi: int) -> None:
    """Start writing the file's dirty pages in bytes [lo, hi) back to disk, without waiting
    for them (best effort: the sync before the journal waits for them and reports errors).
    Measured on a 2-core VM's disk (4 GiB of 512 MiB tiles copied into a shared map, an
    ``msync`` every 0.5 s): 0.57-0.82 GB/s with it after every copy, 0.35-0.71 without."""
    if _C_SYNC_FILE_RANGE is not None and hi > lo:
        _C_SYNC_FILE_RANGE(fd, lo, hi - lo, _SYNC_FILE_RANGE_WRITE)


#: What ``posix_fallocate`` (or an ``O_DIRECT`` open) raises where the file system does not
#: support it: write another way.
NO_FALLOCATE = {errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
                getattr(errno, "ENOSYS", errno.EOPNOTSUPP)}


def reserve(fd: int, start: int, length: int, *, release=()) -> None:
    """``posix_fallocate`` bytes ``[start, start + length)`` of the file open as ``fd``.

    Raises OSError(ENOSPC) without trying when the file system reports less free space than
    the blocks the file still lacks. A failed ``posix_fallocate`` keeps the blocks it did get
    on some file systems (measured on ext4: a 16 MiB request on a 6 MiB file system left it
    with 0 bytes free): the byte ranges ``(lo, hi)`` in ``release`` (data that holds nothing
    to keep, never file metadata) are then given back by punching holes before the error.
    """
    try:
        os.posix_fallocate(fd, start, 1)  # not supported here: that error, before any check
        st, fs = os.fstat(fd), os.fstatvfs(fd)
        if fs.f_blocks and fs.f_bavail * fs.f_frsize < length - min(length, st.st_blocks * 512):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno == errno.ENOSPC and _C_FALLOCATE is not None:
            for lo, hi in release:  # best effort
                _C_FALLOCATE(fd, _PUNCH_HOLE, lo, hi - lo)
        raise


def _bounds(view: np.ndarray) -> tuple[int, int]:
    """The addresses [lo, hi) of the bytes a non-empty view with non-negative strides spans."""
    lo = view.ctypes.data
    return lo, lo + sum((k - 1) * s for k, s in zip(view.shape, view.strides)) + view.itemsize


class FileShortError(OSError):
    """The file no longer covers the mapped range (it was truncated)."""


class FileMap:
    """Bytes ``[start, stop)`` of the file open as ``fd``, mapped shared (read-only unless
    ``writable``); :meth:`copy` works in blocks spanning at most ``step`` bytes of the file.
    Raises OSError or ValueError where the file cannot be mapped."""

    def __init__(self, fd: int, start: int, stop: int, *, path: str, writable: bool = False,
                 step: int = STEP_BYTES):
        if not 0 <= start < stop:
            raise ValueError(f"cannot map bytes {start}:{stop}")
        if step < PAGE:
            raise ValueError(f"Expected a block of at least {PAGE} bytes. Got step={step}.")
        self.fd, self.path, self.start, self.stop = fd, path, start, stop
        self.step = step
        #: The most file bytes one thread copying through this map holds mapped at once.
        self.held_bytes = step + 2 * FAULT_GRAIN
        self.base = start - start % PAGE
        self.check()
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self._mm = mmap.mmap(fd, stop - self.base, flags=mmap.MAP_SHARED, prot=prot,
                             offset=self.base)
        self._bytes = np.frombuffer(self._mm, np.uint8)
        self._addr = self._bytes.ctypes.data
        self.writable = writable
        #: The address spans of the copies in progress, widened to FAULT_GRAIN: no copy
        #: releases pages in another's span (the last copy out releases what they share).
        self._spans: dict[int, tuple[int, int]] = {}
        self._left: list[tuple[int, int]] = []  # windows a copy left mapped for another
        self._spans_lock = threading.Lock()

    def check(self) -> None:
        """Raise FileShortError unless the file still reaches the end of the mapped range."""
        size = os.fstat(self.fd).st_size
        if size < self.stop:
            raise FileShortError(
                errno.EIO, f"file '{self.path}' is {size} bytes long, shorter than the "
                f"{self.stop} bytes its dataset needs (truncated?)")

    def array(self, offset: int, shape: tuple, dtype) -> np.ndarray:
        """A view of the C-ordered array of ``shape`` and ``dtype`` stored at byte ``offset``."""
        dtype = np.dtype(dtype)
        k = offset - self.base
        size = int(np.prod(shape)) * dtype.itemsize
        if offset < self.start or offset + size > self.stop:
            raise ValueError(f"bytes {offset}:{offset + size} lie outside the mapped range "
                             f"{self.start}:{self.stop}")
        return self._bytes[k:k + size].view(dtype).reshape(shape)

    def sync(self, lo: int, hi: int) -> None:
        """Write the file bytes ``[lo, hi)`` (widened to pages) to disk; OSError on failure."""
        lo, hi = max(lo, self.base), min(hi, self.stop)
        if hi <= lo:
            return
        a = lo - (lo - self.base) % PAGE - self.base
        b = hi - self.base
        if _C_MSYNC is None:  # pragma: no cover
            self._mm.flush(a, b - a)
            return
        if _C_MSYNC(ctypes.c_void_p(self._addr + a), b - a, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def copy(self, dest: np.ndarray, src: np.ndarray, view: np.ndarray) -> None:
        """``dest[...] = src`` for 2-D arrays, where ``view`` (``dest`` or ``src``, non-negative
        strides) lies in this map: in blocks of rows (of columns, where one row spans more)
        spanning at most ``step`` bytes of the file, in address order. After each block the
        ``FAULT_GRAIN`` windows it has left behind are dropped (the window it ends in stays
        mapped for the next block, which would fault it in again), at the end the rest.
        Pages within the span of another copy in progress on this map (a neighbouring piece
        of the same rows or chunk, on another thread) are left to the last of them to drop,
        so that no copy drops pages another is copying from."""
        m, n = view.shape
        if m == 0 or n == 0:
            return
        s0, s1 = view.strides
        rows = max(1, self.step // max(1, s0))
        cols = n if n * s1 <= self.step else max(1, self.step // s1)
        lo, hi = _bounds(view)
        done = lo - lo % FAULT_GRAIN  # the mapped pages below this address were dropped
        top = hi + (-hi) % FAULT_GRAIN  # the end of the window the copy ends in
        key = id(view)  # (the view lives as long as the copy)
        with self._spans_lock:
            self._spans[key] = (done, top)
        kept: list[tuple[int, int]] = []  # windows left mapped for a neighbouring copy
        try:
            for a in range(0, m, rows):
                b = min(a + rows, m)
                for c in range(0, n, cols):
                    d = min(c + cols, n)
                    hostcopy.copy(dest[a:b, c:d], src[a:b, c:d])
                    end = lo + (b - 1) * s0 + (d - 1) * s1 + view.itemsize  # past this block
                    end -= end % FAULT_GRAIN
                    if end > done:
                        kept += self._release(key, [(done, end)])
                        done = end
        finally:
            kept.append((done, top))
            with self._spans_lock:  # at once, with what earlier copies left: the last copy
                del self._spans[key]  # out releases what the copies shared
                self._left = self._release(None, kept + self._left)

    def _release(self, key, ranges) -> list[tuple[int, int]]:
        """Drop the address ranges, less the spans of the copies in progress other than
        ``key``'s (with ``key`` None: holding the lock, every copy in progress); returns
        what was left mapped."""
        if key is None:
            spans = list(self._spans.values())
        else:
            with self._spans_lock:
                spans = [v for k, v in self._spans.items() if k != key]
        kept = []
        for lo, hi in ranges:
            for a, b in sorted(spans):
                if b <= lo or a >= hi:
                    continue
                if a > lo:
                    self._drop(lo, a)
                kept.append((max(lo, a), min(hi, b)))
                lo = max(lo, b)
                if lo >= hi:
                    break
            if lo < hi:
                self._drop(lo, hi)
        return kept

    def _drop(self, lo: int, hi: int) -> None:
        """Release the mapped pages at addresses [lo, hi) (clipped to the map): they leave the
        process's RSS and stay in the page cache, dirty ones too (still written by
        :meth:`sync`). Best effort: a failure leaves the pages mapped."""
        lo, hi = max(lo, self._addr), min(hi, self._addr + len(self._bytes))
        if hi <= lo:
            return
        if _C_MADVISE is not None:  # through libc: the GIL is released during the call
            _C_MADVISE(ctypes.c_void_p(lo), hi - lo, _MADV_DONTNEED)
        elif hasattr(self._mm, "madvise"):  # pragma: no cover
            try:
                self._mm.madvise(_MADV_DONTNEED, lo - self._addr, hi - lo)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Unmap (deferred to the garbage collector while views are still in use)."""
        self._bytes = None
        try:
            self._mm.close()
        except BufferError:  # a view outlives us; the mapping goes with its last view
            pass


def _maps_kept() -> int:
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):  # pragma: no cover
        soft = 1024
    return 256 if soft == resource.RLIM_INFINITY else max(4, min(256, soft // 8))


#: The most maps (each with its open file) one :class:`FileMaps` keeps: an eighth of the
#: process's open-file limit, at most 256.
MAPS_KEPT = _maps_kept()


class FileMaps:
    """Read-only maps of whole files of ``size`` bytes by path, kept for reuse: at most
    ``limit``, the least recently used closed first, never one in use. ``mmap`` and
    ``munmap`` take the process's address-space lock for writing, and ``munmap`` flushes the
    TLB of every CPU the process's threads ran on, so readers that copy pieces of the same
    files again and again keep their maps, as a contiguous HDF5 input keeps the map of its
    file. Thread-safe."""

    def __init__(self, size: int, *, step: int = STEP_BYTES, limit: int = MAPS_KEPT):
        self.size, self.step, self.limit = size, step, max(1, limit)
        self._maps: OrderedDict[str, list] = OrderedDict()  # path -> [FileMap, users]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._maps)

    @contextmanager
    def use(self, path: str) -> Iterator[FileMap | None]:
        """The map of the file at ``path``, checked to still cover its size (None where the
        file does not exist; OSError where it holds other than ``size`` bytes)."""
        with self._lock:
            entry = self._maps.get(path)
            if entry is not None:
                self._maps.move_to_end(path)
                entry[1] += 1
        if entry is None:
            fmap = self._open(path)
            if fmap is None:
                yield None
                return
            with self._lock:
                entry = self._maps.get(path)
                if entry is None:
                    entry = self._maps[path] = [fmap, 1]
                    fmap = None
                else:  # another thread mapped it meanwhile
                    entry[1] += 1
            if fmap is not None:
                _close_map(fmap)
        try:
            entry[0].check()
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1
                spare = self._spare()
            for fmap in spare:
                _close_map(fmap)

    def _open(self, path: str) -> FileMap | None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size != self.size:
                raise OSError(f"file '{path}' holds {size} bytes; expected {self.size}")
            return FileMap(fd, 0, self.size, path=path, step=self.step)
        except BaseException:
            os.close(fd)
            raise

    def _spare(self) -> list:
        """Remove the least recently used maps not in use beyond the limit (holding the lock);
        returns them for closing."""
        spare = []
        if len(self._maps) > self.limit:
            for path in [p for p, (_m, users) in self._maps.items() if users == 0]:
                if len(self._maps) <= self.limit:
                    break
                spare.append(self._maps.pop(path)[0])
        return spare

    def close(self) -> None:
        """Close every map (none may be in use)."""
        with self._lock:
            maps, self._maps = [m for m, _u in self._maps.values()], OrderedDict()
        for fmap in maps:
            _close_map(fmap)


def _close_map(fmap: FileMap) -> None:
    fmap.close()
    os.close(fmap.fd)


class MappedWrites:
    """Writes of stored pieces (:func:`.region.clip_pieces`) through a shared writable
    :class:`.FileMap`, and their ``msync``: the byte ranges written since the last sync are
    kept merged where they touch. Writes of disjoint pieces may come from several threads.
    Each copy starts the write-back of the pages it dirtied (:func:`start_writeback`)."""

    kind = "mapped"

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
        for lo, hi in ranges:  # the flusher would start late and write the pages out of order
            start_writeback(self.map.fd, lo, hi)
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

    def close(self) -> None:
        """Nothing to release: the map belongs to the sink that made it."""
