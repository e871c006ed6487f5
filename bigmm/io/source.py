"""Input matrices: :func:`open_input` validates an operand, returns a thread-safe :class:`Source`.

HDF5 datasets whose bytes lie plainly in the file (contiguous, or chunked without filters) are
mapped read-only once per source (:mod:`.mapped`) and read by NumPy copies out of the mapping,
split across the source's threads; the file's size is checked against the dataset's extent at
open and before every read, so a truncated file is a ReadError, not a SIGBUS. Where the file
cannot be mapped (or ``use_mmap=False``), and for full-width row ranges of contiguous datasets
(one long read; as cheap as the copy, and no page faults), they are read with parallel
``preadv`` at byte offsets computed once at open. Chunks compressed by deflate, zstd or blosc
(optionally after shuffle) are read raw and decoded in the reader threads (zlib, numcodecs)
into the source's decode buffers (:class:`.decode.DecodePool`: as many at once as the run's
plan counts; a chunk still held there is not decoded again). Everything else goes through
h5py's ``read_direct`` under one lock, other filtered datasets on one thread for all of them
(:func:`_filter_thread`). ``Source.layout`` says which path a source uses ("array",
"contiguous", "chunked", "deflate", "zstd", "blosc" or "h5py"), ``Source.fast`` whether
reads bypass h5py, ``Source.mapped`` whether they copy from a memory map. Mapped copies drop
the pages they touched as they go (:meth:`.FileMap.copy`), so a reader thread holds one block
of the file in its process's RSS at a time (``map_step``: a few MiB by default), not the pages
of every read so far.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
from h5py import h5d, h5o

from ..errors import (BigmmError, IncompleteOutputError, OptionError, ReadError,
                      SpecError)
from . import hostcopy
from ._h5 import (H5LOCK, JOB_ATTR, REOPENABLE, check_matrix, is_incomplete, load_record,
                  read_region, stored_dtype)
from .decode import (DecodePool, decode_into, give_back, read_stored, stored_bound,
                     unshuffle_into)
from .inputs import (DEFAULT_THREADS, TASK_BYTES, Source, _batches, caller_splits,
                     incomplete_message)
from .h5open import check_readable, data_files, open_h5
from .identity import Footprint, ancestors, array_footprint, file_facts
from .layout import (DECODED_KINDS, MAX_INDEX_CELLS, Layout, chunk_cells, chunk_index,
                     probe_layout, skips_unwritten)
from .mapped import FAULT_GRAIN, PAGE, STEP_BYTES, FileMap
from .rawio import read_block
from .spec import Spec, parse_spec

#: Full-width row ranges of a contiguous dataset at least this large are read with preadv even
#: when the file is mapped. Measured on 8192-wide float32 rows (CPU-s per 256 MiB, warm):
#: 2816-row blocks 0.030 preadv / 0.032 mapped copy, 512 rows 0.039 / 0.032, 64 rows 0.041 /
#: 0.033: equal for long ranges, which then avoid page faults and the truncation window.
PREAD_FULL_ROWS = 16 << 20

_FILTERS: list = []
_FILTERS_LOCK = threading.Lock()


def _filter_thread() -> ThreadPoolExecutor:
    """The one thread that reads filtered chunks through h5py, for every source (HDF5 runs
    one call at a time anyway): the buffers HDF5's filters allocate and free come from one
    thread's arena of the C allocator, which keeps at most one chunk's of them."""
    with _FILTERS_LOCK:
        if not _FILTERS:
            _FILTERS.append(ThreadPoolExecutor(1, thread_name_prefix="bigmm-filters"))
        return _FILTERS[0]


class ArraySource(Source):
    """A NumPy array (any strides, any byte order) of a dtype in DTYPES."""

    layout = "array"

    def __init__(self, array: np.ndarray, label: str):
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = check_matrix(array.shape, array.dtype, label)
        self.label = label

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check_out(r0, r1, c0, c1, out)
        hostcopy.copy(out, self.array[r0:r1, c0:c1])

    def footprint(self) -> Footprint:
        return array_footprint(self.array)


class H5Source(Source):
    """An HDF5 dataset, read raw in parallel where :func:`probe_layout` allows, else via h5py."""

    def __init__(self, dset: h5py.Dataset, label: str, *, own_file: h5py.File | None = None,
                 threads: int = DEFAULT_THREADS, use_mmap: bool = True,
                 map_step: int = STEP_BYTES):
        self.label = label
        self._map_step = map_step
        self.shape = tuple(dset.shape)
        self.dtype = check_matrix(dset.shape, stored_dtype(dset), label)
        self.chunks = tuple(dset.chunks) if dset.chunks else None
        self.path = os.path.realpath(dset.file.filename)
        #: The files the source's h5py handle holds open: the dataset's, and the one opened
        #: for it where an external link led from there to the dataset's (see _drop_handle).
        self.held = {self.path} | ({os.path.realpath(own_file.filename)}
                                   if own_file is not None else set())
        with H5LOCK:
            self._object = int(h5o.get_info(dset.id).addr)
            # HDF5 leaves a buffer as it was where nothing was written: zeroed before reads
            self._zero_first = skips_unwritten(dset.id.get_create_plist())
            self._data = [dict(file_facts(p), path=p) for p in data_files(dset)]
        self._file_facts = file_facts(self.path)
        self._dset, self._file, self._threads = dset, own_file, threads
        self._name = dset.name
        self._pool = None
        self._pool_lock = threading.Lock()
        self._fd = self._map = None
        self._largest = None  # the largest stored chunk, where the chunks are indexed
        self._layout = probe_layout(dset)
        self._storage = self._describe_storage(dset)
        self._decoded = self._decode_pool()
        if not self._layout.fast:  # (filtered: its chunks decoded where all are)
            (_filter_thread().submit(check_readable, dset, label).result() if self.filtered
             else check_readable(dset, label))
        if self._layout.fast:
            self._open_raw(use_mmap)  # (its samples decoded in one buffer)
        if self._decoded is not None:
            self._decoded.set_limit(threads)
        self.layout = self._layout.kind
        self.reason = self._layout.reason
        if self._layout.fast and own_file is not None:
            with H5LOCK:  # raw reads need no h5py handle; release the file for other openers
                own_file.close()
            self._dset = self._file = None
        elif own_file is not None:
            REOPENABLE.add(self)

    @property
    def panel_chunks(self) -> tuple[int, int] | None:
        return None if self.layout == "chunked" else self.chunks  # raw chunks: read in part

    @property
    def filtered(self) -> bool:
        """Whether the chunks are stored through filters (compressed)."""
        return bool(self._storage.get("filters"))

    @property
    def decode_bytes(self) -> int:
        if self._decoded is not None:
            return self._decoded.pair_bytes
        if not self.filtered:
            return 0
        chunk = self.chunks[0] * self.chunks[1] * self.dtype.itemsize
        return chunk + (self._largest if self._largest is not None else stored_bound(chunk))

    @property
    def decode_threads(self) -> int | None:
        return 1 if self.filtered and self._decoded is None else None  # h5py: one thread

    def limit_decoders(self, n: int) -> None:
        if self._decoded is not None:
            self._decoded.set_limit(n)

    def _decode_pool(self) -> DecodePool | None:
        """The decode buffers of chunks decoded raw (DECODED_KINDS), else None."""
        lay = self._layout
        if lay.kind not in DECODED_KINDS:
            return None
        return DecodePool(lay.chunks[0] * lay.chunks[1] * self.dtype.itemsize,
                          int(lay.chunk_sizes.max(initial=0)))

    def where(self) -> dict:
        return {"path": self.path, "file": dict(self._file_facts), "object": self._object,
                "storage": dict(self._storage), "data": [dict(f) for f in self._data]}

    def _describe_storage(self, dset: h5py.Dataset) -> dict:
        """How HDF5 stores the dataset (whichever path bigmm reads it by): its layout, the
        offset of contiguous storage, or the chunk shape, filters and a hash of the chunk index
        (where each chunk lies and its stored size: rewriting a compressed chunk changes it)."""
        with H5LOCK:
            dcpl = dset.id.get_create_plist()
            kind = {h5d.COMPACT: "compact", h5d.CONTIGUOUS: "contiguous",
                    h5d.CHUNKED: "chunked", h5d.VIRTUAL: "virtual"}.get(dcpl.get_layout(), "other")
            out = {"layout": kind}
            if kind == "contiguous":
                offset = dset.id.get_offset()
                out["offset"] = None if offset is None else int(offset)
            if kind != "chunked" or not self.chunks or len(self.chunks) != 2:
                return out
            out["chunks"] = list(self.chunks)
            out["filters"] = [int(dcpl.get_filter(i)[0]) for i in range(dcpl.get_nfilters())]
            lay = self._layout
            if lay.chunk_offsets is not None:
                offsets, sizes = lay.chunk_offsets, lay.chunk_sizes
                if sizes is None:  # unfiltered: every stored chunk is whole
                    w = self.dtype.itemsize
                    sizes = np.where(offsets >= 0, self.chunks[0] * self.chunks[1] * w, 0)
            elif np.prod([-(-d // c) for d, c in zip(self.shape, self.chunks)]) <= MAX_INDEX_CELLS:
                offsets, sizes = chunk_index(dset, self.chunks, None) or (None, None)
            else:
                return out
            if sizes is not None:
                self._largest = int(sizes.max(initial=0))
        h = hashlib.blake2b(digest_size=16)
        for part in (offsets, sizes):
            if part is not None:
                h.update(np.ascontiguousarray(part, np.int64).tobytes())
        out["index"] = h.hexdigest()
        return out

    def footprint(self) -> Footprint:
        dev, ino = self._file_facts["dev"], self._file_facts["ino"]
        ranges = ()
        if self._layout.kind in ("contiguous", "chunked", *DECODED_KINDS):
            start, stop = self._extent()
            ranges = ((dev, ino, start, stop),)
        else:  # somewhere in the file
            ranges = ((dev, ino, 0, 1 << 62),)
        return Footprint(objects=((dev, ino, self._object),), ranges=ranges,
                         files=((dev, ino),), within=ancestors(self.path),
                         elsewhere=tuple((f["dev"], f["ino"]) for f in self._data))

    def stored_files(self) -> tuple:
        if self._layout.kind in ("contiguous", "chunked", *DECODED_KINDS):
            return ((self.path, *self._extent()),)
        return ((self.path, 0, os.path.getsize(self.path)),)

    def record(self) -> dict | None:
        with H5LOCK:
            return load_record(self._dataset().attrs.get(JOB_ATTR))

    def _drop_handle(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._dset = None

    def _dataset(self) -> h5py.Dataset:
        """The h5py dataset (call holding H5LOCK), reopened if a writer released it."""
        if self._dset is None:
            self._file = h5py.File(self.path, "r")
            self._dset = self._file[self._name]
        return self._dset

    # ----- set-up -------------------------------------------------------------------------
    def _open_raw(self, use_mmap: bool) -> None:
        with H5LOCK:
            if self._dset.file.mode != "r":
                self._dset.file.flush()
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            start, stop = self._extent()
            size = os.fstat(self._fd).st_size
            if size < stop:
                raise ReadError(f"Expected the file '{self.path}' to hold bytes {start}:{stop} "
                                f"of {self.label}. Got a file of {size} bytes (truncated?).")
            if use_mmap and self._layout.kind in ("contiguous", "chunked") and stop > start:
                try:
                    self._map = FileMap(self._fd, start, stop, path=self.path,
                                        step=self._map_step)
                except (OSError, ValueError, OverflowError):  # cannot map: preadv only
                    self._map = None
            if self._sample_matches():
                self.mapped = self._map is not None
                return
        except BaseException:
            self._close_raw()
            raise
        self._close_raw()
        self._layout = Layout("h5py", reason="raw bytes differ from h5py's reading",
                              chunks=self.chunks)
        self._decoded = None

    def _extent(self) -> tuple[int, int]:
        """The file bytes [start, stop) the dataset's stored data occupies."""
        lay, w = self._layout, self.dtype.itemsize
        if lay.kind == "contiguous":
            return lay.offset, lay.offset + self.shape[0] * self.shape[1] * w
        offsets = lay.chunk_offsets[lay.chunk_offsets >= 0]
        if offsets.size == 0:
            return 0, 0
        if lay.kind == "chunked":
            ends = offsets + lay.chunks[0] * lay.chunks[1] * w
        else:
            ends = (lay.chunk_offsets + lay.chunk_sizes)[lay.chunk_offsets >= 0]
        return int(offsets.min()), int(ends.max())

    def _sample_matches(self) -> bool:
        """Read a few corner regions both ways; the fast path is used only if they agree.
        Compressed chunks are decoded by HDF5 and then by bigmm, one after the other: HDF5's
        buffers are given back to the system, bigmm's dropped, before the next decodes."""
        m, n = self.shape
        for r0, r1, c0, c1 in ((0, min(m, 3), 0, min(n, 300)),
                               (max(0, m - 3), m, max(0, n - 300), n)):
            ref = np.zeros((r1 - r0, c1 - c0), self.dtype)
            try:
                with H5LOCK:
                    read_region(self._dset, np.s_[r0:r1, c0:c1], ref)
            except Exception as exc:  # a filter's failure: what any read of it would meet
                raise ReadError(f"Expected a readable dataset for {self.label}. Got "
                                f"{type(exc).__name__} reading rows {r0}:{r1}, columns "
                                f"{c0}:{c1}: {exc}.") from exc
            if self.filtered:
                give_back()
            for mapped in {False, self._map is not None}:
                raw = np.empty((r1 - r0, c1 - c0), self.dtype)
                try:
                    self._read_fast(r0, r1, c0, c1, raw, mapped)
                except Exception:  # OSError, a codec's own errors: h5py reads it instead
                    return False
                finally:
                    if self._decoded is not None:
                        self._decoded.release()
                if raw.tobytes() != ref.tobytes():
                    return False
        return True

    # ----- reads --------------------------------------------------------------------------
    def read(self, r0, r1, c0, c1, out) -> None:
        self._check_out(r0, r1, c0, c1, out)
        if r0 == r1 or c0 == c1:
            return
        try:
            if self._fd is not None:
                self._read_fast(r0, r1, c0, c1, out, self._map is not None)
            elif self.filtered:
                _filter_thread().submit(self._read_h5py, r0, r1, c0, c1, out).result()
            else:
                self._read_h5py(r0, r1, c0, c1, out)
        except BigmmError:
            raise
        except Exception as exc:  # OSError, h5py/HDF5 errors from filters
            raise self._read_error(r0, r1, c0, c1, exc) from exc

    def _read_h5py(self, r0, r1, c0, c1, out) -> None:
        if self._zero_first:  # (else what a reused buffer held would stay where HDF5 skips)
            out[...] = 0
        with H5LOCK:
            read_region(self._dataset(), np.s_[r0:r1, c0:c1], out)

    def _read_fast(self, r0, r1, c0, c1, out, mapped: bool) -> None:
        kind = self._layout.kind
        # one task per thread; on a caller that splits the region itself, one in all
        piece = out.nbytes if caller_splits() else max(TASK_BYTES,
                                                       out.nbytes // self._threads + 1)
        inline = True  # a single task runs in the calling thread
        if kind in DECODED_KINDS:
            tasks, run = self._decode_tasks(r0, r1, c0, c1, out), self._decode
        elif mapped and not (kind == "contiguous" and c1 - c0 == self.shape[1]
                             and out.nbytes >= PREAD_FULL_ROWS):
            self._map.check()  # a mapped page past the end of the file would raise SIGBUS
            tasks = (self._mapped_rows if kind == "contiguous"
                     else self._mapped_chunks)(r0, r1, c0, c1, out, piece)
            run = self._copy
            # every mapped copy runs on the pool (or on a caller that splits the region between
            # its own threads), so that at most ``threads`` copies (each holding at most one
            # block of mapped pages, see FileMap.copy) run at once
            inline = False
        else:
            tasks = (self._contiguous_tasks if kind == "contiguous"
                     else self._chunked_tasks)(r0, r1, c0, c1, out, piece)
            run = self._run
        if (len(tasks) < 2 and inline) or caller_splits():
            for task in tasks:
                run(task)
            return
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="bigmm-read")
        for fut in [self._pool.submit(run, task) for task in tasks]:
            fut.result()

    @property
    def layout_kind(self) -> str:
        return self._layout.kind

    def _run(self, group) -> None:
        fd, swap = self._fd, self._layout.swap
        for off, stride, out, a, b, c, d, fill in group:
            if off < 0:
                out[a:b, c:d] = fill
            else:
                read_block(fd, off, stride, out, a, b, c, d)
            if swap:
                out[a:b, c:d].byteswap(inplace=True)

    # mapped copies: a task is a list of (destination view, source view or None for the fill)
    def _copy(self, group) -> None:
        for dest, src, fill in group:
            if src is None:
                dest[...] = fill
            else:  # stored byte order -> native, in the copy; the pages leave RSS after it
                self._map.copy(dest, src, view=src)

    def _stored(self) -> np.dtype:
        # (on a little-endian host; bfloat16 is never swapped: probe_layout refuses it)
        return self.dtype.newbyteorder(">") if self._layout.swap else self.dtype

    def _mapped_rows(self, r0, r1, c0, c1, out, piece) -> list:
        m, n = self.shape
        whole = self._map.array(self._layout.offset, (m, n), self._stored())
        per = max(1, piece // max(1, (c1 - c0) * self.dtype.itemsize))
        return [[(out[a - r0:min(a + per, r1) - r0], whole[a:min(a + per, r1), c0:c1], None)]
                for a in range(r0, r1, per)]

    def _mapped_chunks(self, r0, r1, c0, c1, out, piece) -> list:
        """Tasks of whole chunks' parts; a part larger than ``piece`` goes in blocks of rows
        (whole FAULT_GRAIN windows of the chunk where its rows allow), so that a region of
        few large chunks is copied by as many threads as one of many small ones. Threads on
        neighbouring blocks of a chunk may drop pages at their shared edge that the other
        then faults in again from the page cache: no more."""
        cr, cc = self._layout.chunks
        offsets, stored, fill = self._layout.chunk_offsets, self._stored(), self._layout.fill
        w = self.dtype.itemsize
        grain = max(1, FAULT_GRAIN // (cc * w))

        def cells():
            for ci, cj, a0, a1, b0, b1 in chunk_cells((cr, cc), r0, r1, c0, c1):
                base, row = int(offsets[ci, cj]), (b1 - b0) * w
                chunk = None if base < 0 else self._map.array(base, (cr, cc), stored)
                per = (a1 - a0 if (a1 - a0) * row <= piece
                       else max(grain, piece // row // grain * grain))
                for x0 in range(a0, a1, per):
                    x1 = min(a1, x0 + per)
                    src = None if chunk is None else chunk[x0 - ci * cr:x1 - ci * cr,
                                                           b0 - cj * cc:b1 - cj * cc]
                    yield (out[x0 - r0:x1 - r0, b0 - c0:b1 - c0], src, fill), (x1 - x0) * row

        return _batches(cells(), piece)

    # preadv reads: a task is a list of (file offset or -1, stride, out, rows, columns, fill)
    def _contiguous_tasks(self, r0, r1, c0, c1, out, piece) -> list:
        n, w = self.shape[1], self.dtype.itemsize
        base, stride = self._layout.offset, n * w
        per = max(1, piece // max(1, (c1 - c0) * w))
        return [[(base + (a * n + c0) * w, stride, out, a - r0, min(a + per, r1) - r0,
                  0, c1 - c0, None)] for a in range(r0, r1, per)]

    def _chunked_tasks(self, r0, r1, c0, c1, out, piece) -> list:
        cr, cc = self._layout.chunks
        w = self.dtype.itemsize
        offsets = self._layout.chunk_offsets
        fill = self._raw_fill()

        def reads():
            for ci, cj, a0, a1, b0, b1 in chunk_cells((cr, cc), r0, r1, c0, c1):
                base = int(offsets[ci, cj])
                rows = a1 - a0 if base < 0 else max(1, piece // ((b1 - b0) * w))
                for s0 in range(a0, a1, rows):  # big chunks split by rows
                    s1 = min(a1, s0 + rows)
                    off = -1 if base < 0 else base + ((s0 - ci * cr) * cc + (b0 - cj * cc)) * w
                    yield ((off, cc * w, out, s0 - r0, s1 - r0, b0 - c0, b1 - c0, fill),
                           (s1 - s0) * (b1 - b0) * w)

        return _batches(reads(), piece)

    def _decode_tasks(self, r0, r1, c0, c1, out) -> list:
        return [(ci, cj, out, a0, a1, b0, b1, r0, c0)
                for ci, cj, a0, a1, b0, b1 in chunk_cells(self._layout.chunks, r0, r1, c0, c1)]

    def _decode(self, task) -> None:
        """Copy one compressed chunk's part of a region into out: the chunk read raw and
        decoded into the decode buffers (unless held there still), then copied out (and
        unshuffled on the way)."""
        ci, cj, out, a0, a1, b0, b1, r0, c0 = task
        lay = self._layout
        cr, cc = lay.chunks
        dest = out[a0 - r0:a1 - r0, b0 - c0:b1 - c0]
        if lay.chunk_offsets[ci, cj] < 0:
            dest[...] = lay.fill
            return
        ca, cb = a0 - ci * cr, b0 - cj * cc
        with self._decoded.chunk((ci, cj), lambda stored, data: self.decode_chunk(
                ci, cj, stored, data)) as data:
            if lay.shuffle:  # byte k of every element was stored together
                unshuffle_into(data, dest, (cr, cc), (ca, cb), lay.swap)
            else:
                chunk = data.view(self._stored()).reshape(cr, cc)
                hostcopy.copy(dest, chunk[ca:ca + a1 - a0, cb:cb + b1 - b0])

    def decode_chunk(self, ci, cj, stored, data) -> bool:
        lay = self._layout
        if self._decoded is None:  # h5py's filters: the chunk's region read through them
            cr, cc = self.chunks
            r0, c0 = ci * cr, cj * cc
            r1, c1 = min(r0 + cr, self.shape[0]), min(c0 + cc, self.shape[1])
            self.read(r0, r1, c0, c1, data[:(r1 - r0) * (c1 - c0) * self.dtype.itemsize]
                      .view(self.dtype).reshape(r1 - r0, c1 - c0))
            return True
        off, size = int(lay.chunk_offsets[ci, cj]), int(lay.chunk_sizes[ci, cj])
        if off < 0:
            return False
        what = f"chunk ({ci}, {cj}) at byte {off}"
        decode_into(lay.kind, read_stored(self._fd, off, size, stored, what), data, what)
        return True

    def _raw_fill(self):
        """The fill value as the bytes a raw read would hold (swapped back after the read)."""
        fill = np.array(self._layout.fill, dtype=self.dtype)
        return fill.byteswap() if self._layout.swap else fill

    # ----- teardown -----------------------------------------------------------------------
    def _close_raw(self) -> None:
        self._close_raw_handles()
        self.mapped = False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._decoded is not None:
            self._decoded.close()
        self._close_raw()
        REOPENABLE.discard(self)
        with H5LOCK:
            if self._file is not None:
                self._file.close()
            self._file = self._dset = None


def open_input(x, *, name: str = "A", threads: int = DEFAULT_THREADS,
               use_mmap: bool = True, map_step: int = STEP_BYTES) -> Source:
    """Validate an operand (spec string, Spec, h5py.Dataset, zarr.Array or NumPy array) and
    open it (a Zarr one as a :class:`.zarrsource.ZarrSource`).

    ``use_mmap=False`` reads raw datasets with ``preadv`` only (no memory map); ``map_step``:
    the most file bytes a mapped copy spans between releases of its pages (:class:`FileMap`).
    """
    if isinstance(map_step, bool) or not isinstance(map_step, int) or map_step < PAGE:
        raise OptionError(f"Expected map_step as a whole number of bytes, at least {PAGE}. "
                          f"Got {map_step!r}.")
    if isinstance(x, Source):
        return x
    if isinstance(x, np.ma.MaskedArray):  # its mask would be ignored: a wrong product
        raise SpecError(f"Expected a NumPy array for {name}, every element multiplied. Got a "
                        f"masked array: pass x.filled(0) to multiply its masked elements as 0.")
    if isinstance(x, np.ndarray):
        return ArraySource(x, f"{name} (NumPy array)")
    if isinstance(x, h5py.Dataset):
        if not x.id.valid:
            raise SpecError(f"Expected an open h5py.Dataset for {name}. Got one whose file is "
                            f"closed.")
        label = f"{name} ({x.file.filename}:{x.name})"
        check_matrix(x.shape, stored_dtype(x), label)
        if is_incomplete(x):
            raise IncompleteOutputError(incomplete_message(label))
        return H5Source(x, label, threads=threads, use_mmap=use_mmap, map_step=map_step)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    from . import zarrsource  # Zarr specs and arrays (zarr is imported only for them)

    if zarrsource.is_zarr_array(x):
        return zarrsource.open_zarr(x, name, threads=threads, map_step=map_step)
    if not isinstance(x, (str, Spec)):
        raise SpecError(f"Expected 'file.h5:/dataset', 'store.zarr[:/array]', an h5py.Dataset, "
                        f"a zarr.Array or a NumPy array for {name}. Got {type(x).__name__}.")
    spec = parse_spec(x)
    if spec.zarr:
        return zarrsource.open_zarr(spec, name, threads=threads, map_step=map_step)
    f, dset = open_h5(spec, name)
    try:
        label = f"{name} ({spec})"
        check_matrix(dset.shape, stored_dtype(dset), label)
        if is_incomplete(dset):
            raise IncompleteOutputError(incomplete_message(label))
        return H5Source(dset, label, own_file=f, threads=threads, use_mmap=use_mmap,
                        map_step=map_step)
    except BaseException:
        with H5LOCK:
            f.close()
        raise
