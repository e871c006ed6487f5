"""Page-locked host blocks for the cupy backend's staging buffers: how a block is made, and
the blocks kept between the runs of a process. Imported by :mod:`.cupy` only (it imports
cupy).

A block is made one of two ways, whichever :func:`choose` timed faster on this machine:
``cudaHostAlloc`` (cupy's ``PinnedMemory``), or an ordinary array whose pages are faulted in
on several threads (one byte written a page) and then locked where they lie
(``cudaHostRegister``, :class:`LockedBlock`).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import mmap
import threading
import time

import cupy
import numpy as np

from ..errors import RegisterError
from ..units import format_bytes

PAGE = mmap.PAGESIZE
_HOST_ALLOC_PORTABLE = getattr(cupy.cuda.runtime, "hostAllocPortable", 1)
_REGISTER_PORTABLE, _REGISTER_READ_ONLY = 1, 8  # cudaHostRegisterPortable, ...ReadOnly
#: Threads that touch a new block's pages, and the bytes below which one thread does.
TOUCH_THREADS, TOUCH_ALONE = 16, 16 << 20


def touch(x: np.ndarray) -> None:
    """Fault in every page of the flat byte array ``x`` (the kernel gives it zeroed memory
    now) by writing one byte a page, on TOUCH_THREADS threads for large arrays."""
    if x.nbytes < TOUCH_ALONE:
        x[::PAGE] = 0
        return
    edges = np.linspace(0, x.size, TOUCH_THREADS + 1).astype(int) // PAGE * PAGE
    edges[-1] = x.size

    def one(ab):
        x[ab[0]:ab[1]:PAGE] = 0

    with cf.ThreadPoolExecutor(TOUCH_THREADS) as pool:
        list(pool.map(one, zip(edges, edges[1:])))


class LockedBlock:
    """An ordinary array's whole pages, touched and then locked in place; ``ptr`` and
    ``size`` as cupy's PinnedMemory has them; released when dropped."""

    def __init__(self, nbytes: int):
        span = -(-max(int(nbytes), 1) // PAGE) * PAGE
        self._raw = np.empty(span + PAGE, np.uint8)
        start = -self._raw.ctypes.data % PAGE
        self.bytes = self._raw[start:start + span]
        touch(self.bytes)
        self.ptr, self.size = self.bytes.ctypes.data, int(nbytes)
        cupy.cuda.runtime.hostRegister(self.ptr, span, _REGISTER_PORTABLE)
        self._locked = True

    def __del__(self):
        if getattr(self, "_locked", False):
            self._locked = False
            try:
                cupy.cuda.runtime.hostUnregister(self.ptr)
            except Exception:  # the process is ending: the driver releases it anyway
                pass


def lock_range(ptr: int, nbytes: int, read_only: bool = False) -> None:
    """Page-lock host bytes [ptr, ptr + nbytes) in place (``cudaHostRegister``, portable;
    read-only where asked, and again without the flag where the driver does not know it);
    RegisterError when the driver refuses (the runtime clears the error)."""
    flags = ([_REGISTER_PORTABLE | _REGISTER_READ_ONLY] if read_only else []) + [
        _REGISTER_PORTABLE]
    error = None
    for f in flags:
        try:
            cupy.cuda.runtime.hostRegister(ptr, nbytes, f)
            return
        except cupy.cuda.runtime.CUDARuntimeError as e:
            error = error or e
    raise RegisterError(f"Expected CUDA to page-lock {format_bytes(nbytes)} of host memory in "
                        f"place{' read-only' if read_only else ''}. Got {error}.")


def lock_rate(nbytes: int) -> float | None:
    """Bytes per second of page-locking a touched host array of ``nbytes`` in place and
    releasing it (the best of three; None where the driver refuses)."""
    x = np.ones(max(1, nbytes // 8))
    best = math.inf
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            lock_range(x.ctypes.data, x.nbytes)
            cupy.cuda.runtime.hostUnregister(x.ctypes.data)
            best = min(best, time.perf_counter() - t0)
    except RegisterError:
        return None
    return x.nbytes / max(best, 1e-9)


def as_array(block, size: int, dtype: np.dtype) -> np.ndarray:
    """The block's first ``size`` elements of ``dtype`` as a flat array (which keeps the
    block alive)."""
    if isinstance(block, LockedBlock):
        return block.bytes[: size * dtype.itemsize].view(dtype)
    return np.ndarray((size,), dtype, buffer=cupy.cuda.PinnedMemoryPointer(block, 0))


#: Bytes of the cudaHostAlloc block :func:`choose` times (the slow way at any size, and
#: its time grows with the bytes).
ALLOC_TIMED = 64 << 20
#: How blocks are made: "lock" (LockedBlock) or "alloc" (cudaHostAlloc); set by choose().
_how = {"method": "lock"}


def make(nbytes: int):
    """A new block of ``nbytes`` made the chosen way (cudaHostAlloc where locking fails)."""
    if _how["method"] == "lock":
        try:
            return LockedBlock(nbytes)
        except cupy.cuda.runtime.CUDARuntimeError:
            _how["method"] = "alloc"
    return cupy.cuda.PinnedMemory(nbytes, _HOST_ALLOC_PORTABLE)


def method() -> str:
    """How blocks are made now: "lock" (pages locked in place) or "alloc"."""
    return _how["method"]


def use(how: str) -> None:
    """Make later blocks ``how`` ("lock" or "alloc"), as a kept calibration chose."""
    if how in ("lock", "alloc"):
        _how["method"] = how


def choose(nbytes: int) -> float | None:
    """Time making and dropping a block both ways (the best of three each: a locked block of
    ``nbytes``, a cudaHostAlloc one of at most ALLOC_TIMED bytes), make later blocks the
    faster way, and return its bytes per second."""
    rates = {}
    for method in ("alloc", "lock"):
        _how["method"] = method
        size = min(nbytes, ALLOC_TIMED) if method == "alloc" else nbytes
        best = math.inf
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                block = make(size)
                del block
                best = min(best, time.perf_counter() - t0)
        except cupy.cuda.runtime.CUDARuntimeError:
            continue
        if _how["method"] == method:  # locking did not fall back
            rates[method] = size / max(best, 1e-9)
    if not rates:
        _how["method"] = "alloc"
        return None
    _how["method"] = max(rates, key=rates.get)
    return rates[_how["method"]]


class PinnedCache:
    """Pinned host blocks kept between runs of this process, reused by exact size."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}

    def take(self, nbytes: int):
        with self._lock:
            blocks = self._free.get(nbytes)
            if blocks:
                return blocks.pop()
        return make(nbytes)

    def keep(self, blocks: list) -> None:
        """Hold ``blocks`` for the next run; blocks the last run did not take are freed."""
        with self._lock:
            self._free.clear()
            for b in blocks:
                self._free.setdefault(b.size, []).append(b)

    def sizes(self) -> tuple[int, ...]:
        """The sizes of the blocks held, one entry a block (largest first)."""
        with self._lock:
            return tuple(sorted((b.size for bs in self._free.values() for b in bs),
                                reverse=True))

    def held_bytes(self) -> int:
        with self._lock:
            return sum(b.size for bs in self._free.values() for b in bs)

    def release(self) -> None:
        with self._lock:
            self._free.clear()


#: The blocks this process keeps for its next run.
KEPT = PinnedCache()


def release_pinned() -> None:
    """Free the pinned host blocks kept for the next run."""
    KEPT.release()


def pinned_bytes_held() -> int:
    """Bytes of pinned host memory kept for the next run."""
    return KEPT.held_bytes()
