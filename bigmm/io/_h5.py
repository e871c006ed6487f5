"""Shared h5py helpers: the lock around h5py calls, filter registration, dtype checks, and the
HDF5 type of bfloat16.

bfloat16 in HDF5. HDF5 2.0 defines ``H5T_FLOAT_BFLOAT16LE``: a 2-byte floating-point type with
the sign at bit 15, 8 exponent bits at bit 7 (bias 127) and 7 mantissa bits, which h5py 3.16
does not name. bigmm writes bfloat16 datasets with exactly that type (:func:`h5_type`; any
HDF5 1.10+ reads it as a custom float), and reads every dataset whose type is that layout, in
either byte order, as bfloat16 (:func:`stored_dtype`). h5py maps such a type to float32
(``dset.dtype`` says float32, and ``dset[...]`` gives exact float32 values); the stored size
is ``dset.id.get_type().get_size() == 2``. Opaque 2-byte types (what h5py makes of an
ml_dtypes array) carry no layout and are refused.
"""

from __future__ import annotations

import json
import os
import threading
import weakref

import h5py
import numpy as np

try:  # registers Blosc, LZ4, Zstd, ... filters with HDF5; without it h5py names the filter
    import hdf5plugin  # noqa: F401
except ImportError:  # pragma: no cover
    pass

from ..errors import DtypeError, ShapeError
from ..units import DTYPES, dtype_name as _known, numpy_dtype

#: Serialises every h5py call made by bigmm's I/O threads (h5py is not parallel anyway; the lock
#: keeps multi-call sequences such as select + read atomic).
H5LOCK = threading.RLock()

#: Attribute on an output dataset: False while a run writes it, True once finished.
COMPLETE_ATTR = "bigmm_complete"
#: Attribute on a finished output: its job, the identities of its inputs and its fingerprint
#: (JSON), so that resuming it again knows it is complete.
JOB_ATTR = "bigmm_job"
#: A token drawn when bigmm creates an output, journaled: a resume refuses an output
#: replaced since, even where the file system reuses the old one's inode.
RUN_ATTR = "bigmm_run"

#: Bytes reserved for the job record beyond its size when the output is created (room for the
#: fingerprint and for rounding).
RECORD_SLACK = 256


def reserve_job_record(attrs, nbytes: int) -> None:
    """An empty ``bigmm_job`` of fixed size (``nbytes`` plus slack, rounded up), made with the
    output, so that finishing rewrites attributes in place: HDF5 allocates nothing then, and a
    kill while the file is flushed leaves the dataset readable (an attribute added at the end
    extends the object header, a multi-write change a kill can leave unreadable)."""
    size = -(-(int(nbytes) + RECORD_SLACK) // RECORD_SLACK) * RECORD_SLACK
    attrs.create(JOB_ATTR, np.zeros((), f"S{size}"))


def write_job_record(attrs, text: str) -> None:
    """Store the finished job record: in place in the reserved attribute where it fits (padded
    with NULs, which HDF5's fixed strings drop when read), else as a new attribute."""
    raw = text.encode()
    if JOB_ATTR in attrs:
        dt = attrs.get_id(JOB_ATTR).dtype
        if dt.kind == "S" and dt.itemsize >= len(raw):
            attrs.modify(JOB_ATTR, np.array(raw, dt))
            return
        del attrs[JOB_ATTR]
    attrs[JOB_ATTR] = text


def load_record(raw) -> dict | None:
    """A ``bigmm_job`` attribute as read (str, bytes, or the dict zarr may give) as a dict;
    None where there is none, or it is empty (reserved) or not a JSON object."""
    if raw is None or isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw if isinstance(raw, str) else bytes(raw).decode())
    except (ValueError, TypeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


FLOAT_DTYPES = tuple(numpy_dtype(name) for name in DTYPES)
BFLOAT16 = numpy_dtype("bfloat16")
#: (sign position, exponent position, exponent bits, mantissa position, mantissa bits), bias.
_BF16_FIELDS, _BF16_BIAS = (15, 7, 8, 0, 7), 127


def _bf16_type(order: int) -> h5py.h5t.TypeFloatID:
    t = h5py.h5t.IEEE_F16LE.copy()  # 2 bytes, IEEE conventions (implied MSB, zero padding)
    t.set_fields(*_BF16_FIELDS)
    t.set_ebias(_BF16_BIAS)
    t.set_order(order)
    return t


#: bfloat16 as HDF5 stores it (the layout of HDF5 2.0's H5T_FLOAT_BFLOAT16LE / BE).
BF16_LE, BF16_BE = _bf16_type(h5py.h5t.ORDER_LE), _bf16_type(h5py.h5t.ORDER_BE)


def h5_type(dtype) -> h5py.h5t.TypeID:
    """The HDF5 type bigmm creates datasets of ``dtype`` (a NumPy dtype or a DTYPES name)
    with: a new copy of :data:`BF16_LE` for bfloat16, else h5py's."""
    dtype = numpy_dtype(dtype) if isinstance(dtype, str) and dtype in DTYPES else np.dtype(dtype)
    if dtype == BFLOAT16:
        return BF16_LE.copy()
    return h5py.h5t.py_create(dtype, logical=True)


def is_bf16(tid) -> bool:
    """Whether the HDF5 type ``tid`` is bfloat16 (in either byte order)."""
    return (isinstance(tid, h5py.h5t.TypeFloatID) and tid.get_size() == 2
            and tuple(tid.get_fields()) == _BF16_FIELDS and tid.get_ebias() == _BF16_BIAS)


def stored_dtype(dset: h5py.Dataset) -> np.dtype:
    """The dtype of ``dset``'s stored elements: bfloat16 for the bfloat16 HDF5 type (h5py
    itself says float32), else h5py's dtype."""
    with H5LOCK:
        tid = dset.id.get_type()
        return BFLOAT16 if is_bf16(tid) else dset.dtype


def bf16_order(dset: h5py.Dataset) -> str:
    """"<" or ">": the byte order of a bfloat16 dataset's stored elements."""
    with H5LOCK:
        return ">" if dset.id.get_type().get_order() == h5py.h5t.ORDER_BE else "<"


def read_region(dset: h5py.Dataset, sel, out: np.ndarray) -> None:
    """h5py's ``read_direct`` of ``sel`` into ``out`` (call holding H5LOCK); a bfloat16
    ``out`` is read in the bfloat16 HDF5 type (h5py would make it opaque)."""
    if out.dtype == BFLOAT16:
        _direct(dset, sel, out, write=False)
    else:
        dset.read_direct(out, sel)


def write_region(dset: h5py.Dataset, sel, src: np.ndarray) -> None:
    """h5py's ``write_direct`` of ``src`` into ``sel`` (call holding H5LOCK; bfloat16 as in
    :func:`read_region`)."""
    src = np.ascontiguousarray(src)
    if src.dtype == BFLOAT16:
        _direct(dset, sel, src, write=True)
    else:
        dset.write_direct(src, dest_sel=sel)


def _direct(dset: h5py.Dataset, sel, arr: np.ndarray, write: bool) -> None:
    """Read or write the 2-D region ``sel`` (a tuple of two slices) in the bfloat16 type."""
    rows, cols = sel
    start = (rows.start or 0, cols.start or 0)
    count = arr.shape
    fspace = dset.id.get_space()
    fspace.select_hyperslab(start, count)
    mspace = h5py.h5s.create_simple(count)
    if write:
        dset.id.write(mspace, fspace, arr.view(np.uint16), mtype=BF16_LE)
    else:
        dset.id.read(mspace, fspace, arr.view(np.uint16), mtype=BF16_LE)


def dtype_name(dtype: np.dtype) -> str:
    """A readable name for any HDF5 or NumPy dtype (string, compound, complex, ...)."""
    dtype = np.dtype(dtype)
    if dtype == BFLOAT16:
        return "bfloat16"
    if h5py.check_string_dtype(dtype) is not None or dtype.kind in "SU":
        return f"string ({dtype.str})"
    if dtype.names:
        return f"compound ({', '.join(dtype.names)})"
    if h5py.check_vlen_dtype(dtype) is not None:
        return "variable-length"
    if dtype.kind == "O":
        return "object"
    order = " big-endian" if dtype.byteorder == ">" else ""
    return f"{dtype.newbyteorder('=').name}{order}"


def check_matrix(shape, dtype, label: str) -> np.dtype:
    """Raise unless 2-D with at least one row and one column, and of a dtype in DTYPES (any
    byte order); return the native dtype."""
    if shape is None:
        raise ShapeError(f"Expected a 2-D matrix for {label}. Got an empty dataset (no "
                         f"dataspace).")
    if len(shape) != 2:
        raise ShapeError(
            f"Expected a 2-D matrix for {label}. Got shape {tuple(shape)} ({len(shape)}-D).")
    if 0 in tuple(shape):
        raise ShapeError(f"Expected a matrix with at least one row and one column for {label}. "
                         f"Got shape {tuple(shape)}.")
    dtype = np.dtype(dtype)
    name = _known(dtype)
    if name is None:
        raise DtypeError(f"Expected {', '.join(DTYPES)} for {label}. Got {dtype_name(dtype)}"
                         + (" (an opaque 2-byte type: write bfloat16 with bigmm's HDF5 type, "
                            "see the README)" if dtype.kind == "V" and dtype.itemsize == 2
                            and not dtype.names else "") + ".")
    return numpy_dtype(name)


def is_incomplete(dset: h5py.Dataset) -> bool:
    """True when bigmm marked the dataset as left incomplete by an interrupted run."""
    with H5LOCK:
        flag = dset.attrs.get(COMPLETE_ATTR, None)
    return flag is not None and not bool(flag)


#: Input sources (:class:`.source.H5Source`) that may hold an h5py handle they can drop and reopen (see release_h5_handles).
REOPENABLE: "weakref.WeakSet" = weakref.WeakSet()


def release_h5_handles(path: str) -> None:
    """Close the h5py handles bigmm's sources hold on ``path`` (they reopen on their next read).

    HDF5 refuses to open a file for writing while this process holds it read-only; the output
    layer calls this (holding H5LOCK) before it opens an input's file to write the output.
    """
    real = os.path.realpath(path)
    with H5LOCK:
        for src in list(REOPENABLE):
            if real in src.held:  # its dataset's file, or one holding a link to it
                src._drop_handle()
