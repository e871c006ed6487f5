"""Runs a Plan: read -> copy in -> compute -> copy out -> write, with bounded buffers.

The executor is generic over the Backend protocol and the io Source/Sink interfaces. Buffers are
allocated once per run, as the Plan sized them. The calling thread walks ``plan.steps()`` and
issues the copies and gemms; a thread pool reads panels ahead of the compute, and one writer
thread writes finished C tiles and commits them to the output's journal.

Every buffer is a resource with a "last user": the index of the last step that used it. A load
into a buffer is submitted only once its last user has been issued, and the reader first waits
for the event that frees the buffer (the gemm that used a device slot, or the copy that emptied
a host staging slot). Without staging (NumPy) the readers fill the compute slots directly and
every event is already complete when it is recorded; with staging (GPU) they fill the host slots
and the calling thread orders copies and kernels on three streams with events.

Direct copies: an operand that is a NumPy array in page-locked memory (``Backend.host_pinned``)
with contiguous rows in the plan's dtype is not staged. Its panels are copied in straight from
views of the user's array (no reader work, no host slot), and a pinned output array receives
finished C tiles straight from the device; the writer then only waits for the tile's copy-out
before reporting it finished. Other operands (files, pageable arrays) go through the staging
slots as above. ``RunStats.bytes_staged`` counts the bytes that went through host slots.

Fill and drain. With staging, the first step of a run is issued in K pieces (``RAMP``):
its panels are read, copied in and multiplied piece by piece, so that the first gemm starts once
an eighth of the first panels has landed. The last step of a run computes its tile in row pieces
(``DRAIN``), and each piece is copied out and written while the next computes, so that the
run ends an eighth of a tile after its last gemm (see ``RAMP`` for what the planner's
model counts).

With ``verify="checksum"`` every C tile is checked (:mod:`bigmm.checksum`): the checksum work is
issued on the compute stream beside the gemms, and the writer reads each tile's verdict when it
takes the tile (it waits for the tile's copy-out anyway), so the checks add no host
synchronisation. A tile that fails is not written; once the schedule is done, the failed tiles
are computed again from freshly read panels through the same pipeline and checked again, and a
second failure raises ChecksumError (the output stays resumable without them).
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .checksum import Faults, Mismatch, TileChecksums, has_checksums, parse_verify
from .backends.base import rows_contiguous
from .errors import (BigmmError, ChecksumError, DtypeError, Interrupted, OptionError,
                     ReadError, ShapeError, WriteError)
from .io.sink import ArraySink
from .io.source import ArraySource
from .plan import Plan, Step, Tile
from .plan.schedule import C_SLOTS, HOST_C_SLOTS, HOST_PANEL_SLOTS, MAX_LOOKAHEAD
from .runstats import STAGES, Progress, RunStats, StageClock

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


#: Panel reads are split into pieces of about this many bytes, one per I/O thread.
PIECE_BYTES = 4 << 20
#: Finished tiles are committed to the journal in batches at most this many seconds apart.
COMMIT_INTERVAL = 0.5
_POLL = 0.1  # seconds between checks of the stop flag while waiting


@dataclass
class _Part:
    """One K piece of a load (the whole panel unless the step is ramped): its reads' futures
    and the views it goes through."""

    futures: list
    host: Any = None  # staging: the host view read into (or the user's pinned array's region)
    dev: Any = None  # the device view the data ends in


@dataclass
class _Load:
    """One buffer being filled by the readers: its parts (one per K piece of the step; a C
    tile has one) and slot keys."""

    parts: list[_Part]
    dev_key: tuple = ()
    host_key: tuple = ()


@dataclass
class _Entry:
    index: int
    step: Step
    loads: list[_Load] = field(default_factory=list)
    #: The step's K range in pieces (RAMP for the first step of a run, else one piece).
    pieces: list[tuple[int, int]] = field(default_factory=list)


def execute(plan: Plan, a, b, out, backend, *, alpha: float = 1.0, beta: float = 0.0,
            progress: Callable[[Progress], None] | None = None, io_threads: int = 4,
            stop: threading.Event | None = None, profile=None, verify: str | None = None,
            faults: Faults | None = None) -> RunStats:
    """Run ``plan`` for out = alpha * op(a) @ op(b) + beta * out; returns the run's RunStats.

    ``a``/``b`` are io Sources, ``out`` an io Sink whose ``done`` tiles are skipped. Raises
    Interrupted (output resumable) on KeyboardInterrupt or when ``stop`` is set; errors from
    reader or writer threads are raised here after the other threads have stopped.
    ``profile``: a :class:`bigmm.profile.Profile` that records every stage clock's intervals.
    ``verify="checksum"``: check every C tile with checksums and recompute a tile that fails
    (see the module docstring). ``faults``: a :class:`bigmm.checksum.Faults` that corrupts a
    panel or a finished tile on the compute stream (for tests of the checks).
    """
    _check_operands(plan, a, b, out, beta)
    verify = parse_verify(verify)
    if verify is not None and not has_checksums(backend):
        raise OptionError(f"Expected a backend with checksum support for verify={verify!r}. "
                          f"Got {getattr(backend, 'name', type(backend).__name__)!r}.")
    return _Run(plan, a, b, out, backend, float(alpha), float(beta), progress,
                max(1, int(io_threads)), stop or threading.Event(), profile, verify,
                faults).run()


def in_place(be, x, dtype, write: bool = False) -> bool:
    """Whether copies may use the user's array ``x`` in place, nothing staged (see the module
    docstring): a staging backend, a NumPy array in ``dtype`` (native byte order) with
    contiguous rows, in pinned memory (and writeable, to ``write`` into it)."""
    if not be.staging or not (isinstance(x, np.ndarray) and x.dtype == np.dtype(dtype)
                              and x.dtype.isnative and x.flags.aligned and rows_contiguous(x)
                              and (x.flags.writeable or not write)):
        return False
    pinned = getattr(be, "host_pinned", None)
    return pinned is not None and bool(pinned(x))


def _check_operands(plan: Plan, a, b, out, beta: float) -> None:
    m, n, k = plan.m, plan.n, plan.k
    want = {"A": (k, m) if plan.trans_a else (m, k), "B": (n, k) if plan.trans_b else (k, n),
            "C": (m, n)}
    for name, x in (("A", a), ("B", b), ("C", out)):
        if tuple(x.shape) != want[name]:
            raise ShapeError(f"Expected {name} of shape {want[name]} for this plan. "
                             f"Got {tuple(x.shape)}.")
        if np.dtype(x.dtype) != np.dtype(plan.dtype):
            raise DtypeError(f"Expected {name} of dtype {plan.dtype} for this plan. "
                             f"Got {np.dtype(x.dtype)}.")
    if (beta != 0) != plan.reads_c:
        raise ShapeError(f"Expected a plan with reads_c={beta != 0} for beta={beta}. "
                         f"Got reads_c={plan.reads_c}.")


class _Run:
    def __init__(self, plan, a, b, out, backend, alpha, beta, progress, io_threads, stop,
                 profile=None, verify=None, faults=None):
        self.plan, self.a, self.b, self.out, self.be = plan, a, b, out, backend
        self.alpha, self.beta, self.progress, self.stop = alpha, beta, progress, stop
        self.io_threads = io_threads
        self.dtype = np.dtype(plan.dtype)
        self.clocks = {s: StageClock() for s in STAGES}
        if profile is not None:  # same clocks, each use also recorded as an interval
            self.clocks = {s: profile.clock(s, c) for s, c in self.clocks.items()}
        self.lock = threading.Lock()
        self.bytes_read = self.bytes_written = self.flops = self.bytes_staged = 0
        self.cancel = threading.Event()
        self.tiles_total = plan.n_tiles
        done = frozenset(out.done)
        self.skipped = sum(1 for t in plan.tiles() if t.index in done)
        self.done_before = done
        self.written = 0
        self.verify, self.faults = verify, faults
        #: Whether the run's first step goes in K pieces and its last tile in row pieces
        #: (RAMP, DRAIN): with staging, and without checks or injected faults, whose
        #: bookkeeping follows whole steps.
        self.pieced = bool(backend.staging) and verify is None and faults is None
        self.checks: TileChecksums | None = None
        self.checked = 0
        self.mismatches: list[Mismatch] = []
        self.redo: list[Tile] = []  # tiles whose first check failed, not written
        self.retried: set = set()

    # ----- set-up ---------------------------------------------------------------------------
    def _allocate(self) -> None:
        p, be, dt = self.plan, self.be, self.dtype
        self.dev = {"A": [be.device_buffer(p.bm * p.bk, dt) for _ in range(p.a_slots)],
                    "B": [be.device_buffer(p.bk * p.bn, dt) for _ in range(p.b_slots)],
                    "C": [be.device_buffer(p.bm * p.bn, dt) for _ in range(C_SLOTS)]}
        self.direct = {op: self._direct(op, x) for op, x in (("A", self.a), ("B", self.b),
                                                               ("C", self.out))}
        sizes = {"A": (p.bm * p.bk, HOST_PANEL_SLOTS), "B": (p.bk * p.bn, HOST_PANEL_SLOTS),
                 "C": (p.bm * p.bn, HOST_C_SLOTS)}
        self.host = {op: [be.host_buffer(size, dt) for _ in range(slots)]
                     for op, (size, slots) in sizes.items()
                     if be.staging and self.direct[op] is None}
        self.s_in, self.s_compute, self.s_out = be.stream(), be.stream(), be.stream()
        if self.verify is not None:
            self.checks = TileChecksums(be, p, self.alpha, self.beta)
        self.events: dict[tuple, Any] = {}  # buffer key -> event after which it is free
        self.gemms: dict[tuple, Any] = {}  # slots and shapes -> the gemm launch set up for them
        self.c_written: dict[int, cf.Future] = {}  # C slot -> write of its last tile
        self.last_user: dict[tuple, int] = {}
        self.next_host = {"A": 0, "B": 0}

    def _direct(self, op: str, io) -> np.ndarray | None:
        """The user's array behind ``io`` when copies may use it in place (:func:`in_place`).
        Not for C under verify, where a tile that fails its check must not reach the output
        (its recomputation may read old C)."""
        if op == "C" and self.verify is not None:
            return None
        if not isinstance(io, ArraySink if op == "C" else ArraySource):
            return None
        return io.array if in_place(self.be, io.array, self.dtype, op == "C") else None

    # ----- the run --------------------------------------------------------------------------
    def run(self) -> RunStats:
        self.t0 = time.perf_counter()
        self._allocate()
        self.pool = cf.ThreadPoolExecutor(self.io_threads, thread_name_prefix="bigmm-read")
        self.writer = _Writer(self)
        self.writer.start()
        try:
            self.assigned = self.issued = 0
            self._loop(self.plan.steps(done=self.done_before))
            self._recompute()
            self.writer.stop()
            self._raise_writer_error()
            self._report()
            self.out.finish()
        except BaseException as e:
            self._abort()
            if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
                raise Interrupted(
                    f"Interrupted after {self.written} of {self.tiles_total - self.skipped} "
                    f"tiles; the output {self.out.label} is resumable (resume=True).") from None
            raise
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.writer.stop()
        return self._stats()

    def _loop(self, steps) -> None:
        self.ramp = True  # the first step assigned is issued in K pieces (see _assign)
        self.steps = iter(steps)
        self.pending: Step | None = next(self.steps, None)
        self.window: deque[_Entry] = deque()
        self._fill()
        while self.window:
            self._check()
            entry = self.window.popleft()
            self._issue(entry)
            self.issued += 1
            self._fill()

    def _check(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self._raise_writer_error()
        self._report()

    def _raise_writer_error(self) -> None:
        if self.writer.error is not None:
            raise self.writer.error

    def _report(self) -> None:
        while True:
            try:
                self.writer.finished.get_nowait()
            except queue.Empty:
                return
            self.written += 1
            if self.progress is not None:
                with self.lock:
                    snap = Progress(self.skipped + self.written, self.tiles_total, self.skipped,
                                    self.bytes_read, self.bytes_written, self.flops,
                                    time.perf_counter() - self.t0)
                self.progress(snap)

    # ----- loads ahead of the compute -------------------------------------------------------
    def _fill(self) -> None:
        """Submit the loads of the next steps whose buffers' last users have been issued."""
        while self.pending is not None and len(self.window) < MAX_LOOKAHEAD:
            entry = self._assign(self.pending, self.assigned)
            if entry is None:
                return
            self.window.append(entry)
            self.assigned += 1
            self.pending = next(self.steps, None)

    def _assign(self, st: Step, idx: int) -> _Entry | None:
        targets = []  # (operand, device slot, host slot or None)
        if st.load_a:
            targets.append(("A", st.a_slot, self._host_slot("A")))
        if st.load_b:
            targets.append(("B", st.b_slot, self._host_slot("B")))
        if st.first and self.plan.reads_c:
            targets.append(("C", st.c_slot, st.c_slot if "C" in self.host else None))
        keys = [(op, s) for op, s, _ in targets]
        keys += [("h" + op, h) for op, _, h in targets if h is not None]
        if any(self.last_user.get(k, -1) >= self.issued for k in keys):
            return None
        pieces = [(st.k0, st.k1)]
        if self.ramp and self.pieced:
            pieces = [(st.k0 + q0, st.k0 + q1) for q0, q1 in split_range(st.k1 - st.k0, RAMP)]
        self.ramp = False
        entry = _Entry(idx, st, [self._submit(st, *t, pieces) for t in targets], pieces)
        for op, _, h in targets:
            if h is not None and op != "C":
                self.next_host[op] = (h + 1) % HOST_PANEL_SLOTS
        for key in keys + [("A", st.a_slot), ("B", st.b_slot), ("C", st.c_slot)]:
            self.last_user[key] = idx
        return entry

    def _host_slot(self, op: str) -> int | None:
        return self.next_host[op] if op in self.host else None

    def _submit(self, st: Step, op: str, slot: int, hslot: int | None,
                pieces: list[tuple[int, int]]) -> _Load:
        """The reads of one operand of a step, in parts along K (``pieces``; a C tile whole).
        A part's device view is its region of the slot's panel; its host view, where staged,
        is contiguous: a K piece that is a column range of the panel is staged as a block of
        its own and the copy in puts it in place."""
        src, reg, shape = self._region(st, op)
        dev = self.be.view(self.dev[op][slot], shape)
        host_key = ("h" + op, hslot) if hslot is not None else ()
        if op == "C":
            pieces = [(st.k0, st.k1)]
        axis = self._k_axis(op)
        parts = []
        for q0, q1 in pieces:
            a, b = q0 - st.k0, q1 - st.k0
            r0, r1, c0, c1 = reg if axis is None else _along(reg, axis, a, b)
            pdev = dev if axis is None else _k_slice(dev, axis, a, b)
            if self.direct[op] is not None:  # copied in from the user's pinned array
                view = self.direct[op][r0:r1, c0:c1]
                with self.lock:
                    self.bytes_read += view.nbytes
                parts.append(_Part([], view, pdev))
                continue
            host = None
            if hslot is not None:
                buf = self.host[op][hslot]
                if axis == 1:  # a column range, staged after the pieces before it
                    host = self.be.view(buf[(r1 - r0) * a:], (r1 - r0, c1 - c0))
                else:
                    host = self.be.view(buf, shape)
                    host = host if axis is None else _k_slice(host, axis, a, b)
                with self.lock:
                    self.bytes_staged += host.nbytes
            target = pdev if host is None else host
            if op == "C":  # the C buffer is free once the write of its previous tile finished
                gate = self.c_written.get(slot)
                ready = (lambda: gate.result()) if gate is not None else (lambda: None)
            else:
                event = self.events.get(host_key or (op, slot))
                ready = ((lambda: self.be.synchronize(event)) if event is not None
                         else (lambda: None))
            futures = [self.pool.submit(self._read, src, rr0, rr1, c0, c1,
                                        target[rr0 - r0:rr1 - r0], ready)
                       for rr0, rr1 in _pieces(r0, r1, c1 - c0, self.dtype.itemsize,
                                               self.io_threads, getattr(src, "chunks", None))]
            parts.append(_Part(futures, host, pdev))
        return _Load(parts, (op, slot), host_key)

    def _k_axis(self, op: str) -> int | None:
        """The axis of an operand's stored panel that runs along K (None for C)."""
        if op == "A":
            return 0 if self.plan.trans_a else 1
        return (1 if self.plan.trans_b else 0) if op == "B" else None

    def _region(self, st: Step, op: str):
        """(source, stored region (r0, r1, c0, c1), stored shape) of a step's operand."""
        t, k0, k1, p = st.tile, st.k0, st.k1, self.plan
        if op == "A":
            reg = (k0, k1, t.r0, t.r1) if p.trans_a else (t.r0, t.r1, k0, k1)
            src = self.a
        elif op == "B":
            reg = (t.c0, t.c1, k0, k1) if p.trans_b else (k0, k1, t.c0, t.c1)
            src = self.b
        else:
            reg, src = (t.r0, t.r1, t.c0, t.c1), self.out
        return src, reg, (reg[1] - reg[0], reg[3] - reg[2])

    def _read(self, src, r0, r1, c0, c1, target, ready) -> None:
        if self.cancel.is_set():
            return
        ready()
        with self.clocks["read"]:
            try:
                src.read(r0, r1, c0, c1, target)
            except BigmmError:
                raise
            except Exception as e:
                raise ReadError(f"Expected to read rows {r0}:{r1}, columns {c0}:{c1} of "
                                f"{src.label}. Got {type(e).__name__}: {e}") from e
        with self.lock:
            self.bytes_read += target.nbytes

    # ----- issuing copies and gemms ---------------------------------------------------------
    def _issue(self, entry: _Entry) -> None:
        st, p, be = entry.step, self.plan, self.be
        t = st.tile
        a = be.view(self.dev["A"][st.a_slot],
                    (st.k1 - st.k0, t.r1 - t.r0) if p.trans_a else (t.r1 - t.r0, st.k1 - st.k0))
        b = be.view(self.dev["B"][st.b_slot],
                    (t.c1 - t.c0, st.k1 - st.k0) if p.trans_b else (st.k1 - st.k0, t.c1 - t.c0))
        c = be.view(self.dev["C"][st.c_slot], t.shape)
        # the run's last step: its tile in row pieces, each copied out and written while the
        # next computes (staging, no checks)
        rows = [(0, t.r1 - t.r0)]
        if st.last and self.pending is None and not self.window and self.pieced:
            rows = split_range(t.r1 - t.r0, DRAIN)
        whole = len(entry.pieces) == 1 and len(rows) == 1
        for i, (q0, q1) in enumerate(entry.pieces):
            for load in entry.loads:
                for f in (load.parts[i].futures if i < len(load.parts) else ()):
                    self._wait(f)
            if be.staging:
                self._copy_in(entry, i)
            elif st.first and not p.reads_c and st.c_slot in self.c_written:
                self._wait(self.c_written[st.c_slot])
            beta = (self.beta if st.first else 1.0) if i == 0 else 1.0
            last = i == len(entry.pieces) - 1
            with self.clocks["compute"]:
                if whole:
                    marks = [(0, t.r1 - t.r0, self._compute(st, a, b, c, beta))]
                else:
                    marks = self._compute_pieces(
                        _k_slice(a, self._k_axis("A"), q0 - st.k0, q1 - st.k0),
                        _k_slice(b, self._k_axis("B"), q0 - st.k0, q1 - st.k0),
                        c, beta, rows if last else [(0, t.r1 - t.r0)])
        event = marks[-1][2]
        self.events[("A", st.a_slot)] = self.events[("B", st.b_slot)] = event
        with self.lock:
            self.flops += 2 * (t.r1 - t.r0) * (t.c1 - t.c0) * (st.k1 - st.k0)
        if st.last:
            self._finish_tile(st, c, marks)

    def _compute(self, st: Step, a, b, c, beta: float):
        """A whole step's gemm on the compute stream, with its checks and injected faults;
        returns the event recorded after it."""
        be, checks, s = self.be, self.checks, self.s_compute
        if checks is not None:
            for op, load, slot, x in (("A", st.load_a, st.a_slot, a),
                                      ("B", st.load_b, st.b_slot, b)):
                if load:
                    checks.landed(op, slot, x, s)
        if self.faults is not None:
            with be.run_on(s):
                self.faults.corrupt_panel(st, a, b)
        fused = checks.step(st, a, b, c, s) if checks is not None else None
        self._gemm(st, a, b, c, beta, fused)(s)
        if st.last and self.faults is not None:
            with be.run_on(s):
                self.faults.corrupt_tile(st, c)
        if st.last and checks is not None:
            checks.finish(st, c, s)
        return be.record(s)

    def _compute_pieces(self, a, b, c, beta: float, rows: list[tuple[int, int]]) -> list:
        """One K piece of a step (``a`` and ``b`` that piece's views) in gemms over the row
        ranges ``rows`` of the tile; returns (row0, row1, event after its gemm) per range."""
        be, p, s, marks = self.be, self.plan, self.s_compute, []
        for r0, r1 in rows:
            ar = a[:, r0:r1] if p.trans_a else a[r0:r1]
            be.gemm(ar, b, c[r0:r1], self.alpha, beta, p.trans_a, p.trans_b, s)
            marks.append((r0, r1, be.record(s)))
        return marks

    def _gemm(self, st: Step, a, b, c, beta: float, fused):
        """The step's gemm as a launch taking the stream, set up once per slots and shapes
        where the backend prepares launches (the same views recur at every use of a slot);
        with ``fused`` the gemm does the step's checksum updates too."""
        be, p = self.be, self.plan
        make = getattr(be, "gemm_launcher", None)
        extra = {} if fused is None else {"checks": fused}
        if make is None:
            return lambda s: be.gemm(a, b, c, self.alpha, beta, p.trans_a, p.trans_b, s, **extra)
        key = (st.a_slot, st.b_slot, st.c_slot, a.shape, b.shape, st.first)
        launch = self.gemms.get(key)
        if launch is None:
            launch = self.gemms[key] = make(a, b, c, self.alpha, beta, p.trans_a, p.trans_b,
                                            **extra)
        return launch

    def _copy_in(self, entry: _Entry, i: int) -> None:
        """Copy in the ``i``-th K piece of an entry's loads (a C tile with the first) and make
        the compute stream wait for it."""
        be, st = self.be, entry.step
        copied = [load for load in entry.loads if i < len(load.parts)]
        with self.clocks["copy_in"]:
            for load in copied:
                free = self.events.get(load.dev_key)  # last gemm on a slot, copy-out of a C
                if i == 0 and free is not None:
                    be.wait(self.s_in, free)
                be.copy_in(load.parts[i].host, load.parts[i].dev, self.s_in)
            if copied:
                done = be.record(self.s_in)
                for load in copied:
                    if load.host_key and load.dev_key[0] != "C":
                        self.events[load.host_key] = done
                be.wait(self.s_compute, done)
        c_loaded = any(load.dev_key[0] == "C" for load in entry.loads)
        if i == 0 and st.first and not c_loaded and ("C", st.c_slot) in self.events:
            be.wait(self.s_compute, self.events[("C", st.c_slot)])

    def _finish_tile(self, st: Step, c, marks: list) -> None:
        """Hand a finished tile to the writer; with staging, copy it out first, each row range
        of ``marks`` (row0, row1, event after its gemm) once its gemm is done."""
        be, cs, t = self.be, st.c_slot, st.tile
        src = c
        if be.staging:
            if cs in self.c_written:
                self._wait(self.c_written[cs])
            if self.direct["C"] is not None:  # into the user's array: nothing left to write
                dst, src = self.direct["C"][t.r0:t.r1, t.c0:t.c1], None
            else:
                dst = src = be.view(self.host["C"][cs], t.shape)
                with self.lock:
                    self.bytes_staged += src.nbytes
            copied = []
            with self.clocks["copy_out"]:
                for r0, r1, event in marks:
                    be.wait(self.s_out, event)
                    be.copy_out(c[r0:r1], dst[r0:r1], self.s_out)
                    if self.checks is not None:  # beside the tile, guarded by the same write
                        self.checks.fetch(cs, self.s_out)
                    copied.append((r0, r1, be.record(self.s_out)))
            marks = copied
            self.events[("C", cs)] = marks[-1][2]
        check = None
        if self.checks is not None:
            check = (lambda checks=self.checks, slot=cs, tile=st.tile: checks.verdict(slot, tile))
        self.c_written[cs] = self.writer.submit(st.tile, src, marks, check)

    # ----- checksum failures ----------------------------------------------------------------
    def accept(self, tile: Tile, mismatch: Mismatch | None) -> bool:
        """Writer thread: count a tile's check; False when it failed for the first time (the
        tile is then computed again by :meth:`_recompute`). ChecksumError on a second failure."""
        with self.lock:
            self.checked += 1
            if mismatch is None:
                return True
            self.mismatches.append(mismatch)
            if tile.index in self.retried:
                raise ChecksumError(
                    f"Expected tile {tile.index} (rows {tile.r0}:{tile.r1}, columns "
                    f"{tile.c0}:{tile.c1}) to pass its checksum check when computed again. Got "
                    f"a second mismatch: {mismatch}. The output {self.out.label} is resumable "
                    f"without that tile.")
            self.redo.append(tile)
            return False

    def _recompute(self) -> None:
        """Compute the tiles whose check failed again, from freshly read panels, through the
        same pipeline (every panel loaded again; the checks run again)."""
        if self.checks is None:
            return
        self._wait(self.writer.barrier())
        while self.redo:
            with self.lock:
                tiles, self.redo = self.redo, []
                self.retried.update(t.index for t in tiles)
            self._loop(self._fresh_steps(tiles))
            self._wait(self.writer.barrier())

    def _fresh_steps(self, tiles: list[Tile]):
        """Steps for ``tiles`` in stream order, each loading both of its panels."""
        p, n = self.plan, 0
        panels = p.k_panels()
        for ti, t in enumerate(tiles):
            for kp, (k0, k1) in enumerate(panels):
                yield Step(t, kp, k0, k1, kp == 0, kp == len(panels) - 1, n % p.a_slots, True,
                           n % p.b_slots, True, ti % C_SLOTS)
                n += 1

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
        return RunStats(time.perf_counter() - self.t0, self.flops, self.bytes_read,
                        self.bytes_written, self.written, self.skipped, self.tiles_total, **busy,
                        tiles_checked=self.checked, checksum_mismatches=len(self.mismatches),
                        tiles_recomputed=len(self.retried), mismatches=tuple(self.mismatches),
                        bytes_staged=self.bytes_staged)


class _Writer(threading.Thread):
    """Writes finished tiles in order and commits them to the journal in batches."""

    def __init__(self, run: _Run):
        super().__init__(name="bigmm-write", daemon=True)
        self.run_ = run
        self.q: queue.Queue = queue.Queue()
        self.finished: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._stopped = False
        self.pool: cf.ThreadPoolExecutor | None = None  # for the pieces of large tiles

    def submit(self, tile: Tile, src, marks, check=None) -> cf.Future:
        """Queue a tile for writing: ``marks`` lists its row ranges (tile-relative) with the
        event after which each is in ``src``, written range by range. ``check()`` (when given)
        returns its checksum verdict once the last event completed, and a tile that fails it
        is not written. ``src`` None: the tile is copied into the output directly, and done
        once the last event completed."""
        fut: cf.Future = cf.Future()
        self.q.put((tile, src, marks, fut, check))
        return fut

    def barrier(self) -> cf.Future:
        """A future done once every tile queued before it has been handled."""
        return self.submit(None, None, None)

    def stop(self) -> None:
        """Write and commit what is queued, then end the thread (idempotent)."""
        if not self._stopped:
            self._stopped = True
            self.q.put(None)
        if self.is_alive():
            self.join()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def run(self) -> None:
        pending: list[tuple[int, int]] = []
        last = time.perf_counter()
        while True:
            item = self.q.get()
            if item is None:
                break
            tile, src, marks, fut, check = item
            if self.error is not None:
                fut.set_exception(self.error)
                continue
            if tile is None:  # a barrier
                fut.set_result(None)
                continue
            try:
                if not self._write(tile, src, marks, check):
                    fut.set_result(None)
                    continue
                pending.append(tile.index)
                fut.set_result(None)
                self.finished.put(tile)
                if time.perf_counter() - last >= COMMIT_INTERVAL:
                    self._commit(pending)
                    last = time.perf_counter()
            except BaseException as e:
                self.error = e
                if not fut.done():  # a failed commit comes after this tile's result
                    fut.set_exception(e)
        if self.error is None:
            try:
                self._commit(pending)
            except BaseException as e:
                self.error = e

    def _write(self, tile: Tile, src, marks, check) -> bool:
        """Write a tile, each row range of ``marks`` once its event completed; False (nothing
        written) when it fails its check for the first time."""
        r = self.run_
        if check is not None or src is None:
            r.be.synchronize(marks[-1][2])
        if check is not None and not r.accept(tile, check()):
            return False
        if src is None:  # copied out into the output array itself
            with r.lock:
                r.bytes_written += tile.shape[0] * tile.shape[1] * r.dtype.itemsize
            return True
        try:
            for r0, r1, event in marks:
                r.be.synchronize(event)
                with r.clocks["write"]:
                    self._write_rows(tile, tile.r0 + r0, tile.r0 + r1, src[r0:r1])
        except BigmmError:
            raise
        except Exception as e:
            raise WriteError(f"Expected to write rows {tile.r0}:{tile.r1}, columns "
                             f"{tile.c0}:{tile.c1} of {r.out.label}. "
                             f"Got {type(e).__name__}: {e}") from e
        with r.lock:
            r.bytes_written += src.nbytes
        return True

    def _write_rows(self, tile: Tile, r0: int, r1: int, src) -> None:
        """Write ``src`` to rows [r0, r1) of ``tile``, in row pieces on this writer's threads
        where the sink takes them at once (a NumPy array: one thread copies at a few GB/s, and
        the last tile's write is the run's drain)."""
        r = self.run_
        pieces = [(r0, r1)]
        if getattr(r.out, "parallel_writes", False):
            pieces = _pieces(r0, r1, tile.c1 - tile.c0, r.dtype.itemsize, r.io_threads, None)
        if len(pieces) == 1:
            r.out.write(r0, r1, tile.c0, tile.c1, src)
            return
        if self.pool is None:
            self.pool = cf.ThreadPoolExecutor(r.io_threads, thread_name_prefix="bigmm-copy")
        futures = [self.pool.submit(r.out.write, p0, p1, tile.c0, tile.c1,
                                    src[p0 - r0:p1 - r0]) for p0, p1 in pieces]
        for f in futures:
            f.result()

    def _commit(self, pending: list) -> None:
        if pending:
            with self.run_.clocks["write"]:
                self.run_.out.commit(list(pending))
            pending.clear()


def _pieces(r0: int, r1: int, cols: int, itemsize: int, threads: int,
            chunks: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Split rows [r0, r1) into at most ``threads`` pieces of at least PIECE_BYTES each.

    Inner edges fall on the source's chunk rows, so a compressed chunk is decoded once.
    """
    rows = r1 - r0
    n = max(1, min(threads, rows, rows * cols * itemsize // PIECE_BYTES))
    unit = chunks[0] if chunks else 1
    step = -(-rows // n)
    inner = {-(-(r0 + i * step) // unit) * unit for i in range(1, n)}
    edges = sorted({r0, r1} | {e for e in inner if r0 < e < r1})
    return list(zip(edges, edges[1:]))


def _along(region: tuple[int, int, int, int], axis: int, a: int, b: int) -> tuple:
    """The part [a, b) along ``axis`` (0: rows, 1: columns) of a region (r0, r1, c0, c1)."""
    r0, r1, c0, c1 = region
    return (r0 + a, r0 + b, c0, c1) if axis == 0 else (r0, r1, c0 + a, c0 + b)


def _k_slice(x, axis: int, a: int, b: int):
    """Rows (``axis`` 0) or columns (1) [a, b) of a 2-D array or device view."""
    return x[a:b] if axis == 0 else x[:, a:b]
