"""Where a dataset's bytes lie in its file: the facts the fast reader and writer rely on.

:func:`probe_layout` proves what it can (plain POSIX driver, no user block, no filters, no
external or virtual storage, float little- or big-endian) and returns a :class:`Layout`:

* ``contiguous``: one row-major block at byte ``offset``;
* ``chunked``: a grid of row-major chunks, ``chunk_offsets[i, j]`` the byte offset of chunk
  (i, j) or -1 where the chunk was never written (it reads as the fill value);
* ``deflate``: chunks compressed with gzip (deflate), optionally after the shuffle filter: each
  chunk is read raw and inflated with ``zlib`` in the reader threads (zlib releases the GIL),
  ``chunk_sizes[i, j]`` its stored bytes;
* ``zstd``, ``blosc``: the same for hdf5plugin's Zstd filter (a chunk is one zstd frame) and
  Blosc filter (a Blosc 1 buffer), decoded by numcodecs;
* ``h5py``: anything else; ``reason`` says why, and reads go through ``Dataset.read_direct``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import h5py
import numpy as np
from h5py import h5d, h5z

from ._h5 import BFLOAT16, H5LOCK, bf16_order, stored_dtype

#: The compression filters whose chunks bigmm decodes itself (HDF5 filter id -> the layout's
#: kind): deflate, and hdf5plugin's Zstd and Blosc; each may follow the shuffle filter.
DECODED = {h5z.FILTER_DEFLATE: "deflate", 32015: "zstd", 32001: "blosc"}
DECODED_KINDS = tuple(DECODED.values())


def chunk_cells(chunks: tuple[int, int], r0: int, r1: int, c0: int, c1: int):
    """The chunks a region [r0:r1, c0:c1] overlaps, in row-major order: (ci, cj, a0, a1, b0, b1)
    per chunk, where rows a0:a1 and columns b0:b1 (dataset coordinates) are the part of the
    region inside chunk (ci, cj)."""
    cr, cc = chunks
    for ci in range(r0 // cr, (r1 - 1) // cr + 1):
        a0, a1 = max(r0, ci * cr), min(r1, (ci + 1) * cr)
        for cj in range(c0 // cc, (c1 - 1) // cc + 1):
            yield ci, cj, a0, a1, max(c0, cj * cc), min(c1, (cj + 1) * cc)

@dataclass(frozen=True, eq=False)
class Layout:
    kind: str  # "contiguous" | "chunked" | one of DECODED_KINDS | "h5py"
    reason: str = ""
    offset: int | None = None
    chunks: tuple[int, int] | None = None
    chunk_offsets: np.ndarray | None = field(default=None, repr=False)
    chunk_sizes: np.ndarray | None = field(default=None, repr=False)
    shuffle: bool = False
    swap: bool = False  # stored big-endian: bytes must be swapped after a raw read
    fill: float = 0.0

    @property
    def fast(self) -> bool:
        return self.kind != "h5py"

    def data_ranges(self, shape, itemsize: int) -> list[tuple[int, int]]:
        """The file byte ranges [lo, hi) holding a raw (contiguous or unfiltered chunked)
        dataset's elements: one range, or one per stored chunk."""
        if self.kind == "contiguous":
            return [(self.offset, self.offset + int(np.prod(shape)) * itemsize)]
        size = self.chunks[0] * self.chunks[1] * itemsize
        return [(int(o), int(o) + size) for o in self.chunk_offsets.ravel() if o >= 0]


#: Chunk grids with more cells than this are read through h5py: the raw readers' index holds
#: two int64 per cell (a declared 10^7 x 10^7 dataset in 1000 x 1000 chunks: 1.6 GB).
MAX_INDEX_CELLS = 1 << 22


def _fallback(reason: str, chunks=None) -> Layout:
    return Layout("h5py", reason=reason, chunks=chunks)


def probe_layout(dset: h5py.Dataset) -> Layout:
    """Describe ``dset``'s storage for raw reads, or say why h5py must read it."""
    with H5LOCK:
        return _probe(dset)


def _probe(dset: h5py.Dataset) -> Layout:
    chunks = tuple(dset.chunks) if dset.chunks else None
    dtype = stored_dtype(dset)
    if sys.byteorder != "little" or (dtype.kind != "f" and dtype != BFLOAT16):
        return _fallback(f"dtype {dtype.str} on a {sys.byteorder}-endian machine", chunks)
    swap = (bf16_order(dset) if dtype == BFLOAT16 else dtype.byteorder) == ">"
    if swap and dtype == BFLOAT16:  # NumPy's bfloat16 has no big-endian form
        return _fallback("big-endian bfloat16", chunks)
    if dset.file.driver != "sec2":
        return _fallback(f"file driver {dset.file.driver!r}", chunks)
    if dset.file.userblock_size:
        return _fallback("file has a user block", chunks)
    dcpl = dset.id.get_create_plist()
    kind = dcpl.get_layout()
    if dcpl.get_external_count():
        return _fallback("external storage", chunks)
    if kind == h5d.VIRTUAL:
        return _fallback("virtual dataset", chunks)
    # where HDF5 writes no fill value, h5py's reads (into zeros) give 0 for unwritten storage
    fill = 0.0 if skips_unwritten(dcpl) else float(np.asarray(dset.fillvalue, np.float64))
    if chunks is not None and len(chunks) == 2:
        cells = -(-dset.shape[0] // chunks[0]) * -(-dset.shape[1] // chunks[1])
        if cells > MAX_INDEX_CELLS:
            return _fallback(f"{cells} chunks, more than {MAX_INDEX_CELLS} to index", chunks)
    if dcpl.get_nfilters():
        filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
        codes = [code for code, _flags, _values, _name in filters]
        if (kind == h5d.CHUNKED and codes[-1] in DECODED
                and codes[:-1] in ([], [h5z.FILTER_SHUFFLE])):
            index = chunk_index(dset, chunks, None)
            if index is not None and not _partial_chunks_unfiltered(dcpl):
                return Layout(DECODED[codes[-1]], chunks=chunks, chunk_offsets=index[0],
                              chunk_sizes=index[1], shuffle=len(codes) == 2, swap=swap,
                              fill=fill)
        names = [name.decode(errors="replace").split(";")[0] or str(code)
                 for code, _flags, _values, name in filters]
        return _fallback("filters: " + ", ".join(names), chunks)
    if kind == h5d.CONTIGUOUS:
        offset = dset.id.get_offset()
        if offset is None:
            return _fallback("storage not allocated", chunks)
        if dset.id.get_storage_size() != dset.size * dtype.itemsize:
            return _fallback("storage size does not match the shape", chunks)
        return Layout("contiguous", offset=int(offset), swap=swap, fill=fill)
    if kind == h5d.CHUNKED and chunks is not None and len(chunks) == 2:
        index = chunk_index(dset, chunks, chunks[0] * chunks[1] * dtype.itemsize)
        if index is None:
            return _fallback("chunk sizes differ from the chunk shape", chunks)
        return Layout("chunked", chunks=chunks, chunk_offsets=index[0], swap=swap, fill=fill)
    return _fallback(f"layout {kind}", chunks)


def skips_unwritten(dcpl) -> bool:
    """True where HDF5 reads of storage never written (unallocated chunks or contiguous data)
    leave the reader's buffer as it was (fill time "never", or no fill value defined), so that
    a buffer must hold zeros first to read as h5py's ``dset[...]`` does."""
    return (dcpl.get_fill_time() == h5d.FILL_TIME_NEVER
            or dcpl.fill_value_defined() == h5d.FILL_VALUE_UNDEFINED)


def _partial_chunks_unfiltered(dcpl) -> bool:
    """True when edge chunks are stored unfiltered (H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)."""
    try:
        return bool(dcpl.get_chunk_opts())
    except (AttributeError, RuntimeError, ValueError):
        return False


def chunk_index(dset: h5py.Dataset, chunks, want: int | None):
    """(byte offsets, stored sizes) of every chunk, -1/0 where unwritten; None if a chunk's
    size differs from ``want`` or a filter was skipped for it."""
    m, n = dset.shape
    cr, cc = chunks
    offsets = np.full((-(-m // cr), -(-n // cc)), -1, dtype=np.int64)
    sizes = np.zeros(offsets.shape, dtype=np.int64)
    bad = []

    def visit(info) -> None:
        r, c = info.chunk_offset
        if (want is not None and info.size != want) or info.filter_mask:
            bad.append(info)
        offsets[r // cr, c // cc] = info.byte_offset
        sizes[r // cr, c // cc] = info.size

    if hasattr(dset.id, "chunk_iter"):
        dset.id.chunk_iter(visit)
    else:  # older HDF5: one call per chunk
        for i in range(dset.id.get_num_chunks()):
            visit(dset.id.get_chunk_info(i))
    return None if bad else (offsets, sizes)
