"""Non-finite C tiles of finite operands: the arithmetic overflowed, and the run says so.

A tile's NaN and infinities are looked for as it is finished (``Backend.nonfinite``: on a GPU
one pass over the tile on the device, beside the copies). A tile with any is traced to its
operands (:class:`Origins`): a value at (i, j) comes from them where row i of op(A) or column
j of op(B) holds a NaN or an infinity (those rows and columns read again over all of K, in
blocks), or where the old C tile held one (flagged as it was loaded); such values are written,
as NumPy would write them. Any other came from the arithmetic itself (products or sums beyond
the dtype's largest value): an :class:`~bigmm.errors.OutputOverflowError`, raised before the
tile is journaled, so the output is left incomplete rather than written with infinities and
reported as done.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from ..errors import OutputOverflowError
from ..planner import Plan, Tile
from ..units import accumulate_dtype, dtype_name

#: The most bytes of an operand read at once while tracing a tile.
BLOCK_BYTES = 16 << 20


def bad_lines(src, r0: int, r1: int, c0: int, c1: int, across: bool) -> np.ndarray:
    """Which rows of rows [r0, r1) x columns [c0, c1) of ``src`` (an io Source, as stored)
    hold a NaN or an infinity (its columns where ``across``), read in row blocks of at most
    BLOCK_BYTES."""
    width = max(1, c1 - c0)
    step = max(1, BLOCK_BYTES // (width * np.dtype(src.dtype).itemsize))
    bad = np.zeros(c1 - c0 if across else r1 - r0, bool)
    for q0 in range(r0, r1, step):
        q1 = min(r1, q0 + step)
        buf = np.empty((q1 - q0, c1 - c0), src.dtype)
        src.read(q0, q1, c0, c1, buf)
        finite = np.isfinite(buf)
        if across:
            bad |= ~finite.all(axis=0)
        else:
            bad[q0 - r0:q1 - r0] = ~finite.all(axis=1)
    return bad


class Origins:
    """Traces the non-finite values of a plan's C tiles to its operands (see the module
    docstring): a value at (i, j) comes from the operands where row i of op(A) or column j
    of op(B) holds a NaN or an infinity (or, tile by tile, the old C); which rows and columns
    do is remembered per tile span."""

    def __init__(self, plan: Plan, a, b, label: str, alpha: float, beta: float):
        self.plan, self.a, self.b, self.label = plan, a, b, label
        self.alpha, self.beta = alpha, beta
        self._lock = threading.Lock()
        self._a: dict[tuple[int, int], np.ndarray] = {}
        self._b: dict[tuple[int, int], np.ndarray] = {}

    def check(self, tile: Tile, count: int, old: int = 0, values=None) -> None:
        """OutputOverflowError where ``count`` (> 0) non-finite values of ``tile`` have no
        non-finite operand behind them (``old`` > 0: its old C had some, which explains
        them all). ``values``: the tile on the host, to trace them element by element (else
        the tile as a whole is traced)."""
        if not count or old or not (np.isfinite(self.alpha) and np.isfinite(self.beta)):
            return
        p = self.plan
        rows = self._bad(self._a, (tile.r0, tile.r1), self.a, p.trans_a)
        cols = self._bad(self._b, (tile.c0, tile.c1), self.b, not p.trans_b)
        if values is None:
            unexplained = count if not (rows.any() or cols.any()) else 0
        else:
            lost = ~np.isfinite(values) & ~rows[:, None] & ~cols[None, :]
            unexplained = int(np.count_nonzero(lost))
        if unexplained:
            acc = dtype_name(accumulate_dtype(p.dtype))
            largest = float(ml_dtypes.finfo(acc).max)
            raise OutputOverflowError(
                f"Expected a product within {acc}'s range (largest finite value "
                f"{largest:.6g}). Got {unexplained} infinite or NaN values in rows {tile.r0}:"
                f"{tile.r1}, columns {tile.c0}:{tile.c1} of {self.label} whose rows of A and "
                f"columns of B are finite{' (and old C)' if self.beta != 0 else ''} "
                f"(alpha={self.alpha:g}{f', beta={self.beta:g}' if self.beta != 0 else ''}): "
                f"the {acc} arithmetic overflowed; scale the operands down or multiply them "
                f"in float64.")

    def _bad(self, known: dict, span: tuple[int, int], src, across: bool) -> np.ndarray:
        """Which of ``src``'s rows ``span`` (its columns where ``across``), all of K, hold a
        NaN or an infinity; read once per span."""
        with self._lock:
            if span in known:
                return known[span]
        k = self.plan.k
        bad = bad_lines(src, 0, k, *span, True) if across else bad_lines(src, *span, 0, k, False)
        with self._lock:
            known[span] = bad
        return bad
