"""Positional reads and writes of strided byte ranges with ``os.preadv``/``os.pwritev``.

These run outside h5py (which serialises every call behind one global lock), release the GIL
in the kernel call, and so read and write in parallel from many threads. A "strided range" is
``nrows`` segments of ``seg`` bytes, the k-th at file offset ``off + k * stride``; each lands in
(or comes from) one destination memoryview.
"""

from __future__ import annotations

import os
import threading

#: Most iovecs per preadv call (Linux IOV_MAX is 1024).
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
#: Gaps between row segments up to this size are read into a scratch buffer so that one
#: preadv call covers many rows; larger gaps cost more to copy than a syscall per row.
GAP_MAX = 64 * 1024

_scratch = threading.local()


def _junk(size: int) -> memoryview:
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < size:
        buf = _scratch.buf = bytearray(max(size, 4096))
    return memoryview(buf)[:size]


def preadv_full(fd: int, views: list, offset: int) -> None:
    """Fill every view from the file starting at ``offset``; retries short reads; EOF -> OSError."""
    while views:
        want = sum(len(v) for v in views)
        got = os.preadv(fd, views, offset)
        if got == want:
            return
        if got == 0:
            raise OSError(f"unexpected end of file at byte {offset} (file truncated?)")
        offset += got
        views = _advance(views, got)


def pwritev_full(fd: int, views: list, offset: int) -> None:
    """Write every view to the file starting at ``offset``; retries short writes."""
    while views:
        want = sum(len(v) for v in views)
        put = os.pwritev(fd, views, offset)
        if put == want:
            return
        if put == 0:
            raise OSError(f"write of {want} bytes at {offset} made no progress")
        offset += put
        views = _advance(views, put)


def _advance(views: list, n: int) -> list:
    k = 0
    while n >= len(views[k]):
        n -= len(views[k])
        k += 1
    return [views[k][n:]] + list(views[k + 1:])


def read_rows(fd: int, off: int, stride: int, seg: int, dests: list) -> None:
    """Read ``len(dests)`` segments of ``seg`` bytes at ``off + k*stride`` into ``dests[k]``."""
    n = len(dests)
    if stride == seg:
        for s in range(0, n, IOV_MAX):
            preadv_full(fd, dests[s:s + IOV_MAX], off + s * stride)
        return
    gap = stride - seg
    if gap <= GAP_MAX:
        junk = _junk(gap)
        per = (IOV_MAX + 1) // 2
        for s in range(0, n, per):
            views = []
            for d in dests[s:s + per]:
                views.append(d)
                views.append(junk)
            preadv_full(fd, views[:-1], off + s * stride)
        return
    for k, d in enumerate(dests):
        preadv_full(fd, [d], off + k * stride)


def write_rows(fd: int, off: int, stride: int, seg: int, srcs: list) -> None:
    """Write ``len(srcs)`` segments of ``seg`` bytes to ``off + k*stride`` from ``srcs[k]``."""
    if stride == seg:
        for s in range(0, len(srcs), IOV_MAX):
            pwritev_full(fd, srcs[s:s + IOV_MAX], off + s * stride)
        return
    for k, v in enumerate(srcs):
        pwritev_full(fd, [v], off + k * stride)


def _views(buf, r0: int, r1: int, c0: int, c1: int) -> list:
    """Byte views of ``buf[r, c0:c1]`` for r in [r0, r1) (``buf``: C-contiguous 2-D array)."""
    w = buf.dtype.itemsize
    pitch = buf.shape[1] * w
    flat = memoryview(buf.reshape(-1).view("u1"))
    a, b = c0 * w, c1 * w
    return [flat[r * pitch + a:r * pitch + b] for r in range(r0, r1)]


def read_block(fd: int, off: int, stride: int, buf, r0: int, r1: int, c0: int, c1: int) -> None:
    """Fill ``buf[r0:r1, c0:c1]`` from rows of the file at ``off + k*stride`` (k = 0, 1, ...)."""
    seg = (c1 - c0) * buf.dtype.itemsize
    if stride == seg and c1 - c0 == buf.shape[1]:
        flat = memoryview(buf.reshape(-1).view("u1"))
        preadv_full(fd, [flat[r0 * seg:r1 * seg]], off)
        return
    read_rows(fd, off, stride, seg, _views(buf, r0, r1, c0, c1))


def write_block(fd: int, off: int, stride: int, buf, r0: int, r1: int, c0: int, c1: int) -> None:
    """Write ``buf[r0:r1, c0:c1]`` to rows of the file at ``off + k*stride`` (k = 0, 1, ...)."""
    seg = (c1 - c0) * buf.dtype.itemsize
    if stride == seg and c1 - c0 == buf.shape[1]:
        flat = memoryview(buf.reshape(-1).view("u1"))
        pwritev_full(fd, [flat[r0 * seg:r1 * seg]], off)
        return
    write_rows(fd, off, stride, seg, _views(buf, r0, r1, c0, c1))
