"""Opening HDF5 operands for reading: :func:`open_h5` finds the file and dataset (a missing file,
group or dataset, or a dangling link, is OperandNotFound naming what is there), and
:func:`check_readable` fails where h5py would fail on the first read or quietly read fill
values instead of data (an unavailable filter, a missing external file or virtual source).
"""

from __future__ import annotations

import os

import h5py
from h5py import h5d, h5z

from ..errors import OperandNotFound, ReadError
from ._h5 import H5LOCK
from .spec import Spec


def check_readable(dset: h5py.Dataset, label: str) -> None:
    """Raise where h5py would fail on the first read, or quietly read fill values instead of
    data: an unavailable filter, a missing external raw file (ReadError), a missing source
    file or dataset of a virtual dataset (OperandNotFound). Reads the first and the last
    element."""
    with H5LOCK:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_layout() == h5d.VIRTUAL:
            _check_virtual_sources(dset, dcpl, label)
        m, n = dset.shape
        try:
            dset[0:1, 0:1]
            dset[m - 1:m, n - 1:n]
        except Exception as exc:
            missing = [f"{code} ({name.decode(errors='replace').split(';')[0]})"
                       for code, _flags, _values, name in
                       (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))
                       if not h5z.filter_avail(code)]
            why = (f"filter {', '.join(missing)} not available here (install hdf5plugin or "
                   f"set HDF5_PLUGIN_PATH)" if missing else f"{type(exc).__name__}: {exc}")
            raise ReadError(f"Expected a readable dataset for {label}. Got {why}.") from exc


def data_files(dset: h5py.Dataset) -> list[str]:
    """The other files that hold the dataset's data (its external raw files, the source files
    of a virtual dataset), found as HDF5 finds them (call holding H5LOCK): a change to one of
    them changes the data, not the dataset's own file."""
    dcpl = dset.id.get_create_plist()
    home = os.path.dirname(os.path.abspath(dset.file.filename))
    names = [dcpl.get_external(i)[0] for i in range(dcpl.get_external_count())]
    if dcpl.get_layout() == h5d.VIRTUAL:
        names += [dcpl.get_virtual_filename(i) for i in range(dcpl.get_virtual_count())]
    own, out = os.path.realpath(dset.file.filename), []
    for name in names:
        name = os.fsdecode(name)
        if name == "." or "%" in name:  # the dataset's own file; printf-style source names
            continue
        found = next((p for p in (name, os.path.join(home, name)) if os.path.isfile(p)), None)
        if found is not None and os.path.realpath(found) not in (own, *out):
            out.append(os.path.realpath(found))
    return out


def _check_virtual_sources(dset: h5py.Dataset, dcpl, label: str) -> None:
    """Each source of a virtual dataset must exist: HDF5 reads a missing one as fill values."""
    home = os.path.dirname(os.path.abspath(dset.file.filename))
    for i in range(dcpl.get_virtual_count()):
        name, inner = dcpl.get_virtual_filename(i), dcpl.get_virtual_dsetname(i)
        if "%" in name:  # printf-style source names: not resolved here
            continue
        if name == ".":
            found = dset.file.filename
        else:
            found = next((p for p in (name, os.path.join(home, name)) if os.path.isfile(p)),
                         None)
        ok = found is not None and h5py.is_hdf5(found)
        if ok:
            with h5py.File(found, "r") as f:
                ok = isinstance(f.get(inner), h5py.Dataset)
        if not ok:
            raise OperandNotFound(f"Expected the source '{name}:{inner}' of the virtual "
                                  f"dataset {label}. Got no such file or dataset (HDF5 would "
                                  f"read fill values in its place).")


def _list_datasets(f: h5py.File, limit: int = 8) -> str:
    names: list[str] = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            names.append("/" + name)
        return True if len(names) >= limit else None

    f.visititems(visit)
    return ", ".join(names) if names else "no datasets"


def _missing(f: h5py.File, path: str) -> str:
    """What is at ``path`` where no object is: a dangling link, or nothing."""
    try:
        link = f.get(path, getlink=True)
    except (KeyError, ValueError, RuntimeError):
        link = None
    if isinstance(link, h5py.ExternalLink):
        return f"an external link to '{link.filename}:{link.path}', which cannot be opened"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to '{link.path}', which does not exist"
    return f"none (the file holds {_list_datasets(f)})"


def _finish_committed(path: str, name: str) -> None:
    """Finish a change to the file's structure that a killed bigmm run committed (its redo
    log beside the file: :mod:`.h5atomic`) before the file is read: an output written into
    the inputs' own file, killed while its change was copied in, leaves the file unreadable
    until then."""
    from . import h5atomic
    from .lock import h5_open_retry

    if not os.path.exists(h5atomic.redo_path(path)) or h5atomic.open_here(path):
        return
    try:
        h5_open_retry(lambda: h5atomic.recover(path), path, name)
    except PermissionError as exc:
        raise ReadError(f"Expected to finish the change an interrupted bigmm run committed to "
                        f"'{path}' (its redo log is beside it) before reading {name}. Got "
                        f"{exc.strerror or exc} writing the file.") from exc


def open_h5(spec: Spec, name: str, mode: str = "r") -> tuple[h5py.File, h5py.Dataset]:
    """Open ``spec`` read-only, raising OperandNotFound for a missing file, group or dataset."""
    path = spec.path
    if not os.path.exists(path):
        raise OperandNotFound(f"Expected an existing HDF5 file for {name}. "
                              f"Got '{path}' (no such file).")
    if not os.path.isdir(path) and not os.access(path, os.R_OK):
        raise ReadError(f"Expected a readable file for {name}. Got '{path}' (permission "
                        f"denied).")
    _finish_committed(path, name)
    try:
        hdf5 = not os.path.isdir(path) and h5py.is_hdf5(path)
    except OSError as exc:
        raise ReadError(f"Expected a readable HDF5 file for {name}. Got '{path}': "
                        f"{exc.strerror or exc}.") from exc
    if not hdf5:
        raise OperandNotFound(f"Expected an HDF5 file for {name}. Got '{path}' (not HDF5).")
    with H5LOCK:
        try:
            f = h5py.File(path, mode)
        except OSError as exc:
            raise ReadError(f"Expected a readable HDF5 file for {name}. "
                            f"Got '{path}': {exc}.") from exc
        try:
            obj = f.get(spec.dataset)
            if obj is None:
                raise OperandNotFound(f"Expected a dataset '{spec.dataset}' in '{path}' for "
                                      f"{name}. Got {_missing(f, spec.dataset)}.")
            if not isinstance(obj, h5py.Dataset):
                raise OperandNotFound(f"Expected a dataset at '{spec.dataset}' in '{path}' "
                                      f"for {name}. Got a {type(obj).__name__.lower()}.")
        except BaseException:
            f.close()
            raise
    return f, obj
