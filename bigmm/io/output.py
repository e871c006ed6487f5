"""open_output: validate the output C, then create, overwrite, resume it, or find it complete.

A file output (a spec, or an h5py.Dataset written in place) is locked for the run
(:class:`.lock.OutputLock`: one writer per output) before anything is created or deleted,
refused when it is one of the inputs by any route (:func:`.identity.refuse_alias`), and
journaled. The journal's header records the job and the identity of every input (and of old C when
beta != 0, :mod:`.identity`); a resumed run compares them and refuses anything that changed.
A finished output carries the job and its own fingerprint (``bigmm_job``), so that resuming it
again is success ("already complete") and resuming it with another job is an error.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Callable

import h5py
import numpy as np

from ..errors import (BigmmError, DiskFullError, DtypeError, OperandNotFound, OptionError,
                      OutputExistsError, OutputIsInputError, OutputNotWritable, ResumeError,
                      ShapeError, SpecError)
from ._h5 import (COMPLETE_ATTR, H5LOCK, JOB_ATTR, dtype_name, load_record,
                  release_h5_handles, reserve_job_record, stored_dtype)
from .identity import (Footprint, ancestors, array_footprint, describe, mappings_once,
                       overlaps_itself, refuse_alias)
from .journal import Journal, journal_path, lock_path, parse_journal
from .recorded import (completed, h5_object, journal_header, old_c_identity, record_bytes,
                       resume_output, target_identity)
from .durable import free_bytes, fsync_path
from .lock import OutputLock, h5_open_retry
from .filesink import H5_ALIGNMENT, PARTIAL_SUFFIX, FileSink, create_dataset, tile_chunks
from .sink import _FULL, ArraySink, Sink
from .source import DEFAULT_THREADS, Source
from .spec import Spec, parse_spec
from . import h5atomic, zarrsink, zarrsource
from .zarrfiles import OLD_SUFFIX
from ..units import format_bytes

def open_output(x, *, shape, dtype, inputs: list[Source], job: dict, overwrite: bool = False,
                resume: bool = False, reads_c: bool = False,
                threads: int = DEFAULT_THREADS, tile=None) -> Sink:
    """Open the output C (see the module docstring and the I/O layer's docs for every case).

    ``x``: a spec string or Spec (an HDF5 dataset or a Zarr array, created if missing), None
    (a new NumPy array), a NumPy array, an h5py.Dataset or a zarr.Array (written in place). ``job``: what identifies the
    run (``{"plan": Plan.key(), "alpha": .., "beta": ..}``); the inputs' identities are added
    here. ``tile``: the (rows, columns) of the tiles the run writes; a dataset bigmm creates is
    then chunked by them where that helps (:func:`.filesink.tile_chunks`).
    """
    shape = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    if x is None:
        if reads_c:
            raise OperandNotFound("Expected an output C holding the old values when beta != 0. "
                                  "Got out=None.")
        return ArraySink(np.empty(shape, dtype), "C (NumPy array)")
    if isinstance(x, np.ndarray):
        label = "C (NumPy array)"
        check_in_place(x, reads_c=reads_c, resume=resume)
        _check_like(x.shape, x.dtype, shape, dtype, label)
        with mappings_once():
            refuse_alias(array_footprint(x), inputs, label)
        return ArraySink(x, label)
    if isinstance(x, h5py.Dataset):
        _check_open(x)
        label = f"C ({x.file.filename}:{x.name})"
        _check_like(x.shape, stored_dtype(x), shape, dtype, label)
        check_in_place(x, reads_c=reads_c)
        spec = Spec(os.path.realpath(x.file.filename), x.name)
        return _open_locked(spec, shape, dtype, inputs, job, overwrite, resume, reads_c,
                            threads, None, dataset=x)
    if zarrsource.is_zarr_array(x):
        return _open_zarr_array(x, shape, dtype, inputs, job, overwrite, resume, reads_c,
                                threads)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, Spec)):
        raise SpecError(f"Expected 'file.h5:/dataset', 'store.zarr[:/array]', None, an "
                        f"h5py.Dataset, a zarr.Array or a NumPy array for the output. Got "
                        f"{type(x).__name__}.")
    spec = parse_spec(x)
    if spec.zarr:
        zarrsource.check_zarr_dtype(dtype, f"C ({spec})")
    chunks = _storage(spec).chunks(shape, tile, dtype.itemsize)
    return _open_locked(spec, shape, dtype, inputs, job, overwrite, resume, reads_c,
                        threads, chunks)


def _open_zarr_array(x, shape, dtype, inputs, job, overwrite, resume, reads_c, threads) -> Sink:
    """A ``zarr.Array`` written in place (its chunks and codecs kept), as an h5py.Dataset is."""
    spec = zarrsource.spec_of(x)
    _check_like(x.shape, x.dtype, shape, dtype, f"C ({zarrsource.describe_array(x)})")
    check_in_place(x, reads_c=reads_c)
    return _open_locked(spec, shape, dtype, inputs, job, overwrite, resume, reads_c, threads,
                        None, dataset=x)


def check_in_place(x, *, reads_c: bool, resume: bool = False) -> None:
    """Refuse an output written in place (a NumPy array, an h5py.Dataset or a zarr.Array; others
    pass) that cannot take C: read-only, elements sharing memory, masked, outside a local
    store, a NumPy array to resume, or (``reads_c``) a dataset or array holding old C."""
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):  # its mask would hide part of C
            raise SpecError("Expected a NumPy array for C, every element written. Got a "
                            "masked array.")
        if resume:
            raise ResumeError("Expected an output that can be resumed (a 'file.h5:/C' spec or "
                              "an h5py.Dataset). Got a NumPy array: a run into an array keeps "
                              "no journal.")
        if not x.flags.writeable:
            raise OutputNotWritable("Expected a writeable NumPy array for C. Got a read-only one.")
        if overlaps_itself(x):
            raise OutputIsInputError(f"Expected an output whose elements are distinct. Got "
                                     f"C (NumPy array) with strides {x.strides} over shape "
                                     f"{x.shape}: elements share memory.")
    elif isinstance(x, h5py.Dataset):
        _check_open(x)
        label = f"C ({x.file.filename}:{x.name})"
        if x.file.mode == "r":
            raise OutputNotWritable(f"Expected an h5py.Dataset open for writing for C. "
                                    f"Got {label} in a file opened read-only.")
        if reads_c:
            raise OptionError(
                f"Expected out as a spec 'file.h5:/C' for beta != 0 (old C then survives an "
                f"interruption in a partial dataset, and the run can resume). Got an "
                f"h5py.Dataset, {label}: pass '{x.file.filename}:{x.name}' instead.")
    elif zarrsource.is_zarr_array(x):
        spec = zarrsource.spec_of(x)
        label = f"C ({zarrsource.describe_array(x)})"
        if spec is None:
            raise OutputNotWritable(f"Expected a zarr.Array in a local directory store for C "
                                    f"(its chunks are journaled as files). Got {label}.")
        if x.read_only:
            raise OutputNotWritable(f"Expected a zarr.Array open for writing for C. Got "
                                    f"{label}, opened read-only.")
        if reads_c:
            raise OptionError(
                f"Expected out as a spec 'store.zarr:/C' for beta != 0 (old C then survives an "
                f"interruption in a partial array, and the run can resume). Got a zarr.Array, "
                f"{label}: pass '{spec}' instead.")


def _check_open(x: h5py.Dataset) -> None:
    if not x.id.valid:
        raise OutputNotWritable("Expected an open h5py.Dataset for C. Got one whose file is "
                                "closed.")


def _check_like(have_shape, have_dtype, shape, dtype, label) -> None:
    _check_shape(have_shape, shape, label)
    have = np.dtype(have_dtype)
    if have != dtype:
        order = (" in this machine's byte order" if have.newbyteorder("=") == dtype else "")
        raise DtypeError(f"Expected {dtype}{order} for {label}. Got {dtype_name(have)}.")


def _check_shape(have_shape, shape, label) -> None:
    if have_shape is None:  # an HDF5 dataset with a null dataspace
        raise ShapeError(f"Expected shape {shape} for {label}. Got an empty dataset (no "
                         f"dataspace).")
    if tuple(have_shape) != shape:
        raise ShapeError(f"Expected shape {shape} for {label}. Got {tuple(have_shape)}.")


def refuse_existing(spec: Spec, journaled: bool, exists: bool) -> None:
    """OutputExistsError for an output run without overwrite where an interrupted run's
    journal (``journaled``) or an output (``exists``) is in the way."""
    if journaled or exists:
        why = ("an interrupted run's journal exists; pass resume=True to continue it"
               if journaled else "pass overwrite=True to replace it")
        raise OutputExistsError(f"Expected no existing output at {spec}. Got one: {why}.")


def _check_old_c(spec: Spec, info: dict, shape, label) -> None:
    """OperandNotFound unless the old C (beta != 0) that ``info`` (:func:`_inspect`) describes
    exists, ShapeError unless of ``shape``."""
    if not info["exists"]:
        raise OperandNotFound(f"Expected an existing output {spec} holding C for beta != 0. "
                              f"Got no such dataset.")
    _check_shape(info["shape"], shape, label)


@dataclass(frozen=True)
class _Storage:
    """What opening a file output does that depends on its format (HDF5 or Zarr)."""

    chunks: Callable  # (shape, tile, itemsize) -> chunks of a new output
    check: Callable  # (spec) -> None, or OutputNotWritable
    recover: Callable  # (spec) -> None: finish what a killed run committed to the file
    exists: Callable  # (spec) -> whether the output's file (HDF5) or array (Zarr) exists
    inspect: Callable  # (spec, partial name, label) -> info (see _inspect)
    create: Callable  # (spec, label, shape, dtype, partial, drop_old, chunks) -> target name
    drop_begun: Callable  # (spec, parsed journal) -> None
    mark_incomplete: Callable  # (dataset or array written in place, record bytes) -> None
    sink: Callable  # (spec, shape, dtype, journal, target, reads_c, threads, result, chunks)


def _storage(spec: Spec) -> _Storage:
    return _ZARR if spec.zarr else _HDF5


def check_folder(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        raise OutputNotWritable(f"Expected an existing directory for the output '{path}'. "
                                f"Got '{folder}', which {what}.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputNotWritable(f"Expected a writable directory for the output '{path}'. "
                                f"Got '{folder}' (permission denied).")


def check_name(spec: Spec) -> None:
    """OutputNotWritable for an output named as bigmm names its own partial and set-aside
    outputs: a later run holding old C of the name without the suffix would take it for its
    own leftover."""
    for suffix in (PARTIAL_SUFFIX, OLD_SUFFIX):
        if spec.dataset.endswith(suffix) or (spec.dataset == "/" and
                                             spec.path.rstrip("/").endswith(suffix)):
            raise OutputNotWritable(f"Expected an output name not ending in '{suffix}' (bigmm's "
                                    f"name for a run's own working copy). Got {spec}.")


def _stale_partial(spec: Spec, obj, name: str) -> None:
    """Refuse what lies at the partial output's name ``name`` unless bigmm left it there (a
    dataset marked incomplete): a run removes that, and must not remove anything else."""
    attrs = obj.attrs if isinstance(obj, h5py.Dataset) else None
    ours = attrs is not None and COMPLETE_ATTR in attrs and not bool(attrs[COMPLETE_ATTR])
    if not ours:
        raise OutputNotWritable(f"Expected nothing at '{name}' in '{spec.path}' but a partial "
                                f"output bigmm left there (the name it writes C under while old "
                                f"C survives). Got {h5_kind(obj)} it did not leave: rename it, "
                                f"or write C elsewhere.")


def _has_file(path: str) -> bool:
    """A file at ``path`` other than an empty one (what a kill leaves before HDF5's first
    write to a new file, see .h5atomic): that one is written as a new file."""
    return os.path.exists(path) and not (os.path.isfile(path) and os.path.getsize(path) == 0)


def _recover(spec: Spec) -> None:
    if not os.path.isfile(spec.path):
        return
    if os.path.exists(h5atomic.redo_path(spec.path)) and h5atomic.open_here(spec.path):
        raise OutputNotWritable(f"Expected to finish the change an interrupted run committed to "
                                f"'{spec.path}' (its redo log is beside it) before writing "
                                f"{spec}. Got the file open in this process (an h5py.File): "
                                f"close it and run again.")
    h5_open_retry(lambda: h5atomic.recover(spec.path), spec.path, f"C ({spec})")


def check_file(path: str) -> None:
    if _has_file(path):
        if os.path.isdir(path) or not os.access(path, os.W_OK):
            why = "a directory" if os.path.isdir(path) else "permission denied"
            raise OutputNotWritable(f"Expected a writable HDF5 file for the output. "
                                    f"Got '{path}' ({why}).")
        if not h5py.is_hdf5(path):
            raise OutputNotWritable(f"Expected an HDF5 file (or a new path) for the output. "
                                    f"Got '{path}', which is not HDF5.")


def _inspect(spec: Spec, partial: str, label: str) -> dict:
    """What exists at the output: the dataset's shape, dtype, completion flag and recorded job,
    where it lies (file and object), and whether a partial dataset exists."""
    info = {"exists": False, "partial": False,
            "footprint": Footprint(within=ancestors(spec.path))}  # a Zarr input holding it
    if not _has_file(spec.path):
        return info
    st = os.stat(spec.path)
    with H5LOCK:
        with _open_existing(spec.path, label) as f:
            obj = f.get(spec.dataset)
            # a soft or external link to nothing: replaced only with overwrite
            info["dangling"] = obj is None and f.get(spec.dataset, getlink=True) is not None
            if obj is not None and not isinstance(obj, h5py.Dataset):
                raise OutputNotWritable(f"Expected a dataset path for the output. Got "
                                        f"'{spec.dataset}' in '{spec.path}', which is "
                                        f"{h5_kind(obj)}.")
            if obj is None:
                check_parents(f, spec)
            objects = ()
            if obj is not None:
                objects = (h5_object(obj),)
                raw = obj.attrs.get(JOB_ATTR)
                shape = None if obj.shape is None else tuple(obj.shape)  # None: no dataspace
                info.update(exists=True, shape=shape, dtype=stored_dtype(obj),
                            complete=bool(obj.attrs.get(COMPLETE_ATTR, True)),
                            flagged=COMPLETE_ATTR in obj.attrs,
                            record=load_record(raw))
            if partial in f:  # a run removes it: only if bigmm left it
                _stale_partial(spec, f.get(partial), partial)
            info["partial"] = isinstance(f.get(partial), h5py.Dataset)
    info["footprint"] = Footprint(objects=objects, files=((st.st_dev, st.st_ino),),
                                  within=ancestors(spec.path))
    info["file"] = (st.st_dev, st.st_ino)
    return info


def _open_existing(path: str, label: str) -> h5py.File:
    """The existing output file, read-only (call holding H5LOCK); OutputNotWritable where HDF5
    cannot open it (a truncated or damaged file: left alone, as it may hold the user's
    data)."""
    try:
        return h5_open_retry(lambda: h5py.File(path, "r"), path, label)
    except BigmmError:
        raise
    except OSError as exc:
        raise OutputNotWritable(f"Expected an HDF5 file that opens at the output '{path}'. Got "
                                f"one HDF5 cannot open ({exc}): restore it, or move it away "
                                f"and run again.") from exc


def h5_kind(obj) -> str:
    """What an HDF5 object is, in words."""
    if obj is None:
        return "a link to nothing"
    if isinstance(obj, h5py.Group):
        return "a group"
    if isinstance(obj, h5py.Datatype):
        return "a committed datatype"
    return "a dataset" if isinstance(obj, h5py.Dataset) else f"a {type(obj).__name__}"


def check_parents(f: h5py.File, spec: Spec) -> None:
    """OutputNotWritable where a parent of the missing output dataset is not a group (HDF5
    cannot create the dataset below it)."""
    parts = spec.dataset.strip("/").split("/")
    for i in range(1, len(parts)):
        parent = "/" + "/".join(parts[:i])
        obj = f.get(parent)
        if obj is None:
            return  # created with the dataset
        if not isinstance(obj, h5py.Group):
            raise OutputNotWritable(f"Expected a group at '{parent}' in '{spec.path}' to hold "
                                    f"the output '{spec.dataset}'. Got {h5_kind(obj)}.")


def _drop_begun_file(spec: Spec, journal) -> None:
    """Remove an output file that HDF5 cannot open when the interrupted run whose journal
    parsed to ``journal`` (header, tiles, swap, size) created that file itself and finished
    nothing in it (it was killed inside HDF5's creation of the file): nothing of the user's is
    in it, and resuming creates it again. Any other unreadable output is left alone (and
    opening it fails)."""
    if journal is None:
        return
    header, tiles, swap = journal[0], journal[1], journal[2]
    if not header.get("new_file") or tiles or swap:
        return
    if not os.path.isfile(spec.path):
        return
    try:
        with H5LOCK, h5py.File(spec.path, "r"):
            return
    except OSError:
        os.remove(spec.path)


def _identities(inputs, out_file) -> dict:
    """The identity record of each input ("A", "B"), its file's times not compared where the
    run writes that file too (the output's)."""
    out = {}
    for name, src in zip("AB", inputs):
        where = src.where()
        volatile = where is not None and out_file is not None and (
            (where["file"]["dev"], where["file"]["ino"]) == tuple(out_file))
        out[name] = describe(src, volatile=volatile)
    return out


def _check_one_name(spec: Spec) -> None:
    """OutputNotWritable for an HDF5 output file with other hard links: the lock and the
    journal are named after the file's path, so a run through another name would write it
    at the same time."""
    try:
        st = None if spec.zarr else os.stat(spec.path)
    except OSError:
        return
    links = st.st_nlink if st is not None and stat.S_ISREG(st.st_mode) else 1
    if links > 1:
        raise OutputNotWritable(f"Expected an output file with one name. Got '{spec.path}' "
                                f"with {links} hard links, through which another run could "
                                f"write it at the same time: write to a copy of it, or remove "
                                f"the other links.")


def _open_locked(spec, shape, dtype, inputs, job, overwrite, resume, reads_c, threads, chunks,
                 dataset: h5py.Dataset | None = None) -> Sink:
    """Take the output's lock, then open it (:func:`_open_file`); the sink releases the lock
    when it closes."""
    check_folder(spec.path)
    label = (f"C ({spec})" if dataset is None or spec.zarr
             else f"C ({dataset.file.filename}:{dataset.name})")
    _check_one_name(spec)
    lock = OutputLock(lock_path(spec), label)
    try:
        sink = _open_file(spec, label, shape, dtype, inputs, job, overwrite, resume, reads_c,
                          threads, chunks, dataset)
    except BaseException:
        lock.release()
        raise
    sink.lock = lock
    return sink


def _open_file(spec, label, shape, dtype, inputs, job, overwrite, resume, reads_c, threads,
               chunks, dataset) -> Sink:
    store = _storage(spec)
    store.recover(spec)
    if resume and dataset is None:
        store.drop_begun(spec, parse_journal(journal_path(spec)))
    store.check(spec)
    partial = spec.dataset + PARTIAL_SUFFIX if reads_c else None
    info = store.inspect(spec, spec.dataset + PARTIAL_SUFFIX, label)
    refuse_alias(info["footprint"], inputs, label)
    jpath = journal_path(spec)
    journal = Journal.load(jpath)
    job = dict(job, inputs=_identities(inputs, info.get("file")))
    if resume and journal is not None:
        return resume_output(_storage(spec), spec, label, journal, job, info, shape, dtype,
                             reads_c, threads, chunks, dataset)
    in_place = dataset is not None
    if resume and info["exists"] and info.get("complete"):
        done = completed(spec, label, info, job, threads,
                         strict=not (reads_c or overwrite
                                     or (in_place and info.get("record") is None)),
                         result=dataset if in_place else str(spec))
        if done is not None:
            return done
    elif resume and info["exists"] and not (reads_c or overwrite or in_place):
        raise ResumeError(f"Expected the journal '{jpath}' of an interrupted run to resume "
                          f"{spec}. Got an output left incomplete without one; start over "
                          f"with overwrite=True.")
    if reads_c:
        _check_old_c(spec, info, shape, label)
        _check_like(info["shape"], info["dtype"], shape, dtype, label)
        job["inputs"]["C"] = old_c_identity(spec, label, threads)
    fresh = not in_place and (info["exists"] or info.get("dangling")) and not reads_c
    fresh = fresh and not resume
    if not overwrite:
        refuse_existing(spec, journal is not None, fresh)
    if journal is not None:
        journal.remove()
    header = journal_header(spec, shape, dtype, job, partial)
    journal = Journal.create(jpath, dict(header, new_file=not store.exists(spec)))
    try:
        if in_place:
            store.mark_incomplete(dataset, record_bytes(header["job"]))
            target = spec.dataset
        else:
            target = store.create(spec, label, shape, dtype, partial, drop_old=not reads_c,
                                  chunks=chunks, record_bytes=record_bytes(header["job"]))
        journal.append({"target": target_identity(spec, target, dataset)})
        return store.sink(spec, shape, dtype, journal, target, reads_c, threads, dataset,
                          chunks)
    except (DiskFullError, KeyboardInterrupt):  # keep the journal for --resume, as a kill would
        journal.close()
        raise
    except BaseException:
        journal.remove()
        raise


def _mark_incomplete(dset: h5py.Dataset, record_bytes: int) -> None:
    """Mark a dataset written in place incomplete, with room for its job record."""
    with H5LOCK:
        attrs = dset.attrs
        attrs[COMPLETE_ATTR] = False
        if JOB_ATTR in attrs:  # an earlier run's record: stale from here on
            del attrs[JOB_ATTR]
        reserve_job_record(attrs, record_bytes)
        dset.file.flush()
    fsync_path(dset.file.filename)


def _create_zarr(spec, label, shape, dtype, partial, drop_old, chunks=None,
                 record_bytes=0) -> str:
    _check_space(spec, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return zarrsink.create(spec, label, shape, dtype, partial, drop_old, chunks)


def _check_space(spec: Spec, need: int) -> None:
    """DiskFullError before HDF5 lays out a dataset the file system cannot hold (a huge one
    would take HDF5 seconds to index, then fail to reserve)."""
    free = free_bytes(spec.path)
    if free is not None and need > free:
        raise DiskFullError(
            f"Expected {format_bytes(need)} ({need} bytes) free on the file system of "
            f"'{spec.path}' for C ({spec}). Got {format_bytes(free)} free. Nothing was "
            f"computed; free space and rerun with resume=True, or choose another "
            f"output.")


def _create(spec: Spec, label: str, shape, dtype, partial: str | None, drop_old: bool,
            chunks=None, record_bytes: int = 0) -> str:
    """Create the dataset the run writes (the partial one when old C must survive), chunked
    by ``chunks`` or contiguous, with room for a job record of ``record_bytes``."""
    target = partial or spec.dataset
    stale = spec.dataset + PARTIAL_SUFFIX
    _check_space(spec, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    with H5LOCK:
        release_h5_handles(spec.path)
        try:  # all or nothing (see .h5atomic): a kill leaves the file as it was
            with h5_open_retry(h5atomic.opener(spec.path, journal_path(spec), "a",
                                               **H5_ALIGNMENT), spec.path, label) as f:
                if stale in f:
                    del f[stale]
                if drop_old and spec.dataset in f:
                    del f[spec.dataset]
                create_dataset(f, target, shape, dtype, chunks, record_bytes)
        except BigmmError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, OSError) and exc.errno in _FULL:  # the file as it was
                raise DiskFullError(f"Expected free space to create dataset '{target}' in "
                                    f"'{spec.path}'. Got: disk full ({exc.strerror}). Nothing "
                                    f"was computed; free space and rerun with resume=True, or "
                                    f"choose another output.") from exc
            raise OutputNotWritable(f"Expected to create dataset '{target}' in '{spec.path}'. "
                                    f"Got {type(exc).__name__}: {exc}.") from exc
    return target


# Late-bound (each name looked up at the call), so that a patched function of this module or
# of zarrsink is the one called.
_HDF5 = _Storage(
    chunks=lambda *a: tile_chunks(*a),
    check=lambda spec: check_name(spec) or check_file(spec.path),
    recover=lambda spec: _recover(spec),
    exists=lambda spec: _has_file(spec.path),
    inspect=lambda *a: _inspect(*a),
    create=lambda *a, **k: _create(*a, **k),
    drop_begun=lambda *a: _drop_begun_file(*a),
    mark_incomplete=lambda *a: _mark_incomplete(*a),
    sink=lambda spec, shape, dtype, journal, target, reads_c, threads, result, chunks:
    FileSink(spec, shape, dtype, journal, target, reads_c, threads, result=result))
_ZARR = _Storage(
    chunks=lambda *a: zarrsink.tile_chunks(*a),
    check=lambda spec: check_name(spec) or zarrsink.check(spec),
    recover=lambda spec: None,  # each change of a Zarr array's metadata is one rename
    exists=lambda *a: zarrsink.exists(*a),
    inspect=lambda *a: zarrsink.inspect(*a),
    create=lambda *a, **k: _create_zarr(*a, **k),
    drop_begun=lambda *a: zarrsink.drop_begun(*a),
    mark_incomplete=lambda arr, _record_bytes: zarrsink.mark_incomplete(arr),
    sink=lambda *a: zarrsink.sink(*a))
