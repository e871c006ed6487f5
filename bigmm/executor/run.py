"""The run loop: the calling thread takes the steps from the window of loads in order and issues
each step's copies in, gemm and copy-out, on three streams ordered with events.

Buffers are allocated once per run, as the Plan sized them (:class:`.loads.Slots`). A pool of
reader threads fills them ahead of the compute (:class:`.loads.Loader`), one writer thread
writes finished C tiles and commits them to the output's journal (:class:`.writer.Writer`),
and hooks add work at named points of the steps (:mod:`.hooks`: the checks, injected faults).

Fill and drain. With staging and no hooks, the first step of a run is issued in K pieces
(``tuning.RAMP``): its panels are read, copied in and multiplied piece by piece, so that the
first gemm starts once an eighth of the first panels has landed; not a resumed run, whose
first tile would round differently from the same tile of an uninterrupted run (a resumed C
is bit for bit an uninterrupted run's). The last step of a run
computes its tile in row pieces (``tuning.DRAIN``), and each piece is copied out and written
while the next computes, so that the run ends an eighth of a tile after its last gemm.

With the checksum hook, the writer reads each tile's verdict when it takes the tile (it waits
for the tile's copy-out anyway), so the checks add no host synchronisation. A tile that fails
is not written; once the schedule is done, the failed tiles are computed again from freshly
read panels through the same pipeline and checked again, and a second failure raises
ChecksumError (the output stays resumable without them).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from typing import Callable

import numpy as np

from ..backends.base import Checksums, Syrk
from ..checksum import parse_verify
from ..errors import DtypeError, Interrupted, OptionError, ShapeError
from ..io import tilesums
from ..units import HALF_DTYPES, common_dtype, dtype_name
from ..planner import Plan, Step
from ..runstats import STAGES, Progress, RunStats, StageClock, Tally
from .hooks import Checks, Hook
from .overflow import Origins
from .loads import Entry, Loader, Slots, direct_arrays, k_axis, k_slice, to_lock
from .register import lock, release
from .tuning import DRAIN, split_range, writer_threads
from .writer import Writer

_POLL = 0.1  # seconds between checks of the stop flag while waiting


def execute(plan: Plan, a, b, out, backend, *, alpha: float = 1.0, beta: float = 0.0,
            progress: Callable[[Progress], None] | None = None, io_threads: int = 4,
            stop: threading.Event | None = None, profile=None, verify: str | None = None,
            faults: Hook | None = None) -> RunStats:
    """Run ``plan`` for out = alpha * op(a) @ op(b) + beta * out; returns the run's RunStats.

    ``a``/``b`` are io Sources, ``out`` an io Sink whose ``done`` tiles are skipped. Raises
    Interrupted (output resumable) on KeyboardInterrupt or when ``stop`` is set; errors from
    reader or writer threads are raised here after the other threads have stopped.
    ``profile``: a :class:`bigmm.profile.Profile` that records every stage clock's intervals.
    ``verify="checksum"``: check every C tile with checksums and recompute a tile that fails
    (the :class:`.hooks.Checks` hook; the backend must be
    :class:`~bigmm.backends.base.Checksums`). ``faults``: a hook that corrupts data inside
    the checks (:class:`bigmm.testing.Faults`, for tests of the checks).
    """
    _check_operands(plan, a, b, out, beta)
    verify = parse_verify(verify)
    if verify is not None and plan.dtype in HALF_DTYPES:
        raise OptionError(f"Expected verify=None for {plan.dtype} operands (checksums cover "
                          f"float32 and float64). Got verify={verify!r}.")
    if verify is not None and not isinstance(backend, Checksums):
        raise OptionError(f"Expected a backend with checksum support for verify={verify!r}. "
                          f"Got {backend.name!r}.")
    # alpha == 0: C = beta * C, A and B not read (BLAS's convention): no product to check
    checked = verify and float(alpha) != 0
    hooks = [h for h in (Checks(out.label) if checked else None, faults) if h is not None]
    return Run(plan, a, b, out, backend, float(alpha), float(beta), progress,
               max(1, int(io_threads)), stop or threading.Event(), profile, hooks).run()


def _check_operands(plan: Plan, a, b, out, beta: float) -> None:
    m, n, k = plan.m, plan.n, plan.k
    want = {"A": (k, m) if plan.trans_a else (m, k), "B": (n, k) if plan.trans_b else (k, n),
            "C": (m, n)}
    for name, x in (("A", a), ("B", b), ("C", out)):
        if tuple(x.shape) != want[name]:
            raise ShapeError(f"Expected {name} of shape {want[name]} for this plan. "
                             f"Got {tuple(x.shape)}.")
        if dtype_name(x.dtype) is None:
            raise DtypeError(f"Expected {name} of a dtype bigmm reads and writes. "
                             f"Got {np.dtype(x.dtype)}.")
    # A and B are converted to the plan's dtype as they load, C to its own as it is written
    both = common_dtype(dtype_name(a.dtype), dtype_name(b.dtype))
    if both != plan.dtype:
        raise DtypeError(f"Expected A and B whose common dtype is {plan.dtype} for this plan. "
                         f"Got {np.dtype(a.dtype)} and {np.dtype(b.dtype)} ({both}).")
    if (beta != 0) != plan.reads_c:
        raise ShapeError(f"Expected a plan with reads_c={beta != 0} for beta={beta}. "
                         f"Got reads_c={plan.reads_c}.")


class Run:
    """One run of a plan (see the module docstring)."""

    def __init__(self, plan: Plan, a, b, out, be, alpha: float, beta: float, progress,
                 io_threads: int, stop: threading.Event, profile=None, hooks=()):
        self.plan, self.a, self.b, self.out, self.be = plan, a, b, out, be
        self.alpha, self.beta, self.progress, self.stop = alpha, beta, progress, stop
        self.io_threads = io_threads
        self.clocks = {s: StageClock() for s in STAGES}
        if profile is not None:  # same clocks, each use also recorded as an interval
            self.clocks = {s: profile.clock(s, c) for s, c in self.clocks.items()}
        self.tally = Tally()
        self.cancel = threading.Event()
        self.tiles_total = plan.n_tiles
        self.done_before = frozenset(out.done)
        self.skipped = sum(1 for t in plan.tiles() if t.index in self.done_before)
        self.written = 0
        self.hooks: tuple[Hook, ...] = tuple(hooks)
        self.checks = next((h for h in self.hooks if isinstance(h, Checks)), None)
        if self.checks is not None and plan.a_span > 1:
            raise OptionError(f"Expected a plan loading A one K panel at a time for checked "
                              f"runs. Got a_span={plan.a_span}.")
        #: Whether the run's first step goes in K pieces and its last tile in row pieces
        #: (RAMP, DRAIN): with staging, and without hooks, whose work follows whole steps.
        self.pieced = bool(be.staging) and not self.hooks

    def _allocate(self) -> None:
        p, be = self.plan, self.be
        checked = self.checks is not None
        if p.decoding is not None:  # the readers decoding each input at once, as planned
            for src, n in zip((self.a, self.b), p.decoding.threads):
                if n:
                    src.limit_decoders(n)
        self.locked = lock(be, to_lock(be, p, self.a, self.b, self.out, checked))
        direct = direct_arrays(be, p, self.a, self.b, self.out, checked)
        self.slots = Slots.allocate(be, p, direct)
        self.s_in, self.s_compute, self.s_out = self.streams = [be.stream() for _ in range(3)]
        for hook in self.hooks:
            hook.begin(be, p, self.alpha, self.beta)
        self.gemms: dict[tuple, Callable] = {}  # slots and shapes -> the gemm launch for them

    # ----- the run --------------------------------------------------------------------------
    def run(self) -> RunStats:
        self.t0 = time.perf_counter()
        self.locked, self.streams, self.slots = None, [], None
        try:
            return self._run()
        except BaseException:
            with contextlib.suppress(Exception):  # the run's own error is the one to raise
                if self.slots is not None:  # no buffer left pinning
                    self.slots.close()
                self._unlock()
            raise

    def _unlock(self) -> None:
        """Release the arrays locked for the run once the device is done with them (also
        after an error: the copies issued so far finish first)."""
        if self.locked is None or not self.locked.ranges:
            return
        t0 = time.perf_counter()
        for s in self.streams:
            self.be.synchronize(self.be.record(s))
        try:
            release(self.be, self.locked)
        finally:
            self.locked.seconds += time.perf_counter() - t0

    def _run(self) -> RunStats:
        self._allocate()
        self.pool = cf.ThreadPoolExecutor(self.io_threads, thread_name_prefix="bigmm-read")
        self.loader = Loader(self.plan, self.be, self.slots,
                             {"A": self.a, "B": self.b, "C": self.out}, self.pool, self.tally,
                             self.clocks["read"], self.io_threads, self.cancel,
                             self.pieced and not self.done_before)
        self.writer = Writer(self.be, self.out, self.clocks["write"], self.tally,
                             writer_threads(self.io_threads, self.out.writes),
                             np.dtype(self.out.dtype).itemsize,
                             symmetric=(("upper" if self.plan.upper else "mirror")
                                        if self.plan.symmetric else None),
                             origins=Origins(self.plan, self.a, self.b, self.out.label,
                                             self.alpha, self.beta),
                             spans=tilesums.per_tile(self.tiles_total))
        self.old_c: dict[int, Callable[[], int]] = {}  # C slot -> its old C's non-finite
        self.writer.start()
        try:
            self.issued = 0
            self._loop(self.plan.steps(done=self.done_before))
            self._recompute()
            self.writer.stop()
            self._raise_writer_error()
            self._report()
            self.out.finish()
        except BaseException as e:
            self._abort()
            if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
                raise Interrupted(self.out.interrupted(
                    self.written, self.tiles_total - self.skipped, self.beta)) from None
            raise
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.writer.stop()
            self.slots.close()
        self._unlock()
        return self._stats()

    def _loop(self, steps) -> None:
        loader = self.loader
        loader.start(steps)
        loader.fill(self.issued)
        while loader.window:
            self._check()
            self._issue(loader.window.popleft())
            self.issued += 1
            loader.fill(self.issued)

    def _check(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self._raise_writer_error()
        self._report()

    def _raise_writer_error(self) -> None:
        if self.writer.error is not None:
            raise self.writer.error

    def _report(self) -> None:
        while not self.writer.finished.empty():
            self.writer.finished.get_nowait()
            self.written += 1
            if self.progress is not None:
                self.progress(self.tally.progress(
                    self.skipped + self.written, self.tiles_total, self.skipped,
                    time.perf_counter() - self.t0))

    # ----- issuing copies and gemms ---------------------------------------------------------
    def _issue(self, entry: Entry) -> None:
        st, p, be, slots = entry.step, self.plan, self.be, self.slots
        t = st.tile
        diagonal = p.diagonal(t)
        g0, g1 = st.a_k  # A's slot holds its load: the step's K range of it
        a = k_slice(be.view(slots.dev["A"][st.a_slot],
                            (g1 - g0, t.r1 - t.r0) if p.trans_a else (t.r1 - t.r0, g1 - g0)),
                    k_axis(p, "A"), st.k0 - g0, st.k1 - g0)
        b = a if diagonal else be.view(
            slots.dev["B"][st.b_slot],
            (t.c1 - t.c0, st.k1 - st.k0) if p.trans_b else (st.k1 - st.k0, t.c1 - t.c0))
        c = be.view(slots.dev["C"][st.c_slot], t.shape)
        # the run's last step: its tile in row pieces, each copied out and written while the
        # next computes (staging, no hooks; not a diagonal tile, updated as a whole)
        rows = [(0, t.r1 - t.r0)]
        if st.last and self.loader.drained and self.pieced and not diagonal:
            rows = split_range(t.r1 - t.r0, DRAIN)
        whole = len(entry.pieces) == 1 and len(rows) == 1
        for i, (q0, q1) in enumerate(entry.pieces):
            for load in entry.loads:
                for f in (load.parts[i].futures if i < len(load.parts) else ()):
                    self._wait(f)
            if be.staging:
                self._copy_in(entry, i)
            elif st.first and not p.reads_c and slots.c_key(st.c_slot) in slots.c_written:
                self._wait(slots.c_written[slots.c_key(st.c_slot)])
            beta = (self.beta if st.first else 1.0) if i == 0 else 1.0
            if i == 0 and st.first and beta != 0:  # the old C tile, as loaded
                self.old_c[st.c_slot] = be.nonfinite(c, self.s_compute)
            last = i == len(entry.pieces) - 1
            with self.clocks["compute"]:
                if whole:
                    marks = [(0, t.r1 - t.r0, self._compute(st, a, b, c, beta))]
                else:
                    ak = k_slice(a, k_axis(p, "A"), q0 - st.k0, q1 - st.k0)
                    marks = (self._compute_pieces(
                        ak, k_slice(b, k_axis(p, "B"), q0 - st.k0, q1 - st.k0),
                        c, beta, rows if last else [(0, t.r1 - t.r0)]) if not diagonal
                        else [(0, t.r1 - t.r0, self._rank_k(ak, c, beta, self.s_compute))])
        event = marks[-1][2]
        slots.events[("A", st.a_slot)] = event
        if not diagonal:
            slots.events[("B", st.b_slot)] = event
        rows_, cols_ = t.shape
        self.tally.add(flops=(rows_ * (rows_ + 1) if diagonal and isinstance(be, Syrk)
                              else 2 * rows_ * cols_) * (st.k1 - st.k0))
        if st.last:
            self._finish_tile(st, c, marks)

    def _compute(self, st: Step, a, b, c, beta: float):
        """A whole step's gemm on the compute stream, with the hooks' work around it; returns
        the event recorded after it."""
        s = self.s_compute
        for hook in self.hooks:
            hook.landed(st, a, b, s)
        fused = self.checks.gemm_checks(st, a, b, c, s) if self.checks is not None else None
        if self.plan.diagonal(st.tile):
            self._rank_k(a, c, beta, s)
        elif self.alpha == 0:
            self.be.scale(c, beta, s)
        else:
            self._gemm(st, a, b, c, beta, fused)(s)
        if st.last:
            for hook in reversed(self.hooks):
                hook.finished(st, c, s)
        return self.be.record(s)

    def _compute_pieces(self, a, b, c, beta: float, rows: list[tuple[int, int]]) -> list:
        """One K piece of a step (``a`` and ``b`` that piece's views) in gemms over the row
        ranges ``rows`` of the tile; returns (row0, row1, event after its gemm) per range."""
        be, p, s, marks = self.be, self.plan, self.s_compute, []
        for r0, r1 in rows:
            ar = a[:, r0:r1] if p.trans_a else a[r0:r1]
            if self.alpha == 0:
                be.scale(c[r0:r1], beta, s)
            else:
                be.gemm(ar, b, c[r0:r1], self.alpha, beta, p.trans_a, p.trans_b, s)
            marks.append((r0, r1, be.record(s)))
        return marks

    def _rank_k(self, a, c, beta: float, s):
        """A diagonal tile of a Gram plan: c = alpha * op(a) op(a)^T + beta * c, its upper
        triangle by the backend's syrk (:class:`~bigmm.backends.base.Syrk`), else the whole
        tile by gemm; returns the event after it."""
        p = self.plan
        if self.alpha == 0:
            self.be.scale(c, beta, s)
        elif isinstance(self.be, Syrk):
            self.be.syrk(a, c, self.alpha, beta, p.trans_a, s)
        else:
            self.be.gemm(a, a, c, self.alpha, beta, p.trans_a, not p.trans_a, s)
        return self.be.record(s)

    def _gemm(self, st: Step, a, b, c, beta: float, fused):
        """The step's gemm as a launch taking the stream, set up once per slots and shapes
        (the same views recur at every use of a slot: A's by the width of its load too, its
        rows' pitch); with ``fused`` the gemm does the step's checksum updates too."""
        key = (st.a_slot, st.b_slot, st.c_slot, a.shape, b.shape, st.first,
               st.k0 - st.a_k[0], st.a_k[1] - st.a_k[0])
        launch = self.gemms.get(key)
        if launch is None:
            p, extra = self.plan, {} if fused is None else {"checks": fused}
            launch = self.gemms[key] = self.be.gemm_launcher(a, b, c, self.alpha, beta,
                                                             p.trans_a, p.trans_b, **extra)
        return launch

    def _copy_in(self, entry: Entry, i: int) -> None:
        """Copy in the ``i``-th K piece of an entry's loads (a C tile with the first) and make
        the compute stream wait for it."""
        be, st, events = self.be, entry.step, self.slots.events
        copied = [load for load in entry.loads if i < len(load.parts)]
        with self.clocks["copy_in"]:
            for load in copied:
                free = events.get(load.dev_key)  # last gemm on a slot, copy-out of a C
                if i == 0 and free is not None:
                    be.wait(self.s_in, free)
                be.copy_in(load.parts[i].target(), load.parts[i].dev, self.s_in)
            if copied:
                done = be.record(self.s_in)
                for load in copied:
                    if load.host_key:
                        events[load.host_key] = done
                be.wait(self.s_compute, done)
        c_loaded = any(load.dev_key[0] == "C" for load in entry.loads)
        if i == 0 and st.first and not c_loaded and ("C", st.c_slot) in events:
            be.wait(self.s_compute, events[("C", st.c_slot)])

    def _finish_tile(self, st: Step, c, marks: list) -> None:
        """Hand a finished tile to the writer; with staging, copy it out first, each row range
        of ``marks`` (row0, row1, event after its gemm) once its gemm is done."""
        be, cs, t, slots = self.be, st.c_slot, st.tile, self.slots
        key, src = slots.c_key(cs), c
        if be.staging:
            if key in slots.c_written:  # the host buffer's (or the copy's) previous tile
                self._wait(slots.c_written[key])
            if slots.direct["C"] is not None:  # into the user's array: nothing left to write
                dst, src = slots.direct["C"][t.r0:t.r1, t.c0:t.c1], None
            else:
                dst = src = be.view(slots.host["C"][key].result(), t.shape)
                if ("hC", key) in slots.events:  # a C read into it may still be copying in
                    be.wait(self.s_out, slots.events[("hC", key)])
                self.tally.add(bytes_staged=src.nbytes)
            copied = []
            with self.clocks["copy_out"]:
                for r0, r1, event in marks:
                    be.wait(self.s_out, event)
                    be.copy_out(c[r0:r1], dst[r0:r1], self.s_out)
                    if self.checks is not None:  # beside the tile, guarded by the same write
                        self.checks.copied_out(cs, self.s_out)
                    copied.append((r0, r1, be.record(self.s_out)))
            marks = copied
            slots.events[("C", cs)] = marks[-1][2]
        # its NaN and infinities counted (a diagonal tile's by the writer, once mirrored)
        counted = None
        if not self.plan.diagonal(t):
            counted = be.nonfinite(c, self.s_out)
            if be.staging:
                slots.events[("C", cs)] = be.record(self.s_out)
        counts = (slots.events.get(("C", cs)), counted, self.old_c.pop(cs, None))
        check = self.checks.verdict(cs, t) if self.checks is not None else None
        slots.c_written[key] = self.writer.submit(t, src, marks, check, counts)

    # ----- tiles that failed their checks ---------------------------------------------------
    def _recompute(self) -> None:
        """Compute the tiles whose check failed again, from freshly read panels, through the
        same pipeline (every panel loaded again; the checks run again)."""
        if self.checks is None:
            return
        self._wait(self.writer.barrier())
        while tiles := self.checks.take_redo():
            self._loop(self.plan.fresh_steps(tiles))
            self._wait(self.writer.barrier())

    def _wait(self, fut: cf.Future) -> None:
        """Wait for a future while watching the stop flag and the writer; raise its error."""
        while not fut.done():
            cf.wait([fut], timeout=_POLL)
            if self.stop.is_set():
                raise KeyboardInterrupt
            self._raise_writer_error()
        fut.result()

    # ----- ending ---------------------------------------------------------------------------
    def _abort(self) -> None:
        """Stop reading, let the writer finish the tiles it holds, commit them."""
        self.cancel.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.writer.stop()

    def _stats(self) -> RunStats:
        busy = {f"{s}_busy": c.total for s, c in self.clocks.items()}
        t = self.tally
        checks = self.checks.counts() if self.checks is not None else {}
        locked = self.locked
        return RunStats(time.perf_counter() - self.t0, t.flops, t.bytes_read, t.bytes_written,
                        self.written, self.skipped, self.tiles_total, **busy,
                        bytes_staged=t.bytes_staged, bytes_locked=locked.nbytes,
                        lock_seconds=locked.seconds,
                        notes=locked.notes() + self.out.redone_note(),
                        tiles_redone=len(self.out.redone), **checks)
