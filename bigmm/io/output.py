"""open_output: validate the output C, then create, overwrite or resume it."""

from __future__ import annotations

import os

import h5py
import numpy as np

from ..errors import (DiskFullError, DtypeError, OperandNotFound, OutputExistsError,
                      OutputIsInputError, OutputNotWritable, ResumeError, ShapeError, SpecError)
from ._h5 import COMPLETE_ATTR, H5LOCK, dtype_name
from .journal import Journal, journal_path, normalise, parse_journal
from .sink import (PARTIAL_SUFFIX, ArraySink, DatasetSink, FileSink, Sink, create_dataset,
                   tile_chunks)
from .source import DEFAULT_THREADS, Source, release_h5_handles
from .spec import Spec, parse_spec
from ..units import format_bytes


def open_output(x, *, shape, dtype, inputs: list[Source], job: dict, overwrite: bool = False,
                resume: bool = False, reads_c: bool = False,
                threads: int = DEFAULT_THREADS, tile=None) -> Sink:
    """Open the output C (see the I/O layer's docs for every case and error).

    ``x``: a spec string or Spec (an HDF5 dataset, created if missing), None (a new NumPy
    array), a NumPy array or an h5py.Dataset (written in place). ``tile``: the (rows, columns)
    of the tiles the run writes; a dataset bigmm creates is then chunked by them where that
    helps (:func:`.sink.tile_chunks`), so that each tile is one byte range of the file.
    """
    shape = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    if x is None:
        if reads_c:
            raise OperandNotFound("Expected an output C holding the old values when beta != 0. "
                                  "Got out=None.")
        return ArraySink(np.empty(shape, dtype), "C (NumPy array)")
    if isinstance(x, np.ndarray):
        _check_like(x.shape, x.dtype, shape, dtype, "C (NumPy array)")
        if not x.flags.writeable:
            raise OutputNotWritable("Expected a writeable NumPy array for C. Got a read-only one.")
        for src in inputs:
            if getattr(src, "array", None) is not None and np.may_share_memory(x, src.array):
                raise OutputIsInputError(f"Expected an output array separate from the inputs. "
                                         f"Got C sharing memory with {src.label}.")
        return ArraySink(x, "C (NumPy array)")
    if isinstance(x, h5py.Dataset):
        label = f"C ({x.file.filename}:{x.name})"
        _check_like(x.shape, x.dtype, shape, dtype, label)
        if x.file.mode == "r":
            raise OutputNotWritable(f"Expected an h5py.Dataset open for writing for C. "
                                    f"Got {label} in a file opened read-only.")
        _check_not_input((os.path.realpath(x.file.filename), x.name), inputs, label)
        return DatasetSink(x, label)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, Spec)):
        raise SpecError(f"Expected 'file.h5:/dataset', None, an h5py.Dataset or a NumPy array "
                        f"for the output. Got {type(x).__name__}.")
    chunks = tile_chunks(shape, tile, dtype.itemsize)
    return _open_file(parse_spec(x), shape, dtype, inputs, job, overwrite, resume, reads_c,
                      threads, chunks)


def _check_like(have_shape, have_dtype, shape, dtype, label) -> None:
    if tuple(have_shape) != shape:
        raise ShapeError(f"Expected shape {shape} for {label}. Got {tuple(have_shape)}.")
    if np.dtype(have_dtype) != dtype:
        raise DtypeError(f"Expected {dtype} for {label}. Got {dtype_name(have_dtype)}.")


def _check_not_input(identity, inputs, label) -> None:
    for src in inputs:
        if src.identity is not None and tuple(src.identity) == tuple(identity):
            raise OutputIsInputError(f"Expected an output other than the inputs. Got {label}, "
                                     f"which is also {src.label}.")


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        raise OutputNotWritable(f"Expected an existing directory for the output '{path}'. "
                                f"Got '{folder}', which {what}.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputNotWritable(f"Expected a writable directory for the output '{path}'. "
                                f"Got '{folder}' (permission denied).")
    if os.path.exists(path):
        if os.path.isdir(path) or not os.access(path, os.W_OK):
            why = "a directory" if os.path.isdir(path) else "permission denied"
            raise OutputNotWritable(f"Expected a writable HDF5 file for the output. "
                                    f"Got '{path}' ({why}).")
        if not h5py.is_hdf5(path):
            raise OutputNotWritable(f"Expected an HDF5 file (or a new path) for the output. "
                                    f"Got '{path}', which is not HDF5.")


def _inspect(spec: Spec, partial: str) -> dict:
    """What exists at the output: dataset shape/dtype/complete flag, partial dataset."""
    info = {"exists": False, "partial": False}
    if not os.path.exists(spec.path):
        return info
    with H5LOCK:
        with h5py.File(spec.path, "r") as f:
            obj = f.get(spec.dataset)
            if obj is not None and not isinstance(obj, h5py.Dataset):
                raise OutputNotWritable(f"Expected a dataset path for the output. Got "
                                        f"'{spec.dataset}' in '{spec.path}', which is a group.")
            if obj is not None:
                info.update(exists=True, shape=tuple(obj.shape), dtype=obj.dtype,
                            complete=bool(obj.attrs.get(COMPLETE_ATTR, True)))
            info["partial"] = isinstance(f.get(partial), h5py.Dataset)
    return info


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


def _header(spec, shape, dtype, job, partial) -> dict:
    return normalise({"bigmm_journal": 1, "dataset": spec.dataset, "shape": list(shape),
                      "dtype": dtype.name, "partial": partial, "job": job})


def _open_file(spec, shape, dtype, inputs, job, overwrite, resume, reads_c, threads,
               chunks) -> Sink:
    if resume:
        _drop_begun_file(spec, parse_journal(journal_path(spec)))
    _check_writable(spec.path)
    label = f"C ({spec})"
    _check_not_input((os.path.realpath(spec.path), spec.dataset), inputs, label)
    partial = spec.dataset + PARTIAL_SUFFIX if reads_c else None
    jpath = journal_path(spec)
    journal = Journal.load(jpath)
    info = _inspect(spec, spec.dataset + PARTIAL_SUFFIX)
    header = _header(spec, shape, dtype, job, partial)
    if resume and journal is not None:
        return _resume(spec, journal, header, info, shape, dtype, reads_c, threads, chunks)
    if resume and not overwrite:
        state = " (the output is complete)" if info["exists"] and info.get("complete") else ""
        raise ResumeError(f"Expected a journal '{jpath}' of an interrupted run to resume "
                          f"{spec}. Got none{state}.")
    if reads_c:
        if not info["exists"]:
            raise OperandNotFound(f"Expected an existing output {spec} holding C for beta != 0. "
                                  f"Got no such dataset.")
        _check_like(info["shape"], info["dtype"], shape, dtype, label)
    if not overwrite and (journal is not None or (info["exists"] and not reads_c)):
        why = ("an interrupted run's journal exists; pass resume=True (--resume) to continue it"
               if journal is not None else "pass overwrite=True (--overwrite) to replace it")
        raise OutputExistsError(f"Expected no existing output at {spec}. Got one: {why}.")
    if journal is not None:
        journal.remove()
    journal = Journal.create(jpath, dict(header, new_file=not os.path.exists(spec.path)))
    try:
        target = _create(spec, shape, dtype, partial, drop_old=not reads_c, chunks=chunks)
        return FileSink(spec, shape, dtype, journal, target, reads_c, threads)
    except DiskFullError:  # the output exists, empty: keep its journal for --resume
        journal.close()
        raise
    except BaseException:
        journal.remove()
        raise


def _check_space(spec: Spec, need: int) -> None:
    """DiskFullError before HDF5 lays out a dataset the file system cannot hold (a huge one
    would take HDF5 seconds to index, then fail to reserve)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(spec.path)))
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if st.f_blocks and need > free:
        raise DiskFullError(
            f"Expected {format_bytes(need)} ({need} bytes) free on the file system of "
            f"'{spec.path}' for C ({spec}). Got {format_bytes(free)} free. Nothing was "
            f"computed; free space and rerun with --resume (resume=True), or choose another "
            f"output.")


def _create(spec: Spec, shape, dtype, partial: str | None, drop_old: bool,
            chunks=None) -> str:
    """Create the dataset the run writes (the partial one when old C must survive), chunked
    by ``chunks`` or contiguous."""
    target = partial or spec.dataset
    stale = spec.dataset + PARTIAL_SUFFIX
    _check_space(spec, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    with H5LOCK:
        release_h5_handles(spec.path)
        try:
            with h5py.File(spec.path, "a") as f:
                if stale in f:
                    del f[stale]
                if drop_old and spec.dataset in f:
                    del f[spec.dataset]
                create_dataset(f, target, shape, dtype, chunks)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise OutputNotWritable(f"Expected to create dataset '{target}' in '{spec.path}'. "
                                    f"Got {type(exc).__name__}: {exc}.") from exc
    fd = os.open(spec.path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return target


def _resume(spec, journal, header, info, shape, dtype, reads_c, threads, chunks) -> Sink:
    recorded = journal.header
    diffs = [f"{key}: recorded {recorded.get(key)!r}, given {header.get(key)!r}"
             for key in ("dataset", "shape", "dtype", "partial")
             if recorded.get(key) != header.get(key)]
    rjob, njob = recorded.get("job") or {}, header["job"] or {}
    diffs += [f"job {key}: recorded {rjob.get(key)!r}, given {njob.get(key)!r}"
              for key in sorted(set(rjob) | set(njob)) if rjob.get(key) != njob.get(key)]
    if diffs:
        raise ResumeError(f"Expected the job recorded in '{journal.path}' to resume {spec}. "
                          f"Got a different one: {'; '.join(diffs)}.")
    target = header["partial"] or spec.dataset
    if not journal.swap:
        present = info["partial"] if reads_c else info["exists"]
        if not present and journal.tiles:
            raise ResumeError(f"Expected dataset '{target}' in '{spec.path}' to resume {spec}. "
                              f"Got none, though the journal lists finished tiles.")
        if reads_c and not info["exists"]:
            raise ResumeError(f"Expected the original {spec} (old C for beta != 0) to resume. "
                              f"Got no such dataset.")
        if not present:
            _create(spec, shape, dtype, header["partial"], drop_old=not reads_c, chunks=chunks)
    elif not (info["exists"] or info["partial"]):
        raise ResumeError(f"Expected {spec} or its partial dataset to finish resuming. "
                          f"Got neither.")
    return FileSink(spec, shape, dtype, journal, target, reads_c, threads)


def read_journal(x) -> dict | None:
    """The job recorded for an interrupted output ``x`` (spec), or None when there is none."""
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, Spec)):
        return None
    parsed = parse_journal(journal_path(parse_spec(x)))
    return None if parsed is None else parsed[0].get("job")
