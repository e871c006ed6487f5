"""Hooks: work a run adds at named points of its steps, and the checksum hook.

A run calls each of its hooks at these points:

* ``begin(be, plan, alpha, beta)``: once the run's buffers are allocated, before any step;
* ``landed(step, a, b, stream)``: a step's panels are in the device views ``a`` and ``b``
  (those it loads have just landed), before its gemm;
* ``finished(step, c, stream)``: a tile's last gemm has been issued and ``c`` holds the tile,
  before it is copied out.

``stream`` is the compute stream: work a hook issues there is ordered with the gemms. Hooks
nest: at ``landed`` they are called in the order given, at ``finished`` in reverse, so that a
hook given after another sits nearer the data (fault injection, :class:`bigmm.testing.Faults`,
inside the checks: the checks take a panel's sums before the fault corrupts it, and compare a
tile's sums after). A run with hooks goes whole step by whole step (no RAMP or DRAIN pieces).

:class:`Checks` is the hook of ``verify="checksum"`` (:mod:`bigmm.checksum`). The run asks it
besides for the updates a fusing gemm does (``gemm_checks``), has it fetch each tile's verdict
beside the tile's copy-out (``copied_out``), hands the writer its ``verdict``, and computes the
tiles that failed once more (``take_redo``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from ..backends.base import GemmChecks
from ..checksum import Mismatch, TileChecksums
from ..errors import ChecksumError
from ..planner import Plan, Step, Tile


class Hook(Protocol):
    """Work added at named points of a run (see the module docstring)."""

    def begin(self, be, plan: Plan, alpha: float, beta: float) -> None:
        """The run starts on backend ``be``."""

    def landed(self, st: Step, a: Any, b: Any, stream: Any) -> None:
        """The step's panels are in ``a`` and ``b``; its gemm comes next."""

    def finished(self, st: Step, c: Any, stream: Any) -> None:
        """The tile's last gemm was issued; ``c`` holds the tile."""


class Checks:
    """The checksum hook of one run: every C tile checked (Huang & Abraham), a tile that
    fails not written but computed again once the schedule is done, a second failure a
    ChecksumError naming the output ``label`` (resumable without that tile)."""

    def __init__(self, label: str):
        self.label = label
        self.sums: TileChecksums | None = None
        self._lock = threading.Lock()  # the writer thread counts the verdicts
        self.checked = 0
        self.mismatches: list[Mismatch] = []
        self._redo: list[Tile] = []  # tiles whose first check failed, not written
        self.retried: set = set()

    # ----- on the compute stream, in step order ---------------------------------------------
    def begin(self, be, plan: Plan, alpha: float, beta: float) -> None:
        self.sums = TileChecksums(be, plan, alpha, beta)

    def landed(self, st: Step, a, b, stream) -> None:
        """Take the vectors of the panels the step loaded."""
        for op, load, slot, x in (("A", st.load_a, st.a_slot, a), ("B", st.load_b, st.b_slot, b)):
            if load:
                self.sums.landed(op, slot, x, stream)

    def gemm_checks(self, st: Step, a, b, c, stream) -> GemmChecks | None:
        """Add the step's terms to its tile's expected sums; what the gemm is to do itself
        (``checks=``) where it fuses them, else None."""
        return self.sums.step(st, a, b, c, stream)

    def finished(self, st: Step, c, stream) -> None:
        """Compare the finished tile's sums with the expected ones (on the device)."""
        self.sums.finish(st, c, stream)

    # ----- beside the copy-out, and on the writer thread ------------------------------------
    def copied_out(self, c_slot: int, stream) -> None:
        """Fetch the C slot's verdict on ``stream``, beside its tile's copy-out."""
        self.sums.fetch(c_slot, stream)

    def verdict(self, c_slot: int, tile: Tile) -> Callable[[], bool]:
        """For the writer, once the tile's copy-out is complete: whether to write it (False:
        it failed for the first time and is computed again)."""
        return lambda: self.accept(tile, self.sums.verdict(c_slot, tile))

    def accept(self, tile: Tile, mismatch: Mismatch | None) -> bool:
        """Count a tile's check; False when it failed for the first time. ChecksumError on a
        second failure."""
        with self._lock:
            self.checked += 1
            if mismatch is None:
                return True
            self.mismatches.append(mismatch)
            if tile.index in self.retried:
                raise ChecksumError(
                    f"Expected tile {tile.index} (rows {tile.r0}:{tile.r1}, columns "
                    f"{tile.c0}:{tile.c1}) to pass its checksum check when computed again. Got "
                    f"a second mismatch: {mismatch}. The output {self.label} is resumable "
                    f"without that tile.")
            self._redo.append(tile)
            return False

    # ----- after the schedule ---------------------------------------------------------------
    def take_redo(self) -> list[Tile]:
        """The tiles that failed since the last call, now counted as computed again."""
        with self._lock:
            tiles, self._redo = self._redo, []
            self.retried.update(t.index for t in tiles)
        return tiles

    def counts(self) -> dict:
        """The run's statistics of the checks (RunStats fields)."""
        return dict(tiles_checked=self.checked, checksum_mismatches=len(self.mismatches),
                    tiles_recomputed=len(self.retried), mismatches=tuple(self.mismatches))
