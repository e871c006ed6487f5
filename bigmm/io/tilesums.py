"""Samples of written C tiles: a hash of a few short spans of each tile as it was written,
journaled with the tile, and read back from the output when a run resumes.

A resumed run trusts the journal's tiles only where the output still holds what was written:
an output restored from an older copy while its journal is newer, or written into by another
program, would otherwise finish with a wrong C. A tile's sample is up to SPANS spans of at
most SPAN elements (rows spread over the tile, each span's columns moving across it), their
positions recorded beside the hash, so that the resumed run reads the same elements whatever
its plan. Tiles whose spans read back differently are computed again.

A sample is not a checksum of the whole tile: an element changed outside the spans goes
unseen (a tile restored whole, zeroed, or never written is seen). The number of spans a tile
gets falls with the run's tile count, so that a resume reads at most READ_SPANS spans (one a
tile beyond READ_SPANS tiles).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

#: Spans per tile (at most), elements per span, and spans a resume reads (about, at most).
SPANS, SPAN, READ_SPANS = 4, 64, 16384


def per_tile(tiles_total: int) -> int:
    """Spans each tile's sample gets in a run of ``tiles_total`` tiles (at least one)."""
    return max(1, min(SPANS, READ_SPANS // max(int(tiles_total), 1)))


def spans(r0: int, r1: int, c0: int, c1: int, count: int) -> list[list[int]]:
    """``count`` spans [row, column, length] of region rows r0:r1, columns c0:c1: rows spread
    over it, each span's columns further across (none for an empty region)."""
    rows, cols = r1 - r0, c1 - c0
    if rows <= 0 or cols <= 0:
        return []
    n = min(SPAN, cols)
    out = []
    for s in range(count):
        f = (2 * s + 1) / (2 * count)
        span = [r0 + min(rows - 1, int(rows * f)), c0 + int((cols - n) * f), n]
        if span not in out:
            out.append(span)
    return out


def digest(values) -> str:
    """The hash of the concatenated span values (their bytes, native order)."""
    h = hashlib.blake2b(digest_size=8)
    for v in values:
        h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


def take(region: tuple[int, int, int, int], src: np.ndarray, dtype, count: int,
         mirror: str | None = None) -> list:
    """The sample [spans, hash] of a tile written from ``src`` (tile-relative) at ``region``
    (r0, r1, c0, c1) in ``dtype``; ``mirror`` "mirror" or "upper": the tile was also written
    at (c0:c1, r0:r1), transposed or as zeros, and that region is sampled too."""
    r0, r1, c0, c1 = region
    dtype = np.dtype(dtype)
    found = spans(r0, r1, c0, c1, count)
    values = [src[r - r0, c - c0:c - c0 + n].astype(dtype) for r, c, n in found]
    if mirror is not None:
        below = spans(c0, c1, r0, r1, count)
        for r, c, n in below:  # row r of the mirror: column r - c0 of src, rows c - r0...
            v = src[c - r0:c - r0 + n, r - c0]
            values.append(v.astype(dtype) if mirror == "mirror" else np.zeros(n, dtype))
        found += below
    return [found, digest(values)]


class Sampler:
    """The sample of a region written in parts (a tile a dask worker writes sub-tile by
    sub-tile): each write hands :meth:`add` its part, which keeps the elements of the
    region's spans it holds; :meth:`sample` is then what :func:`take` gives of the whole
    region. Parts may come from several threads (they do not overlap)."""

    def __init__(self, region: tuple[int, int, int, int], dtype, count: int):
        self.r0, r1, self.c0, c1 = region
        self.found = spans(self.r0, r1, self.c0, c1, count)
        self.values = [np.empty(n, dtype) for _, _, n in self.found]
        self._missing = sum(n for _, _, n in self.found)
        self._lock = threading.Lock()

    def add(self, r0: int, r1: int, c0: int, c1: int, src: np.ndarray) -> None:
        """Rows r0:r1, columns c0:c1 of the region (region-relative) were written from
        ``src``."""
        got = 0
        for (r, c, n), v in zip(self.found, self.values):
            row, lo = r - self.r0, c - self.c0
            a, b = max(lo, c0), min(lo + n, c1)
            if r0 <= row < r1 and a < b:
                v[a - lo:b - lo] = src[row - r0, a - c0:b - c0]
                got += b - a
        if got:
            with self._lock:
                self._missing -= got

    def sample(self) -> list | None:
        """[spans, hash] once every span element was written (None before)."""
        return [self.found, digest(self.values)] if self._missing == 0 else None


def changed(samples: dict, read) -> list[tuple[int, int]]:
    """The tiles of ``samples`` ({tile: [spans, hash]}) whose spans, read by ``read(spans)``
    (a list of arrays, one per span, in the output's dtype), hash otherwise; in tile order."""
    return sorted(t for t, (found, h) in samples.items() if digest(read(found)) != h)
