"""Changes to an HDF5 file's structure made all or nothing, whenever the process is killed.

HDF5 updates a file in place with several writes (object headers, their continuations, group
tables, heaps, the superblock); a kill between two of them leaves objects that do not open,
and the library keeps no journal. bigmm changes a file's structure only at a run's ends
(creating C or its partial dataset; swapping the partial dataset in, recording the job and
marking C complete), and does each through :class:`H5Atomic`: h5py writes into an overlay
that keeps every write in memory; on a clean close the writes go to a redo log beside the file
(synced, then renamed into place: the commit), then to the file, which is synced before the
log is removed. A log found later (a kill after its commit) is applied again first:
:func:`recover`, called before anything opens the file to write. A kill before the commit
leaves the file as it was.

The file stays locked (``flock``, as HDF5 locks it) from the overlay's open to the log's
removal, so that HDF5 readers and writers elsewhere wait, as they would for HDF5's own lock.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import hashlib
import io
import os
import struct
from typing import NamedTuple

import h5py

from ..errors import ResumeError
from .durable import fsync_dir

#: Suffix of the redo log beside an HDF5 file (one per file; the file's lock orders writers).
REDO_SUFFIX = ".bigmm-redo"
_MAGIC = b"bigmm redo 1\n"
#: the file's device and inode, the size it is cut to, its final size, the number of extents,
#: the length of the owner's path
_HEAD = struct.Struct("<QQQQQH")
_EXTENT = struct.Struct("<QQ")  # offset, length
_DIGEST = 32


def redo_path(path: str) -> str:
    return os.path.realpath(path) + REDO_SUFFIX


def open_here(path: str) -> bool:
    """Whether HDF5 in this process has the file at ``path`` open (a user's h5py.File): a change
    then goes through that open file, as HDF5 shares it, not through :class:`H5Atomic` (whose
    lock the open file's holds)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    for fid in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        try:
            other = os.stat(os.fsdecode(h5py.h5f.get_name(fid)))
        except (OSError, ValueError):
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return True
    return False


class _Overlay(io.RawIOBase):
    """A file seen through writes held in memory: sorted, disjoint extents over its bytes."""

    def __init__(self, fd: int):
        self._fd, self._pos = fd, 0
        self.size = self.low = os.fstat(fd).st_size  # low: the file's bytes kept from here on
        self._starts: list[int] = []
        self._data: list[bytearray] = []

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        start, n = self._pos, len(view)
        got = os.preadv(self._fd, [view], start) if start < self.size else 0
        valid = max(0, min(got, self.low - start))  # zeros past the end, as HDF5's own driver
        view[valid:] = bytes(n - valid)
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while i < len(self._starts) and self._starts[i] < start + n:
            s, d = self._starts[i], self._data[i]
            lo, hi = max(s, start), min(s + len(d), start + n)
            if lo < hi:
                view[lo - start:hi - start] = d[lo - s:hi - s]
            i += 1
        self._pos += n
        return n

    def write(self, buf) -> int:
        data = bytes(memoryview(buf).cast("B"))
        start, stop = self._pos, self._pos + len(data)
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        if i < len(self._starts) and self._starts[i] + len(self._data[i]) < start:
            i += 1
        j = i  # extents i..j-1 touch [start, stop]: merged into one
        merged_start, merged = start, bytearray(data)
        while j < len(self._starts) and self._starts[j] <= stop:
            s, d = self._starts[j], self._data[j]
            if s < merged_start:
                merged = d[:merged_start - s] + merged
                merged_start = s
            end = s + len(d)
            if end > merged_start + len(merged):
                merged += d[merged_start + len(merged) - s:]
            j += 1
        self._starts[i:j], self._data[i:j] = [merged_start], [merged]
        self.size = max(self.size, stop)
        self._pos = stop
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else int(size)
        i = bisect.bisect_left(self._starts, size)
        del self._starts[i:], self._data[i:]
        if self._data and self._starts[-1] + len(self._data[-1]) > size:
            self._data[-1] = self._data[-1][:size - self._starts[-1]]
        self.size, self.low = size, min(self.low, size)
        return size

    def flush(self) -> None:
        pass

    def log(self, owner: str) -> bytes:
        """The redo log of the writes held (valid while the file ``owner`` exists): header, the
        owner's path, extents, the digest of all before it."""
        st, name = os.fstat(self._fd), os.fsencode(owner)
        parts = [_MAGIC, _HEAD.pack(st.st_dev, st.st_ino, self.low, self.size,
                                    len(self._starts), len(name)), name]
        for s, d in zip(self._starts, self._data):
            parts += [_EXTENT.pack(s, len(d)), bytes(d)]
        body = b"".join(parts)
        return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()


class _Log(NamedTuple):
    dev: int
    ino: int
    low: int
    size: int
    owner: str
    extents: list


def _parse(raw: bytes, path: str) -> _Log:
    body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if (len(raw) < len(_MAGIC) + _HEAD.size + _DIGEST or not body.startswith(_MAGIC)
            or hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest):
        raise ResumeError(f"Expected a whole redo log of the changes to '{path}' committed by an "
                          f"interrupted run. Got a damaged one at '{redo_path(path)}'; the "
                          f"file may be inconsistent: restore it, or remove both and start "
                          f"over.")
    pos = len(_MAGIC)
    dev, ino, low, size, count, named = _HEAD.unpack_from(body, pos)
    pos += _HEAD.size
    owner = os.fsdecode(body[pos:pos + named])
    pos += named
    extents = []
    for _ in range(count):
        off, n = _EXTENT.unpack_from(body, pos)
        pos += _EXTENT.size
        extents.append((off, body[pos:pos + n]))
        pos += n
    return _Log(dev, ino, low, size, owner, extents)


def _apply(fd: int, log: _Log) -> None:
    if log.low < os.fstat(fd).st_size:
        os.ftruncate(fd, log.low)
    for off, data in log.extents:
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd, view, off + len(data) - len(view)):]
    os.ftruncate(fd, log.size)
    os.fsync(fd)


def _lock(fd: int) -> None:
    """HDF5's own lock on the file (raises BlockingIOError while another process holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise  # a file system without locks: HDF5 would go on without them too


def _recover_locked(fd: int, path: str) -> None:
    log = redo_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(log + ".tmp")  # never committed: the file was left as it was
    try:
        with open(log, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return
    entry, st = _parse(raw, path), os.fstat(fd)
    if (entry.dev, entry.ino) == (st.st_dev, st.st_ino) and os.path.exists(entry.owner):
        _apply(fd, entry)
    # else stale: the file was replaced, or the run that wrote the log was given up (its
    # journal removed, the output started over)
    os.unlink(log)
    fsync_dir(log)


def recover(path: str) -> None:
    """Finish the changes an interrupted process committed to the HDF5 file at ``path`` (a no-op
    when there are none)."""
    log = redo_path(path)
    if not os.path.exists(log) and not os.path.exists(log + ".tmp"):
        return
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:  # the file is gone: its logs are stale
        for stale in (log, log + ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        return
    try:
        _lock(fd)
        _recover_locked(fd, os.path.realpath(path))
    finally:
        os.close(fd)


def opener(path: str, owner: str, mode: str, **kwargs):
    """How to open ``path`` to change it (for :func:`.lock.h5_open_retry`): all or nothing
    through :class:`H5Atomic`, or with h5py in ``mode`` where HDF5 in this process has the file
    open (:func:`open_here`), which HDF5 then shares."""
    return lambda: (h5py.File(path, mode, **kwargs) if open_here(path)
                    else H5Atomic(path, owner, **kwargs))


class H5Atomic:
    """``with H5Atomic(path, owner, **h5py_options) as f``: an h5py.File on ``path`` (created
    where missing or empty) whose changes reach the file all together when the block ends
    without an exception, and not at all otherwise. ``owner`` is the file (the run's journal)
    whose removal gives the change up: a log committed by a killed run is applied by the next
    open only while its owner exists and the file is the same one. Opening raises
    BlockingIOError while another process holds the file's lock (see
    :func:`.lock.h5_open_retry`)."""

    def __init__(self, path: str, owner: str, **kwargs):
        self.path, self.owner = os.path.realpath(path), os.path.realpath(owner)
        self._new = not os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                           0o666)
        try:
            _lock(self._fd)
            _recover_locked(self._fd, self.path)
            self._overlay = _Overlay(self._fd)
            self.file = h5py.File(self._overlay, "r+" if self._overlay.size else "w", **kwargs)
        except BaseException:
            self._close(done=False)
            raise

    def __enter__(self) -> h5py.File:
        return self.file

    def __exit__(self, kind, exc, tb) -> None:
        done = False
        try:
            self.file.close()  # what HDF5 still held goes into the overlay
            if kind is None:
                self._commit()
                done = True
        finally:
            self._close(done)

    def _close(self, done: bool) -> None:
        """Unlock; a file this change created and left empty goes (while still locked)."""
        try:
            if not done and self._new and os.fstat(self._fd).st_size == 0:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(self._fd)

    def _commit(self) -> None:
        log = redo_path(self.path)
        fd = os.open(log + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                     | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            view = memoryview(self._overlay.log(self.owner))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(log + ".tmp", log)  # the commit
        fsync_dir(log)
        _recover_locked(self._fd, self.path)
