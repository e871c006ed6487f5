"""What an output already is, looked at read-only before a run opens it (nothing created,
locked or recovered): the dtype of one that is kept (:func:`existing_dtype`), whether it
is one of the inputs (:func:`refuse_output_alias`, as :func:`.output.open_output` refuses
it), whether it can be written and holds the old C asked for (:func:`check_output`), and
where it is stored (:func:`output_spec`)."""

from __future__ import annotations

import os

import h5py
import numpy as np

from ..errors import BigmmError, SpecError
from ..units import numpy_dtype
from . import h5atomic, zarrmeta, zarrsource
from ._h5 import H5LOCK, stored_dtype
from .filesink import PARTIAL_SUFFIX
from .identity import array_footprint, refuse_alias
from .journal import journal_path, parse_journal
from .lock import h5_open_retry
from .output import (check_folder, check_in_place, _check_old_c, _check_open, _check_shape,
                     _storage, refuse_existing)
from .spec import Spec, parse_spec


def existing_dtype(x, *, resume: bool = False, reads_c: bool = False) -> np.dtype | None:
    """The dtype of the output C that ``x`` names where it is kept and so decides C's dtype:
    an array or h5py.Dataset written in place, and a spec's dataset where it is resumed (the
    dtype its journal recorded) or holds old C (``reads_c``); None where C is new (or
    replaced)."""
    if isinstance(x, np.ndarray):
        return x.dtype
    if isinstance(x, h5py.Dataset):
        _check_open(x)
        return stored_dtype(x)
    if zarrsource.is_zarr_array(x):
        return np.dtype(x.dtype)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, Spec)) or not (resume or reads_c):
        return None
    spec = parse_spec(x)
    recorded = parse_journal(journal_path(spec)) if resume else None
    if recorded is not None and recorded[0].get("dtype"):
        try:
            return numpy_dtype(recorded[0]["dtype"])
        except BigmmError:
            return None
    if spec.zarr:
        if zarrmeta.node_type(zarrsource.array_dir(spec.path, spec.dataset)) != "array":
            return None
        return np.dtype(zarrsource.open_array(spec, "C").dtype)
    if not os.path.isfile(spec.path) or not h5py.is_hdf5(spec.path):
        return None
    with H5LOCK, h5_open_retry(lambda: h5py.File(spec.path, "r"), spec.path, str(spec)) as f:
        obj = f.get(spec.dataset)
        return stored_dtype(obj) if isinstance(obj, h5py.Dataset) else None


def output_spec(x) -> tuple[Spec | None, str]:
    """The output ``x`` (a spec, an h5py.Dataset, a zarr.Array, None or a NumPy array) as the
    Spec of its storage and its label; None for arrays (and for Zarr arrays outside a local
    store, which :func:`.output.open_output` refuses)."""
    if x is None or isinstance(x, np.ndarray):
        return None, "C (NumPy array)"
    if isinstance(x, h5py.Dataset):
        _check_open(x)
        return (Spec(os.path.realpath(x.file.filename), x.name),
                f"C ({x.file.filename}:{x.name})")
    if zarrsource.is_zarr_array(x):
        spec = zarrsource.spec_of(x)
        return spec, f"C ({spec})" if spec is not None else "C (zarr.Array)"
    if isinstance(x, (str, os.PathLike, Spec)):
        spec = parse_spec(os.fspath(x) if isinstance(x, os.PathLike) else x)
        return spec, f"C ({spec})"
    raise SpecError(f"Expected 'file.h5:/dataset', 'store.zarr[:/array]', None, an "
                    f"h5py.Dataset, a zarr.Array or a NumPy array for the output. Got "
                    f"{type(x).__name__}.")


def refuse_output_alias(x, inputs) -> None:
    """OutputIsInputError where the output ``x`` (None, a spec, an h5py.Dataset, a zarr.Array
    or a NumPy array) shares a byte or an HDF5 object with one of the opened ``inputs``, as
    :func:`.output.open_output` refuses it, with the same message; read-only (an HDF5 file
    with a change left to finish is not looked into: see :mod:`.h5atomic`)."""
    if x is None:
        return
    if isinstance(x, np.ndarray):
        refuse_alias(array_footprint(x), inputs, "C (NumPy array)")
        return
    spec, label = output_spec(x)
    if spec is None:  # a Zarr array not in a local store: open_output refuses it for that
        return
    if not spec.zarr and os.path.exists(h5atomic.redo_path(spec.path)):
        return  # a killed run's change to finish first: the run does, then refuses it
    store = _storage(spec)
    store.check(spec)  # a place that cannot hold the output, as open_output says it
    info = store.inspect(spec, spec.dataset + PARTIAL_SUFFIX, label)
    refuse_alias(info["footprint"], inputs, label)


def check_output(x, shape, *, reads_c: bool, resume: bool = False,
                 overwrite: bool | None = None) -> None:
    """Refuse, read-only and as :func:`.output.open_output` refuses it, an output ``x`` that
    cannot be written (OutputNotWritable: its directory missing or not writable, a file that
    is not HDF5; an array, dataset or zarr.Array that cannot take C in place:
    :func:`.output.check_in_place`) or, for beta != 0 (``reads_c``), that holds no old C
    (OperandNotFound) or one not of ``shape`` (ShapeError); an h5py.Dataset with no
    dataspace (ShapeError). A resumed output with a journal is left to the run (it may be
    mid-swap). With ``overwrite`` False, an output file or array in the way is refused as
    the run refuses it (OutputExistsError: an interrupted run's journal without ``resume``,
    an output C without ``reads_c``); None: not looked at."""
    check_in_place(x, reads_c=reads_c, resume=resume)  # read-only, old C in place, ...
    if isinstance(x, h5py.Dataset):
        spec, label = output_spec(x)
        _check_shape(x.shape, shape, label)
        return
    if not isinstance(x, (str, os.PathLike, Spec)):
        return  # None or an array: its shape and dtype checked where the plan is made
    spec, label = output_spec(x)
    check_folder(spec.path)
    if not spec.zarr and os.path.exists(h5atomic.redo_path(spec.path)):
        return  # a killed run's change to finish first (see refuse_output_alias)
    store = _storage(spec)
    store.check(spec)
    refuses = overwrite is False and not resume
    if not (reads_c or refuses):
        return
    journaled = parse_journal(journal_path(spec)) is not None
    if resume and journaled:
        return
    info = store.inspect(spec, spec.dataset + PARTIAL_SUFFIX, label)
    if refuses:
        refuse_existing(spec, journaled,
                        not reads_c and (info["exists"] or bool(info.get("dangling"))))
    if reads_c:
        _check_old_c(spec, info, shape, label)
