"""Seeded random operands written to HDF5 or Zarr block by block (never the whole matrix in
memory).

The matrix is defined independently of how it is written: its elements, in row-major order, are
cut into fixed units of ``UNIT`` elements, and unit ``u`` is drawn from
``SeedSequence(seed, spawn_key=(u,))`` (the ``u``-th child that ``SeedSequence(seed).spawn``
would give). Standard-normal values are drawn in float64 and rounded to the dtype, so a float32
(float16, bfloat16) matrix is the rounded float64 matrix of the same seed. bfloat16 datasets are
written in the bfloat16 HDF5 type (see :mod:`._h5`). Writes then go in row blocks of any
size (aligned to the chunk rows where chunked), each block drawing only the units it overlaps:
the result is the same for every block size, and memory stays bounded for matrices larger than
RAM. A Zarr spec (``store.zarr[:/array]``) writes a Zarr v3 array of the same values: every Zarr
array is chunked, so its layouts are "chunked" (uncompressed) and "compressed" (zstd, blosc or
gzip); "contiguous" is refused there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np

from ..errors import (DiskFullError, DtypeError, OptionError, OutputExistsError,
                      OutputNotWritable, ShapeError)
from ..units import DTYPES, format_bytes, numpy_dtype, parse_seed
from ..units import dtype_name as _dtype_name
from ._h5 import COMPLETE_ATTR, h5_type, stored_dtype, write_region
from .durable import free_bytes
from .spec import parse_spec
from .output import check_file, check_folder, check_parents, h5_kind

#: Elements per random unit (fixed: changing it changes every generated matrix).
UNIT = 1 << 16
#: Elements per write block (default; any value gives the same matrix).
BLOCK_ELEMENTS = 1 << 23
LAYOUTS = ("contiguous", "chunked", "compressed")
COMPRESSIONS = ("gzip", "zstd", "lz4")
#: Codecs of the compressed layout of a Zarr array.
ZARR_COMPRESSIONS = ("gzip", "zstd", "blosc")
#: Default chunk edge for chunked and compressed layouts.
CHUNK_EDGE = 512


@dataclass(frozen=True)
class Layout:
    """How the dataset is stored: ``chunks`` None means contiguous."""

    chunks: tuple[int, int] | None
    filter: dict
    codec: str | None = None  # a Zarr array's compressor (None: uncompressed)


def generate(spec, shape, *, dtype: str = "float32", layout: str | None = None,
             chunks=None, compression: str | None = None, seed: int = 0,
             overwrite: bool = False,
             block_elements: int = BLOCK_ELEMENTS) -> str:
    """Write a seeded standard-normal matrix of ``shape`` to the dataset ``spec``; return the spec.

    ``layout``: "contiguous", "chunked" (``chunks`` or 512 x 512) or "compressed" (chunked with
    ``compression`` "gzip" (the default), "zstd" or "lz4"; the last two through hdf5plugin).
    Without a layout: "compressed" where ``compression`` is given, else "chunked" where
    ``chunks`` are, else "contiguous"; options the layout cannot use are an error. A Zarr spec
    writes a Zarr v3 array: "chunked" (the default) or "compressed" with "zstd" (the default
    there), "blosc" (lz4, byte shuffle) or "gzip". An existing
    dataset is replaced only with ``overwrite``. A failed write removes the partial dataset.
    """
    m, n = parse_shape(shape)
    dtype = parse_dtype(dtype)
    seed = parse_seed(seed)
    if (isinstance(block_elements, bool) or not isinstance(block_elements, (int, np.integer))
            or block_elements < 1):
        raise OptionError(f"Expected block_elements as a positive integer. "
                          f"Got {block_elements!r}.")
    parsed = parse_spec(spec)
    lay = parse_layout(layout, chunks, compression, (m, n), zarr=parsed.zarr)
    if not lay.filter and not compression:  # uncompressed: its bytes must fit the disk
        _check_space(parsed.path, m * n * numpy_dtype(dtype).itemsize, str(parsed))
    if parsed.zarr:
        from .zarrgen import generate_zarr
        from .zarrsource import check_zarr_dtype

        check_zarr_dtype(dtype, str(parsed))

        return generate_zarr(parsed, (m, n), dtype, lay, seed, overwrite, block_elements,
                             _draw)
    path, name = _split_spec(spec)
    f = _open_file(path)
    try:
        check_parents(f, parse_spec(f"{path}:{name}"))
        if name in f:  # a dataset, a link to nothing, or another object
            obj = f.get(name)
            if obj is not None and not isinstance(obj, h5py.Dataset):  # datasets only
                raise OutputNotWritable(f"Expected a dataset path for {path}:{name}. Got "
                                        f"{h5_kind(obj)}.")
            if not overwrite:
                raise OutputExistsError(
                    f"Expected {path}:{name} not to exist (pass overwrite=True to replace it). "
                    f"Got an existing dataset.")
            del f[name]
        dset = f.create_dataset(name, shape=(m, n), dtype=h5py.Datatype(h5_type(dtype)),
                                chunks=lay.chunks, track_times=False, **lay.filter)
        dset.attrs[COMPLETE_ATTR] = False  # a killed run leaves a dataset marked incomplete
        dset.attrs["bigmm_seed"] = seed  # now, so that the end rewrites one flag in place
        f.flush()  # the mark on disk: a kill before the end leaves a file HDF5 can open
        try:
            _fill(dset, seed, block_elements, lay.chunks)
        except BaseException:
            del f[name]
            raise
        dset.attrs.modify(COMPLETE_ATTR, True)
    finally:
        f.close()
    return f"{path}:{name}"


def incomplete_message(x, name: str) -> str | None:
    """The error's message where ``x`` (a spec, h5py.Dataset or zarr.Array) is marked
    incomplete as an interrupted ``generate`` leaves it: no run's mark or job record and no
    journal beside it (an interrupted multiply's output has them, and resumes). None
    otherwise, or where it cannot be looked at."""
    from ._h5 import JOB_ATTR, RUN_ATTR
    from .journal import journal_path

    try:
        if isinstance(x, h5py.Dataset):
            spec = parse_spec(f"{x.file.filename}:{x.name}")
            attrs = dict(x.attrs)
        elif isinstance(x, np.ndarray) or x is None:
            return None
        else:
            from . import zarrsource

            if zarrsource.is_zarr_array(x):
                spec, attrs = zarrsource.spec_of(x), dict(x.attrs)
            else:
                spec = parse_spec(x)
                if spec.zarr:
                    attrs = dict(zarrsource.open_array(spec, name).attrs)
                else:
                    with h5py.File(spec.path, "r") as f:
                        attrs = dict(f[spec.dataset].attrs)
        if (spec is None or attrs.get(COMPLETE_ATTR, True) or RUN_ATTR in attrs
                or JOB_ATTR in attrs or os.path.exists(journal_path(spec))):
            return None
    except Exception:  # noqa: BLE001 - the open's own error stands
        return None
    return (f"Expected a complete dataset. Got {name} ({spec}), left incomplete by an "
            f"interrupted generate (there is no run to resume); run generate again with "
            f"overwrite=True.")


def block(shape, seed: int, r0: int, r1: int, dtype: str = "float64") -> np.ndarray:
    """Rows [r0, r1) of the matrix ``generate`` writes for ``shape`` and ``seed`` (in memory)."""
    m, n = parse_shape(shape)
    seed = parse_seed(seed)
    if (not all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in (r0, r1))
            or not 0 <= r0 <= r1 <= m):
        raise ShapeError(f"Expected integers 0 <= r0 <= r1 <= {m}. Got r0={r0!r}, r1={r1!r}.")
    flat = _draw(seed, int(r0) * n, int(r1) * n)
    return flat.reshape(r1 - r0, n).astype(numpy_dtype(parse_dtype(dtype)), copy=False)


# ----- parsing -----------------------------------------------------------------------------

def parse_shape(shape) -> tuple[int, int]:
    """(M, N) of positive integers."""
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if (dims is None or len(dims) != 2
            or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                       for d in dims)):
        raise ShapeError(f"Expected a shape of two positive integers (M, N). Got {shape!r}.")
    return int(dims[0]), int(dims[1])


def parse_dtype(dtype) -> str:
    """A name in DTYPES ('float16', 'bfloat16', 'float32' or 'float64')."""
    name = _dtype_name(dtype)
    if name is None:
        raise DtypeError(f"Expected dtype {', '.join(DTYPES)}. Got {dtype!r}.")
    return name


def parse_layout(layout: str | None, chunks, compression: str | None,
                 shape: tuple[int, int], zarr: bool = False) -> Layout:
    """Storage settings for h5py's ``create_dataset``, or with ``zarr`` for a Zarr array (see
    :func:`generate` for the rules)."""
    if layout is None:
        layout = ("compressed" if compression is not None else
                  "chunked" if chunks is not None or zarr else "contiguous")
    if layout not in LAYOUTS:
        raise OptionError(f"Expected layout to be one of {', '.join(LAYOUTS)}. Got {layout!r}.")
    if zarr and layout == "contiguous":
        raise OptionError("Expected the chunked or compressed layout for a Zarr array (every "
                          "Zarr array is chunked; chunks of whole rows come closest to "
                          "contiguous). Got layout='contiguous'.")
    if compression is not None and layout != "compressed":
        raise OptionError(f"Expected compression only with the compressed layout. Got "
                          f"compression={compression!r} with layout={layout!r}.")
    if layout == "contiguous":
        if chunks is not None:
            raise OptionError(f"Expected no chunks for a contiguous layout. Got {chunks!r}.")
        return Layout(None, {})
    if chunks is None:
        chunks = (min(shape[0], CHUNK_EDGE), min(shape[1], CHUNK_EDGE))
    try:
        chunks = parse_shape(chunks)
    except ShapeError:
        raise OptionError(f"Expected chunks as two positive integers. Got {chunks!r}.") from None
    if chunks[0] > shape[0] or chunks[1] > shape[1]:
        raise OptionError(f"Expected chunks no larger than the shape {shape}. Got {chunks}.")
    if layout == "chunked":
        return Layout(chunks, {})
    if zarr:
        codec = compression or "zstd"
        if codec not in ZARR_COMPRESSIONS:
            raise OptionError(f"Expected compression to be one of "
                              f"{', '.join(ZARR_COMPRESSIONS)} for a Zarr array. Got {codec!r}.")
        return Layout(chunks, {}, codec)
    return Layout(chunks, _filter(compression or "gzip"))


def describe_layout(lay: Layout) -> str:
    """"contiguous", "chunked 512 x 512" or "gzip, chunks 512 x 512" for a Layout."""
    if lay.chunks is None:
        return "contiguous"
    shape = f"{lay.chunks[0]} x {lay.chunks[1]}"
    if lay.codec:
        return f"{lay.codec}, chunks {shape}"
    if not lay.filter:
        return f"chunked {shape}"
    codec = lay.filter.get("compression")
    name = {"gzip": "gzip", 32015: "zstd", 32004: "lz4"}.get(codec, str(codec))
    return f"{name}, chunks {shape}"


def _filter(compression: str) -> dict:
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 1}
    if compression in ("zstd", "lz4"):
        import hdf5plugin

        return dict(hdf5plugin.Zstd() if compression == "zstd" else hdf5plugin.LZ4())
    raise OptionError(
        f"Expected compression to be one of {', '.join(COMPRESSIONS)}. Got {compression!r}.")


def _split_spec(spec) -> tuple[str, str]:
    s = parse_spec(spec)
    return s.path, s.dataset


def _open_file(path: str) -> h5py.File:
    check_folder(path)  # as multiply checks its output: a folder, a file not HDF5
    check_file(path)
    try:
        return h5py.File(path, "a")
    except OSError as e:
        raise OutputNotWritable(
            f"Expected a writable HDF5 file at {path}. Got: {e.strerror or e}.") from None


# ----- drawing -----------------------------------------------------------------------------

def _draw(seed: int, e0: int, e1: int) -> np.ndarray:
    """Elements [e0, e1) of the row-major matrix, in float64."""
    out = np.empty(e1 - e0, dtype=np.float64)
    u0, u1 = e0 // UNIT, -(-e1 // UNIT)
    for u in range(u0, u1):
        lo, hi = max(e0, u * UNIT), min(e1, (u + 1) * UNIT)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(u,))))
        vals = rng.standard_normal(hi - u * UNIT)  # a unit's prefix is the same at any length
        out[lo - e0:hi - e0] = vals[lo - u * UNIT:]
    return out


def _fill(dset: h5py.Dataset, seed: int, block_elements: int, chunks) -> None:
    m, n = dset.shape
    rows = max(1, block_elements // n)
    if chunks is not None:
        rows = max(chunks[0], rows // chunks[0] * chunks[0])
    dtype = stored_dtype(dset)  # native: generate creates the dataset
    if n > block_elements:  # rows wider than a block: each row in pieces
        for r in range(m):
            for c0 in range(0, n, block_elements):
                c1 = min(n, c0 + block_elements)
                write_region(dset, np.s_[r:r + 1, c0:c1],
                             _draw(seed, r * n + c0, r * n + c1).reshape(1, -1).astype(dtype))
        return
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        write_region(dset, np.s_[r0:r1, 0:n],
                     _draw(seed, r0 * n, r1 * n).reshape(r1 - r0, n).astype(dtype))


def _check_space(path: str, need: int, label: str) -> None:
    """DiskFullError before writing a matrix the file system cannot hold."""
    free = free_bytes(path)  # None: the folder's own error comes when it is opened
    if free is not None and need > free:
        raise DiskFullError(f"Expected {format_bytes(need)} free on the file system of "
                            f"'{path}' for {label}. Got {format_bytes(free)} free. Nothing was "
                            f"written.")
