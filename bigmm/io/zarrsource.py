"""Zarr arrays as inputs: :func:`open_zarr` validates one (a Zarr spec or a ``zarr.Array``) and
returns a thread-safe :class:`ZarrSource`.

Zarr keeps every chunk in a file of its own, so chunks are read and decoded in parallel with no
global lock. zarr-python 3 reads through an asyncio codec pipeline: every chunk is a coroutine
scheduled on one event-loop thread, and that scheduling, not the I/O or the codec, bounds it
(measured on 2 cores, 8192^2 float32 in 512^2 chunks read as 1024-row panels, warm: 0.6-2.3
GB/s uncompressed and 0.5-0.8 GB/s zstd through ``Array.get_basic_selection`` at any
``async.concurrency``/``threading.max_workers``, against 7.5 and 1.0 GB/s reading the chunk
files in two threads). So the arrays of the common layouts are read by a **direct path** (the
source's ``layout`` says which):

* ``zarr-raw``: chunks stored uncompressed (``bytes`` codec, either byte order): each chunk
  file is a row-major block, read into the destination with ``preadv`` (the rows of its
  part the vectors of a read), or, for chunk files of at least :data:`MAPPED_MIN_BYTES`,
  copied through a map of the file kept for the source's life (as HDF5 inputs are,
  :class:`.mapped.FileMaps`), the byte order converted after the read or in the copy: a
  small file's map would release its pages file by file, far more often than an HDF5 file's
  blocks do; any part of a chunk is read alone,
  so plans need not align to these chunks (``panel_chunks`` is None). Before a region's
  chunks are copied, the kernel is asked to read their parts ahead
  (``posix_fadvise(WILLNEED)``, see :func:`read_ahead`): a thread copies its chunks one
  after another, and a chunk file's pages would otherwise be read only when the copy reaches
  them, one file at a time, where an HDF5 file's read-ahead runs on into the next chunk.
  Parts narrower than half a chunk's rows are left to the kernel (the range asked for would
  be mostly bytes the region does not need);
* ``zarr-zstd``, ``zarr-blosc``, ``zarr-gzip``: ``bytes`` then one of those compressors: each
  chunk file is read whole and decoded in the reader threads by the very numcodecs codec
  zarr-python's own codec wraps (they release the GIL; gzip streamed through ``zlib``), then
  copied into place. The stored bytes and the decoded chunk go to the source's decode buffers
  (:class:`.decode.DecodePool`: as many chunks decode at once as the run's plan counts, and a
  chunk still held is not decoded again). Before a region's chunks are decoded, the files of
  those not held are read ahead whole (as uncompressed parts are): the readers wait on their
  decoders, and an HDF5 file's read-ahead runs on into its next chunks where these files' does
  not.

A missing chunk file reads as the array's fill value. Everything else (sharding, ``transpose``
or other filters, ``crc32c``, other codecs, Zarr v2 arrays, stores other than the local file
system) is read through zarr-python (``layout`` "zarr", ``reason`` says why). Sources on a local
store record their identity (:meth:`ZarrSource.where`: the array's directory, its ``zarr.json``,
an index of its chunk files) and their footprint (the directory and the chunk files).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import (BackendUnavailable, BigmmError, DtypeError, IncompleteOutputError,
                      OperandNotFound, ReadError, SpecError)
from ._h5 import COMPLETE_ATTR, JOB_ATTR, check_matrix, load_record
from . import hostcopy
from .decode import DecodePool, decode_into, read_stored, stored_bound
from .identity import Footprint, ancestors, status
from .layout import MAX_INDEX_CELLS, chunk_cells
from .mapped import STEP_BYTES, FileMaps
from .rawio import read_block
from .inputs import DEFAULT_THREADS, TASK_BYTES, Source, caller_splits, incomplete_message
from .spec import ZARR, Spec
from .zarrmeta import META, node_type, readable_type
from ..units import dtype_name

#: Suffix of a chunk file being written (:mod:`.zarrsink`); never read as a chunk.
TMP_SUFFIX = ".bigmm-tmp"
#: Compressors read on the direct path, by their Zarr v3 name.
DIRECT_CODECS = ("zstd", "blosc", "gzip")
#: Uncompressed chunk files of at least this many bytes are copied through a map of the file
#: (as HDF5 inputs are); smaller ones are read with ``preadv`` (see
#: docs/benchmarks-history.md, "Zarr's small chunk files read with preadv").
MAPPED_MIN_BYTES = 8 << 20
#: Uncompressed parts at least this fraction of a chunk's width are read ahead (narrower
#: ones would ask mostly for bytes the region does not need).
READ_AHEAD_WIDTH = 0.5
#: Chunk files named by ``stored_files`` at most (evenly spaced in the store's order).
STORED_SAMPLE = 64


def zarr_module():
    """zarr-python, imported on first use (``import bigmm`` stays light)."""
    try:
        import zarr
    except ImportError as exc:
        raise BackendUnavailable(f"Expected zarr-python 3 for a Zarr operand (pip install "
                                 f"'zarr>=3.1'; it needs Python 3.11). Got {type(exc).__name__}: "
                                 f"{exc}.") from exc
    return zarr


def is_zarr_array(x) -> bool:
    """True for a ``zarr.Array`` (zarr is imported only when ``x`` comes from it)."""
    if type(x).__module__.split(".")[0] != "zarr":
        return False
    return isinstance(x, zarr_module().Array)


def array_dir(store: str, path: str) -> str:
    """The directory of the array at ``path`` ("" or "/" for the root) in the local ``store``."""
    inner = path.strip("/")
    return os.path.join(store, *inner.split("/")) if inner else store


def spec_of(arr) -> Spec | None:
    """The spec of a ``zarr.Array`` on a local store (absolute store path), else None."""
    zarr = zarr_module()
    if not isinstance(arr.store, zarr.storage.LocalStore):
        return None
    return Spec(os.path.abspath(str(arr.store.root)), "/" + arr.path.strip("/"), ZARR)


def enclosing_array(store: str, path: str) -> str | None:
    """The path ("/" for the root) of an array that holds the place ``path`` in ``store``
    (only groups may hold other nodes), or None."""
    parts = [p for p in path.strip("/").split("/") if p]
    for k in range(len(parts)):
        if node_type(array_dir(store, "/".join(parts[:k]))) == "array":
            return "/" + "/".join(parts[:k])
    return None


def v2_group_above(store: str, path: str) -> str | None:
    """The first folder, from ``store`` down to the group holding the place ``path`` (the
    store itself for the root), that holds a Zarr v2 group (``.zgroup``, no ``zarr.json``),
    or None."""
    parts = [p for p in path.strip("/").split("/") if p]
    for k in range(max(1, len(parts))):
        folder = array_dir(store, "/".join(parts[:k]))
        if not os.path.isfile(os.path.join(folder, META)) and node_type(folder) == "group":
            return folder
    return None


def open_array(spec: Spec, name: str, mode: str = "r"):
    """The ``zarr.Array`` named by ``spec``; OperandNotFound for a missing store or array (or a
    group in its place), ReadError where zarr cannot open it."""
    zarr = zarr_module()
    store, path = spec.path, spec.dataset.strip("/")
    if not os.path.exists(store):
        raise OperandNotFound(f"Expected an existing Zarr store for {name}. Got '{store}' (no "
                              f"such directory).")
    if not os.path.isdir(store):
        raise OperandNotFound(f"Expected a Zarr store (a directory) for {name}. Got '{store}', "
                              f"a file.")
    folder = array_dir(store, path)
    kind = node_type(folder)
    if kind != "array":
        got = ("none" if kind is None else f"a {kind}") + (
            f" (the store holds {_list_arrays(store)})" if kind is None else "")
        raise OperandNotFound(f"Expected a Zarr array '/{path}' in '{store}' for {name}. "
                              f"Got {got}.")
    try:
        return zarr.open_array(store=zarr.storage.LocalStore(store, read_only=mode == "r"),
                               path=path, mode=mode)
    except Exception as exc:  # zarr's metadata and codec errors
        raise ReadError(f"Expected a readable Zarr array for {name}. Got '{spec}': "
                        f"{type(exc).__name__}: {exc}.") from exc


def _list_arrays(store: str, limit: int = 8) -> str:
    found = []
    for root, dirs, files in os.walk(store):
        dirs[:] = sorted(d for d in dirs if d != "c")
        if META in files and root != store and readable_type(root) == "array":
            found.append("/" + os.path.relpath(root, store).replace(os.sep, "/"))
            dirs[:] = []
        if len(found) >= limit:
            break
    return ", ".join(found) if found else "no arrays"


def is_incomplete(arr) -> bool:
    """True when bigmm marked the array as left incomplete by an interrupted run."""
    flag = arr.attrs.get(COMPLETE_ATTR, None)
    return flag is not None and not bool(flag)


def direct_codec(arr) -> tuple[str | None, str]:
    """(the direct path's compressor name, "" for none) of an array, or (None, why not)."""
    zarr = zarr_module()
    if arr.metadata.zarr_format != 3:
        return None, "a Zarr v2 array"
    if not isinstance(arr.store, zarr.storage.LocalStore):
        return None, f"a {type(arr.store).__name__}, not a local directory"
    if getattr(arr, "shards", None) is not None:
        return None, "sharded"
    if arr.filters:
        return None, f"filters {[f.to_dict()['name'] for f in arr.filters]}"
    if not isinstance(arr.serializer, zarr.codecs.BytesCodec):
        return None, f"serializer {arr.serializer.to_dict()['name']}"
    names = [c.to_dict()["name"] for c in arr.compressors]
    if len(names) > 1 or (names and names[0] not in DIRECT_CODECS):
        return None, f"compressors {names}"
    return (names[0] if names else ""), ""


class ZarrSource(Source):
    """A Zarr array, read by the direct path where its codecs allow, else through zarr."""

    def __init__(self, arr, label: str, threads: int = DEFAULT_THREADS,
                 map_step: int = STEP_BYTES):
        self.array, self.label, self._threads = arr, label, threads
        self._map_step = map_step
        self.shape = tuple(int(d) for d in arr.shape)
        self.dtype = check_matrix(arr.shape, arr.dtype, label)
        self.chunks = tuple(int(c) for c in arr.chunks)
        self._pool = None
        self._pool_lock = threading.Lock()
        self._local = threading.local()
        self._maps: FileMaps | None = None  # large raw chunks' maps
        codec, self.reason = direct_codec(arr)
        self._codec = codec
        spec = spec_of(arr)
        self.dir = None if spec is None else os.path.realpath(array_dir(spec.path, spec.dataset))
        self.layout = "zarr" if codec is None else f"zarr-{codec or 'raw'}"
        if codec is not None:
            order = arr.serializer.endian
            big = getattr(order, "value", order) == "big"
            self._stored = self.dtype.newbyteorder(">" if big else "<")
            self._swap = not self._stored.isnative
            self._fill = np.array(arr.fill_value, dtype=self.dtype)
            self._chunk_bytes = self.chunks[0] * self.chunks[1] * self.dtype.itemsize
            self._key = arr.metadata.encode_chunk_key
            if codec == "" and self._chunk_bytes >= MAPPED_MIN_BYTES:
                self._maps = FileMaps(self._chunk_bytes, step=map_step)
        self._facts = self._describe() if self.dir is not None else None
        self._decoded = None
        if codec:  # buffers for the chunks' stored bytes (the largest file) and decoded
            largest = (self._facts or {}).get("largest")
            self._decoded = DecodePool(self._chunk_bytes, largest if largest is not None
                                       else stored_bound(self._chunk_bytes), threads)

    @property
    def fast(self) -> bool:
        return self.layout != "zarr"

    @property
    def panel_chunks(self) -> tuple[int, int] | None:
        return None if self._codec == "" else self.chunks  # raw chunks: read in part

    @property
    def decode_bytes(self) -> int:
        return self._decoded.pair_bytes if self._decoded is not None else 0

    def limit_decoders(self, n: int) -> None:
        if self._decoded is not None:
            self._decoded.set_limit(n)

    # ----- identity -------------------------------------------------------------------------
    def _describe(self) -> dict:
        """What identifies the stored array: its directory, its metadata file, its chunk
        files (their names, sizes and modification times, hashed) and where they lie."""
        st = os.stat(self.dir)
        meta = os.stat(os.path.join(self.dir, META)) if os.path.exists(
            os.path.join(self.dir, META)) else os.stat(os.path.join(self.dir, ".zarray"))
        files = chunk_files(self.dir, stats=(stats := []))
        storage = {"layout": "zarr", "chunks": list(self.chunks),
                   "codecs": _codecs_json(self.array)}
        if files is not None:
            h = hashlib.blake2b(digest_size=16)
            for rel, _dev, _ino, size, mtime in files:
                h.update(f"{rel}\0{size}\0{mtime}\n".encode())
            storage["index"] = h.hexdigest()
        return {"file": {"dev": st.st_dev, "ino": st.st_ino, "size": meta.st_size,
                         "mtime_ns": meta.st_mtime_ns, **status([meta, *stats])},
                "object": meta.st_ino, "storage": storage,
                "chunk_files": tuple((dev, ino) for _r, dev, ino, _s, _m in files or ()),
                "sizes": tuple((rel, size) for rel, _d, _i, size, _m in files or ()),
                "largest": None if files is None else max((f[3] for f in files), default=0)}

    def record(self) -> dict | None:
        return load_record(self.array.attrs.get(JOB_ATTR))

    def where(self) -> dict | None:
        if self._facts is None:
            return None
        return {"path": self.dir, "file": dict(self._facts["file"]),
                "object": self._facts["object"], "storage": dict(self._facts["storage"])}

    def footprint(self) -> Footprint:
        if self._facts is None:
            return Footprint()
        dev, ino = self._facts["file"]["dev"], self._facts["file"]["ino"]
        ranges = tuple((d, i, 0, 1 << 62) for d, i in self._facts["chunk_files"])
        return Footprint(ranges=ranges, files=((dev, ino),), tree=(dev, ino),
                         within=ancestors(self.dir))

    def stored_files(self) -> tuple:
        if self._facts is None:
            return ()
        sizes = self._facts["sizes"]
        every = max(1, len(sizes) // STORED_SAMPLE)  # a store of many files: evenly sampled
        return tuple((os.path.join(self.dir, rel), 0, size) for rel, size in sizes[::every])

    # ----- reads ----------------------------------------------------------------------------
    def read(self, r0, r1, c0, c1, out) -> None:
        self._check_out(r0, r1, c0, c1, out)
        if r0 == r1 or c0 == c1:
            return
        try:
            if self._codec is None:
                self._read_zarr(r0, r1, c0, c1, out)
            else:
                self._read_chunks(r0, r1, c0, c1, out)
        except BigmmError:
            raise
        except Exception as exc:  # OSError, codec errors
            raise self._read_error(r0, r1, c0, c1, exc) from exc

    def _read_zarr(self, r0, r1, c0, c1, out) -> None:
        from zarr.core.buffer import default_buffer_prototype

        target = default_buffer_prototype().nd_buffer.from_numpy_array(out)
        self.array.get_basic_selection((slice(r0, r1), slice(c0, c1)), out=target)

    def _read_chunks(self, r0, r1, c0, c1, out) -> None:
        cells = list(chunk_cells(self.chunks, r0, r1, c0, c1))
        if self._decoded is None:
            read_ahead([(self.chunk_path(ci, cj), self._part(ci, cj, a0, a1, b0, b1))
                        for ci, cj, a0, a1, b0, b1 in cells
                        if b1 - b0 >= READ_AHEAD_WIDTH * self.chunks[1] or a1 - a0 == 1])
        else:  # compressed: the files of the chunks not held decoded, whole
            read_ahead([(self.chunk_path(ci, cj), (0, None)) for ci, cj, *_ in cells
                        if not self._decoded.holds((ci, cj))])
        nbytes = (r1 - r0) * (c1 - c0) * self.dtype.itemsize
        groups = _even_groups([(cell, self._cell_bytes(cell)) for cell in cells],
                              min(self._threads, nbytes // TASK_BYTES))
        tasks = [[(cell, out, r0, c0) for cell in g] for g in groups]
        if len(tasks) == 1 or caller_splits():
            for task in tasks:
                self._group(task)
            return
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="bigmm-zarr")
        for fut in [self._pool.submit(self._group, t) for t in tasks]:
            fut.result()

    def _part(self, ci, cj, a0, a1, b0, b1) -> tuple[int, int]:
        """The bytes [lo, hi) of chunk (ci, cj)'s file that rows a0:a1, columns b0:b1 of the
        array lie in (uncompressed chunks)."""
        cr, cc = self.chunks
        w = self.dtype.itemsize
        return (((a0 - ci * cr) * cc + b0 - cj * cc) * w,
                ((a1 - 1 - ci * cr) * cc + b1 - cj * cc) * w)

    def _cell_bytes(self, cell) -> int:
        _ci, _cj, a0, a1, b0, b1 = cell
        return (a1 - a0) * (b1 - b0) * self.dtype.itemsize

    def _group(self, group) -> None:
        for cell in group:
            self._chunk(cell)

    def chunk_path(self, ci: int, cj: int) -> str:
        return os.path.join(self.dir, *self._key((ci, cj)).split("/"))

    def _chunk(self, task) -> None:
        """Read one chunk's part of a region into ``out`` (fill where the chunk is missing)."""
        (ci, cj, a0, a1, b0, b1), out, r0, c0 = task
        cr, cc = self.chunks
        dest = out[a0 - r0:a1 - r0, b0 - c0:b1 - c0]
        path = self.chunk_path(ci, cj)
        if self._maps is not None:
            with self._maps.use(path) as fmap:
                if fmap is None:
                    dest[...] = self._fill
                    return
                # stored byte order -> native, in the copy; the pages leave RSS after it
                src = fmap.array(0, (cr, cc), self._stored)[a0 - ci * cr:a1 - ci * cr,
                                                            b0 - cj * cc:b1 - cj * cc]
                fmap.copy(dest, src, view=src)
                del src
            return
        if self._decoded is not None:  # compressed: the chunk decoded whole
            ca, cb = a0 - ci * cr, b0 - cj * cc
            try:
                with self._decoded.chunk((ci, cj), lambda stored, data: self._decode_file(
                        path, stored, data)) as data:
                    chunk = data.view(self._stored).reshape(cr, cc)
                    hostcopy.copy(dest, chunk[ca:ca + a1 - a0, cb:cb + b1 - b0])
            except FileNotFoundError:
                dest[...] = self._fill
            return
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            dest[...] = self._fill
            return
        try:
            size = os.fstat(fd).st_size
            if size != self._chunk_bytes:
                raise OSError(f"chunk file '{path}' holds {size} bytes; an uncompressed "
                              f"chunk holds {self._chunk_bytes}")
            off = self._part(ci, cj, a0, a1, b0, b1)[0]
            read_block(fd, off, cc * self.dtype.itemsize, out, a0 - r0, a1 - r0, b0 - c0,
                       b1 - c0)
            if self._swap:
                dest.byteswap(inplace=True)
        finally:
            os.close(fd)

    def decode_chunk(self, ci, cj, stored, data) -> bool:
        try:
            self._decode_file(self.chunk_path(ci, cj), stored, data)
        except FileNotFoundError:
            return False
        return True

    def _decode_file(self, path: str, stored: np.ndarray, data: np.ndarray) -> None:
        """Read a compressed chunk file into ``stored`` and decode it into all of ``data``
        (FileNotFoundError where it is missing)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        what = f"chunk file '{path}'"
        try:
            raw = read_stored(fd, 0, os.fstat(fd).st_size, stored, what)
        finally:
            os.close(fd)
        decode_into(self._codec, raw, data, what)

    # ----- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._maps is not None:
            self._maps.close()
        if self._decoded is not None:
            self._decoded.close()


def read_ahead(parts: list) -> None:
    """Ask the kernel to start reading the byte ranges ``(path, (lo, hi))`` of files into
    the page cache without waiting for them (``posix_fadvise(WILLNEED)``; ``hi`` None: to the
    file's end), unless the first range's first and last bytes are cached already: then the
    region is taken to be cached (asking walks every page of a range). Missing files and
    systems without the calls are passed over: it is only a hint."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # pragma: no cover
        return
    for i, (path, (lo, hi)) in enumerate(parts):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            if i == 0 and _cached(fd, lo) and (hi is None or _cached(fd, hi - 1)):
                return
            advise(fd, lo, 0 if hi is None else hi - lo, os.POSIX_FADV_WILLNEED)
        except OSError:  # a refused hint: the copies read as they would have
            pass
        finally:
            os.close(fd)


def _cached(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` of the open file is in the page cache (a one-byte read
    that may not wait for the disk); True where that cannot be asked (no hint is given then:
    reads are left to the kernel's read-ahead, as where the file lives in memory)."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None:  # pragma: no cover
        return True
    try:
        return os.preadv(fd, [bytearray(1)], offset, nowait) == 1
    except BlockingIOError:  # not cached
        return False
    except OSError:  # EOPNOTSUPP (tmpfs, some network file systems): not asked
        return True


def _even_groups(items: list, k: int) -> list[list]:
    """``(item, nbytes)`` pairs in at most ``k`` (at least one) runs of consecutive items of
    about equal bytes. Chunks stay whole: threads copying parts of one chunk would release the
    mapped pages the others are copying from (:meth:`.FileMap.copy` drops whole windows)."""
    total = sum(b for _i, b in items)
    k = max(1, min(k, len(items)))
    groups, acc, g = [[] for _ in range(k)], 0, 0
    for left, (item, nbytes) in zip(range(len(items), 0, -1), items):
        # the next group starts once this one has its share, or as the items left run out
        if groups[g] and g < k - 1 and (acc * k >= total * (g + 1) or left <= k - 1 - g):
            g += 1
        groups[g].append(item)
        acc += nbytes
    return groups


def _codecs_json(arr) -> list:
    try:
        return [c.to_dict() for c in arr.metadata.codecs]
    except AttributeError:  # Zarr v2 metadata
        return [json.loads(json.dumps(arr.metadata.to_dict().get("compressor"), default=str))]


def chunk_files(folder: str, limit: int = MAX_INDEX_CELLS, stats: list | None = None):
    """(relative path, device, inode, size, mtime_ns) of the chunk files under an array's
    directory, sorted (metadata and files being written left out); None when there are more
    than ``limit`` (the index is then not recorded). ``stats``: a list their os.stat results
    are added to, in that order."""
    out = []
    stack = [folder]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                name = entry.name
                if name in (META, ".zarray", ".zattrs") or name.endswith(TMP_SUFFIX) \
                        or name.endswith(".partial"):
                    continue
                st = entry.stat(follow_symlinks=True)
                out.append((os.path.relpath(entry.path, folder), st.st_dev, st.st_ino,
                            st.st_size, st.st_mtime_ns, st))
                if len(out) > limit:
                    return None
    out.sort(key=lambda f: f[0])
    if stats is not None:
        stats += [f[-1] for f in out]
    return [f[:-1] for f in out]


def check_zarr_dtype(dtype, label: str) -> None:
    """DtypeError for a dtype a Zarr array cannot hold (Zarr has no bfloat16), before anything
    is created."""
    if dtype_name(dtype) == "bfloat16":
        raise DtypeError(f"Expected float16, float32 or float64 for the Zarr array {label}. "
                         f"Got bfloat16 (Zarr has no bfloat16 data type; write it to an HDF5 "
                         f"dataset).")


def describe_array(arr) -> str:
    spec = spec_of(arr)
    return str(spec) if spec is not None else f"zarr.Array {arr.path or '/'} in {arr.store}"


def open_zarr(x, name: str = "A", threads: int = DEFAULT_THREADS,
              map_step: int = STEP_BYTES) -> ZarrSource:
    """Open a Zarr operand: a Zarr :class:`Spec` or a ``zarr.Array`` (``map_step``: the most
    chunk-file bytes a mapped copy spans between releases of its pages, :class:`FileMap`)."""
    if isinstance(x, Spec):
        if not x.zarr:
            raise SpecError(f"Expected a Zarr spec for {name}. Got {x}.")
        arr, label = open_array(x, name), f"{name} ({x})"
    else:
        arr, label = x, f"{name} ({describe_array(x)})"
    check_matrix(arr.shape, arr.dtype, label)
    if is_incomplete(arr):
        raise IncompleteOutputError(incomplete_message(label))
    return ZarrSource(arr, label, threads=threads, map_step=map_step)
