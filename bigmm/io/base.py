"""What inputs (:class:`.Source`) and the output (:class:`.Sink`) share: a 2-D matrix with a
label, regions checked against its shape, and ``close`` / context-manager / ``repr``."""

from __future__ import annotations

import os

import numpy as np

from ..errors import ShapeError


class Matrix:
    """A stored matrix that reads or writes rectangular regions ``[r0:r1, c0:c1]``."""

    shape: tuple[int, int]
    dtype: np.dtype
    label: str
    layout: str

    def close(self) -> None:
        pass

    def _close_raw_handles(self) -> None:
        """Close the memory map (``_map``) and file descriptor (``_fd``) of a matrix read or
        written raw at byte offsets; idempotent."""
        if getattr(self, "_map", None) is not None:
            self._map.close()
            self._map = None
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.label} {self.shape} {self.dtype} "
                f"layout={self.layout}>")

    def _check_region(self, r0, r1, c0, c1) -> None:
        m, n = self.shape
        if not (0 <= r0 <= r1 <= m and 0 <= c0 <= c1 <= n):
            raise ShapeError(f"Expected a region within {self.shape} of {self.label}. "
                             f"Got rows {r0}:{r1}, columns {c0}:{c1}.")
