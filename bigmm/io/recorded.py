"""What an output's journal and records say, compared with a run: the job, the inputs' and old
C's identities and the target an interrupted run wrote (a resume), and the job a finished output
carries (found complete, or of another job)."""

from __future__ import annotations

import json
import os

import h5py

from ..errors import ResumeError
from ._h5 import H5LOCK, RUN_ATTR
from .identity import describe, differences, fingerprint
from .journal import finished_job, normalise
from .sink import CompleteSink, Sink
from .source import open_input
from .spec import Spec
from . import zarrsink
from .zarrmeta import read_meta


def journal_header(spec, shape, dtype, job, partial) -> dict:
    return normalise({"bigmm_journal": 2, "dataset": spec.dataset, "shape": list(shape),
                      "dtype": dtype.name, "partial": partial, "job": job})


def target_identity(spec: Spec, target: str, dataset=None) -> list:
    """Where the run's tiles go: (device, inode) of the Zarr array's directory, or of the
    HDF5 file with the dataset's address, and the token bigmm drew when it created it (None
    for outputs written in place). A resume refuses an output replaced since."""
    if spec.zarr:
        folder = zarrsink.target_dir(spec, target)
        st = os.stat(folder)
        attrs = (read_meta(folder) or {}).get("attributes") or {}
        return [st.st_dev, st.st_ino, attrs.get(RUN_ATTR)]
    with H5LOCK:
        if dataset is not None:  # written in place: the caller holds its file open
            return [*h5_object(dataset), _token(dataset)]
        with h5py.File(spec.path, "r") as f:
            return [*h5_object(f[target]), _token(f[target])]


def _token(dset) -> str | None:
    token = dset.attrs.get(RUN_ATTR)
    return token.decode() if isinstance(token, bytes) else (None if token is None
                                                             else str(token))


def same_target(recorded: list | None, now: list) -> bool:
    """Whether the journaled target is ``now`` (journals without the token: the rest)."""
    return recorded is None or list(recorded) == now[:len(recorded)]


def h5_object(obj) -> tuple[int, int, int]:
    """(device, inode) of the file an HDF5 object lives in (an external link's target file)
    and its address there (call holding H5LOCK)."""
    home = os.stat(obj.file.filename)
    return home.st_dev, home.st_ino, int(h5py.h5o.get_info(obj.id).addr)


def old_c_identity(spec: Spec, label: str, threads: int) -> dict:
    src = open_input(spec, name="old C", threads=threads)  # labelled "old C (<spec>)"
    try:
        return describe(src, volatile=True)
    finally:
        src.close()


def completed(spec, label, info, job, threads, strict: bool, result) -> Sink | None:
    """A CompleteSink when the finished output at ``spec`` is this job's (same inputs by
    identity, same options, its contents as the job left them). Otherwise None where the run
    may start (old C for beta != 0, or overwrite), else ResumeError naming what differs."""
    record = info.get("record")
    why = _job_differences(record, job)
    if not why:
        src = open_input(spec, name=label, threads=threads)
        try:
            if fingerprint(src) != record.get("result"):
                why = ["the output's contents changed after the run finished"]
        finally:
            src.close()
    if not why:
        return CompleteSink(label, info["shape"], info["dtype"], result)
    if not strict:
        return None
    raise ResumeError(f"Expected an interrupted run, or a finished one of the same job, to "
                      f"resume {spec}. Got a finished output of another job: {'; '.join(why)}. "
                      f"Start over with overwrite=True.")


def _job_differences(record: dict | None, job: dict) -> list[str]:
    if record is None:
        return ["it was not written by bigmm (no job recorded)"]
    old, now = record.get("job") or {}, finished_job(job)["job"]
    out = [f"{key} {now.get(key)!r} (the output's {old.get(key)!r})"
           for key in sorted(set(now) | set(old)) if old.get(key) != now.get(key)]
    if swapped(record.get("inputs") or {}, job["inputs"]):
        return ["A and B swapped (A is the data the run read as B, and B as A)"] + out
    for name in job["inputs"]:
        rec, cur = (record.get("inputs") or {}).get(name), job["inputs"][name]
        diff = ["no record"] if rec is None else differences(rec, cur)
        out += [f"{name} ({cur['label']}): {d}" for d in diff]
    return out


def record_bytes(job: dict | None) -> int:
    """The size of the job record a finished output of ``job`` carries, less its fingerprint
    (within the reservation's slack)."""
    return len(json.dumps(finished_job(job or {}), sort_keys=True).encode())


def resume_output(store, spec, label, journal, job, info, shape, dtype, reads_c, threads,
                  chunks, dataset) -> Sink:
    """The sink of an interrupted run of ``job`` into ``spec`` (``store``: its storage's
    functions), after comparing what its journal recorded: ResumeError naming a difference."""
    recorded = journal.header
    header = journal_header(spec, shape, dtype, job, journal.header.get("partial"))
    diffs = [f"{key}: recorded {recorded.get(key)!r}, given {header.get(key)!r}"
             for key in ("dataset", "shape", "dtype")
             if recorded.get(key) != header.get(key)]
    if bool(recorded.get("partial")) != bool(reads_c):
        diffs.append(f"beta != 0: recorded {bool(recorded.get('partial'))}, given {reads_c}")
    rjob, njob = recorded.get("job") or {}, header["job"] or {}
    diffs += [f"{key}: recorded {rjob.get(key)!r}, given {njob.get(key)!r}"
              for key in sorted((set(rjob) | set(njob)) - {"inputs"})
              if rjob.get(key) != njob.get(key)]
    if diffs:
        raise ResumeError(f"Expected the job recorded in '{journal.path}' to resume {spec}. "
                          f"Got a different one: {'; '.join(diffs)}.")
    rin = rjob.get("inputs") or {}
    if set(rin) < set(job["inputs"]):
        raise ResumeError(f"Expected a journal recording the identity of the inputs to resume "
                          f"{spec}. Got '{journal.path}' without them (written by an older "
                          f"bigmm); start over with overwrite=True.")
    if swapped(rin, job["inputs"]):
        raise ResumeError(f"Expected A and B in the order the interrupted run read them, to "
                          f"resume {spec}. Got them swapped (A is the data the run read as B, "
                          f"and B as A): give them in the run's order, or start over with "
                          f"overwrite=True.")
    for name in job["inputs"]:
        diff = differences(rin[name], job["inputs"][name])
        if diff:
            raise ResumeError(_changed(name, job["inputs"][name]["label"], diff, spec))
    target = recorded.get("partial") or spec.dataset
    if not journal.swap:
        present = info["partial"] if reads_c else info["exists"]
        if not present and journal.tiles:
            raise ResumeError(f"Expected dataset '{target}' in '{spec.path}' to resume {spec}. "
                              f"Got none, though the journal lists finished tiles.")
        if reads_c and not info["exists"]:
            raise ResumeError(f"Expected the original {spec} (old C for beta != 0) to resume. "
                              f"Got no such dataset.")
        if reads_c:
            now = old_c_identity(spec, label, threads)
            diff = differences(rin.get("C") or {}, now, volatile=True)
            if diff:
                raise ResumeError(_changed("old C", now["label"], diff, spec))
        now = target_identity(spec, target, dataset) if present else None
        if present and not same_target(recorded.get("target"), now):
            if not journal.tiles:  # nothing written to mix with: the run goes on in it
                journal.append({"target": now})
        if present and not same_target(journal.header.get("target"), now):
            raise ResumeError(f"Expected the {'array' if spec.zarr else 'dataset'} "
                              f"'{target}' the interrupted run wrote, to resume {spec}. Got "
                              f"another at that name (replaced after the interruption?). "
                              f"Nothing was mixed: start over with overwrite=True.")
        if not present:
            store.create(spec, label, shape, dtype, recorded.get("partial"),
                                  drop_old=not reads_c, chunks=chunks,
                                  record_bytes=record_bytes(rjob))
            journal.append({"target": target_identity(spec, target, dataset)})
    elif not (info["exists"] or info["partial"]):
        raise ResumeError(f"Expected {spec} or its partial dataset to finish resuming. "
                          f"Got neither.")
    return store.sink(spec, shape, dtype, journal, target, reads_c, threads, dataset,
                               chunks)


def swapped(recorded: dict, now: dict) -> bool:
    """Whether the stored A and B given now are the run's recorded B and A (by device, inode
    and object; two stored objects apart)."""
    def key(rec):
        f = (rec or {}).get("file")
        return None if f is None else (f.get("dev"), f.get("ino"), rec.get("object"))

    ra, rb, na, nb = (key(x.get(n)) for x in (recorded, now) for n in ("A", "B"))
    return None not in (ra, rb) and ra != rb and (na, nb) == (rb, ra)


def _changed(name: str, label: str, diff: list[str], spec) -> str:
    return (f"Expected {name} ({label.split(' (', 1)[-1].rstrip(')')}) as the interrupted run "
            f"read it, to resume {spec}. Got {'; '.join(diff)}. Nothing was mixed: restore "
            f"{name}, or start over with overwrite=True.")
