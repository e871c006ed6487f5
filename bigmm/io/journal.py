"""The resume journal of an output: a JSON-lines file beside the HDF5 file (or Zarr store).

Line 1 is the header (the job, the output dataset, its shape and dtype, the name of the
partial dataset when old C must survive). Each later line records one durable event:
``{"tiles": [[i, j], ...]}`` after those tiles' bytes were fsynced (with ``"samples"``, one
per tile, where the writer took them: :mod:`.tilesums`), and ``{"swap": true}`` before the
partial dataset replaces the original. Every line is appended and fsynced; a torn
last line (a crash mid-append) is ignored and cut off before the next append.
"""

from __future__ import annotations

import json
import os
import threading
from urllib.parse import quote

from ..errors import ResumeError
from .durable import fsync_dir
from .spec import Spec

SUFFIX = ".bigmm-journal"
LOCK_SUFFIX = ".bigmm-lock"


def journal_path(spec: Spec) -> str:
    """``c.h5`` + ``/grp/C`` -> ``c.h5.grp%2FC.bigmm-journal`` (one journal per dataset),
    beside the file the path resolves to (so any spelling of it finds the journal)."""
    return _beside(spec, SUFFIX)


def lock_path(spec: Spec) -> str:
    """The output's lock file (see :mod:`.lock`), beside its journal."""
    return _beside(spec, LOCK_SUFFIX)


def _beside(spec: Spec, suffix: str) -> str:
    """Beside the file (HDF5) or the store directory (Zarr; a root array: ``store.zarr`` +
    suffix)."""
    inner = quote(spec.dataset.strip("/"), safe="")
    return f"{os.path.realpath(spec.path)}{'.' + inner if inner else ''}{suffix}"


def normalise(job) -> dict:
    """The job as it reads back from JSON (tuples -> lists), for comparisons."""
    return json.loads(json.dumps(job, sort_keys=True))


#: The job's fields that say what a finished output holds (the plan's tiles may differ between
#: runs of one job).
JOB_FIELDS = ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c")


def finished_job(job: dict) -> dict:
    """What a finished output records of its job (``bigmm_job``, beside its fingerprint): the
    options and the identities of A and B (old C is gone once the run finished)."""
    plan = job.get("plan") or {}
    opts = {key: plan.get(key) for key in JOB_FIELDS} if isinstance(plan, dict) else {"plan": plan}
    opts.update(alpha=job.get("alpha"), beta=job.get("beta"))
    if "precision" in job:  # recorded where not the default
        opts["precision"] = job["precision"]
    if isinstance(plan, dict) and plan.get("upper"):  # a Gram product's zeros below
        opts["upper"] = True
    inputs = job.get("inputs") or {}
    return normalise({"job": opts, "inputs": {k: inputs[k] for k in ("A", "B") if k in inputs}})


class Journal:
    """An open journal: ``header``, the committed ``tiles`` (``samples``: per tile, the
    sample its last record holds, where it has one) and whether a ``swap`` began."""

    def __init__(self, path: str, header: dict, tiles: set, swap: bool, valid_bytes: int,
                 samples: dict | None = None):
        self.path, self.header, self.tiles, self.swap = path, header, tiles, swap
        self.samples = {} if samples is None else samples
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        self._size = valid_bytes
        if os.fstat(self._fd).st_size != valid_bytes:  # cut a torn last line
            os.ftruncate(self._fd, valid_bytes)
            os.fsync(self._fd)

    @classmethod
    def create(cls, path: str, header: dict) -> "Journal":
        """Write a fresh journal holding only ``header`` (atomically: temp file, rename)."""
        line = (json.dumps(header, sort_keys=True) + "\n").encode()
        tmp = path + ".tmp"  # one writer per output (its lock): no other run makes this file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path)
        return cls(path, normalise(header), set(), False, len(line), {})

    @classmethod
    def load(cls, path: str) -> "Journal | None":
        """Open an existing journal, or None when there is none."""
        parsed = parse_journal(path)
        return None if parsed is None else cls(path, *parsed)

    def append(self, record: dict) -> None:
        """Append one line and fsync it. On failure (a full disk) the partial line is cut
        off again where possible, and the record counts as not written."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            try:
                done = 0
                while done < len(line):  # a short write (disk nearly full) goes on
                    done += os.pwrite(self._fd, line[done:], self._size + done)
                os.fsync(self._fd)
            except BaseException:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass  # a torn last line is ignored on loading anyway
                raise
            self._size += len(line)
            if "tiles" in record:
                _add_tiles(record, self.tiles, self.samples)
            if record.get("swap"):
                self.swap = True
            if "target" in record:
                self.header["target"] = normalise(record["target"])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
            fsync_dir(self.path)


def parse_journal(path: str):
    """(header, tiles, swap, valid_bytes, samples) of the journal at ``path``, or None if
    there is none."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    header, tiles, swap, valid, samples = None, set(), False, 0, {}
    lines = data.split(b"\n")
    for k, raw in enumerate(lines):
        last = k == len(lines) - 1  # text after the final newline: torn (or empty)
        if last:
            break
        try:
            record = json.loads(raw)
        except ValueError:
            if k == len(lines) - 2 and not lines[-1]:
                break  # the last complete-looking line is garbage: treat as torn
            raise ResumeError(f"Expected a readable journal. Got a corrupt line {k + 1} "
                              f"in {path}.") from None
        valid += len(raw) + 1
        if header is None:
            header = record
        elif "tiles" in record:
            _add_tiles(record, tiles, samples)
        elif record.get("swap"):
            swap = True
        elif "target" in record:  # what the tiles are written into (see io.output)
            header["target"] = record["target"]
    if header is None:
        return None
    return header, tiles, swap, valid, samples


def _add_tiles(record: dict, tiles: set, samples: dict) -> None:
    """Add a record's tiles, and their samples where it has them (a tile journaled again
    without one keeps none)."""
    found = record.get("samples")
    for k, t in enumerate(record["tiles"]):
        t = tuple(t)
        tiles.add(t)
        if found is not None and found[k] is not None:
            samples[t] = found[k]
        else:
            samples.pop(t, None)


def read_journal(x) -> dict | None:
    """The job recorded for an interrupted output ``x`` (a spec or an h5py.Dataset), or None
    when there is none."""
    parsed = _parsed(x)
    return None if parsed is None else parsed[0].get("job")


def journaled_tiles(x) -> int | None:
    """How many tiles the journal of an interrupted output ``x`` (as :func:`read_journal`'s)
    holds, or None when it has none."""
    parsed = _parsed(x)
    return None if parsed is None else len(parsed[1])


def _parsed(x):
    """:func:`parse_journal` of the journal of output ``x``; None without one (or for an
    array)."""
    import h5py

    from . import zarrsource
    from .spec import parse_spec

    if isinstance(x, h5py.Dataset):
        x = Spec(os.path.realpath(x.file.filename), x.name)
    elif zarrsource.is_zarr_array(x):
        x = zarrsource.spec_of(x)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, Spec)):
        return None
    return parse_journal(journal_path(parse_spec(x)))
