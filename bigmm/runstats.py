"""What a run reports: the pipeline's stages, progress snapshots, the run's statistics (with the
tiles whose checksums disagreed), the stage clocks and the tally of bytes and flops its threads
add to."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

#: The pipeline's stages, in the order data passes them.
STAGES = ("read", "copy_in", "compute", "copy_out", "write")


@dataclass(frozen=True)
class Progress:
    """Passed to the progress callback after each tile is written."""

    tiles_done: int  # including tiles skipped because an earlier run finished them
    tiles_total: int
    tiles_skipped: int
    bytes_read: int
    bytes_written: int
    flops_done: int
    elapsed: float


@dataclass(frozen=True)
class Mismatch:
    """A tile whose checksums disagree: for the column and the row sums, the largest error
    over its bound (a ratio above 1 fails) and where it is (column or row within the tile)."""

    tile: tuple[int, int]
    rows: tuple[int, int]
    cols: tuple[int, int]
    column_ratio: float
    column_at: int
    row_ratio: float
    row_at: int

    @property
    def checks(self) -> tuple[str, ...]:
        """The checks that failed: "column", "row" or both."""
        return tuple(name for name, r in (("column", self.column_ratio), ("row", self.row_ratio))
                     if r > 1.0)

    def __str__(self) -> str:
        parts = [f"{name} sums off by {ratio:.3g}x the rounding bound at {name} {at}"
                 for name, ratio, at in (("column", self.column_ratio, self.column_at),
                                         ("row", self.row_ratio, self.row_at)) if ratio > 1.0]
        return (f"tile {self.tile} (rows {self.rows[0]}:{self.rows[1]}, columns "
                f"{self.cols[0]}:{self.cols[1]}): {'; '.join(parts)}")


@dataclass(frozen=True)
class RunStats:
    """What a run did and how long each stage was busy (wall time with any work in flight)."""

    seconds: float
    flops: int
    bytes_read: int
    bytes_written: int
    tiles_done: int
    tiles_skipped: int
    tiles_total: int
    read_busy: float = 0.0
    copy_in_busy: float = 0.0
    compute_busy: float = 0.0
    copy_out_busy: float = 0.0
    write_busy: float = 0.0
    #: Checksum checks run (verify="checksum"; a recomputed tile is checked again).
    tiles_checked: int = 0
    #: Checks that failed, and the tiles computed again because of them.
    checksum_mismatches: int = 0
    tiles_recomputed: int = 0
    mismatches: tuple[Mismatch, ...] = ()
    #: Bytes that went through the backend's host staging slots (GPU: panels read into them,
    #: tiles copied out to them); pinned user arrays are copied directly and add nothing.
    bytes_staged: int = 0
    #: Bytes of the user's arrays page-locked in place for the run, and the seconds that
    #: locking and releasing took (part of ``seconds``).
    bytes_locked: int = 0
    lock_seconds: float = 0.0
    #: What the run did otherwise than its plan said (an array it could not lock, staged;
    #: journaled tiles computed again).
    notes: tuple[str, ...] = ()
    #: Tiles an earlier run journaled whose samples the output no longer held as written
    #: (resumed runs): computed again, counted in ``tiles_done``, not ``tiles_skipped``.
    tiles_redone: int = 0

    @property
    def busy(self) -> dict[str, float]:
        return {s: getattr(self, f"{s}_busy") for s in STAGES}

    def utilisation(self) -> dict[str, float]:
        """Busy time over elapsed time, per stage."""
        return {s: (b / self.seconds if self.seconds > 0 else 0.0) for s, b in self.busy.items()}

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flops_per_second"] = self.flops_per_second
        d["utilisation"] = self.utilisation()
        return d


class StageClock:
    """Union of the wall intervals during which at least one worker was in a stage."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self.total = 0.0

    def __enter__(self):
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def __exit__(self, *exc):
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self.total += time.perf_counter() - self._since


class Tally:
    """Bytes and flops of a run so far, added to from its threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.bytes_read = self.bytes_written = self.bytes_staged = self.flops = 0

    def add(self, *, bytes_read: int = 0, bytes_written: int = 0, bytes_staged: int = 0,
            flops: int = 0) -> None:
        with self._lock:
            self.bytes_read += bytes_read
            self.bytes_written += bytes_written
            self.bytes_staged += bytes_staged
            self.flops += flops

    def progress(self, tiles_done: int, tiles_total: int, tiles_skipped: int,
                 elapsed: float) -> Progress:
        """A progress snapshot with the bytes and flops so far."""
        with self._lock:
            return Progress(tiles_done, tiles_total, tiles_skipped, self.bytes_read,
                            self.bytes_written, self.flops, elapsed)
