"""Non-finite C tiles of finite operands: the arithmetic overflowed, and the run says so.

A tile's NaN and infinities are looked for on the device as it is finished
(``Backend.nonfinite``: one pass over the tile, beside the copies). A tile with any is traced back to its operands
(:class:`Origins`): the old C tile where beta != 0 (its non-finite values counted on the device
as it was loaded), then A's rows of the tile and B's columns over all of K, read again in
blocks. Where one of them holds a NaN or an infinity, the
product carries it, as NumPy's would, and the tile is written. Where all are finite, the
values came from the arithmetic itself (products or sums beyond the dtype's largest value):
an :class:`~bigmm.errors.OutputOverflowError`, raised before the tile is journaled, so the
output is left incomplete rather than written with infinities and reported as done.
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


def finite_region(src, r0: int, r1: int, c0: int, c1: int) -> bool:
    """Whether rows [r0, r1) x columns [c0, c1) of ``src`` (an io Source, as stored) are all
    finite, read in row blocks of at most BLOCK_BYTES."""
    width = max(1, c1 - c0)
    step = max(1, BLOCK_BYTES // (width * np.dtype(src.dtype).itemsize))
    for q0 in range(r0, r1, step):
        q1 = min(r1, q0 + step)
        buf = np.empty((q1 - q0, c1 - c0), src.dtype)
        src.read(q0, q1, c0, c1, buf)
        if not np.isfinite(buf).all():
            return False
    return True


class Origins:
    """Traces the non-finite values of a plan's C tiles to its operands (see the module
    docstring); A's row ranges and B's column ranges found holding some are remembered."""

    def __init__(self, plan: Plan, a, b, label: str, alpha: float, beta: float):
        self.plan, self.a, self.b, self.label = plan, a, b, label
        self.alpha, self.beta = alpha, beta
        self._lock = threading.Lock()
        self._a: dict[tuple[int, int], bool] = {}
        self._b: dict[tuple[int, int], bool] = {}

    def check(self, tile: Tile, count: int, old: int = 0) -> None:
        """OutputOverflowError where ``count`` (> 0) non-finite values of ``tile`` have no
        non-finite operand behind them (``old`` > 0: its old C had some)."""
        if count and not old and not self.explained(tile):
            acc = dtype_name(accumulate_dtype(self.plan.dtype))
            largest = float(ml_dtypes.finfo(acc).max)
            raise OutputOverflowError(
                f"Expected a product within {acc}'s range (largest finite value "
                f"{largest:.6g}). Got {count} infinite or NaN values in rows {tile.r0}:"
                f"{tile.r1}, columns {tile.c0}:{tile.c1} of {self.label} from finite A, B"
                f"{' and C' if self.beta != 0 else ''} (alpha={self.alpha:g}"
                f"{f', beta={self.beta:g}' if self.beta != 0 else ''}): the {acc} arithmetic "
                f"overflowed; scale the operands down or multiply them in float64.")

    def explained(self, tile: Tile) -> bool:
        """Whether A's rows or B's columns of ``tile`` (all of K) hold a NaN or an
        infinity."""
        p = self.plan
        if not (np.isfinite(self.alpha) and np.isfinite(self.beta)):
            return True
        rows, cols = (tile.r0, tile.r1), (tile.c0, tile.c1)
        if not self._finite(self._a, rows, self.a, p.trans_a):
            return True
        return not self._finite(self._b, cols, self.b, not p.trans_b)

    def _finite(self, known: dict, span: tuple[int, int], src, across: bool) -> bool:
        """Whether ``src``'s rows ``span`` (its columns where ``across``), all of K, are
        finite; read once per span."""
        with self._lock:
            if span in known:
                return known[span]
        k = self.plan.k
        found = (finite_region(src, 0, k, *span) if across
                 else finite_region(src, *span, 0, k))
        with self._lock:
            known[span] = found
        return found
