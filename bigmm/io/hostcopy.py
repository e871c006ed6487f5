"""Copies between host arrays with non-temporal stores: the user's arrays into staging and
C's tiles back.

An ordinary copy reads each destination cache line before it writes it, so copying n bytes
moves 3n through the host's memory; streaming stores write whole lines without reading them
(2n). NumPy copies through the C library, which streams only single calls far larger than a
panel's rows or a reader's piece, so the pipeline's copies (16-64 KiB rows, 4-64 MiB
pieces) took the slow way. :func:`copy` streams every row of a copy at least MIN_BYTES long
through a few lines of C (``hostcopy.c``), compiled once per machine with the system's C
compiler (``CC``, else ``cc``) into bigmm's cache directory and called through ctypes, which
lets go of the interpreter's lock while it copies. Where that cannot be (no compiler, not
x86-64, ``BIGMM_HOST_COPY=numpy``), or the arrays are not plain rows of one dtype, NumPy
copies as before: the bytes are the same either way.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from ..calibration import cache_dir

#: Environment variable: "numpy" copies with NumPy only.
MODE_ENV = "BIGMM_HOST_COPY"
#: Copies smaller than this go through NumPy (the call's own cost, and lines that the
#: reader of a small destination would find in the cache).
MIN_BYTES = 256 << 10
_SOURCE = Path(__file__).with_name("hostcopy.c")
_LOCK = threading.Lock()
_LIB: list = []  # [library or None] once tried
_WHY: list[str] = []  # why the library is not there


class _CompileError(Exception):
    """The C compiler failed or is missing (the copies fall back to NumPy)."""


def kind() -> str:
    """How :func:`copy` copies large rows in this process: "stream" (non-temporal stores)
    or "numpy"."""
    return "numpy" if _streamer() is None else "stream"


def why_numpy() -> str:
    """Why :func:`copy` copies with NumPy ('' where it streams)."""
    if _streamer() is not None:
        return ""
    if os.environ.get(MODE_ENV) == "numpy":
        return f"{MODE_ENV}=numpy"
    return _WHY[0] if _WHY else ""


def copy(dest: np.ndarray, src: np.ndarray) -> None:
    """``dest[...] = src`` for arrays of one shape: rows of one dtype (each contiguous, at
    least MIN_BYTES in all, not overlapping) streamed where :func:`kind` is "stream", else
    by NumPy (which also converts and broadcasts as ``dest[...] = src`` does)."""
    rows = _rows(dest, src)
    lib = _streamer() if rows is not None else None
    if lib is None:
        dest[...] = src
        return
    n, row_bytes, ds, ss = rows
    lib.bigmm_copy_rows(dest.ctypes.data, ds, src.ctypes.data, ss, n, row_bytes)


def _streamer():
    """The compiled copy, or None where copies go through NumPy (asked for, or it could
    not be built)."""
    return None if os.environ.get(MODE_ENV) == "numpy" else _library()


def _rows(dest: np.ndarray, src: np.ndarray) -> tuple[int, int, int, int] | None:
    """(rows, bytes a row, destination's and source's row strides) where the copy is plain
    rows of bytes, else None."""
    if (not isinstance(src, np.ndarray) or dest.dtype != src.dtype or dest.shape != src.shape
            or dest.ndim not in (1, 2) or dest.nbytes < MIN_BYTES or dest.dtype.hasobject
            or not dest.flags.writeable):
        return None
    w = dest.itemsize
    if dest.ndim == 1:
        if dest.strides[0] != w or src.strides[0] != w:
            return None
        rows, row_bytes, ds, ss = 1, dest.nbytes, 0, 0
    else:
        if (dest.shape[1] > 1 and (dest.strides[1] != w or src.strides[1] != w)) or \
                dest.strides[0] == 0:
            return None
        rows, row_bytes, ds, ss = dest.shape[0], dest.shape[1] * w, *dest.strides[:1], \
            src.strides[0]
    if np.may_share_memory(dest, src):
        return None
    return rows, row_bytes, ds, ss


def _library():
    if _LIB:
        return _LIB[0]
    with _LOCK:
        if not _LIB:
            _LIB.append(_load())
        return _LIB[0]


def _load():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _WHY.append(f"streaming stores are written for x86-64 (this is {platform.machine()})")
        return None
    cc = os.environ.get("CC") or "cc"
    text = _SOURCE.read_bytes()
    key = hashlib.sha256(text + cc.encode() + sys.version.encode()).hexdigest()[:16]
    own = None  # a directory of this process's own, where the cache cannot be written
    try:
        try:
            path = _built(Path(cache_dir()), key, cc)
        except OSError:
            own = Path(tempfile.mkdtemp(prefix="bigmm-"))
            path = _built(own, key, cc)
        return _opened(path)  # which reports its own failures
    except (OSError, _CompileError) as exc:
        _WHY.append(f"could not compile {_SOURCE.name}: {exc}")
        return None
    finally:
        if own is not None:  # loaded or not, this process's own build is not needed again
            shutil.rmtree(own, ignore_errors=True)


def _opened(path: Path):
    """The compiled copy at ``path``, loaded; None (the reason in _WHY) where it cannot be
    loaded or does not stream here."""
    try:
        lib = ctypes.CDLL(str(path))
        lib.bigmm_copy_rows.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p,
                                        ctypes.c_ssize_t, ctypes.c_size_t, ctypes.c_size_t]
        lib.bigmm_copy_rows.restype = None
        if not lib.bigmm_streams():
            _WHY.append("the compiled copy does not stream on this machine")
            return None
    except (OSError, AttributeError) as exc:
        _WHY.append(f"could not load {path}: {exc}")
        return None
    return lib


def _built(folder: Path, key: str, cc: str) -> Path:
    """The compiled library in ``folder`` (compiled now unless it is there)."""
    path = folder / f"hostcopy-{key}.so"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        cmd = cc.split() + ["-O2", "-shared", "-fPIC", "-o", tmp, str(_SOURCE)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _CompileError(f"{cmd[0]}: {exc}") from exc
        if done.returncode != 0:
            raise _CompileError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-300:]}")
        os.replace(tmp, path)  # whole or not at all, whoever else compiles beside
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
