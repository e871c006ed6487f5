"""Shared h5py helpers: the lock around h5py calls, filter registration, dtype checks."""

from __future__ import annotations

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
from ..units import DTYPES

#: Serialises every h5py call made by bigmm's I/O threads (h5py is not parallel anyway; the lock
#: keeps multi-call sequences such as select + read atomic).
H5LOCK = threading.RLock()

#: Attribute on an output dataset: False while a run writes it, True once finished.
COMPLETE_ATTR = "bigmm_complete"
#: Attribute on a finished output: its job, the identities of its inputs and its fingerprint
#: (JSON), so that resuming it again knows it is complete.
JOB_ATTR = "bigmm_job"

FLOAT_DTYPES = tuple(np.dtype(name) for name in DTYPES)


def dtype_name(dtype: np.dtype) -> str:
    """A readable name for any HDF5 or NumPy dtype (string, compound, complex, ...)."""
    dtype = np.dtype(dtype)
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
    """Raise unless 2-D with at least one row and one column, and float32/float64 (any byte
    order); return the native dtype."""
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
    native = dtype.newbyteorder("=") if dtype.kind == "f" else dtype
    if dtype.names or native not in FLOAT_DTYPES:
        raise DtypeError(f"Expected float32 or float64 for {label}. Got {dtype_name(dtype)}.")
    return native


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
            if src.path == real:
                src._drop_handle()
