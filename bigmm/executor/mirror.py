"""A Gram plan's mirror on the host: the strictly lower triangle of a diagonal tile filled from
its upper (or with zeros), and off-diagonal tiles transposed for their mirror position.

Both go in square blocks of BLOCK elements a side, so that each transposed read stays in the
cache (a 4096^2 float32 tile: about 45 ms on one core of a small VM in 128-blocks, against
130-190 ms for a masked copy of whole rows), and the rows of a tile are shared out over a
thread pool where one is given: the blocks written are disjoint from those read (the lower
triangle from the upper)."""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np

#: Edge of the square blocks transposed at a time.
BLOCK = 128


def fill_lower(src: np.ndarray, r0: int, r1: int, zeros: bool,
               pool: cf.Executor | None = None) -> None:
    """Rows [r0, r1) of the square tile ``src`` (its rows above r1 complete): the strictly
    lower triangle set from the upper (``src[r, c] = src[c, r]`` for c < r), or to zeros;
    row blocks on ``pool`` where given."""
    starts = range(r0, r1, BLOCK)
    if pool is None or len(starts) < 2:
        for q0 in starts:
            _fill_rows(src, q0, min(r1, q0 + BLOCK), zeros)
        return
    for f in [pool.submit(_fill_rows, src, q0, min(r1, q0 + BLOCK), zeros) for q0 in starts]:
        f.result()


def _fill_rows(src: np.ndarray, q0: int, q1: int, zeros: bool) -> None:
    for p0 in range(0, q0, BLOCK):  # whole blocks left of the diagonal block
        p1 = min(q0, p0 + BLOCK)
        src[q0:q1, p0:p1] = 0 if zeros else src[p0:p1, q0:q1].T
    d = src[q0:q1, q0:q1]
    np.copyto(d, 0 if zeros else d.T.copy(), where=np.tri(q1 - q0, k=-1, dtype=bool))


def transposed(src: np.ndarray, pool: cf.Executor | None = None) -> np.ndarray:
    """A C-contiguous copy of ``src.T``, in square blocks (row blocks of the result on
    ``pool`` where given)."""
    rows, cols = src.shape
    out = np.empty((cols, rows), src.dtype)

    def band(c0: int) -> None:
        c1 = min(cols, c0 + BLOCK)
        for p0 in range(0, rows, BLOCK):
            out[c0:c1, p0:p0 + BLOCK] = src[p0:p0 + BLOCK, c0:c1].T

    starts = range(0, cols, BLOCK)
    if pool is None or len(starts) < 2:
        for c0 in starts:
            band(c0)
    else:
        for f in [pool.submit(band, c0) for c0 in starts]:
            f.result()
    return out
