"""Tile writes that bypass the page cache: ``O_DIRECT`` writes of an output's reserved storage.

A C tile of an output chunked by the plan's tiles is one sequential byte range of the file; so
is every row piece of it that the writer's threads write at once. Written through the page
cache (copies into a shared map, or ``pwrite``), those bytes are first copied into cached
pages, then written back by the kernel's flusher, and ``msync``/``fdatasync`` waits for that
write-back before the tile may be journaled. Measured on a 2-core VM's disk (ext4, 4 GiB in
512 MiB tiles, 4 threads, a sync every 0.5 s, cold cache; the machine is shared, so each
figure is the spread of repeated runs): copies into a map 0.35-0.71 GB/s (12 CPU-s), the same
with the write-back started after each copy (``sync_file_range``) 0.57-0.82, ``pwrite``
0.70-1.09, ``O_DIRECT`` 2.0-2.9 GB/s (1.7-2.7 CPU-s), 1.8-2.0 GB/s through an aligned bounce
buffer. Through the output layer (a 32768^2 float32 C chunked by 32768 x 4096 tiles from a
page-aligned buffer, a commit per tile, three alternating rounds): 2.43-2.72 GB/s and
0.12-0.14 CPU-s direct, against 0.28-0.46 GB/s and 7.0-8.8 CPU-s for the copies into a map
of the previous writer. :class:`DirectWrites` therefore writes each long sequential run of a
tile with ``O_DIRECT``: the page-aligned middle straight from the tile's buffer when its
address is aligned with the file offset (the GPU's pinned buffers, page-aligned, into chunks
that the output layer aligns to pages), else through a small aligned bounce buffer (also where
the kernel cannot use the source in place: EFAULT); the partial pages at either end go through
the page cache by ``pwrite``, and so do pieces whose runs are shorter than ``DIRECT_MIN``
bytes (copied into a shared map where the sink has one). A direct write has reached the device
when it returns; :meth:`DirectWrites.sync` is one ``fdatasync``, which commits the file system's
metadata (reserved extents becoming written) and flushes the device's write cache, so a tile
journaled after it is durable, as before.

Direct writes are used only where the storage is reserved (``posix_fallocate``: no write can
meet a full disk halfway) and the file system is backed by a device: on memory file systems
(tmpfs, ramfs) there is no device to bypass the cache for, and copies into a shared map let
several processes write one file at once. Where ``O_DIRECT`` cannot be opened, or a direct
write is refused for its alignment (EINVAL: a device with larger blocks), the writes go through
the page cache instead (the latter from then on), with the same durability.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

import numpy as np

from . import hostcopy
from .mapped import MappedWrites, libc_function, start_writeback  # noqa: F401

#: File offsets, lengths and buffer addresses of direct writes are multiples of this (the
#: largest logical block size in common use, and the page size).
ALIGN = 4096
#: Runs shorter than this go through the page cache (a direct write pays a device round trip).
DIRECT_MIN = 256 << 10
#: An unaligned source is written through an aligned buffer of this many bytes per call.
BOUNCE_BYTES = 1 << 20
#: statfs ``f_type`` of file systems held in memory (tmpfs, ramfs, hugetlbfs).
MEMORY_FS = {0x01021994, 0x858458F6, 0x958458F6}

_fdatasync = getattr(os, "fdatasync", os.fsync)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_C_FSTATFS = libc_function("fstatfs", [ctypes.c_int, ctypes.c_void_p])


def in_memory(fd: int) -> bool:
    """True when the file open as ``fd`` lies on a memory file system (tmpfs, ramfs)."""
    if _C_FSTATFS is None:  # pragma: no cover
        return False
    buf = (ctypes.c_long * 32)()  # struct statfs (120 bytes on 64-bit Linux), f_type first
    if _C_FSTATFS(fd, buf) != 0:
        return False
    return (buf[0] & 0xFFFFFFFF) in MEMORY_FS


def open_direct(path: str) -> int:
    """A write-only ``O_DIRECT`` descriptor of ``path``; OSError where the file system refuses
    it (or the platform has no ``O_DIRECT``)."""
    if not _O_DIRECT:
        raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
    return os.open(path, os.O_WRONLY | _O_DIRECT | getattr(os, "O_CLOEXEC", 0))


def supports_direct(folder: str) -> bool:
    """True when a file in ``folder`` takes an aligned ``O_DIRECT`` write (tried on a
    temporary file, removed again)."""
    path = os.path.join(folder, f".bigmm-direct-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    try:
        dfd = open_direct(path)
        try:
            buf = mmap.mmap(-1, ALIGN)
            return os.pwrite(dfd, buf, 0) == ALIGN
        finally:
            os.close(dfd)
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(path)


def _whole_rows(piece, src: np.ndarray) -> bool:
    """True when the piece spans its stored block's full width and the source's: its rows
    are one sequential byte range in the file and in memory."""
    _, (_, bc), (_, _, ca, cb), (_, _, c, d) = piece
    return ca == 0 and cb == bc and d - c == src.shape[1]


def run_bytes(piece, src: np.ndarray, itemsize: int) -> int:
    """The length of the sequential runs :func:`runs` cuts the piece into."""
    _, _, (ra, rb, ca, cb), _ = piece
    return (cb - ca) * itemsize * ((rb - ra) if _whole_rows(piece, src) else 1)


def runs(piece, src: np.ndarray, itemsize: int):
    """The sequential byte runs of one stored piece (:func:`.region.clip_pieces`) of the
    C-contiguous ``src``, as (file offset, uint8 view of the source bytes): a piece that spans
    its stored block's full width (and the source's) is one run, else each of its rows."""
    base, (_, bc), (ra, rb, ca, cb), (a, b, c, d) = piece
    if _whole_rows(piece, src):
        return [(base + ra * bc * itemsize, src[a:b].reshape(-1).view(np.uint8))]
    return [(base + ((ra + i) * bc + ca) * itemsize, src[a + i, c:d].view(np.uint8))
            for i in range(b - a)]


def _pwrite_all(fd: int, view, offset: int) -> None:
    """Write all of ``view`` at ``offset``; a write that makes no progress is an OSError."""
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"write of {len(view) - done} bytes at {offset + done} "
                          f"made no progress")
        done += n


def _write_direct(fd: int, view, offset: int) -> None:
    """One run's aligned middle, written on the ``O_DIRECT`` descriptor."""
    _pwrite_all(fd, view, offset)


class DirectWrites:
    """Writes of stored pieces into reserved storage of the file open as ``fd`` (read-write):
    runs of at least ``DIRECT_MIN`` bytes with ``O_DIRECT`` (see the module docstring), their
    partial end pages with ``pwrite`` on ``fd``, pieces of shorter runs through ``cached`` (a
    :class:`.MappedWrites` of the output: one copy for all the piece's rows) or ``pwrite``.
    Several threads may write disjoint pieces at once. Raises OSError where ``O_DIRECT``
    cannot be opened."""

    kind = "direct"

    def __init__(self, fd: int, path: str, dtype, cached: MappedWrites | None = None):
        self.fd, self.path, self.dtype, self.cached = fd, path, np.dtype(dtype), cached
        self.dfd = open_direct(path)
        self.direct = True  # False once a direct write was refused for its alignment
        self.zero_copy = True  # False once the kernel could not use a source in place
        self._dirty = False
        self._lock = threading.Lock()
        #: Bytes written with O_DIRECT from the source, through the bounce buffer, cached.
        self.bytes = {"direct": 0, "bounced": 0, "cached": 0}

    def write(self, pieces, src: np.ndarray) -> None:
        """Write ``src`` to ``pieces``; on return the direct runs have reached the device and
        the rest is in the page cache (:meth:`sync` makes it all durable)."""
        src = np.ascontiguousarray(src)
        w = self.dtype.itemsize
        bounce = None
        try:
            for piece in pieces:
                if self.cached is not None and (run_bytes(piece, src, w) < DIRECT_MIN
                                                or not self.direct):
                    self.cached.write([piece], src)
                    (a, b, c, d) = piece[3]
                    self._count("cached", (b - a) * (d - c) * w)
                    continue
                for offset, view in runs(piece, src, w):
                    bounce = self._run(offset, view, bounce)
        finally:
            with self._lock:
                self._dirty = True
            if bounce is not None:
                try:
                    bounce.close()
                except BufferError:  # a failed write's frame still holds a view of it
                    pass

    def _run(self, offset: int, view: np.ndarray, bounce):
        """Write one run: its aligned middle direct, its partial end pages cached."""
        n = len(view)
        head = -offset % ALIGN
        mid = (n - head) // ALIGN * ALIGN if n > head else 0
        if not self.direct or mid == 0 or mid < DIRECT_MIN:
            self._pwrite(offset, view)
            return bounce
        if head:
            self._pwrite(offset, view[:head])
        body = view[head:head + mid]
        try:
            if self.zero_copy and body.ctypes.data % ALIGN == 0:
                try:
                    _write_direct(self.dfd, body, offset + head)
                    self._count("direct", mid)
                    return self._tail(offset, view, head + mid, bounce)
                except OSError as exc:
                    if exc.errno != errno.EFAULT:
                        raise
                    self.zero_copy = False  # memory the kernel cannot pin for I/O: bounce
            bounce = bounce or mmap.mmap(-1, BOUNCE_BYTES)
            self._bounced(offset + head, body, bounce)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.direct = False  # alignment refused here: through the page cache from now on
            self._pwrite(offset + head, body)
        return self._tail(offset, view, head + mid, bounce)

    def _tail(self, offset: int, view: np.ndarray, done: int, bounce):
        if done < len(view):
            self._pwrite(offset + done, view[done:])
        return bounce

    def _bounced(self, offset: int, body: np.ndarray, bounce) -> None:
        buf = np.frombuffer(bounce, np.uint8)
        for k in range(0, len(body), len(buf)):
            part = body[k:k + len(buf)]
            hostcopy.copy(buf[:len(part)], part)
            _write_direct(self.dfd, memoryview(bounce)[:len(part)], offset + k)
        del buf
        self._count("bounced", len(body))

    def _pwrite(self, offset: int, view: np.ndarray) -> None:
        _pwrite_all(self.fd, view, offset)
        self._count("cached", len(view))

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self.bytes[key] += n

    def sync(self) -> None:
        """Make everything written so far durable: the mapped writes' ``msync``, then one
        ``fdatasync`` (the pwrites, the direct writes' extents, the device's write cache).
        OSError on failure (the next sync tries again)."""
        if self.cached is not None:
            self.cached.sync()
        with self._lock:
            dirty, self._dirty = self._dirty, False
        if not dirty:
            return
        try:
            _fdatasync(self.fd)
        except BaseException:
            with self._lock:
                self._dirty = True
            raise

    def close(self) -> None:
        if self.dfd is not None:
            os.close(self.dfd)
            self.dfd = None


#: How reserved outputs are written: "auto" (direct where the file system is backed by a
#: device and opens ``O_DIRECT``, else mapped), "direct" (wherever ``O_DIRECT`` opens) or
#: "mapped" (copies into a shared map). Benchmarks and tests set it to compare the paths.
MODE = "auto"
MODES = ("auto", "direct", "mapped")


def wants_direct(fd: int) -> bool:
    """Whether writes to the file open as ``fd`` are to try ``O_DIRECT`` (see :data:`MODE`)."""
    if MODE not in MODES:
        raise ValueError(f"Expected MODE in {MODES}. Got {MODE!r}.")
    return MODE == "direct" or (MODE == "auto" and not in_memory(fd))


def tile_writes(fd: int, path: str, fmap, dtype):
    """The writer of a reserved output's tiles (see :data:`MODE`): a :class:`DirectWrites`
    (short runs through ``fmap`` where it is given), else a :class:`.MappedWrites` of ``fmap``,
    else None (the caller writes with ``pwritev``)."""
    direct = wants_direct(fd)
    cached = MappedWrites(fmap, dtype) if fmap is not None else None
    if direct:
        try:
            return DirectWrites(fd, path, dtype, cached)
        except OSError:  # the file system refuses O_DIRECT: through the page cache
            pass
    return cached
