"""What the page cache holds of an input, and which disk a file is on: for the predicted
time, which reads the cached bytes of a file at the page cache's rate and the rest at its
disk's (:mod:`bigmm.filerates`).

The share cached is sampled: ``mincore`` of SAMPLES windows of WINDOW bytes spread evenly
over the input's stored bytes (a read-only shared map of each file sampled; mapping reads
nothing, and ``mincore`` neither reads nor faults a page). Sampling a whole 4 GiB file page
by page took 17-57 ms; the windows take well under one.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

#: Windows sampled per input, and the bytes of each.
SAMPLES = 64
WINDOW = 1 << 20

_PAGE = mmap.PAGESIZE


def _libc():
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):  # pragma: no cover (no mincore: not Linux or BSD)
        return None


_LIBC = _libc()
_FAILED = ctypes.c_void_p(-1).value


def windows(ranges, samples: int = SAMPLES, window: int = WINDOW) -> list[tuple[int, int, int]]:
    """(range index, lo, hi) of ``samples`` windows of ``window`` bytes spread evenly over
    the byte ranges ``[(lo, hi), ...]`` taken end to end (all of them where they are
    shorter than the windows together)."""
    sizes = [max(0, hi - lo) for lo, hi in ranges]
    total = sum(sizes)
    if total == 0:
        return []
    if total <= samples * window:
        return [(i, lo, hi) for i, (lo, hi) in enumerate(ranges) if hi > lo]
    out, edges = [], np.cumsum([0] + sizes)
    for s in range(samples):
        at = s * (total - window) // max(1, samples - 1)  # the first and last bytes sampled
        i = int(np.searchsorted(edges, at, side="right")) - 1
        lo = ranges[i][0] + at - int(edges[i])
        out.append((i, lo, min(ranges[i][1], lo + window)))
    return out


def cached_share(files) -> float | None:
    """The share of the bytes of ``files`` (``(path, lo, hi)`` byte ranges) the page cache
    holds, sampled (see the module docstring); None where nothing could be sampled (no
    files, none readable, or no ``mincore``)."""
    files = list(files)
    if _LIBC is None or not files:
        return None
    cached = seen = 0
    by_file: dict[int, list] = {}
    for i, lo, hi in windows([(lo, hi) for _p, lo, hi in files]):
        by_file.setdefault(i, []).append((lo, hi))
    for i, spans in by_file.items():
        got = _sample(files[i][0], spans)
        if got is not None:
            cached, seen = cached + got[0], seen + got[1]
    return cached / seen if seen else None


def _sample(path: str, spans) -> tuple[int, int] | None:
    """(pages cached, pages sampled) of the byte spans of one file; None where it cannot be
    mapped."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return _sample_open(fd, spans)
    except OSError:
        return None
    finally:
        os.close(fd)


def _sample_open(fd: int, spans) -> tuple[int, int] | None:
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    addr = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _FAILED):
        return None
    try:
        cached = seen = 0
        for lo, hi in spans:
            lo, hi = lo // _PAGE * _PAGE, min(size, hi)
            if hi <= lo:
                continue
            vec = np.zeros(-(-(hi - lo) // _PAGE), np.uint8)
            if _LIBC.mincore(addr + lo, hi - lo, vec.ctypes.data) != 0:
                return None
            cached, seen = cached + int(np.count_nonzero(vec & 1)), seen + vec.size
        return cached, seen
    finally:
        _LIBC.munmap(addr, size)


def device(path: str) -> str | None:
    """The device ("major:minor") holding ``path``, or the folder it would be made in where
    it does not exist yet; None where neither can be looked at."""
    here = os.path.abspath(path)
    while True:
        try:
            dev = os.stat(here).st_dev
            return f"{os.major(dev)}:{os.minor(dev)}"
        except OSError:
            up = os.path.dirname(here)
            if up == here:
                return None
            here = up
