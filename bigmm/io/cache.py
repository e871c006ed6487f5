"""How much of a file the page cache holds (``mincore`` on a read-only map of it).

The planner's time model reads a file at disk speed when it is cold and at memory-copy speed
when the kernel already caches it; a warm input read from many narrow panels is bound by the
cost of each load, a cold one by the disk. :func:`resident_fraction` tells the two apart
before the run: it maps the file (no page is touched, so nothing is read or faulted in), asks
the kernel which pages are resident, and unmaps it. About 1 ms per GiB.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from .mapped import libc_function

_C_MINCORE = libc_function("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
#: Most bytes mapped at a time while asking (a multiple of the allocation granularity).
_WINDOW = 1 << 30
_PAGE = mmap.PAGESIZE


def resident_fraction(path: str) -> float | None:
    """The fraction (0 to 1) of ``path``'s pages in the page cache now; None where it cannot
    be told (no ``mincore``, an empty or unreadable file)."""
    if _C_MINCORE is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        resident = 0
        for start in range(0, size, _WINDOW):
            length = min(_WINDOW, size - start)
            vec = np.zeros(-(-length // _PAGE), np.uint8)
            with mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=start) as m:
                view = np.frombuffer(m, np.uint8)  # the map's address; no page touched
                try:
                    rc = _C_MINCORE(view.ctypes.data, length, vec.ctypes.data)
                finally:
                    del view  # before the map closes
            if rc != 0:
                return None
            resident += int(np.count_nonzero(vec & 1))
        return resident / -(-size // _PAGE)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
