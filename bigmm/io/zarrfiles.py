"""The file mechanics of Zarr outputs: chunk files written whole into temporary files and
published durably (:class:`ChunkFiles`), metadata rewritten atomically and durably, directories
removed and swapped (idempotently). Used by :mod:`.zarrsink`; no zarr-python here."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import OutputNotWritable, ReadError
from . import direct
from .durable import fsync_dir, fsync_path
from .layout import chunk_cells
from .mapped import NO_FALLOCATE, reserve, start_writeback
from .rawio import write_block
from .zarrmeta import META, read_meta
from .zarrsource import TMP_SUFFIX

#: Suffix of the original array's directory while a partial array replaces it.
OLD_SUFFIX = ".bigmm-old"
#: The file :func:`swap` puts in a directory before moving it aside: only one so marked is
#: bigmm's to remove.
SET_ASIDE = ".bigmm-set-aside"
#: zarr-python writes a file through a temporary beside it, ``<stem>.<32 hex digits>.partial``
#: (left behind where the process is killed mid-write); of a node's metadata, its stem "zarr".
ZARR_TEMP = re.compile(r"[^.]*\.[0-9a-f]{32}\.partial")
ZARR_META_TEMP = re.compile(r"zarr\.[0-9a-f]{32}\.partial")
#: Chunk files made durable at once by a commit.
SYNC_THREADS = 8
#: Finished chunks kept open (not yet durable) before a commit makes them durable anyway.
MAX_READY = 256
#: Chunk files written with ``O_DIRECT`` wherever :func:`.direct.wants_direct` (a device's file
#: system), as HDF5 outputs are; False: through the page cache, the write-back started at once,
#: unless ``direct.MODE`` is "direct" (cached writes ran Zarr jobs sooner, cold and warm:
#: BENCHMARKS.md).
DIRECT_WRITES = False
#: Chunk files an output makes ahead of its writers, on a thread of its own, in the order
#: the writers have been asking for chunks (row-major, or column-major where the last two
#: were one above the other): making one (create, size or reserve, open) takes
#: milliseconds, which the writers of a tile would otherwise wait for.
AHEAD = 2


# ----- files and directories ------------------------------------------------------------------

def write_json(path: str, value: dict) -> None:
    """Replace the file at ``path`` with ``value`` as JSON, atomically and durably."""
    tmp = path + TMP_SUFFIX
    data = json.dumps(value, indent=2).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path)


def write_attributes(folder: str, values: dict) -> None:
    """Set attributes of the Zarr v3 array in ``folder`` (its ``zarr.json`` rewritten
    atomically and durably; everything else in it kept)."""
    meta = read_meta(folder)
    if meta is None:
        raise ReadError(f"Expected a Zarr array's metadata in '{folder}'. Got none.")
    meta["attributes"] = dict(meta.get("attributes") or {}, **values)
    write_json(os.path.join(folder, META), meta)


def remove_tree(folder: str) -> None:
    """Remove a directory and what it holds, durably (its parent is synced)."""
    if os.path.lexists(folder):
        shutil.rmtree(folder)
        fsync_dir(folder)


def swap(name: str, partial: str) -> None:
    """Put the directory ``partial`` in the place of ``name`` (idempotent: safe to repeat after
    a crash at any point): ``name`` is marked and moves aside to ``name + OLD_SUFFIX``,
    ``partial`` moves in, the old one is removed."""
    old = name + OLD_SUFFIX
    if os.path.isdir(partial):
        if os.path.isdir(name):
            remove_set_aside(old)
            with open(os.path.join(name, SET_ASIDE), "wb"):
                pass
            fsync_dir(os.path.join(name, SET_ASIDE))  # the mark before the move
            os.rename(name, old)
        os.rename(partial, name)
        fsync_dir(name)
    remove_set_aside(old)


def remove_set_aside(old: str) -> None:
    """Remove the directory :func:`swap` set aside at ``old``, and nothing else: what lies
    there without its mark is the user's (OutputNotWritable)."""
    if not os.path.lexists(old):
        return
    if os.path.islink(old) or not os.path.isfile(os.path.join(old, SET_ASIDE)):
        raise OutputNotWritable(f"Expected nothing at '{old}' but old C that a run of bigmm set "
                                f"aside there. Got something it did not leave: rename it, or "
                                f"write C elsewhere.")
    remove_tree(old)


# ----- chunk files --------------------------------------------------------------------------------

class _Chunk:
    __slots__ = ("fd", "tmp", "final", "left", "direct")

    def __init__(self, fd, tmp, final, left, writes=None):
        self.fd, self.tmp, self.final, self.left = fd, tmp, final, left
        self.direct = writes  # a direct.DirectWrites of the file, or None: through the cache


class ChunkFiles:
    """Whole chunks of an uncompressed Zarr array written from any thread: each chunk is
    written into a temporary file beside its place at the byte offsets of its rows, and
    :meth:`publish` makes the finished ones durable and renames them into place. Every element
    of a chunk is written once (a region cut across chunks writes its part of each); a chunk
    is finished once all of its elements are written.

    A chunk file is written through the page cache, its write-back started as each run of
    rows lands (:data:`DIRECT_WRITES`); with ``O_DIRECT`` where :data:`.direct.MODE` is
    "direct": its storage then reserved at once and its long sequential runs (a whole chunk
    when a tile is a chunk) written direct (:class:`.direct.DirectWrites`), short runs
    through the cache. Either way :meth:`publish` ``fsync``\\ s a chunk before it is renamed
    into place.

    With ``ahead`` (the whole output's files, not a region's), the next ``ahead`` chunk files
    are made on a thread of their own (:data:`AHEAD`); those never written are dropped by
    :meth:`close` like any unfinished chunk."""

    def __init__(self, folder: str, shape, chunks, stored: np.dtype, key, ahead: int = 0):
        self.folder, self.shape, self.chunks = folder, tuple(shape), tuple(chunks)
        self.stored, self.key = np.dtype(stored), key
        self.chunk_bytes = self.chunks[0] * self.chunks[1] * self.stored.itemsize
        self.grid = tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))
        self._open: dict[tuple, _Chunk] = {}
        self._creating: dict[tuple, threading.Event] = {}  # chunk files being made
        self._ahead = ahead
        self._early: set[tuple] = set()  # made ahead, not yet asked for
        self._finished: set[tuple] = set()
        self._last: tuple | None = None  # the last chunk a writer asked for first
        self._maker: ThreadPoolExecutor | None = None
        self._closed = False
        self._ready: list[_Chunk] = []
        self._made: set[str] = set()  # chunk directories known to exist
        self._new_dirs: set[str] = set()  # directories whose entries are not yet durable
        self._lock = threading.Lock()
        self._direct: bool | None = None  # decided with the first chunk file
        #: Bytes written with O_DIRECT (from the source or bounced) and through the cache.
        self.bytes = {"direct": 0, "bounced": 0, "cached": 0}

    @property
    def unfinished(self) -> int:
        return len(self._open)

    @property
    def writes(self) -> str:
        """How chunk files are written: "direct" or "cached" (see the class docstring)."""
        return "direct" if self._direct else "cached"

    def write(self, r0, r1, c0, c1, src) -> None:
        """Write ``src`` (rows r0:r1, columns c0:c1 of the array) into its chunks."""
        src = np.ascontiguousarray(src, dtype=self.stored)
        cr, cc = self.chunks
        w = self.stored.itemsize
        for ci, cj, a0, a1, b0, b1 in chunk_cells(self.chunks, r0, r1, c0, c1):
            chunk = self._chunk(ci, cj)
            ra, ca = a0 - ci * cr, b0 - cj * cc
            if chunk.direct is not None:
                chunk.direct.write([(0, (cr, cc), (ra, a1 - ci * cr, ca, b1 - cj * cc),
                                     (a0 - r0, a1 - r0, b0 - c0, b1 - c0))], src)
            else:
                off = (ra * cc + ca) * w
                write_block(chunk.fd, off, cc * w, src, a0 - r0, a1 - r0, b0 - c0, b1 - c0)
                start_writeback(chunk.fd, off, off + ((a1 - a0 - 1) * cc + b1 - b0) * w)
                self._count("cached", (a1 - a0) * (b1 - b0) * w)
            with self._lock:
                chunk.left -= (a1 - a0) * (b1 - b0)
                done = chunk.left == 0
            if not done:
                continue
            self._close_direct(chunk)  # finished: only its own descriptor makes it durable
            with self._lock:
                self._finished.add((ci, cj))
                if self._open.pop((ci, cj), None) is chunk:  # (not dropped by close meanwhile)
                    self._ready.append(chunk)
                many = len(self._ready) >= MAX_READY
            if many:
                self.publish()

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self.bytes[key] += n

    def _chunk(self, ci: int, cj: int, asked: bool = True) -> _Chunk | None:
        """The open chunk (ci, cj), its file made by the first thread to need it, outside the
        lock; others needing it meanwhile wait for it. ``asked``: by a writer; else made
        ahead, and None where it is open, finished or the files are closing (a finished
        chunk's temporary file must never be made again: that would empty it)."""
        key = (ci, cj)
        while True:
            with self._lock:
                chunk = self._open.get(key)
                if not asked and (chunk is not None or key in self._finished or self._closed):
                    return None
                if chunk is not None:
                    if key in self._early:
                        self._early.discard(key)
                        self._plan_ahead(key)
                    return chunk
                made = self._creating.get(key)
                if made is None:
                    final = self._final(key)
                    self._dirs(os.path.dirname(final))  # once a directory: under the lock
                    made = self._creating[key] = threading.Event()
                    break
            made.wait()  # made by another thread (or failed there: then tried here)
        try:
            chunk = self._make(ci, cj, final)
            with self._lock:
                self._open[key] = chunk
                if asked:
                    self._early.discard(key)
                    self._plan_ahead(key)
            return chunk
        finally:
            with self._lock:
                del self._creating[key]
            made.set()

    def _final(self, key: tuple) -> str:
        """The path of chunk ``key``'s file in place."""
        return os.path.join(self.folder, *self.key(key).split("/"))

    def _make(self, ci: int, cj: int, final: str) -> _Chunk:
        tmp = final + TMP_SUFFIX
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            writes = self._reserve(fd, tmp)  # an edge chunk is stored whole
        except BaseException:
            os.close(fd)
            raise
        m, n = self.shape
        cr, cc = self.chunks
        left = (min(m, (ci + 1) * cr) - ci * cr) * (min(n, (cj + 1) * cc) - cj * cc)
        return _Chunk(fd, tmp, final, left, writes)

    def _plan_ahead(self, key: tuple) -> None:
        """(Under the lock.) After a writer first asked for ``key``: make the ``ahead`` chunks
        that follow it in the writers' order where not made yet (at most 4 ``ahead`` made and
        not yet asked for: guesses of another order wait for their turn)."""
        last, self._last = self._last, key
        if not self._ahead or self._closed:
            return
        rows, cols = self.grid
        down = last is not None and (last[0] + 1, last[1]) == key
        here = key[1] * rows + key[0] if down else key[0] * cols + key[1]  # place in that order
        wanted = []
        for at in range(here + 1, min(here + 1 + self._ahead, rows * cols)):
            nxt = (at % rows, at // rows) if down else (at // cols, at % cols)
            if (nxt in self._open or nxt in self._creating or nxt in self._finished
                    or nxt in self._early):
                continue
            if len(self._early) + len(wanted) >= 4 * self._ahead:
                break
            wanted.append(nxt)
        if not wanted:
            return
        self._early.update(wanted)  # (claimed now; made, or given up, on the maker's thread)
        if self._maker is None:
            self._maker = ThreadPoolExecutor(1, thread_name_prefix="bigmm-chunk-files")
        for nxt in wanted:
            self._maker.submit(self._make_early, nxt)

    def _make_early(self, key: tuple) -> None:
        made = None
        try:
            if not os.path.exists(self._final(key)):
                made = self._chunk(*key, asked=False)  # (not a chunk a run before wrote)
        except Exception:  # a writer meets any error itself, making the file then
            pass
        if made is None:
            with self._lock:
                self._early.discard(key)

    def _reserve(self, fd: int, tmp: str):
        """Give the new chunk file its full size: storage reserved and a direct writer where
        direct writes are used (decided on the first file), else a sparse file."""
        if self._direct is None:
            self._direct = direct.MODE == "direct" or (DIRECT_WRITES and direct.wants_direct(fd))
        if self._direct:
            try:  # a failed attempt's blocks are given back
                reserve(fd, 0, self.chunk_bytes, release=[(0, self.chunk_bytes)])
                return direct.DirectWrites(fd, tmp, self.stored)
            except OSError as exc:  # a full disk is an error; else through the page cache
                if exc.errno not in NO_FALLOCATE:
                    raise
                self._direct = False
        os.ftruncate(fd, self.chunk_bytes)
        return None

    def _dirs(self, folder: str) -> None:
        if folder in self._made:
            return
        os.makedirs(folder, exist_ok=True)
        self._made.add(folder)
        here = folder
        while len(here) > len(self.folder):  # each new entry on the way down must be durable
            self._new_dirs.add(os.path.dirname(here))
            here = os.path.dirname(here)
        self._new_dirs.add(folder)

    def publish(self) -> None:
        """Make every finished chunk durable, then rename it into place and sync its
        directory: what this returns having published is durable."""
        with self._lock:
            ready, self._ready = self._ready, []
            dirs, self._new_dirs = self._new_dirs, set()
        try:
            _fsync_all([chunk.fd for chunk in ready])
            for chunk in ready:
                self._close(chunk)
                os.replace(chunk.tmp, chunk.final)
                dirs.add(os.path.dirname(chunk.final))
            for folder in sorted(dirs, key=len, reverse=True):
                fsync_path(folder)
        except BaseException:
            with self._lock:  # published again (or dropped) later
                self._ready = [c for c in ready if c.fd is not None] + self._ready
                self._new_dirs |= dirs
            raise

    def _close_direct(self, chunk: _Chunk) -> None:
        if chunk.direct is not None:
            with self._lock:
                for key, n in chunk.direct.bytes.items():
                    self.bytes[key] += n
            chunk.direct.close()
            chunk.direct = None

    def _close(self, chunk: _Chunk) -> None:
        self._close_direct(chunk)
        if chunk.fd is not None:
            os.close(chunk.fd)
            chunk.fd = None

    def close(self) -> None:
        """Drop what was not published (its temporary files); idempotent."""
        with self._lock:
            self._closed = True
            maker, self._maker = self._maker, None
        if maker is not None:
            maker.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            left = list(self._open.values()) + self._ready
            self._open, self._ready = {}, []
        for chunk in left:
            self._close(chunk)
            try:
                os.unlink(chunk.tmp)
            except OSError:
                pass


def _fsync_all(fds: list[int]) -> None:
    """``fsync`` every file, several at once (a journaling file system commits fsyncs that
    wait together in one transaction); the first failure is raised after all have run."""
    if len(fds) < 2:
        for fd in fds:
            os.fsync(fd)
        return
    with ThreadPoolExecutor(min(len(fds), SYNC_THREADS), thread_name_prefix="bigmm-fsync") as pool:
        futures = [pool.submit(os.fsync, fd) for fd in fds]
    for fut in futures:
        fut.result()


def drop_stale(folder: str, store: str | None = None) -> None:
    """Remove the temporary files an interrupted run left in an array's directory (its chunk
    files, and zarr-python's temporaries of its metadata and chunks), and zarr-python's
    temporaries of the metadata of the groups above it, up to the ``store``'s root, which the
    run's creation of the array wrote (the output's lock is held: no other writer's)."""
    for here, _dirs, files in os.walk(folder):
        for name in files:
            if name.endswith(TMP_SUFFIX) or ZARR_TEMP.fullmatch(name):
                _unlink(os.path.join(here, name))
    here, top = os.path.realpath(folder), os.path.realpath(store or folder)
    while here != top and here.startswith(top + os.sep):
        here = os.path.dirname(here)
        with os.scandir(here) as entries:
            for entry in entries:
                if ZARR_META_TEMP.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    _unlink(entry.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
