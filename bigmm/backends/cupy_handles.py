"""cuBLAS handles kept between the cupy backends of a process. Imported by :mod:`.cupy` only
(it imports cupy).

A backend takes a handle when it first calls cuBLAS and gives it back when it closes, so that
the next backend on the same device takes it instead of creating one, and no run ends
destroying one (which waits for the device and frees the handle's workspace). A handle is
used by one backend at a time; its math mode is set whenever it is taken, and every call
sets its stream first.
"""

from __future__ import annotations

import threading

#: Handles kept per device, at most (more backends closing at once destroy theirs).
KEEP_PER_DEVICE = 8


class HandlePool:
    """Free cuBLAS handles per device id (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}

    def take(self, device_id: int, math_mode: int) -> int:
        """A handle for the current device ``device_id`` (kept, else new) in ``math_mode``."""
        from cupy_backends.cuda.libs import cublas

        with self._lock:
            free = self._free.get(device_id)
            handle = free.pop() if free else None
        if handle is None:
            handle = cublas.create()
        cublas.setMathMode(handle, math_mode)
        return handle

    def give(self, device_id: int, handle: int) -> None:
        """Keep ``handle`` (its work done) for the next backend on ``device_id``; destroy it
        where KEEP_PER_DEVICE are kept already (the device current)."""
        with self._lock:
            free = self._free.setdefault(device_id, [])
            if len(free) < KEEP_PER_DEVICE:
                free.append(handle)
                return
        from cupy_backends.cuda.libs import cublas

        cublas.destroy(handle)

    def kept(self, device_id: int) -> list[int]:
        """The handles kept for ``device_id`` now."""
        with self._lock:
            return list(self._free.get(device_id, ()))
