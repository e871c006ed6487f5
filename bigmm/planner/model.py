"""The pipeline model: rates, and the time a plan's pipeline takes under them.

A plan's predicted time is the makespan of a step-level model of the executor's pipeline
(:func:`simulate`): read -> copy in -> gemm -> copy out -> write, each stage one server taking
its work in schedule order, a load waiting for its slot's previous user (host staging slots,
the order's device slots, the C slots) and for the executor's look-ahead window (the slots
and the window are the schedule's: :mod:`bigmm.planner.schedule`). Schedules longer than
SIM_STEPS steps are simulated over a prefix of whole rows or tiles and extrapolated
(:func:`predict_seconds`). :class:`StageTimes` gives each stage's busy time, bounds on the
makespan and a quick guess of it, by which the search orders the candidates it simulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import islice

from .schedule import C_SLOTS, HOST_C_SLOTS, HOST_PANEL_SLOTS, MAX_LOOKAHEAD, Plan

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
    wc = p.c_itemsize  # C's elements (float32 for half-precision panels)
    first = w * (p.bm * p.bk + p.bk * p.bn) + (wc * p.bm * p.bn if p.reads_c else 0)
    rows, cols = p.tile(p.ni - 1, p.nj - 1).shape  # the last tile of either order
    tail = wc * rows * cols
    copy = (lambda nbytes: nbytes / h2d) if h2d else (lambda nbytes: 0.0)
    steps = p.n_steps
    # every tile sums its panels once per step (fused: each panel once per load) and itself
    # twice
    summed = ((p.a_reads * p.m * p.k + p.b_reads * p.k * p.n) if r.check_fused
              else p.k * (p.nj * p.m + p.ni * p.n)) + 2 * p.m * p.n
    # every step after a tile's first adds into the tile (and the first too when it reads C)
    adds = p.nk - 1 + (1 if p.reads_c else 0)
    compute = (r.gemm_seconds(p.flops, steps, p.n_tiles * p.k, wc * p.m * p.n * adds)
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
    tile0 = (r.gemm_seconds(2 * p.bm * p.bn * p.k, p.nk, p.k, wc * p.bm * p.bn * adds)
             + r.check_seconds(w * ((p.bm + p.bn) * p.k + 2 * p.bm * p.bn), p.nk))
    head = max((w * (p.bm * p.k + p.k * p.bn) + wc * c) / r.read_bytes + compute - tile0,
               (w * row + wc * c * wide / (p.bn if p.row_major else p.bm)) / r.read_bytes
               + compute
               - r.gemm_seconds(2 * (p.bm if p.row_major else p.bn) * wide * p.k, p.nk * tiles,
                                tiles * p.k, wc * (p.bm if p.row_major else p.bn) * wide * adds)
               ) + drain
    if p.row_major:
        later, panels = p.ni - 1, p.bm * p.k + (p.k * p.bn if p.b_reads > 1 else 0) + c
    else:
        later, panels = p.nj - 1, p.k * p.bn + (p.bm * p.k if p.a_reads > 1 else 0) + c
    burst = max(0.0, (w * (panels - c) + wc * c) / r.read_bytes - tile0)
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
    wc = p.c_itemsize
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
            loads.append((2, cs, wc * rows * cols))
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
        gemm = r.step_seconds(rows, cols, depth, w, kp == last_kp, kp > 0 or reads_c, landed,
                              wc)
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
            nbytes = wc * rows * cols
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
