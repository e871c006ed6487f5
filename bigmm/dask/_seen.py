"""What each tile task checks first: that its worker sees A, B and C's file as the calling
process does. A worker that sees another file at one of those paths (a node-local copy, a file
replaced by another since the job began) would read other inputs, or write its tile where
this process never looks, and the job would end with a wrong C reported as finished."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import OperandNotFound
from ..io import parse_spec
from ..units import format_time_ns

#: A Zarr array's metadata file (v3, v2): its size and time stand for the array's.
_ZARR_META = ("zarr.json", ".zarray")


@dataclass(frozen=True)
class Seen:
    """A file (or C's Zarr folder) as the calling process sees it."""

    what: str  # "A", "B", "C"
    path: str
    ino: int | None = None  # C's: the file or folder the tasks write into
    size: int | None = None  # an input's (with its modification time)
    mtime_ns: int | None = None

    def facts(self) -> str:
        if self.ino is not None:
            return f"inode {self.ino}"
        return f"{self.size} bytes, modified at {format_time_ns(self.mtime_ns)}"


def input_seen(what: str, spec: str, out_file: str | None) -> Seen | None:
    """A or B (an absolute spec) as this process sees it: its HDF5 file, or its Zarr array's
    metadata file (size and modification time, which a shared filesystem shows every host
    alike); None where it cannot be told (or it is C's own file, which the run writes)."""
    s = parse_spec(spec)
    path = s.path
    if s.zarr:
        folder = os.path.join(s.path, s.dataset.strip("/"))
        path = next((p for p in (os.path.join(folder, m) for m in _ZARR_META)
                     if os.path.isfile(p)), None)
    if path is None or (out_file is not None and _same(path, out_file)):
        return None
    st = os.stat(path)
    return Seen(what, path, size=st.st_size, mtime_ns=st.st_mtime_ns)


def output_seen(path: str) -> Seen:
    """C's file (or Zarr folder) the tasks write into, by inode: its size and time change as
    the workers write it."""
    return Seen("C", path, ino=os.stat(path).st_ino)


def check_seen(seen) -> None:
    """On a worker: OperandNotFound where a file of ``seen`` is missing or another here."""
    for s in seen:
        try:
            st = os.stat(s.path)
            now = Seen(s.what, s.path, *((st.st_ino, None, None) if s.ino is not None
                                        else (None, st.st_size, st.st_mtime_ns)))
        except OSError as exc:
            now = None
            got = f"no such file there ({type(exc).__name__}: {exc.strerror})"
        if now == s:
            continue
        if now is not None:
            got = f"another file there ({now.facts()})"
        raise OperandNotFound(
            f"Expected {s.path} ({s.what}) on dask worker {_worker()} to be the file the "
            f"calling process sees ({s.facts()}). Got {got}: every worker must see A, B and "
            f"C at the same paths, on a filesystem they share, unchanged during the run.")


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _worker() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "(none)"
