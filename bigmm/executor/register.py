"""Page-locking the user's arrays for one run.

A plan that copies an operand in place (``Plan.in_place``) from an array that is not
page-locked names it in ``Plan.registered``: the run asks the backend to lock the array's
memory where it lies (:class:`~bigmm.backends.base.Registers`, ``cudaHostRegister``) before
the first copy and releases it after the last, so that the copies are asynchronous DMA from
and to the user's array, with no host copy into staging buffers.

The driver locks whole pages, and locking a page a second time fails: each array's extent is
rounded out to whole pages, and extents that share a page are merged and locked once (an A
and a B that are views of one buffer, or small arrays next to each other on the heap). Memory
the process may only read is locked read-only. Where the backend cannot lock memory or the
driver refuses, the operand is staged as usual and the run's statistics say why
(``RunStats.notes``).
"""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Registers
from ..errors import RegisterError

#: The host's page size: locks cover whole pages.
PAGE = mmap.PAGESIZE


@dataclass
class Locked:
    """The ranges a run locked, (start, bytes), and what it took; ``staged``: per operand
    that was to be locked and is staged instead, why."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0
    staged: dict[str, str] = field(default_factory=dict)

    def notes(self) -> tuple[str, ...]:
        """One line per operand staged instead of copied in place, for the run's stats."""
        return tuple(f"{op} staged, not page-locked in place: {why}"
                     for op, why in sorted(self.staged.items()))


def page_extent(x: np.ndarray) -> tuple[int, int]:
    """[first, last) byte of the whole pages holding the array ``x`` (non-negative
    strides)."""
    lo = x.ctypes.data
    hi = lo + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.itemsize
    return lo - lo % PAGE, -(-hi // PAGE) * PAGE


def lock(be, arrays: dict[str, np.ndarray]) -> Locked:
    """Lock the memory of ``arrays`` (operand -> array; C written by the device, A and B
    read) with ``be``; an operand whose lock fails is left out and named in
    ``Locked.staged``."""
    out = Locked()
    if not arrays:
        return out
    if not isinstance(be, Registers):
        out.staged = {op: f"backend {be.name!r} cannot page-lock memory" for op in arrays}
        return out
    t0 = time.perf_counter()
    for ops, lo, hi in _merged(arrays):
        read_only = all(op != "C" and not arrays[op].flags.writeable for op in ops)
        try:
            be.register(lo, hi - lo, read_only=read_only)
        except RegisterError as e:
            out.staged.update({op: str(e) for op in ops})
            continue
        out.ranges.append((lo, hi - lo))
        out.nbytes += hi - lo
    out.seconds = time.perf_counter() - t0
    return out


def release(be, locked: Locked | None) -> None:
    """Release every range of ``locked`` (the device must be done with them); the first
    failure is raised after all were tried."""
    if locked is None or not locked.ranges:
        return
    error = None
    for lo, _ in locked.ranges:
        try:
            be.unregister(lo)
        except Exception as e:  # release the others first
            error = error or e
    locked.ranges = []
    if error is not None:
        raise error


@contextlib.contextmanager
def held(be, arrays: Sequence[np.ndarray]) -> Iterator[Locked]:
    """Keep ``arrays`` page-locked with ``be`` while the block runs (for many runs, which then
    copy them in place without locking them each time): those not page-locked already are
    locked where they lie, read-only where the process may not write them, and released on
    the way out, also after an error (no copy may still use them then). Yields the Locked
    ranges; an array left unlocked (a refused lock, a backend that cannot lock, negative
    strides) is named in ``Locked.staged`` as ``array i``."""
    todo: dict[str, np.ndarray] = {}
    left: dict[str, str] = {}
    for i, x in enumerate(arrays):
        name = f"array {i}"
        if x.size == 0 or be.host_pinned(x):
            continue
        if any(s < 0 for s in x.strides):
            left[name] = "negative strides (lock a contiguous copy)"
        else:
            todo[name] = x
    locked = lock(be, todo)
    locked.staged.update(left)
    try:
        yield locked
    finally:
        release(be, locked)


def _merged(arrays: dict[str, np.ndarray]) -> list[tuple[tuple[str, ...], int, int]]:
    """(operands, first byte, last byte) of the page ranges to lock: each array's pages,
    ranges that share a page merged."""
    spans = sorted((*page_extent(x), op) for op, x in arrays.items())
    out: list[list] = []
    for lo, hi, op in spans:
        if out and lo < out[-1][2]:
            out[-1][0].append(op)
            out[-1][2] = max(out[-1][2], hi)
        else:
            out.append([[op], lo, hi])
    return [(tuple(ops), lo, hi) for ops, lo, hi in out]
