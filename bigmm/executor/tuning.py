"""The pipeline's tuning: how the executor cuts its work into pieces, and how often it commits.

The pipeline's slots and its look-ahead window are part of the schedule
(:mod:`bigmm.planner.schedule`), which sizes the plan's memory by them and whose model simulates
them; what is here the model does not count.
"""

from __future__ import annotations

from ..planner.schedule import PIECE_BYTES

#: With staging (GPU backends) and no hooks (checks, injected faults), the executor issues the
#: first step of a run in K pieces of these relative depths (its first gemm starts once the
#: first piece has landed: the fill that no overlap hides is an eighth of the first panels)
#: and computes the last step's tile in row pieces of these relative heights, each copied out
#: and written while the next computes (the drain is the last eighth of the tile). The
#: pipeline model still counts whole panels and tiles for both: measured, the larger tiles
#: that smaller fills and drains would favour ran slower for reasons the model does not have
#: (see BENCHMARKS.md).
RAMP = (1, 1, 2, 4)
DRAIN = (4, 2, 1, 1)
#: Inner edges of those pieces fall on multiples of this (whole kernel tiles, aligned loads).
PIECE_ALIGN = 256
#: Finished tiles are committed to the journal in batches at most this many seconds apart.
COMMIT_INTERVAL = 0.5
#: The share of the I/O threads that copies finished tiles into an output in memory (a NumPy
#: array): the readers copy panels at the same time, and with as many writers as readers the
#: copying threads outnumber the cores (measured slower: see BENCHMARKS.md). Writes to
#: storage wait on the device, not on the cores: they take all the I/O threads.
MEMORY_WRITERS = 0.5


def writer_threads(io_threads: int, writes: str) -> int:
    """Threads of the writer's pool for an output written as ``writes`` (``Sink.writes``)."""
    return max(1, int(io_threads * MEMORY_WRITERS)) if writes == "array" else io_threads


def split_range(n: int, weights: tuple[int, ...], align: int = PIECE_ALIGN,
                offset: int = 0) -> list[tuple[int, int]]:
    """[0, n) in consecutive pieces about in proportion to ``weights``, each inner edge ``e``
    the nearest at which ``offset + e`` is a multiple of ``align`` (pieces that would be empty
    merge with their neighbours: without an offset, a range shorter than ``align`` stays
    whole)."""
    total, acc, edges = sum(weights), 0, {0, n}
    for w in weights[:-1]:
        acc += w
        e = round((offset * total + n * acc) / (total * align)) * align - offset
        if 0 < e < n:
            edges.add(e)
    edges = sorted(edges)
    return list(zip(edges, edges[1:]))


def io_pieces(r0: int, r1: int, cols: int, itemsize: int, threads: int,
              chunks: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Rows [r0, r1) of a region ``cols`` wide in at most ``threads`` even pieces of at least
    PIECE_BYTES each, one per I/O thread; inner edges on the chunk rows of a chunked source
    (``chunks``), so that a compressed chunk is decoded once and a raw one is copied by one
    thread (see BENCHMARKS.md, warm panel reads)."""
    rows = r1 - r0
    n = max(1, min(threads, rows, rows * cols * itemsize // PIECE_BYTES))
    unit = chunks[0] if chunks else 1
    return [(r0 + a, r0 + b) for a, b in split_range(rows, (1,) * n, unit, r0)]
