"""The planner: shapes, dtype, transposes, budgets and chunk shapes -> a frozen, printable Plan.

Pure and shape-only: no h5py, no cupy, no I/O. The executor runs a Plan step by step; every step
names the C tile, the K panel, and the device slots its A and B panels live in, and whether each
panel must be loaded or is already resident. Slot assignment is decided here, so the executor
never decides what fits: the bytes resident are those the Plan printed.

Schedule (C is M x N, depth K, element size w, device budget S bytes):

* ``stream``: C tiles in row-major order; every tile streams its K panels of A and B through
  double-buffered slots. A is read ceil(N/bn) times, B ceil(M/bm) times.
* ``resident-a``: a whole row panel of A (bm x K) stays on the device while the tiles of that
  row sweep over B: A is read once, B ceil(M/bm) times.
* ``resident-b``: the mirror image, column-major tile order: B read once, A ceil(N/bn) times.

The planner enumerates tile sizes for each order and keeps those within both budgets. Without
rates it picks the fewest bytes moved, counting as moved the pipeline's fill (the first panels)
and drain (the last C tile), which no overlap hides, and a fixed cost per gemm; ties go to fewer
tiles, then larger K panels.

With :class:`Rates` it picks the shortest predicted time (ties: the byte order above). The time
is the makespan of a step-level model of the executor's pipeline (:func:`simulate`): read ->
copy in -> gemm -> copy out -> write, each stage one server taking its work in schedule order,
a load waiting for its slot's previous user (host staging slots, the order's device slots, the
C slots) and for the executor's look-ahead window. Schedules longer than SIM_STEPS steps are
simulated over a prefix of whole rows or tiles and extrapolated (:func:`predict_seconds`).
Candidates are simulated in order of a quick estimate, at most SIM_PLANS of them, skipping any
whose lower bound (:class:`StageTimes`) exceeds the best time found. The byte objective cannot
see that a plan reading all of A before its first tile can compute waits for it; the time does.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from itertools import islice
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

from .errors import BudgetError, DtypeError, PlanError, ShapeError
from .units import format_bytes, format_seconds

ORDERS = ("stream", "resident-a", "resident-b")
DTYPES = {"float32": 4, "float64": 8}

#: Device C tiles: one accumulating while the previous one is copied out and written.
C_SLOTS = 2
#: Host staging slots per operand (double buffering between the readers and the copy engine).
HOST_PANEL_SLOTS = 2
#: Host C buffers: one being filled from the device while the previous one is written to disk.
HOST_C_SLOTS = 2
#: Fixed cost of one gemm step (launch, events, the executor's bookkeeping), counted as bytes
#: moved when comparing schedules: about 40 us at 25 GB/s. Stops the planner from trading a few
#: bytes for thousands of tiny panels.
STEP_COST_BYTES = 1 << 20
#: Writing a byte of C (device -> host copy, then disk) costs about twice reading one.
DRAIN_WEIGHT = 2
#: Fixed time of one gemm step in the pipeline model (the same ~40 us as STEP_COST_BYTES).
STEP_SECONDS = 40e-6
#: Most steps whose loads may be in flight ahead of the compute (the executor's window, which
#: the pipeline model follows).
MAX_LOOKAHEAD = 64
#: Nominal disk speeds (bytes per second) for the predicted time (page-cache reads are faster).
READ_RATE, WRITE_RATE = 2.0e9, 1.0e9
#: Steps the pipeline model simulates per plan; longer schedules are extrapolated.
SIM_STEPS = 1024
#: Most candidate plans simulated when choosing by time (those with the lowest bounds).
SIM_PLANS = 32
#: Candidates with the fewest gemm steps simulated beside them, and how many of the fastest
#: are also tried with deeper K panels.
SIM_LARGE = 8
DEEPEN = 4
#: With staging (GPU backends) and no checks, the executor issues the first step of a run in
#: K pieces of these relative depths (its first gemm starts once the first piece has landed:
#: the fill that no overlap hides is an eighth of the first panels) and computes the last
#: step's tile in row pieces of these relative heights, each copied out and written while the
#: next computes (the drain is the last eighth of the tile). The pipeline model still counts
#: whole panels and tiles for both: measured, the larger tiles that smaller fills and drains
#: would favour ran slower for reasons the model does not have (see BENCHMARKS.md).
RAMP = (1, 1, 2, 4)
DRAIN = (4, 2, 1, 1)
#: Inner edges of those pieces fall on multiples of this (whole kernel tiles, aligned loads).
PIECE_ALIGN = 256


#: Calibrated rates are rounded to this many points per octave (steps of 4.4%) before
#: planning: two processes that time one machine a little apart then get the same rates, and
#: the same plan where two plans' predicted times are close (tiles, and so the order in which
#: C's sums are added, do not change from run to run).
RATE_STEPS = 16


def snap_rate(x: float | None) -> float | None:
    """``x`` rounded to the nearest of RATE_STEPS points per octave (None, 0 and infinite
    rates as they are)."""
    if x is None or not 0 < x < math.inf:
        return x
    return 2.0 ** (round(math.log2(x) * RATE_STEPS) / RATE_STEPS)


@dataclass(frozen=True)
class Rates:
    """Nominal speeds (per second) used only for the predicted time."""

    flops: float
    read_bytes: float
    write_bytes: float
    h2d_bytes: float | None = None  # None: host memory is the compute memory (no copies)
    #: With checksums (verify="checksum"): bytes per second the checksum reductions read
    #: (None: no checks) and the fixed seconds they add to each step (their launches).
    check_bytes: float | None = None
    check_step: float = 0.0
    #: The gemm does a step's column and row updates itself (``fuses_checks``): the checks
    #: then sum each panel once as it lands, not both panels at every step.
    check_fused: bool = False
    #: Bytes per second of the compute memory (None: not counted). A gemm step that adds into
    #: its C tile (every step after a tile's first, and the first when it reads C) reads and
    #: writes the tile once more than the calibrated product, whose C is written once.
    memory_bytes: float | None = None
    #: Flops that one wave of the gemm kernel's thread blocks (all that the GPU holds at once)
    #: does per unit of depth (None: not counted). A gemm's last wave is partly empty: half a
    #: wave is lost per gemm on average, whatever the tile's size, so that many small gemms
    #: lose more than a few large ones.
    wave_flops: float | None = None

    def snapped(self) -> "Rates":
        """These rates with the calibrated speeds (flops, copies, device memory) rounded to
        the nearest of RATE_STEPS points per octave (see there)."""
        return replace(self, flops=snap_rate(self.flops), h2d_bytes=snap_rate(self.h2d_bytes),
                       memory_bytes=snap_rate(self.memory_bytes))

    def gemm_seconds(self, flops: float, steps: int, depth: int, added: float) -> float:
        """Seconds of ``steps`` gemm steps doing ``flops`` over ``depth`` (their depths
        summed) on the compute stream: the flops, the fixed STEP_SECONDS per step, the half
        waves lost, and reading and writing back ``added`` bytes of C tiles that the steps
        add into (see ``memory_bytes``)."""
        return (flops / self.flops + STEP_SECONDS * steps
                + (0.5 * depth * self.wave_flops / self.flops if self.wave_flops else 0.0)
                + (2 * added / self.memory_bytes if self.memory_bytes else 0.0))

    def check_seconds(self, nbytes: float, steps: int) -> float:
        """Seconds the checks add on the compute stream for ``steps`` steps whose sums read
        ``nbytes`` (0 without checks)."""
        return nbytes / self.check_bytes + self.check_step * steps if self.check_bytes else 0.0

    def step_seconds(self, rows: int, cols: int, depth: int, itemsize: int,
                     last: bool, accumulates: bool = False, landed: int | None = None) -> float:
        """Seconds of one gemm step of a rows x cols tile over ``depth`` on the compute
        stream: the gemm (and when it ``accumulates`` into C, the tile's extra traffic), the
        fixed STEP_SECONDS and the checks (sums over both panels, or with ``check_fused``
        over the ``landed`` elements of the panels the step loads, and over the finished
        tile, read twice, after its ``last`` step)."""
        panels = (rows + cols) * depth
        if self.check_fused and landed is not None:
            panels = landed
        summed = panels + (2 * rows * cols if last else 0)
        return (self.gemm_seconds(2 * rows * cols * depth, 1, depth,
                                  itemsize * rows * cols if accumulates else 0)
                + self.check_seconds(itemsize * summed, 1))


def split_range(n: int, weights: tuple[int, ...], align: int = PIECE_ALIGN
                ) -> list[tuple[int, int]]:
    """[0, n) in consecutive pieces about in proportion to ``weights``, inner edges on
    multiples of ``align`` (pieces that would be empty merge with their neighbours; a range
    shorter than two ``align`` stays whole)."""
    total, acc, edges = sum(weights), 0, {0, n}
    for w in weights[:-1]:
        acc += w
        e = round(n * acc / (total * align)) * align
        if 0 < e < n:
            edges.add(e)
    edges = sorted(edges)
    return list(zip(edges, edges[1:]))


@dataclass(frozen=True)
class Tile:
    """One C tile: rows [r0, r1) and columns [c0, c1) of C, grid position (i, j)."""

    i: int
    j: int
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def index(self) -> tuple[int, int]:
        return (self.i, self.j)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.r1 - self.r0, self.c1 - self.c0)


@dataclass(frozen=True)
class Step:
    """One gemm of the schedule: C[tile] (+)= op(A)[rows, k0:k1] @ op(B)[k0:k1, cols].

    ``first``: the first K panel of the tile (apply beta, or zero-initialise when beta == 0).
    ``last``: the tile is complete after this step (copy it out and write it).
    ``load_a``/``load_b``: the panel is not resident and must be read into its slot.
    """

    tile: Tile
    kp: int
    k0: int
    k1: int
    first: bool
    last: bool
    a_slot: int
    load_a: bool
    b_slot: int
    load_b: bool
    c_slot: int


@dataclass(frozen=True)
class Plan:
    """A complete, checked schedule for C = alpha * op(A) @ op(B) + beta * C."""

    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool
    trans_b: bool
    reads_c: bool
    bm: int
    bn: int
    bk: int
    order: str
    staging: bool
    device_budget: int
    host_budget: int
    a_chunks: tuple[int, int] | None = None
    b_chunks: tuple[int, int] | None = None
    rates: Rates | None = field(default=None, compare=False)

    # ----- grid ---------------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def ni(self) -> int:
        return -(-self.m // self.bm)

    @property
    def nj(self) -> int:
        return -(-self.n // self.bn)

    @property
    def nk(self) -> int:
        return -(-self.k // self.bk)

    @property
    def n_tiles(self) -> int:
        return self.ni * self.nj

    @property
    def n_steps(self) -> int:
        """Gemm steps of the whole run: one per K panel of every tile."""
        return self.n_tiles * self.nk

    def tile(self, i: int, j: int) -> Tile:
        r0, c0 = i * self.bm, j * self.bn
        return Tile(i, j, r0, min(r0 + self.bm, self.m), c0, min(c0 + self.bn, self.n))

    def tiles(self) -> Iterator[Tile]:
        """C tiles in execution order."""
        if not self.row_major:
            for j in range(self.nj):
                for i in range(self.ni):
                    yield self.tile(i, j)
        else:
            for i in range(self.ni):
                for j in range(self.nj):
                    yield self.tile(i, j)

    def k_panels(self) -> list[tuple[int, int]]:
        return [(k0, min(k0 + self.bk, self.k)) for k0 in range(0, self.k, self.bk)]

    # ----- slots --------------------------------------------------------------------------
    @property
    def a_slots(self) -> int:
        return self.nk + 1 if self.order == "resident-a" else 2

    @property
    def b_slots(self) -> int:
        return self.nk + 1 if self.order == "resident-b" else 2

    @property
    def a_panel_shape(self) -> tuple[int, int]:
        """Shape of one A panel as stored (op(A) panel is bm x bk; stored transposed if trans_a)."""
        return (self.bk, self.bm) if self.trans_a else (self.bm, self.bk)

    @property
    def b_panel_shape(self) -> tuple[int, int]:
        """Shape of one B panel as stored (op(B) panel is bk x bn)."""
        return (self.bn, self.bk) if self.trans_b else (self.bk, self.bn)

    def steps(self, done: frozenset[tuple[int, int]] | set = frozenset()) -> Iterator[Step]:
        """Every gemm of the schedule, skipping the tiles in ``done`` (already written).

        Panels are placed in slots by least-recently-used replacement; a panel found in its
        slot is not loaded again. The slot a panel is loaded into was last used at least two
        steps earlier, so loading it can overlap the previous step's compute.
        """
        panels = self.k_panels()
        last = len(panels) - 1
        for t, kp, a_slot, load_a, b_slot, load_b, c_slot in self._slot_schedule(done):
            k0, k1 = panels[kp]
            yield Step(t, kp, k0, k1, kp == 0, kp == last, a_slot, load_a, b_slot, load_b, c_slot)

    def _slot_schedule(self, done=frozenset()) -> Iterator[tuple]:
        """``steps`` as plain tuples (tile, kp, a_slot, load_a, b_slot, load_b, c_slot): the one
        place the slots are assigned, shared by ``steps`` and the pipeline model."""
        a_cache: OrderedDict = OrderedDict()  # key -> slot, in LRU order
        b_cache: OrderedDict = OrderedDict()
        a_slots, b_slots, nk = self.a_slots, self.b_slots, self.nk
        c_slot = 0
        for t in self.tiles():
            if t.index in done:
                continue
            for kp in range(nk):
                a_slot, load_a = _lru(a_cache, (t.i, kp), a_slots)
                b_slot, load_b = _lru(b_cache, (t.j, kp), b_slots)
                yield t, kp, a_slot, load_a, b_slot, load_b, c_slot
            c_slot = (c_slot + 1) % C_SLOTS

    # ----- memory -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> int:
        """Bytes the compute side holds: C tiles and the A and B panel slots."""
        w = self.itemsize
        return w * (C_SLOTS * self.bm * self.bn + self.a_slots * self.bm * self.bk
                    + self.b_slots * self.bk * self.bn)

    @property
    def host_bytes(self) -> int:
        """Host staging bytes (pinned). Without staging, the compute buffers are host memory."""
        if not self.staging:
            return self.device_bytes
        w = self.itemsize
        return w * (HOST_PANEL_SLOTS * (self.bm * self.bk + self.bk * self.bn)
                    + HOST_C_SLOTS * self.bm * self.bn)

    # ----- traffic ------------------------------------------------------------------------
    @property
    def row_major(self) -> bool:
        return self.order != "resident-b"

    @property
    def a_reads(self) -> int:
        """How many times all of A is read under the LRU slot schedule of ``steps``.

        Row-major tiles touch the row panel A(i, 0..nk-1) nj times in a row: it stays when its
        nk panels fit in the slots. Column-major tiles cycle through all ni*nk panels of A per
        tile column: A stays only when all of it fits.
        """
        cycle = self.nk if self.row_major else self.ni * self.nk
        return 1 if self.nj == 1 or self.a_slots >= cycle else self.nj

    @property
    def b_reads(self) -> int:
        """Mirror image of ``a_reads``."""
        cycle = self.nj * self.nk if self.row_major else self.nk
        return 1 if self.ni == 1 or self.b_slots >= cycle else self.ni

    @property
    def bytes_read(self) -> int:
        w = self.itemsize
        c = self.m * self.n if self.reads_c else 0
        return w * (self.a_reads * self.m * self.k + self.b_reads * self.k * self.n + c)

    @property
    def bytes_written(self) -> int:
        return self.itemsize * self.m * self.n

    @property
    def bytes_h2d(self) -> int:
        """Bytes copied host -> device (equal to bytes read: every panel read is copied in)."""
        return self.bytes_read

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def lower_bound_bytes(self) -> float:
        """Communication lower bound 2*M*N*K/sqrt(S) words (S = device budget in elements).

        Also at least the compulsory traffic: each input read once and C written once.
        """
        w = self.itemsize
        s = self.device_budget / w
        hk = 2 * self.m * self.n * self.k / math.sqrt(s)
        compulsory = self.m * self.k + self.k * self.n
        return w * max(hk, compulsory)

    @property
    def bound_ratio(self) -> float:
        """Input bytes moved over the lower bound (1.0 is optimal)."""
        w = self.itemsize
        moved = w * (self.a_reads * self.m * self.k + self.b_reads * self.k * self.n)
        return moved / self.lower_bound_bytes

    @property
    def predicted_seconds(self) -> float | None:
        """The pipeline model's makespan under ``rates`` (see :func:`predict_seconds`)."""
        if self.rates is None:
            return None
        if "_predicted" not in self.__dict__:  # frozen: cache beside the fields
            object.__setattr__(self, "_predicted", predict_seconds(self, self.rates))
        return self.__dict__["_predicted"]

    def key(self) -> dict:
        """What identifies the schedule (recorded in the resume journal)."""
        return {f: getattr(self, f) for f in
                ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c", "bm", "bn", "bk", "order")}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ni=self.ni, nj=self.nj, nk=self.nk, n_tiles=self.n_tiles,
                 device_bytes=self.device_bytes, host_bytes=self.host_bytes,
                 bytes_read=self.bytes_read, bytes_written=self.bytes_written,
                 bytes_h2d=self.bytes_h2d, flops=self.flops,
                 lower_bound_bytes=self.lower_bound_bytes, bound_ratio=self.bound_ratio,
                 predicted_seconds=self.predicted_seconds)
        return d

    def __str__(self) -> str:
        ta, tb = ("A^T" if self.trans_a else "A"), ("B^T" if self.trans_b else "B")
        rows = [
            ("product", f"C[{self.m} x {self.n}] = {ta} @ {tb}, depth {self.k}, {self.dtype}"),
            ("loop order", self.order),
            ("C tiles", f"{self.ni} x {self.nj} = {self.n_tiles} tiles of {self.bm} x {self.bn}"),
            ("K panels", f"{self.nk} per tile, depth {self.bk}"),
            ("device memory", f"{format_bytes(self.device_bytes)} of {format_bytes(self.device_budget)}"
                              f" (C {C_SLOTS}, A {self.a_slots}, B {self.b_slots} slots)"),
            ("host staging", f"{format_bytes(self.host_bytes)} of {format_bytes(self.host_budget)}"
                             + ("" if self.staging else " (shared with compute)")),
            ("read", f"{format_bytes(self.bytes_read)} (A x{self.a_reads}, B x{self.b_reads}"
                     + (", C x1)" if self.reads_c else ")")),
            ("written", format_bytes(self.bytes_written)),
            ("lower bound", f"{format_bytes(self.lower_bound_bytes)}; plan moves "
                            f"{self.bound_ratio:.2f}x the bound"),
            ("flops", f"{self.flops:.3e}"),
        ]
        if self.a_chunks or self.b_chunks:
            rows.append(("input chunks", f"A {self.a_chunks}, B {self.b_chunks}"))
        t = self.predicted_seconds
        if t is not None:
            rows.append(("predicted time", format_seconds(t)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _lru(cache: OrderedDict, key, capacity: int) -> tuple[int, bool]:
    if key in cache:
        cache.move_to_end(key)
        return cache[key], False
    if len(cache) < capacity:
        slot = len(cache)
    else:
        _, slot = cache.popitem(last=False)
    cache[key] = slot
    return slot, True


# ----- the pipeline model -----------------------------------------------------------------

@dataclass(frozen=True)
class StageTimes:
    """Seconds each stage of a plan is busy under some rates (``copy_out`` at the host-to-
    device rate: the copies are symmetric), the fill before the first gemm (the first step's
    reads and copies) and the drain after the last (the last tile's copy-out and write)."""

    read: float
    copy_in: float
    compute: float
    copy_out: float
    write: float
    fill: float
    drain: float
    #: Reading the first tile, or the first row (column) of tiles, then the gemms left after
    #: it and the drain: the longer of the two.
    head: float = 0.0
    #: The first tile's gemms (no write starts before they end).
    first: float = 0.0
    #: How long each later row's (column's) first tile waits for its new row panel beyond its
    #: own gemms, times the number of later rows: a guess (the slots let reads run only a
    #: step or two ahead), not a bound.
    bursts: float = 0.0

    @property
    def guess(self) -> float:
        """A quick estimate of the makespan, to order the candidates simulated."""
        return max(self.lower_bound,
                   max(self.fill + self.compute + self.drain, self.head) + self.bursts)

    @property
    def lower_bound(self) -> float:
        """No schedule ends sooner: each stage is one server, the gemms run between the fill
        and the drain, and a prefix's gemms wait for the prefix's reads."""
        return max(self.read + self.drain, self.copy_in, self.copy_out,
                   self.fill + self.first + self.write, self.fill + self.compute + self.drain,
                   self.head)

    @property
    def upper_bound(self) -> float:
        """The stages one after the other (list scheduling never leaves all of them idle)."""
        return self.read + self.copy_in + self.compute + self.copy_out + self.write


def stage_times(p: Plan, r: Rates) -> StageTimes:
    """Busy seconds per stage of ``p`` under ``r`` (whole schedule; no tiles done)."""
    w, h2d = p.itemsize, (r.h2d_bytes if p.staging and r.h2d_bytes else None)
    first = w * (p.bm * p.bk + p.bk * p.bn + (p.bm * p.bn if p.reads_c else 0))
    rows, cols = p.tile(p.ni - 1, p.nj - 1).shape  # the last tile of either order
    tail = w * rows * cols
    copy = (lambda nbytes: nbytes / h2d) if h2d else (lambda nbytes: 0.0)
    steps = p.n_steps
    # every tile sums its panels once per step (fused: each panel once per load) and itself
    # twice
    summed = ((p.a_reads * p.m * p.k + p.b_reads * p.k * p.n) if r.check_fused
              else p.k * (p.nj * p.m + p.ni * p.n)) + 2 * p.m * p.n
    # every step after a tile's first adds into the tile (and the first too when it reads C)
    adds = p.nk - 1 + (1 if p.reads_c else 0)
    compute = (r.gemm_seconds(p.flops, steps, p.n_tiles * p.k, w * p.m * p.n * adds)
               + r.check_seconds(w * summed, steps))
    drain = copy(tail) + tail / r.write_bytes
    # the first tile's panels and the first row's (column's) are read before their last gemm
    if p.row_major:
        wide, tiles, again = p.n, p.nj, p.a_reads > 1  # row 0: A row panel, all of B
        row = p.bm * p.k * (tiles if again else 1) + p.k * wide
    else:
        wide, tiles, again = p.m, p.ni, p.b_reads > 1
        row = p.bn * p.k * (tiles if again else 1) + p.k * wide
    c = p.bm * p.bn if p.reads_c else 0
    tile0 = (r.gemm_seconds(2 * p.bm * p.bn * p.k, p.nk, p.k, w * p.bm * p.bn * adds)
             + r.check_seconds(w * ((p.bm + p.bn) * p.k + 2 * p.bm * p.bn), p.nk))
    head = max(w * (p.bm * p.k + p.k * p.bn + c) / r.read_bytes + compute - tile0,
               w * (row + c * wide / (p.bn if p.row_major else p.bm)) / r.read_bytes + compute
               - r.gemm_seconds(2 * (p.bm if p.row_major else p.bn) * wide * p.k, p.nk * tiles,
                                tiles * p.k, w * (p.bm if p.row_major else p.bn) * wide * adds)
               ) + drain
    if p.row_major:
        later, panels = p.ni - 1, p.bm * p.k + (p.k * p.bn if p.b_reads > 1 else 0) + c
    else:
        later, panels = p.nj - 1, p.k * p.bn + (p.bm * p.k if p.a_reads > 1 else 0) + c
    burst = max(0.0, w * panels / r.read_bytes - tile0)
    return StageTimes(read=p.bytes_read / r.read_bytes, copy_in=copy(p.bytes_h2d),
                      compute=compute, copy_out=copy(p.bytes_written),
                      write=p.bytes_written / r.write_bytes,
                      fill=first / r.read_bytes + copy(first), drain=drain, head=head,
                      first=tile0, bursts=later * burst)


def predict_seconds(p: Plan, r: Rates, max_steps: int | None = None) -> float:
    """The makespan of ``p``'s pipeline under ``r``, within ``stage_times``' bounds.

    Schedules of at most ``max_steps`` (default SIM_STEPS) steps are simulated whole
    (:func:`simulate`). Longer ones are simulated over a prefix of whole periods (rows of the
    tile order when two fit in ``max_steps``, else tiles, else steps) and extrapolated: the
    last simulated period took ``f`` times its busiest stage's work, and the rest of the
    schedule is taken to take ``f`` times its busiest stage's remaining work, then the drain
    (when the period is a tile, every later row's first tile, which loads a new row panel, is
    taken to take as long as the first one did, and its work is left out of the rest); never
    less than any stage's end in the prefix plus its remaining work."""
    st = stage_times(p, r)
    limit = SIM_STEPS if max_steps is None else max_steps
    total = p.n_steps
    if total <= limit:
        est = simulate(p, r).end
    else:
        row = (p.nj if p.row_major else p.ni) * p.nk
        period = row if 2 * row <= limit else p.nk if 2 * p.nk <= limit else 1
        sim = simulate(p, r, max(2, limit // period) * period, period)
        (t0, *w0), (t1, *w1) = sim.marks[-2:]
        f = (t1 - t0) / max(b - a for a, b in zip(w0, w1))
        left = [total - done for total, done in
                zip((st.read, st.copy_in, st.compute, st.copy_out, st.write), w1)]
        rows = (p.ni if p.row_major else p.nj) - 1 if period == p.nk else 0
        first = sim.marks[0]  # rows longer than the prefix: each later row's first tile
        steady = [max(0.0, x - rows * y) for x, y in zip(left, first[1:])]  # (new row panel)
        est = max(t1 + f * max(steady) + rows * first[0] + st.drain,  # takes as long as the first
                  *(end + rest for end, rest in zip(sim.ends, left)))
    return min(max(est, st.lower_bound), st.upper_bound)


@dataclass(frozen=True)
class Simulated:
    """After simulating a schedule or a prefix: when it ended, where each stage's server
    stands (``ends``: read, copy_in, compute, copy_out, write), and at the end of every
    ``period`` steps the last gemm's end followed by each stage's busy seconds so far."""

    end: float
    ends: tuple[float, float, float, float, float]
    marks: tuple[tuple[float, ...], ...]


def simulate(p: Plan, r: Rates, max_steps: int | None = None, period: int = 0) -> Simulated:
    """List-scheduling simulation of the executor's pipeline for ``p`` under ``r``.

    Each stage is one server taking its work in schedule order: reads (``r.read_bytes``;
    with staging they fill the host slots), copies in (``r.h2d_bytes``), gemms (``r.flops``
    plus STEP_SECONDS), copies out (at the host-to-device rate) and writes of finished C
    tiles (``r.write_bytes``); a gemm adding into its tile also moves the tile through the
    compute memory (``r.memory_bytes``). The executor's limits hold: a step's loads are issued only
    once the last users of their slots have been issued and the step is within
    MAX_LOOKAHEAD of the one issuing; a read waits for its host slot's previous copy-in
    (staging) or its device slot's previous gemm (without staging); a copy-in waits for the
    previous gemm on its device slot; a tile's first gemm waits for the copy-out (the write,
    without staging) of the tile that used its C slot before; a copy-out waits for the write
    of the tile that used its host C buffer before, and so does the issuing of later steps.
    Without staging the gemm runs on the issuing thread. O(steps)."""
    w, staging, reads_c, last_kp = p.itemsize, p.staging, p.reads_c, p.nk - 1
    fused = r.check_fused
    rd, wr = r.read_bytes, r.write_bytes
    h2d = r.h2d_bytes if staging and r.h2d_bytes else math.inf  # no copies: free
    depths = [k1 - k0 for k0, k1 in p.k_panels()]
    read_end = cin_end = gemm_end = cout_end = write_end = issue = assign = 0.0
    busy = [0.0] * 5  # seconds of work so far: read, copy_in, compute, copy_out, write
    issued: list[float] = []  # per step: when the issuing thread was done with it
    gemms: list[float] = [0.0]  # per step + 1: end of its gemm (gemms[0]: none)
    # per operand (A, B, C) and slot: the last step using the device slot, the last step
    # loading into the host slot and the end of that load's copy-in
    dev_user = [[-1] * p.a_slots, [-1] * p.b_slots, [-1] * C_SLOTS]
    host_user = [[-1] * HOST_PANEL_SLOTS, [-1] * HOST_PANEL_SLOTS, [-1] * HOST_C_SLOTS]
    host_copied = [[0.0] * HOST_PANEL_SLOTS, [0.0] * HOST_PANEL_SLOTS, [0.0] * HOST_C_SLOTS]
    host_next = [0, 0, 0]
    c_copied = [0.0] * C_SLOTS  # copy-out end of the last tile in each C slot
    c_written = [0.0] * C_SLOTS  # write end of the last tile in each C slot
    marks = []
    sched = p._slot_schedule()
    if max_steps is not None:
        sched = islice(sched, max_steps)
    for s, (t, kp, a_slot, load_a, b_slot, load_b, cs) in enumerate(sched):
        rows, cols, depth = t.r1 - t.r0, t.c1 - t.c0, depths[kp]
        loads = []  # (operand 0/1/2 = A/B/C, device slot, bytes)
        if load_a:
            loads.append((0, a_slot, w * rows * depth))
        if load_b:
            loads.append((1, b_slot, w * depth * cols))
        if kp == 0 and reads_c:
            host_next[2] = cs
            loads.append((2, cs, w * rows * cols))
        # the loads go to the readers once their slots' last users were issued
        if s >= MAX_LOOKAHEAD and issued[s - MAX_LOOKAHEAD] > assign:
            assign = issued[s - MAX_LOOKAHEAD]
        for op, slot, _ in loads:
            u = dev_user[op][slot]
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
            u = host_user[op][host_next[op]] if staging else -1
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
        start = issue
        for op, slot, nbytes in loads:
            if op == 2:
                ready = c_written[slot]
            elif staging:
                ready = host_copied[op][host_next[op]]
            else:
                ready = gemms[dev_user[op][slot] + 1]
            read_end = max(read_end, assign, ready) + nbytes / rd
            busy[0] += nbytes / rd
            if read_end > start:
                start = read_end
        # the issuing thread: copies in, the gemm, and after a tile's last gemm its copy-out
        landed = sum(nbytes for op, _, nbytes in loads if op < 2) // w if fused else None
        gemm = r.step_seconds(rows, cols, depth, w, kp == last_kp, kp > 0 or reads_c, landed)
        busy[2] += gemm
        if staging:
            ready = start
            for op, slot, nbytes in loads:
                free = c_copied[slot] if op == 2 else gemms[dev_user[op][slot] + 1]
                cin_end = ready = max(cin_end, start, free) + nbytes / h2d
                busy[1] += nbytes / h2d
                h = host_next[op]
                host_user[op][h], host_copied[op][h] = s, cin_end
                host_next[op] = (h + 1) % HOST_PANEL_SLOTS
            if kp == 0 and not reads_c and c_copied[cs] > ready:
                ready = c_copied[cs]
            gemm_end = (gemm_end if gemm_end > ready else ready) + gemm
            issue = start
        else:
            if kp == 0 and not reads_c and c_written[cs] > start:
                start = c_written[cs]
            issue = gemm_end = (gemm_end if gemm_end > start else start) + gemm
        if kp == last_kp:
            nbytes = w * rows * cols
            done = gemm_end
            if staging:
                if c_written[cs] > issue:
                    issue = c_written[cs]
                c_copied[cs] = cout_end = done = max(cout_end, gemm_end, issue) + nbytes / h2d
                busy[3] += nbytes / h2d
            c_written[cs] = write_end = (write_end if write_end > done else done) + nbytes / wr
            busy[4] += nbytes / wr
        issued.append(issue)
        gemms.append(gemm_end)
        dev_user[0][a_slot] = dev_user[1][b_slot] = dev_user[2][cs] = s
        if period and (s + 1) % period == 0:
            marks.append((gemm_end, *busy))
    return Simulated(end=max(write_end, gemm_end),
                     ends=(read_end, cin_end, gemm_end, cout_end, write_end), marks=tuple(marks))


# ----- planning ---------------------------------------------------------------------------

def _check_dims(m: int, n: int, k: int) -> None:
    for name, v in (("M", m), ("N", n), ("K", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShapeError(f"Expected {name} to be a positive integer. Got {v!r}.")


def _units(dim: int, chunk: int | None, align: int) -> int:
    """Tile-size unit along one dimension: the chunk edge if chunked, else ``align``."""
    unit = chunk if chunk else align
    return max(1, min(unit, dim))


def _candidates(dim: int, unit: int, lo: int) -> list[int]:
    """Tile sizes for one dimension: even splits of ``dim`` rounded up to ``unit``, largest first.

    Includes the smallest allowed size, max(unit, min(dim, lo)) capped at dim, so the minimum
    budget stated for unaligned tiles (unit 1) works.
    """
    out = {min(dim, max(unit, lo))}
    nb = 1
    while True:
        t = min(dim, -(-(-(-dim // nb)) // unit) * unit)  # ceil(ceil(dim / nb) / unit) * unit
        if t < min(lo, dim):
            break
        out.add(t)
        if t <= unit:
            break
        nb = nb + 1 if nb < 8 else max(nb + 1, int(nb * 1.4))
    return sorted(out, reverse=True)


def _op_chunks(chunks: tuple[int, int] | None, trans: bool) -> tuple[int | None, int | None]:
    """Chunk edges of op(X) as (rows, cols) of op(X)."""
    if not chunks:
        return None, None
    return (chunks[1], chunks[0]) if trans else (chunks[0], chunks[1])


#: Plans kept by make_plan.
PLAN_CACHE = 256


def _cached_plans(plan_fn):
    """``plan_fn`` keeping its last PLAN_CACHE results by argument: plans are frozen and depend
    on the arguments alone, so a process running jobs of one shape plans once (choosing by
    time simulates up to SIM_PLANS schedules, tens of milliseconds). Lists (chunk shapes,
    tiles) count as the tuples they equal; errors are raised again every time."""
    cached = functools.lru_cache(maxsize=PLAN_CACHE)(plan_fn)

    @functools.wraps(plan_fn)
    def plan(*args, **kwargs):
        return cached(*args, **{k: tuple(v) if isinstance(v, list) else v
                                for k, v in kwargs.items()})

    return plan


@_cached_plans
def make_plan(m: int, n: int, k: int, dtype: str = "float32", *, trans_a: bool = False,
              trans_b: bool = False, reads_c: bool = False, device_budget: int,
              host_budget: int | None = None, staging: bool = True,
              a_chunks: tuple[int, int] | None = None, b_chunks: tuple[int, int] | None = None,
              align: int = 256, max_bk: int = 4096, min_tile: int = 8,
              tile: tuple[int, int, int] | None = None, order: str | None = None,
              rates: Rates | None = None, step_bytes: int = STEP_COST_BYTES) -> Plan:
    """Choose the schedule moving the fewest bytes within both budgets (cached: see
    :func:`_cached_plans`).

    ``step_bytes``: the fixed cost of one gemm step in bytes moved, for the byte objective
    (STEP_COST_BYTES; more where each gemm call costs more, as on a CPU with many BLAS
    threads: see :func:`cpu_step_bytes`).

    Tile edges are multiples of ``align`` (256: whole block tiles of the GPU kernels, whose
    largest is 128 x 256) unless the dimension is smaller or the budget forbids it.

    ``max_bk`` caps the K panels' depth; when choosing by time, the fastest few plans are
    also tried with deeper panels, up to twice as deep (:func:`_fastest`).

    ``a_chunks``/``b_chunks`` are the stored datasets' chunk shapes (before transposition);
    tile edges are multiples of them where the budget allows. ``tile``=(bm, bn, bk) and
    ``order`` fix the schedule (used to resume a run exactly as it started); they are checked
    against the budgets like any other.
    """
    _check_dims(m, n, k)
    if dtype not in DTYPES:
        raise DtypeError(f"Expected dtype float32 or float64. Got {dtype!r}.")
    if order is not None and order not in ORDERS:
        raise PlanError(f"Expected order to be one of {', '.join(ORDERS)}. Got {order!r}.")
    for name, v in (("device budget", device_budget), ("host budget", host_budget)):
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise BudgetError(f"Expected the {name} as a positive number of bytes. Got {v!r}.")
    host_budget = device_budget if host_budget is None else host_budget
    base = dict(m=m, n=n, k=k, dtype=dtype, trans_a=trans_a, trans_b=trans_b, reads_c=reads_c,
                staging=staging, device_budget=device_budget, host_budget=host_budget,
                a_chunks=tuple(a_chunks) if a_chunks else None,
                b_chunks=tuple(b_chunks) if b_chunks else None, rates=rates)

    if tile is not None:
        bm, bn, bk = tile
        for name, v, dim in (("bm", bm, m), ("bn", bn, n), ("bk", bk, k)):
            if not isinstance(v, int) or v < 1:
                raise PlanError(f"Expected tile size {name} to be a positive integer. Got {v!r}.")
        plan = Plan(bm=min(bm, m), bn=min(bn, n), bk=min(bk, k), order=order or "stream", **base)
        _check_fits(plan)
        return plan

    am, ak = _op_chunks(a_chunks, trans_a)
    bkc, bnc = _op_chunks(b_chunks, trans_b)
    k_chunk = max(c for c in (ak, bkc, 1) if c)
    for aligned in (True, False):
        um = _units(m, am, align) if aligned else 1
        un = _units(n, bnc, align) if aligned else 1
        uk = _units(k, k_chunk if (ak or bkc) else align, align) if aligned else 1
        depths = _candidates(k, uk, min_tile)
        shallow = max(max_bk, uk)
        bks = [b for b in depths if b <= shallow] or [min(k, uk)]
        found = []
        for o in ((order,) if order else ORDERS):
            for bm in _candidates(m, um, min_tile):
                for bn in _candidates(n, un, min_tile):
                    if not _fits(Plan(bm=bm, bn=bn, bk=bks[-1], order=o, **base)):
                        continue
                    for bk in bks:  # largest first: the first that fits is the best for (bm, bn)
                        p = Plan(bm=bm, bn=bn, bk=bk, order=o, **base)
                        if _fits(p):
                            found.append(((_cost(p, step_bytes), p.n_steps, -p.bk,
                                           ORDERS.index(o)), p))
                            break
        if found:
            if rates is None:
                return min(found, key=lambda x: x[0])[1]
            return _fastest(found, rates, [b for b in depths if shallow < b <= 2 * shallow])
    raise _too_small(Plan(bm=min(m, min_tile), bn=min(n, min_tile), bk=min(k, min_tile),
                          order="stream", **base))


def _fastest(found: list[tuple[tuple, Plan]], rates: Rates, depths: list[int] = ()) -> Plan:
    """The candidate with the shortest predicted makespan (ties: the byte score): the first
    SIM_PLANS in order of ``StageTimes.guess`` and the SIM_LARGE with the fewest steps are
    simulated (a candidate whose lower bound exceeds the best makespan found is not), and the
    DEEPEN fastest are tried again with the deepest K panel of ``depths`` (deepest first) that
    fits (fewer C-tile updates and steps against a longer fill)."""
    ranked = sorted(((stage_times(p, rates), score, p) for score, p in found),
                    key=lambda x: (x[0].guess, x[1]))
    timed: list[tuple[float, tuple, Plan]] = []
    best = math.inf

    def simulate_unless_bounded(st: StageTimes, score: tuple, p: Plan) -> None:
        nonlocal best
        if st.lower_bound <= best:
            timed.append((p.predicted_seconds, score, p))
            best = min(best, timed[-1][0])

    rest = []
    for i, candidate in enumerate(ranked):
        if len(timed) == SIM_PLANS:
            rest = ranked[i:]
            break
        simulate_unless_bounded(*candidate)
    for candidate in sorted(rest, key=lambda x: (x[2].n_steps, x[0].guess, x[1]))[:SIM_LARGE]:
        simulate_unless_bounded(*candidate)
    timed.sort(key=lambda x: x[:2])
    for _, score, p in timed[:DEEPEN]:
        deeper = next((q for q in (replace(p, bk=bk) for bk in depths) if _fits(q)), None)
        if deeper is not None:
            timed.append((deeper.predicted_seconds, score, deeper))
    return min(timed, key=lambda x: x[:2])[2]


def _cost(p: Plan, step_bytes: int = STEP_COST_BYTES) -> int:
    """What the planner minimises, in bytes moved: the traffic, plus the pipeline's fill (the
    first panels, read before any compute) and drain (the last C tile, written after all
    compute), which no overlap hides, plus a fixed cost per gemm step."""
    w = p.itemsize
    fill = w * (p.bm * p.bk + p.bk * p.bn)
    drain = DRAIN_WEIGHT * w * p.bm * p.bn
    return p.bytes_read + fill + drain + step_bytes * p.n_steps


def cpu_step_bytes(threads: int) -> int:
    """The fixed cost of one gemm step on a CPU whose BLAS runs ``threads`` threads: every
    call starts and synchronises all of them and packs its panels anew, so the cost grows
    with the threads (measured on 16 cores, 12288^3 float32 under a 256 MiB budget: 48 tiles
    of 4096 x 768 in 384 gemms ran at 0.78 of in-core numpy.matmul, 9 tiles of 4096 x 4096 in
    54 gemms at 0.845, reading 3.4 GiB instead of 2.3)."""
    return STEP_COST_BYTES * max(1, int(threads))


def _fits(plan: Plan) -> bool:
    return plan.device_bytes <= plan.device_budget and plan.host_bytes <= plan.host_budget


def _check_fits(plan: Plan) -> None:
    if not _fits(plan):
        raise BudgetError(
            f"Expected budgets of at least {format_bytes(plan.device_bytes)} (device) and "
            f"{format_bytes(plan.host_bytes)} (host) for tiles {plan.bm}x{plan.bn}x{plan.bk} "
            f"in order {plan.order}. Got {format_bytes(plan.device_budget)} and "
            f"{format_bytes(plan.host_budget)}.",
            minimum=max(plan.device_bytes, plan.host_bytes))


def _too_small(smallest: Plan) -> BudgetError:
    need_dev, need_host = smallest.device_bytes, smallest.host_bytes
    parts = []
    if smallest.device_budget < need_dev:
        parts.append(f"a device memory budget of at least {need_dev} bytes "
                     f"({format_bytes(need_dev)}). Got {smallest.device_budget} bytes")
    if smallest.host_budget < need_host:
        parts.append(f"a host memory budget of at least {need_host} bytes "
                     f"({format_bytes(need_host)}). Got {smallest.host_budget} bytes")
    return BudgetError(
        f"Expected {'; and '.join(parts)} (the smallest tiles, "
        f"{smallest.bm}x{smallest.bn}x{smallest.bk}, need that much).",
        minimum=max(need_dev, need_host))
