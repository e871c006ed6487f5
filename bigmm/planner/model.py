"""The pipeline model: rates, and the time a plan's pipeline takes under them.

A plan's predicted time is the makespan of a step-level model of the executor's pipeline
(:func:`simulate`): read -> copy in -> gemm -> copy out -> write, each stage one server taking
its work in schedule order, a load waiting for its slot's previous user (host staging slots,
the order's device slots, the C slots) and for the executor's look-ahead window (the slots
and the window are the schedule's: :mod:`bigmm.planner.schedule`). Schedules longer than
SIM_STEPS steps are simulated over a prefix of whole rows or tiles and extrapolated
(:func:`predict_seconds`). :func:`stage_times` gives each stage's busy time, bounds on the
makespan and a quick guess of it (:class:`~.stages.StageTimes`), by which the search orders
the candidates it simulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import islice

from .derived import made
from .host import lock_seconds, pinned_at, pins, read_rates
from .schedule import HOST_C_SLOTS, MAX_LOOKAHEAD, PIECE_BYTES, Plan
from .stages import StageTimes, direct_operands, pitched

#: Fixed time of one gemm step in the pipeline model (the ~40 us of the search's
#: STEP_COST_BYTES).
STEP_SECONDS = 40e-6
#: Nominal disk speeds (bytes per second) for the predicted time (page-cache reads are faster).
READ_RATE, WRITE_RATE = 2.0e9, 1.0e9
#: Steps the pipeline model simulates per plan; longer schedules are extrapolated.
SIM_STEPS = 1024

#: Calibrated rates are rounded to this many points per octave (steps of 4.4%) before
#: planning: two processes that time one machine a little apart then get the same rates, and
#: the same plan where two plans' predicted times are close (tiles, and so the order in which
#: C's sums are added, do not change from run to run).
RATE_STEPS = 16
#: The least share of the one-way rate the model lets copies keep while the link runs both
#: ways (below it, copies both ways would be slower than one after the other).
MIN_DUPLEX = 0.5
#: The share of a staging block's pinning that holds the run up when the block is pinned
#: while the run goes: its locking, during which the driver makes the issuing thread's CUDA
#: calls wait (faulting its pages in first takes about as long).
LOCK_SHARE = 0.5


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
    #: Fixed seconds of one gemm step on the issuing thread and the compute stream (the
    #: executor's bookkeeping, the launch; on a CPU also the BLAS call's start): what makes
    #: tiny tiles slow.
    per_step: float = STEP_SECONDS
    #: Fixed seconds of one read of a panel (or a C tile) by the host, and of one write of a C
    #: tile, beyond its bytes: the call into the source, its threads, a chunk's lookup.
    per_load: float = 0.0
    #: Host seconds the issuing thread of a staging backend spends on each step (launching
    #: its copies and gemm, its bookkeeping) and on each staged load it takes over from the
    #: reader threads: work on that one thread, beside the compute stream, which bounds steps
    #: too small to hide it.
    per_issue: float = 0.0
    per_handoff: float = 0.0
    #: Fixed seconds of a staging backend's run beyond its steps: starting and stopping its
    #: slots, streams and threads (in the setup).
    per_run: float = 0.0
    #: Seconds per row of a host copy between a user's array and the staging buffers, beyond
    #: its bytes (a panel of a wider array is copied row by row), for reads and writes alike.
    per_host_row: float = 0.0
    #: Seconds per row of a pitched copy between the device and a user's array copied in place
    #: (a panel narrower than the array's rows is one 2-D copy of many rows; staged panels
    #: are contiguous).
    per_row: float = 0.0
    #: Bytes per second of page-locking a user's array in place for a run and releasing it
    #: after (None: not known; then not counted).
    register_bytes: float | None = None
    #: Bytes per second of allocating the run's page-locked staging buffers (None: not
    #: counted). A run pins its first step's staging before its first copy and the rest
    #: while it goes (:func:`pinned_at`).
    pin_bytes: float | None = None
    #: Sizes in bytes of the page-locked blocks an earlier run of the process kept: a buffer
    #: of one of these sizes is taken, not pinned (each block once, in the order the run
    #: takes its buffers).
    kept_pinned: tuple[int, ...] = ()
    #: Bytes per second one reader thread copies out of a user's array into staging while
    #: the others copy too (None: not counted). A panel is read in pieces of PIECE_BYTES, one
    #: a thread: small panels are read by few threads (:meth:`load_rate`).
    thread_bytes: float | None = None
    #: Flops per second of the products a gemm that splits its panels ahead (``Plan.presplit``)
    #: leaves unsplit: those of tiles too small for it, and plain TF32 ones that round only the
    #: smaller panel ahead (None: ``flops`` for every product). Plain TF32 products that read
    #: both panels as stored (``Plan.reads_as_stored``) run at ``flops``, which was measured so.
    unsplit_flops: float | None = None
    #: Decoded bytes per second one reader reads and decodes of the chunks of A and of B
    #: (0.0: not decoded, or not known): a compressed panel comes in no faster than its
    #: decoding readers decode it (:func:`read_rates`).
    decode_bytes: tuple[float, float] = (0.0, 0.0)
    #: The share of its one-way rate a copy keeps while copies run the other way at once
    #: (1.0: the link carries both directions at full speed; at least MIN_DUPLEX).
    duplex: float = 1.0
    #: Gemm steps timed at their own shapes, as ``(rows, cols, depth, flops per second)`` of
    #: a step that adds into its C tile: a library's kernels run some shapes markedly slower
    #: than others of the same size (see BENCHMARKS.md). A plan whose steps have one of these
    #: shapes is predicted at that rate (:meth:`for_plan`).
    shapes: tuple = ()

    def for_plan(self, p: Plan) -> "Rates":
        """These rates for ``p``'s products: ``flops`` is ``unsplit_flops`` where p's gemm
        could split its panels ahead but does not (``Plan.splits_ahead``: tiles too small, or
        only the smaller panel rounded ahead), and not plain TF32 reading both as stored."""
        r = self
        if self.unsplit_flops and p.presplit and not p.splits_ahead and not p.reads_as_stored:
            r = replace(self, flops=self.unsplit_flops)
        timed = self.shape_flops(p.bm, p.bn, p.bk)
        if timed is None:
            return r
        # the timing holds the step's last wave and its C traffic, which the model adds back
        per_flop = 1 / timed - (p.c_itemsize / (p.bk * r.memory_bytes) if r.memory_bytes else 0)
        return replace(r, flops=1 / per_flop if per_flop > 0 else timed, wave_flops=None)

    def shape_flops(self, rows: int, cols: int, depth: int) -> float | None:
        """The rate a step of this shape was timed at (None: not timed)."""
        return next((f for r, c, d, f in self.shapes if (r, c, d) == (rows, cols, depth)), None)

    def with_shapes(self, timed: dict) -> "Rates":
        """These rates with the steps ``timed`` ({(rows, cols, depth): flops per second})."""
        return replace(self, shapes=tuple(sorted((*shape, f) for shape, f in timed.items())))

    def load_rate(self, nbytes: float) -> float:
        """Bytes per second the host reads loads of ``nbytes`` at: ``read_bytes``, or less
        where so few threads share one (``thread_bytes`` a piece). Panels of a few pieces read
        about one at a time whatever the host slots: measured on an H100 host, 3.5 MiB panels
        (one piece) came in at 11-12 GB/s in all with four slots, one thread's rate."""
        if not self.thread_bytes:
            return self.read_bytes
        return min(self.read_bytes, max(1, int(nbytes) // PIECE_BYTES) * self.thread_bytes)

    def snapped(self) -> "Rates":
        """These rates with the calibrated speeds (flops, copies, device memory, the fixed
        costs of steps, loads and rows, registration) rounded to the nearest of RATE_STEPS
        points per octave (see there)."""
        return replace(self, flops=snap_rate(self.flops), h2d_bytes=snap_rate(self.h2d_bytes),
                       memory_bytes=snap_rate(self.memory_bytes),
                       per_step=snap_rate(self.per_step),
                       per_load=snap_rate(self.per_load),
                       per_issue=snap_rate(self.per_issue),
                       per_handoff=snap_rate(self.per_handoff),
                       per_run=snap_rate(self.per_run),
                       per_row=snap_rate(self.per_row),
                       per_host_row=snap_rate(self.per_host_row),
                       register_bytes=snap_rate(self.register_bytes),
                       pin_bytes=snap_rate(self.pin_bytes),
                       thread_bytes=snap_rate(self.thread_bytes),
                       unsplit_flops=snap_rate(self.unsplit_flops),
                       decode_bytes=tuple(snap_rate(x) or 0.0 for x in self.decode_bytes),
                       duplex=snap_rate(self.duplex),
                       shapes=tuple((r, c, d, snap_rate(f)) for r, c, d, f in self.shapes))

    def gemm_seconds(self, flops: float, steps: int, depth: int, added: float) -> float:
        """Seconds of ``steps`` gemm steps doing ``flops`` over ``depth`` (their depths
        summed) on the compute stream: the flops, the fixed ``per_step`` seconds a step, the
        half waves lost, and reading and writing back ``added`` bytes of C tiles that the
        steps add into (see ``memory_bytes``)."""
        return (flops / self.flops + self.per_step * steps
                + (0.5 * depth * self.wave_flops / self.flops if self.wave_flops else 0.0)
                + (2 * added / self.memory_bytes if self.memory_bytes else 0.0))

    def makespan(self, plan: Plan) -> float:
        """Seconds ``plan``'s pipeline takes under these rates (:func:`predict_seconds`)."""
        return predict_seconds(plan, self)

    def check_seconds(self, nbytes: float, steps: int) -> float:
        """Seconds the checks add on the compute stream for ``steps`` steps whose sums read
        ``nbytes`` (0 without checks)."""
        return nbytes / self.check_bytes + self.check_step * steps if self.check_bytes else 0.0

    def step_seconds(self, rows: int, cols: int, depth: int, itemsize: int,
                     last: bool, accumulates: bool = False, landed: int | None = None,
                     c_itemsize: int | None = None) -> float:
        """Seconds of one gemm step of a rows x cols tile over ``depth`` on the compute
        stream: the gemm (and when it ``accumulates`` into C, the tile's extra traffic), the
        fixed STEP_SECONDS and the checks (sums over both panels, or with ``check_fused``
        over the ``landed`` elements of the panels the step loads, and over the finished
        tile, read twice, after its ``last`` step). ``itemsize``: bytes per panel element;
        ``c_itemsize``: per C element (default ``itemsize``)."""
        panels = (rows + cols) * depth
        if self.check_fused and landed is not None:
            panels = landed
        summed = panels + (2 * rows * cols if last else 0)
        wc = itemsize if c_itemsize is None else c_itemsize
        return (self.gemm_seconds(2 * rows * cols * depth, 1, depth,
                                  wc * rows * cols if accumulates else 0)
                + self.check_seconds(itemsize * summed, 1))


def setup_seconds(p: Plan, r: Rates) -> float:
    """Seconds before the run's first copy and after its last: pinning the staging buffers
    its first step uses that no earlier run kept (``r.pin_bytes``, ``r.kept_pinned``;
    :meth:`Plan.host_slots`) and the locking of the others (LOCK_SHARE of their pinning,
    which holds the run up while they are pinned beside it), page-locking the operands
    ``p.registered`` and releasing them (``r.register_bytes``), the run's own start and end
    (``r.per_run``); 0 for what has no known rate, and without staging."""
    if not p.staging:
        return 0.0
    pin = (sum(nbytes * (1.0 if first else LOCK_SHARE)
               for _, _, nbytes, first, new in pins(p, r) if new) / r.pin_bytes
           if r.pin_bytes else 0.0)
    return (pin + lock_seconds(p.registered, p.m, p.n, p.k, p.itemsize, p.c_itemsize, r)
            + r.per_run)


def stage_times(p: Plan, r: Rates) -> StageTimes:
    """Busy seconds per stage of ``p`` under ``r`` (whole schedule; no tiles done). The
    registration of ``p.registered`` (:func:`setup_seconds`) counts in the fill."""
    r = r.for_plan(p)
    m, n, k, bm, bn, bk, ni, nj, nk = p.m, p.n, p.k, p.bm, p.bn, p.bk, p.ni, p.nj, p.nk
    reads_c, staging, trans_a, trans_b = p.reads_c, p.staging, p.trans_a, p.trans_b
    w, h2d = p.itemsize, (r.h2d_bytes if staging and r.h2d_bytes else None)
    da, db, dc = direct_operands(p)
    # seconds per element flowing in, for the bounds on the first tiles: read by the host, or
    # copied in place
    wc = p.c_itemsize  # C's elements (float32 for half-precision panels)
    ra, rb, rc = read_rates(p, r)
    in_a = (w / h2d if h2d else 0.0) if da else w / ra
    in_b = (w / h2d if h2d else 0.0) if db else w / rb
    in_c = (wc / h2d if h2d else 0.0) if dc else wc / rc
    pa, pb, pc = pitched(p, (da, db, dc))  # (pitched_rows)
    first = w * (bm * bk * p.a_span + bk * bn) + (wc * bm * bn if reads_c else 0)
    first_read = (w * ((not da) * bm * bk / ra + (not db) * bk * bn / rb)
                  + (wc * bm * bn / rc if reads_c and not dc else 0))  # seconds
    rows, cols = m - (ni - 1) * bm, n - (nj - 1) * bn  # the last tile of either order
    tail = wc * rows * cols
    row_s = r.per_row if h2d else 0.0
    steps, n_tiles, c_elements = p.n_steps, p.n_tiles, p.c_elements
    a_passes, b_passes = p.a_passes, p.b_passes
    # every tile sums its panels once per step (fused: each panel once per load) and itself
    # twice
    summed = ((a_passes * m * k + b_passes * k * n) if r.check_fused
              else k * (nj * m + ni * n)) + 2 * m * n
    # every step after a tile's first adds into the tile (and the first too when it reads C)
    adds = nk - 1 + (1 if reads_c else 0)
    compute = (r.gemm_seconds(p.flops, steps, n_tiles * k, wc * c_elements * adds)
               + r.check_seconds(w * summed, steps))
    setup = setup_seconds(p, r)
    hr = r.per_host_row
    write_tile = (0.0 if dc else tail / r.write_bytes + r.per_load + rows * hr)
    drain = (tail / h2d if h2d else 0.0) + (rows if pc else 0) * row_s + write_tile
    c = bm * bn if reads_c else 0
    # a Gram plan's first tile is diagonal: the flops of its upper triangle (and its row's)
    halved = bm * (bm - 1) * k if p.symmetric else 0
    tile0 = (r.gemm_seconds(2 * bm * bn * k - halved, nk, k, wc * bm * bn * adds)
             + r.check_seconds(w * ((bm + bn) * k + 2 * bm * bn), nk))
    head = bursts = 0.0
    if p.order != "resident-c":
        # the first tile's panels and the first row's (column's) are read before its last gemm
        row_major = p.row_major
        if row_major:
            wide, tiles, again = n, nj, p.a_reads > 1  # row 0: A row panel, all of B
            row = (bm * k * (tiles if again else 1) * in_a + k * wide * in_b)
        else:
            wide, tiles, again = m, ni, p.b_reads > 1
            row = (bn * k * (tiles if again else 1) * in_b + k * wide * in_a)
        head = max((bm * k * in_a + k * bn * in_b + c * in_c) + compute - tile0,
                   row + c * wide / (bn if row_major else bm) * in_c + compute
                   - r.gemm_seconds(2 * (bm if row_major else bn) * wide * k - halved,
                                    nk * tiles, tiles * k,
                                    wc * (bm if row_major else bn) * wide * adds)
                   ) + drain + setup
        if row_major:
            later = ni - 1
            panels = bm * k * in_a + (k * bn * in_b if p.b_reads > 1 else 0) + c * in_c
        else:
            later = nj - 1
            panels = k * bn * in_b + (bm * k * in_a if p.a_reads > 1 else 0) + c * in_c
        bursts = later * max(0.0, panels - tile0)
    # reads by the host: staged operands only, each read one call besides its bytes, and
    # its stored rows one by one
    loads = sum([(not da) * a_passes * ni * nk, (not db) * b_passes * nj * nk,
                 (not dc) * n_tiles * reads_c])
    host_rows = ((not da) * a_passes * (k * ni if trans_a else m * nk)
                 + (not db) * b_passes * (n * nk if trans_b else k * nj)
                 + (not dc) * reads_c * m * nj)
    first_rows = (not da) * (bk if trans_a else bm) + (not db) * (bn if trans_b else bk)
    read_seconds = (w * ((not da) * a_passes * m * k / ra
                         + (not db) * b_passes * k * n / rb)
                    + (wc * c_elements / rc if reads_c and not dc else 0))
    # the rows of pitched copies in place: every panel of each pass over A and B, C's tiles
    a_rows = a_passes * (k * ni if trans_a else m * p.a_loads / ni) if pa else 0
    b_rows = b_passes * (n * nk if trans_b else k * nj) if pb else 0
    c_rows = m * nj if pc else 0
    return made(StageTimes, {  # StageTimes(**...), faster
        "read": read_seconds + r.per_load * loads + hr * host_rows,
        "copy_in": (p.bytes_h2d / h2d if h2d else 0.0)
        + row_s * (a_rows + b_rows + (c_rows if reads_c else 0)),
        "compute": compute,
        "copy_out": (wc * c_elements / h2d if h2d else 0.0) + row_s * c_rows,
        "write": 0.0 if dc else (p.bytes_written / r.write_bytes + r.per_load * n_tiles
                                 + hr * m * nj),
        "fill": setup + first_read + (first / h2d if h2d else 0.0)
        + r.per_load * ((not da) + (not db)) + hr * first_rows,
        "drain": drain, "head": head, "first": tile0, "bursts": bursts, "setup": setup,
        "pinning": max(pinned_at(p, r, 0.0).values(), default=0.0) if r.pin_bytes else 0.0,
        "issue": r.per_issue * steps + r.per_handoff * loads if staging else 0.0})


def predict_seconds(p: Plan, r: Rates, max_steps: int | None = None) -> float:
    """The makespan of ``p``'s pipeline under ``r``, within ``stage_times``' bounds.

    Schedules of at most ``max_steps`` (default SIM_STEPS) steps are simulated whole
    (:func:`simulate`). Longer ones are simulated over a prefix and extrapolated. Resident-c:
    its first panels in rounds (a K panel of every strip), the strips' last ``tail`` panels
    after them; the rounds but the last two that fit are left out of the simulation and
    added at the last simulated round's time. The other orders: a prefix of whole periods
    (rows of the tile order when two fit in ``max_steps``, else tiles, else steps): the last
    simulated period took ``f`` times its busiest stage's work, and the rest of the schedule
    is taken to take ``f`` times its busiest stage's remaining work, then the drain (when the
    period is a tile, every later row's first tile, which loads a new row panel, is taken to
    take as long as the first one did, and its work is left out of the rest); never less
    than any stage's end in the prefix plus its remaining work."""
    st = stage_times(p, r)
    limit = SIM_STEPS if max_steps is None else max_steps
    total = p.n_steps
    if total <= limit:
        est = simulate(p, r).end
    elif p.order == "resident-c":
        est = _resident_c_seconds(p, r, limit)
    else:
        row = (p.nj if p.row_major else p.ni) * p.nk
        period = row if 2 * row <= limit else p.nk if 2 * p.nk <= limit else 1
        sim = simulate(p, r, max(2, limit // period) * period, period)
        (t0, *w0), (t1, *w1) = sim.marks[-2:]
        f = (t1 - t0) / max(b - a for a, b in zip(w0, w1))
        left = [total - done for total, done in
                zip((st.read, st.copy_in, st.compute, st.copy_out, st.write, st.issue), w1)]
        rows = (p.ni if p.row_major else p.nj) - 1 if period == p.nk else 0
        first = sim.marks[0]  # rows longer than the prefix: each later row's first tile
        steady = [max(0.0, x - rows * y) for x, y in zip(left, first[1:])]  # (new row panel)
        est = max(t1 + f * max(steady) + rows * first[0] + st.drain,  # takes as long as the first
                  *(end + rest for end, rest in zip(sim.ends, left)))
    return min(max(est, st.lower_bound), st.upper_bound)


def _resident_c_seconds(p: Plan, r: Rates, limit: int) -> float:
    """Resident-c's makespan from a simulation of its first rounds and its whole tail: the
    rounds left out are taken to take as long as the last simulated one."""
    head, span = p.nk - p.tail, p.a_span  # rounds of a strip's A load: a period
    rounds = max(2 * span, min(head, (limit - p.ni * p.tail) // max(1, p.ni)) // span * span)
    if rounds >= head:
        return simulate(p, r).end
    sim = simulate(p, r, period=p.ni, head_rounds=rounds)
    (t0, *_), (t1, *_) = sim.marks[rounds - 1 - span], sim.marks[rounds - 1]
    return sim.end + (head - rounds) * (t1 - t0) / span


@dataclass(frozen=True)
class Simulated:
    """After simulating a schedule or a prefix: when it ended, where each stage's server
    stands (``ends``: read, copy_in, compute, copy_out, write, issue), and at the end of every
    ``period`` steps the last gemm's end followed by each stage's busy seconds so far (the
    issuing thread's last)."""

    end: float
    ends: tuple[float, float, float, float, float, float]
    marks: tuple[tuple[float, ...], ...]


def simulate(p: Plan, r: Rates, max_steps: int | None = None, period: int = 0,
             head_rounds: int | None = None) -> Simulated:
    """List-scheduling simulation of the executor's pipeline for ``p`` under ``r``.

    Each stage is one server taking its work in schedule order: reads (:func:`read_rates`
    and ``r.per_load`` a read; with staging they fill the host slots), copies in
    (``r.h2d_bytes``, and ``r.per_row`` a row of a pitched copy in place), gemms
    (``r.flops`` plus ``r.per_step``), copies out (at the host-to-device rate; a copy's
    seconds that overlap the other direction's copies at ``r.duplex`` of it) and writes
    of finished C tiles (``r.write_bytes``); a gemm adding into its tile also moves the tile
    through the compute memory (``r.memory_bytes``). Operands copied in place
    (``p.in_place``) are not read or written by the host and use no host slot; the run starts
    once ``p.registered`` is page-locked (:func:`setup_seconds`). The executor's limits hold:
    a step's loads are issued only once the last users of their slots have been issued and
    the step is within MAX_LOOKAHEAD of the one issuing; a read waits for its host slot's
    previous copy-in (staging) or its device slot's previous gemm (without staging); a
    copy-in waits for the previous gemm on its device slot; a tile's first gemm waits for the
    copy-out (the write, without staging) of the tile that used its C slot before; a
    copy-out waits for the write of the tile that used its host C buffer before, and so does
    the issuing of later steps. Without staging the gemm runs on the issuing thread.
    ``head_rounds``: resident-c with only that many of its first rounds. O(steps)."""
    r = r.for_plan(p)
    w, staging, reads_c, last_kp = p.itemsize, p.staging, p.reads_c, p.nk - 1
    wc, fused = p.c_itemsize, r.check_fused
    (rate_a, rate_b, rate_c), wr, load_s, hr = (read_rates(p, r), r.write_bytes, r.per_load,
                                                r.per_host_row)
    h2d = r.h2d_bytes if staging and r.h2d_bytes else math.inf  # no copies: free
    row_s = r.per_row if staging and r.h2d_bytes else 0.0
    slow = 1.0 / max(MIN_DUPLEX, min(1.0, r.duplex)) - 1.0  # per second beside the other way
    da, db, dc = direct_operands(p)
    sa, sb, sc = staging and not da, staging and not db, staging and not dc  # host slots
    pa, pb, pc = pitched(p, (da, db, dc))  # (copies of the rows as stored, where pitched)
    trans_a, trans_b, sym = p.trans_a, p.trans_b, p.symmetric
    per_issue, per_handoff = r.per_issue, r.per_handoff
    depths = [k1 - k0 for k0, k1 in p.k_panels()]
    start0 = setup_seconds(p, r)
    read_end = cin_end = gemm_end = cout_end = write_end = issue = assign = start0
    # seconds of work so far: read, copy_in, compute, copy_out, write, issue
    b_read = b_in = b_gemm = b_out = b_write = b_issue = 0.0
    issued: list[float] = []  # per step: when the issuing thread was done with it
    gemms: list[float] = [start0]  # per step + 1: end of its gemm (gemms[0]: none)
    # per operand (A, B, C) and slot: the last step using the device slot, the last step
    # loading into the host slot and the end of that load's copy-in
    dev_a, dev_b, dev_c = [-1] * p.a_slots, [-1] * p.b_slots, [-1] * p.c_slots
    na, nb = p.host_panel_slots("A"), max(1, p.host_panel_slots("B"))
    user_a, user_b, user_c = [-1] * na, [-1] * nb, [-1] * HOST_C_SLOTS
    # a host buffer is free once pinned (those of the first step in the setup, the others
    # in the background: :func:`pinned_at`), then once its last load was copied in
    pinned = pinned_at(p, r, start0)
    copied_a, copied_b, copied_c = ([pinned.get((op, i), start0) for i in range(n)]
                                    for op, n in zip("ABC", (na, nb, HOST_C_SLOTS)))
    ha = hb = hc = 0  # each operand's next host slot
    c_copied = [start0] * p.c_slots  # copy-out end of the last tile in each C slot
    # write end of the last tile through each host C buffer (staging), else each C slot
    c_written = ([pinned.get(("C", i), start0) for i in range(HOST_C_SLOTS)] if staging
                 else [start0] * p.c_slots)
    marks = []
    gemm_of: dict = {}  # (tile shape) -> {step's K panel (and panels landed): seconds}
    sched = p._slot_schedule(head_rounds=head_rounds)
    if max_steps is not None:
        sched = islice(sched, max_steps)
    tile = None
    for s, (t, kp, a_slot, load_a, b_slot, load_b, cs, (ka, kb)) in enumerate(sched):
        if t is not tile:  # its shape, and the seconds of its shape's gemms by step
            tile, rows, cols, diagonal = t, t.r1 - t.r0, t.c1 - t.c0, sym and t.i == t.j
            by_step = gemm_of.get((rows, cols, diagonal))
            if by_step is None:
                by_step = gemm_of[rows, cols, diagonal] = {}
        depth = depths[kp]
        ck = cs % HOST_C_SLOTS if staging else cs  # Plan.host_c_slot
        load_c = kp == 0 and reads_c
        if load_c:
            hc = ck
        # the loads (A, B, then C) go to the readers once their slots' last users were issued
        if s >= MAX_LOOKAHEAD and issued[s - MAX_LOOKAHEAD] > assign:
            assign = issued[s - MAX_LOOKAHEAD]
        if load_a:
            u = dev_a[a_slot]
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
            u = user_a[ha] if sa else -1
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
        if load_b:
            u = dev_b[b_slot]
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
            u = user_b[hb] if sb else -1
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
        if load_c:
            u = dev_c[cs]
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
            u = user_c[hc] if sc else -1
            if u >= 0 and issued[u] > assign:
                assign = issued[u]
        start = issue
        # each load's bytes, and its rows as stored; copied from the user's array: no read
        if load_a:
            bytes_a, stored_a = w * rows * (kb - ka), kb - ka if trans_a else rows
            if da:
                if assign > start:
                    start = assign
            else:
                ready = copied_a[ha] if staging else gemms[dev_a[a_slot] + 1]
                seconds = bytes_a / rate_a + load_s + stored_a * hr
                if assign > read_end:  # (max(read_end, assign, ready))
                    read_end = assign
                read_end = (ready if ready > read_end else read_end) + seconds
                b_read += seconds
                if read_end > start:
                    start = read_end
        if load_b:
            bytes_b, stored_b = w * depth * cols, cols if trans_b else depth
            if db:
                if assign > start:
                    start = assign
            else:
                ready = copied_b[hb] if staging else gemms[dev_b[b_slot] + 1]
                seconds = bytes_b / rate_b + load_s + stored_b * hr
                if assign > read_end:  # (max(read_end, assign, ready))
                    read_end = assign
                read_end = (ready if ready > read_end else read_end) + seconds
                b_read += seconds
                if read_end > start:
                    start = read_end
        if load_c:
            bytes_c = wc * rows * cols
            if dc:
                if assign > start:
                    start = assign
            else:  # the host C buffer: its last write, and its last C copied in
                ready = max(c_written[ck], copied_c[ck]) if staging else c_written[ck]
                seconds = bytes_c / rate_c + load_s + rows * hr
                if assign > read_end:  # (max(read_end, assign, ready))
                    read_end = assign
                read_end = (ready if ready > read_end else read_end) + seconds
                b_read += seconds
                if read_end > start:
                    start = read_end
        # the issuing thread: copies in, the gemm, and after a tile's last gemm its copy-out
        landed = ((bytes_a if load_a else 0) + (bytes_b if load_b else 0)) // w if fused else None
        gemm = by_step.get((kp, landed) if fused else kp)
        if gemm is None:
            gemm = r.step_seconds(rows, cols, depth, w, kp == last_kp, kp > 0 or reads_c,
                                  landed, wc)
            if diagonal:  # a rank-k update of the upper triangle
                gemm -= (rows * cols - rows * (rows + 1) // 2) * 2 * depth / r.flops
            by_step[(kp, landed) if fused else kp] = gemm
        b_gemm += gemm
        if staging:  # the issuing thread's own work before it issues the copies
            work = per_issue + per_handoff * ((load_a and sa) + (load_b and sb) + (load_c and sc))
            start += work
            b_issue += work
            ready = start
            if load_a:
                begin, free = (start if start > cin_end else cin_end), gemms[dev_a[a_slot] + 1]
                begin = free if free > begin else begin  # max(cin_end, start, free)
                seconds = bytes_a / h2d + (stored_a if pa else 0) * row_s
                if slow and cout_end > begin:
                    seconds += slow * min(seconds, cout_end - begin)
                cin_end = ready = begin + seconds
                b_in += seconds
                if sa:
                    user_a[ha], copied_a[ha] = s, cin_end
                    ha = (ha + 1) % na
            if load_b:
                begin, free = (start if start > cin_end else cin_end), gemms[dev_b[b_slot] + 1]
                begin = free if free > begin else begin  # max(cin_end, start, free)
                seconds = bytes_b / h2d + (stored_b if pb else 0) * row_s
                if slow and cout_end > begin:
                    seconds += slow * min(seconds, cout_end - begin)
                cin_end = ready = begin + seconds
                b_in += seconds
                if sb:
                    user_b[hb], copied_b[hb] = s, cin_end
                    hb = (hb + 1) % nb
            if load_c:
                begin, free = (start if start > cin_end else cin_end), c_copied[cs]
                begin = free if free > begin else begin  # max(cin_end, start, free)
                seconds = bytes_c / h2d + (rows if pc else 0) * row_s
                if slow and cout_end > begin:
                    seconds += slow * min(seconds, cout_end - begin)
                cin_end = ready = begin + seconds
                b_in += seconds
                if sc:
                    user_c[hc], copied_c[hc] = s, cin_end
                    hc = (hc + 1) % HOST_C_SLOTS
            if kp == 0 and not reads_c and c_copied[cs] > ready:
                ready = c_copied[cs]
            gemm_end = (gemm_end if gemm_end > ready else ready) + gemm
            issue = start
        else:
            if kp == 0 and not reads_c and c_written[cs] > start:
                start = c_written[cs]
            issue = gemm_end = (gemm_end if gemm_end > start else start) + gemm
        if kp == last_kp:
            nbytes = wc * rows * cols
            done = gemm_end
            if staging:
                if c_written[ck] > issue:
                    issue = c_written[ck]
                begin = max(cout_end, gemm_end, issue)
                seconds = nbytes / h2d + (rows if pc else 0) * row_s
                if slow and cin_end > begin:
                    seconds += slow * min(seconds, cin_end - begin)
                c_copied[cs] = cout_end = done = begin + seconds
                b_out += seconds
            if dc:  # copied out into the user's array: nothing to write
                c_written[ck] = done
            else:
                mirrored = sym and t.i != t.j  # its mirror (or zeros) written too
                seconds = (1 + mirrored) * (nbytes / wr + load_s + rows * hr)
                c_written[ck] = write_end = (write_end if write_end > done else done) + seconds
                b_write += seconds
        issued.append(issue)
        gemms.append(gemm_end)
        dev_a[a_slot] = dev_c[cs] = s
        if not diagonal:  # a diagonal tile of a Gram plan uses no B slot
            dev_b[b_slot] = s
        if period and (s + 1) % period == 0:
            marks.append((gemm_end, b_read, b_in, b_gemm, b_out, b_write, b_issue))
    return Simulated(end=max(write_end, gemm_end, cout_end, *c_written),
                     ends=(read_end, cin_end, gemm_end, cout_end, write_end, issue),
                     marks=tuple(marks))
