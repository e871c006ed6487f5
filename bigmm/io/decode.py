"""Decode buffers: where a source's readers decode its compressed chunks.

A chunk stored compressed (a Zarr codec, HDF5's deflate filter) is read whole and decoded
before the part a region needs is copied out. A thread decoding one holds the chunk's stored
bytes and the decoded chunk: a :class:`DecodePool` holds such pairs of buffers, as many as
its ``limit`` (the run's plan sets it: ``Plan.decoding``), allocated on first use and kept to
the source's close. The memory is then what the plan counts, and no thread allocates
chunk-sized buffers of its own (which the C allocator keeps in each thread's arena after they
are freed). A thread that finds every pair in use waits for one.

The pairs also keep the chunks decoded last: a read of a chunk still held copies from it
without decoding it again (panels that cut a chunk each read it; the least recently used pair
is decoded into next).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

#: Bytes of input and of output per step of a streamed inflate (zlib's own buffers stay small).
INFLATE_IN, INFLATE_OUT = 64 << 10, 256 << 10


def stored_bound(nbytes: int) -> int:
    """The most bytes a chunk of ``nbytes`` may take compressed by zstd, blosc, deflate or
    gzip where the stored sizes are not known (each adds under nbytes / 128 and a header)."""
    return nbytes + nbytes // 128 + 4096


class _Pair:
    """One pair of buffers: the stored bytes read, the chunk decoded (``key``, once
    ``ready``), and the threads copying from it."""

    def __init__(self, decoded: int, stored: int):
        self.data, self.stored = _private(decoded), _private(stored)
        self.key = None
        self.ready = False
        self.users = 0
        self.used = 0


def _private(nbytes: int) -> np.ndarray:
    """``nbytes`` of private anonymous memory, mapped apart: unmapped once dropped, not kept
    by the C allocator (and counted as the process's own, as a heap's would be)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    return np.frombuffer(mmap.mmap(-1, max(1, nbytes), flags=flags), np.uint8)[:nbytes]


class DecodePool:
    """Buffers for decoding chunks of ``decoded`` bytes stored in at most ``stored`` bytes,
    at most ``limit`` pairs at once (see the module docstring)."""

    def __init__(self, decoded: int, stored: int, limit: int = 1):
        self.decoded, self.stored = int(decoded), int(stored)
        self._limit = max(1, int(limit))
        self._pairs: list[_Pair] = []
        self._cond = threading.Condition()
        self._clock = 0

    @property
    def pair_bytes(self) -> int:
        """Bytes one pair holds: a decoded chunk and its stored bytes."""
        return self.decoded + self.stored

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, n: int) -> None:
        """Hold at most ``n`` (at least one) pairs: those beyond it are dropped as soon as no
        thread uses them."""
        with self._cond:
            self._limit = max(1, int(n))
            self._trim()
            self._cond.notify_all()

    def holds(self, key) -> bool:
        """Whether chunk ``key`` is held decoded (or being decoded) now."""
        with self._cond:
            return any(p.key == key for p in self._pairs)

    @contextmanager
    def chunk(self, key, decode: Callable[[np.ndarray, np.ndarray], None]
              ) -> Iterator[np.ndarray]:
        """The decoded chunk ``key`` (its bytes, uint8): the one held, else decoded by
        ``decode(stored, data)`` into a pair (``stored``: the buffer for its stored bytes;
        ``data``: the chunk's, which it fills)."""
        pair = self._take(key)
        try:
            if not pair.ready:
                try:
                    decode(pair.stored, pair.data)
                except BaseException:
                    with self._cond:
                        pair.key = None
                        self._cond.notify_all()
                    raise
                with self._cond:
                    pair.ready = True
                    self._cond.notify_all()
            yield pair.data
        finally:
            with self._cond:
                pair.users -= 1
                self._clock += 1
                pair.used = self._clock
                self._trim()
                self._cond.notify_all()

    def _take(self, key) -> _Pair:
        """A pair for ``key``, counted as used: the one holding or decoding it (once it is
        decoded), else a new pair within the limit, else the least recently used free one
        (marked to be decoded into), waiting for one where none is free."""
        with self._cond:
            while True:
                held = next((p for p in self._pairs if p.key == key), None)
                if held is not None and held.ready:
                    held.users += 1
                    return held
                if held is None:
                    pair = self._free()
                    if pair is not None:
                        pair.key, pair.ready, pair.users = key, False, 1
                        return pair
                self._cond.wait()

    def _free(self) -> _Pair | None:
        """A pair no thread uses (call holding the lock): a new one while fewer than the
        limit are held, else the least recently used, else None."""
        if len(self._pairs) < self._limit:
            pair = _Pair(self.decoded, self.stored)
            self._pairs.append(pair)
            return pair
        return self._least_used()

    def _trim(self) -> None:
        """Drop the least recently used unused pairs beyond the limit (holding the lock)."""
        while len(self._pairs) > self._limit:
            pair = self._least_used()
            if pair is None:
                return
            self._pairs.remove(pair)

    def _least_used(self) -> _Pair | None:
        """The least recently used pair no thread uses, None where all are in use (holding
        the lock)."""
        free = [p for p in self._pairs if p.users == 0]
        return min(free, key=lambda p: p.used) if free else None

    def release(self) -> None:
        """Drop the pairs no thread uses (made again when needed)."""
        with self._cond:
            self._pairs = [p for p in self._pairs if p.users]

    close = release


def give_back() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``), after HDF5
    decoded chunks in buffers of its own, which the allocator would otherwise keep."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # pragma: no cover (not glibc)
        return None


def read_stored(fd: int, offset: int, size: int, buf: np.ndarray, what: str) -> memoryview:
    """Bytes [offset, offset + size) of the open file into the start of ``buf``; OSError
    where they do not fit it or the file ends first (``what`` names the chunk)."""
    if size > buf.nbytes:
        raise OSError(f"{what} holds {size} bytes stored; its decode buffer holds "
                      f"{buf.nbytes} (changed since it was opened?)")
    view = memoryview(buf)[:size]
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise OSError(f"unexpected end of file in {what} at byte {offset + got}")
        got += n
    return view


def inflate_into(src, out: np.ndarray, wbits: int, what: str) -> None:
    """Inflate the deflate stream ``src`` (zlib's ``wbits``: 15 zlib, 31 gzip) into all of
    the uint8 array ``out``, streamed through small buffers; OSError where it is corrupt or
    does not fill ``out`` exactly."""
    d = zlib.decompressobj(wbits)
    src, pos, n = memoryview(src), 0, out.nbytes

    def put(piece: bytes) -> int:
        if pos + len(piece) > n:
            raise OSError(f"{what} inflates to more than {n} bytes")
        out[pos:pos + len(piece)] = np.frombuffer(piece, np.uint8)
        return pos + len(piece)

    try:
        for i in range(0, len(src), INFLATE_IN):
            data = src[i:i + INFLATE_IN]
            while data and not d.eof:
                pos = put(d.decompress(data, INFLATE_OUT))
                data = d.unconsumed_tail
            if d.eof:
                break
        pos = put(d.flush())
    except zlib.error as exc:
        raise OSError(f"{what} does not inflate: {exc}") from exc
    if not d.eof or pos != n:
        raise OSError(f"{what} inflates to {pos} bytes{'' if d.eof else ' (truncated)'}; "
                      f"expected {n}")


#: The numcodecs codecs of compressors decoded whole, made on first use.
_NUMCODECS: dict = {}


def decode_into(codec: str, raw, data: np.ndarray, what: str) -> None:
    """Decode a chunk's stored bytes ``raw`` into all of the uint8 array ``data``: "deflate"
    (a zlib stream) or "gzip" (either) streamed through ``zlib``, "zstd" or "blosc" by the
    numcodecs codec (which releases the GIL); OSError where they do not decode to exactly
    its bytes, or a Blosc buffer is shorter than its header says (``what`` names the
    chunk)."""
    if codec in ("deflate", "gzip"):
        inflate_into(raw, data, 15 if codec == "deflate" else 47, what)
        return
    if codec == "blosc":
        check_blosc(raw, what)
    if codec not in _NUMCODECS:
        import numcodecs

        _NUMCODECS[codec] = {"zstd": numcodecs.Zstd, "blosc": numcodecs.Blosc}[codec]()
    decode = _NUMCODECS[codec].decode
    size = declared_size(codec, raw)
    if size is not None and size != data.nbytes:
        raise OSError(f"{what} decodes to {size} bytes; a chunk holds {data.nbytes}")
    if size is not None:
        decode(raw, out=data)
        return
    decoded = memoryview(decode(raw)).cast("B")  # no size stated: decoded apart
    if len(decoded) != data.nbytes:
        raise OSError(f"{what} decoded to {len(decoded)} bytes; a chunk holds {data.nbytes}")
    data[...] = np.frombuffer(decoded, np.uint8)


#: Bytes of a Blosc 1 header: version, flags, type size, then the decoded size, the block
#: size and the stored size (``cbytes``, header included), each 4 bytes little-endian.
BLOSC_HEADER = 16


def check_blosc(src, what: str) -> None:
    """OSError unless ``src`` holds a whole Blosc 1 header and at least the bytes it states:
    Blosc takes its stored size from the header and reads that many bytes whatever the
    buffer holds (past the end of a truncated or empty chunk: stale bytes of the decode
    buffer, or another chunk's)."""
    n = len(memoryview(src).cast("B"))
    if n < BLOSC_HEADER:
        raise OSError(f"{what} holds {n} bytes, less than a Blosc header ({BLOSC_HEADER})")
    cbytes = int.from_bytes(bytes(memoryview(src).cast("B")[12:16]), "little")
    if cbytes > n:
        raise OSError(f"{what} holds {n} bytes; its Blosc header says {cbytes} (truncated?)")


def declared_size(codec: str, src) -> int | None:
    """The decoded size a zstd frame or a blosc buffer declares in its header (None where it
    states none, or the header is not one: the codec then says what is wrong)."""
    head = bytes(memoryview(src)[:18])
    if codec == "blosc":
        return int.from_bytes(head[4:8], "little") if len(head) >= 16 else None
    if len(head) < 6 or int.from_bytes(head[:4], "little") != 0xFD2FB528:
        return None
    fhd = head[4]
    single, flag = (fhd >> 5) & 1, fhd >> 6
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = (1 if single else 0) if flag == 0 else (1, 2, 4, 8)[flag]
    if not size:
        return None
    value = int.from_bytes(head[pos:pos + size], "little")
    return value + 256 if size == 2 else value


def unshuffle_into(data: np.ndarray, dest: np.ndarray, chunk: tuple[int, int],
                   at: tuple[int, int], swap: bool) -> None:
    """Copy rows and columns of a shuffled chunk (HDF5's shuffle filter: byte k of every
    element stored together) into ``dest`` (native, rows contiguous) directly, byte plane
    by byte plane: ``at`` is where ``dest`` starts in the chunk; ``swap``: the elements are
    stored big-endian."""
    cr, cc = chunk
    w = dest.dtype.itemsize
    rows, cols = dest.shape
    planes = data.reshape(w, cr, cc)[:, at[0]:at[0] + rows, at[1]:at[1] + cols]
    flat = dest.view(np.uint8)  # (rows, cols * w), rows strided as dest's
    out = np.lib.stride_tricks.as_strided(flat, (rows, cols, w), (flat.strides[0], w, 1))
    for k in range(w):
        out[:, :, k] = planes[w - 1 - k if swap else k]
