"""The loads ahead of the compute: the run's buffers, and the readers that fill them.

Every buffer is a resource with a "last user": the index of the last step that used it. A load
into a buffer is submitted only once its last user has been issued, and the reader first waits
for the event that frees the buffer (the gemm that used a device slot, or the copy that emptied
a host staging slot). Without staging (NumPy) the readers fill the compute slots directly and
every event is already complete when it is recorded; with staging (GPU) they fill the host
slots, and the run copies them in.

Conversion: a reader fills its buffer in the plan's dtype (C's buffers: the plan's ``c_dtype``);
an operand stored in another dtype (float32 A with float64 B, old C of another dtype) is
converted in the reader thread (:func:`read_into`). One stored narrower (A and B always: the
plan's dtype is the wider of theirs) is read into the end of its own buffer and widened there,
front to back (:func:`widen`): no temporary of the panel. Old C stored wider is read into a
temporary in its dtype, which the plan counts (``Plan.convert_bytes``). Half-precision panels
of a half-precision plan are read as they are stored and reach the gemm in their own dtype.

Direct copies: an operand that is a NumPy array in page-locked memory (:func:`in_place`) is not
staged. Its panels are copied in straight from views of the user's array (no reader work, no
host slot), and a pinned output array receives finished C tiles straight from the device.
Where the plan names the operands copied in place (``Plan.in_place``), those and only those
are (the others are staged even from page-locked arrays), and the run first locks the arrays
the plan names in ``Plan.registered`` (:mod:`.register`; :func:`to_lock`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import DeviceBlocks, rows_contiguous
from ..errors import BigmmError, ReadError
from ..io.inputs import on_caller_thread
from ..io.sink import ArraySink
from ..io.source import ArraySource
from ..planner import Plan, Step
from ..planner.schedule import HOST_C_SLOTS, MAX_LOOKAHEAD
from ..runstats import Tally
from ..units import accumulate_dtype, numpy_dtype
from .tuning import RAMP, io_pieces, split_range


def eligible(x, dtype, write: bool = False) -> bool:
    """Whether copies could use the array ``x`` in place were it page-locked: a NumPy array
    in ``dtype`` (native byte order) with contiguous rows (and writeable, to ``write`` into
    it)."""
    return (isinstance(x, np.ndarray) and x.dtype == np.dtype(dtype) and x.dtype.isnative
            and x.flags.aligned and rows_contiguous(x) and (x.flags.writeable or not write))


def in_place(be, x, dtype, write: bool = False) -> bool:
    """Whether copies may use the user's array ``x`` in place, nothing staged: a staging
    backend, an :func:`eligible` array, in pinned memory."""
    if not be.staging or not eligible(x, dtype, write):
        return False
    return bool(be.host_pinned(x))


@dataclass
class Slots:
    """A run's buffers, allocated once as the plan sized them, and what frees them.

    ``dev``: the device slots of A, B and C; ``host``: the host staging slots of the operands
    that are staged (a staging backend's; none for direct ones); ``direct``: per operand, the
    user's array that copies use in place, or None; ``events``: per buffer key, the event
    after which it is free; ``c_written``: per C slot, the write of its last tile."""

    dev: dict[str, list]
    #: Per staged operand, its host buffers as futures: those of the first step pinned before
    #: the run starts, the others on the pinning thread while it runs (Plan.host_slots).
    host: dict[str, list[cf.Future]]
    direct: dict[str, Any]
    staging: bool = True
    events: dict[tuple, Any] = field(default_factory=dict)
    #: Per host C buffer (staging; per device C slot without), the write of its last tile.
    c_written: dict[int, cf.Future] = field(default_factory=dict)
    pinning: cf.ThreadPoolExecutor | None = None
    itemsize: dict[str, int] = field(default_factory=dict)  # per operand, of its buffers

    @classmethod
    def allocate(cls, be, p: Plan, direct: dict[str, Any]) -> Slots:
        dt, ct = numpy_dtype(p.dtype), numpy_dtype(p.c_dtype)
        dev = {"A": _device_buffers(be, p.bm * p.bk * p.a_span, p.a_slots, dt),
               "B": _device_buffers(be, p.bk * p.bn, p.b_slots, dt),
               "C": _device_buffers(be, p.bm * p.bn, p.c_slots, ct)}
        slots = cls(dev, {}, direct, bool(be.staging))
        slots.itemsize = {"A": dt.itemsize, "B": dt.itemsize, "C": ct.itemsize}
        if not be.staging:
            return slots
        order = p.host_slots("".join(op for op in "ABC" if direct[op] is None))
        for op, i, _, _ in sorted(order):
            slots.host.setdefault(op, []).append(cf.Future())
        for op, i, nbytes, first in order:
            t = ct if op == "C" else dt
            if first:
                slots.host[op][i].set_result(be.host_buffer(nbytes // t.itemsize, t))
                continue
            if slots.pinning is None:
                slots.pinning = cf.ThreadPoolExecutor(1, thread_name_prefix="bigmm-pin")
            slots.pinning.submit(_pin, be, nbytes // t.itemsize, t, slots.host[op][i])
        return slots

    def close(self) -> None:
        """Stop pinning (a buffer being pinned is finished; the ones not started never
        are)."""
        if self.pinning is not None:
            self.pinning.shutdown(wait=True, cancel_futures=True)
            for buffers in self.host.values():
                for f in buffers:
                    if not f.done():
                        f.cancel()

    def c_key(self, c_slot: int) -> int:
        """The key of ``c_written`` for a device C slot: the host C buffer its tiles pass
        through (staging), else the slot itself (its buffer is what the writer reads)."""
        return c_slot % HOST_C_SLOTS if self.staging else c_slot


def _device_buffers(be, size: int, count: int, dtype) -> list:
    """``count`` device buffers of ``size`` elements: one allocation where the backend can
    (:class:`~bigmm.backends.base.DeviceBlocks`)."""
    if count > 1 and isinstance(be, DeviceBlocks):
        return be.device_buffers(size, count, dtype)
    return [be.device_buffer(size, dtype) for _ in range(count)]


def _pin(be, size: int, dtype, fut: cf.Future) -> None:
    """Pin one host buffer into ``fut`` (its error, where pinning fails)."""
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(be.host_buffer(size, dtype))
    except BaseException as e:
        fut.set_exception(e)


def _arrays(a, b, out, checked: bool) -> dict[str, np.ndarray | None]:
    """Per operand, the user's NumPy array behind io ``a``, ``b`` or ``out`` (None for other
    sources and sinks, and for C when ``checked``: a tile that fails its check must not reach
    the output, whose old C its recomputation may read; and for a Gram plan's C, whose tiles
    the writer mirrors)."""
    def array(op: str, io) -> np.ndarray | None:
        if op == "C" and checked:
            return None
        return io.array if isinstance(io, ArraySink if op == "C" else ArraySource) else None

    return {op: array(op, x) for op, x in (("A", a), ("B", b), ("C", out))}


def operand_dtype(dtype: str, op: str) -> np.dtype:
    """The dtype copies move ``op`` in for a product in ``dtype``: the panels' for A and B,
    the tiles' (:func:`bigmm.units.accumulate_dtype`) for C; arrays of others are converted,
    not used in place."""
    return numpy_dtype(accumulate_dtype(dtype) if op == "C" else dtype)


def direct_arrays(be, p: Plan, a, b, out, checked: bool) -> dict[str, Any]:
    """Per operand, the user's array behind io ``a``, ``b`` or ``out`` when copies use it in
    place (:func:`in_place`: page-locked now, locked for the run included), else None; where
    the plan names its operands in place, only those (:func:`_arrays` for C when
    ``checked``)."""
    return {op: x if x is not None and (p.in_place is None or op in p.in_place)
            and in_place(be, x, operand_dtype(p.dtype, op), op == "C") else None
            for op, x in _arrays(a, b, out, checked or p.symmetric).items()}


def to_lock(be, p: Plan, a, b, out, checked: bool) -> dict[str, np.ndarray]:
    """The arrays of the operands the plan has page-locked for the run (``Plan.registered``)
    that are not page-locked already and that copies could use in place once they are."""
    if not be.staging or not p.registered:
        return {}
    return {op: x for op, x in _arrays(a, b, out, checked).items()
            if x is not None and op in p.registered
            and eligible(x, operand_dtype(p.dtype, op), op == "C")
            and not be.host_pinned(x) and not (op == "C" and p.symmetric)}


@dataclass
class Part:
    """One K piece of a load (the whole panel unless the step is ramped): its reads' futures
    and the views it goes through."""

    futures: list
    host: Any = None  # staging: the host view read into (or the user's pinned array's region)
    dev: Any = None  # the device view the data ends in
    #: A staged part: its host buffer (a future, pinned in the background where it is not
    #: the first step's) and how ``host`` is made from it.
    pinned: cf.Future | None = None
    view: Any = None

    def target(self):
        """Where the reads go and the copy in comes from: the host view (a staged part's made
        once its buffer is pinned), else the device view (without staging)."""
        if self.host is None and self.pinned is not None:
            self.host = self.view(self.pinned.result())
        return self.dev if self.host is None else self.host


@dataclass
class Load:
    """One buffer being filled by the readers: its parts (one per K piece of the step; a C
    tile has one) and slot keys."""

    parts: list[Part]
    dev_key: tuple = ()
    host_key: tuple = ()


@dataclass
class Entry:
    """A step whose loads are submitted, waiting in the window to be issued."""

    index: int
    step: Step
    loads: list[Load] = field(default_factory=list)
    #: The step's K range in pieces (RAMP for the first step of a ramped pass, else one).
    pieces: list[tuple[int, int]] = field(default_factory=list)


class Loader:
    """The window of steps whose loads were submitted ahead of the compute, at most
    MAX_LOOKAHEAD of them. ``sources``: the io objects of "A", "B" and "C" (C is read where
    the plan reads it); reads run on ``pool`` and stop once ``cancel`` is set; ``ramped``:
    the first step of each pass goes in RAMP's K pieces."""

    def __init__(self, plan: Plan, be, slots: Slots, sources: dict, pool: cf.Executor,
                 tally: Tally, clock, threads: int, cancel: threading.Event, ramped: bool):
        self.plan, self.be, self.slots, self.sources = plan, be, slots, sources
        self.pool, self.tally, self.clock, self.threads = pool, tally, clock, threads
        self.cancel, self.ramped = cancel, ramped
        self.last_user: dict[tuple, int] = {}
        self.next_host = {"A": 0, "B": 0}
        self.assigned = 0  # steps assigned so far, over every pass
        self.window: deque[Entry] = deque()
        self.pending: Step | None = None

    def start(self, steps) -> None:
        """A pass over ``steps`` (the schedule, or tiles computed again)."""
        self.ramp = self.ramped
        self.steps = iter(steps)
        self.pending = next(self.steps, None)
        self.window = deque()

    @property
    def drained(self) -> bool:
        """Nothing left to load in this pass: the entry taken last is its last step."""
        return self.pending is None and not self.window

    def fill(self, issued: int) -> None:
        """Submit the loads of the next steps whose buffers' last users are among the first
        ``issued`` steps."""
        while self.pending is not None and len(self.window) < MAX_LOOKAHEAD:
            entry = self._assign(self.pending, self.assigned, issued)
            if entry is None:
                return
            self.window.append(entry)
            self.assigned += 1
            self.pending = next(self.steps, None)

    def _assign(self, st: Step, idx: int, issued: int) -> Entry | None:
        targets = []  # (operand, device slot, host slot or None)
        if st.load_a:
            targets.append(("A", st.a_slot, self._host_slot("A")))
        if st.load_b:
            targets.append(("B", st.b_slot, self._host_slot("B")))
        if st.first and self.plan.reads_c:
            targets.append(("C", st.c_slot,
                            self.slots.c_key(st.c_slot) if "C" in self.slots.host else None))
        keys = [(op, s) for op, s, _ in targets]
        keys += [("h" + op, h) for op, _, h in targets if h is not None]
        if any(self.last_user.get(k, -1) >= issued for k in keys):
            return None
        pieces = [(st.k0, st.k1)]
        if self.ramp:
            pieces = [(st.k0 + q0, st.k0 + q1) for q0, q1 in split_range(st.k1 - st.k0, RAMP)]
        self.ramp = False
        entry = Entry(idx, st, [self._submit(st, *t, pieces) for t in targets], pieces)
        for op, _, h in targets:
            if h is not None and op != "C":
                self.next_host[op] = (h + 1) % self.plan.host_panel_slots(op)
        for key in keys + [("A", st.a_slot), ("B", st.b_slot), ("C", st.c_slot)]:
            self.last_user[key] = idx
        if st.last and "C" in self.slots.host:
            # the finished tile is copied out into its host C buffer: no later read of old C
            # into that buffer starts before this step is issued and its write known
            self.last_user[("hC", self.slots.c_key(st.c_slot))] = idx
        return entry

    def _host_slot(self, op: str) -> int | None:
        return self.next_host[op] if op in self.slots.host else None

    def _submit(self, st: Step, op: str, slot: int, hslot: int | None,
                pieces: list[tuple[int, int]]) -> Load:
        """The reads of one operand of a step, in parts along K (``pieces``; a C tile whole).
        A part's device view is its region of the slot's panel; its host view, where staged,
        is contiguous: a K piece that is a column range of the panel is staged as a block of
        its own and the copy in puts it in place."""
        slots, be = self.slots, self.be
        # A's slot holds its whole load (Plan.a_span K panels): the step's K range at its
        # offset there, and the last piece reaching to the load's end
        g0, g1 = st.a_k if op == "A" else (st.k0, st.k1)
        src, reg, shape = self.sources[op], *region(self.plan, st, op, (g0, g1))
        if g1 != st.k1:
            pieces = pieces[:-1] + [(pieces[-1][0], g1)]
        dev = be.view(slots.dev[op][slot], shape)
        host_key = ("h" + op, hslot) if hslot is not None else ()
        if op == "C":
            pieces = [(st.k0, st.k1)]
        axis = k_axis(self.plan, op)
        parts = []
        for q0, q1 in pieces:
            a, b = q0 - g0, q1 - g0
            r0, r1, c0, c1 = reg if axis is None else _along(reg, axis, a, b)
            pdev = dev if axis is None else k_slice(dev, axis, a, b)
            if slots.direct[op] is not None:  # copied in from the user's pinned array
                view = slots.direct[op][r0:r1, c0:c1]
                self.tally.add(bytes_read=view.nbytes)
                parts.append(Part([], view, pdev))
                continue
            part = Part([], None, pdev)
            if hslot is not None:  # its view of the host buffer, once that is pinned
                part.pinned = slots.host[op][hslot]
                part.view = functools.partial(staged_view, be, shape=shape, axis=axis,
                                              piece=(a, b), region=(r1 - r0, c1 - c0))
                self.tally.add(bytes_staged=(r1 - r0) * (c1 - c0) * slots.itemsize[op])
            if op == "C":  # the C buffer is free once the write of its previous tile and the
                # copy in of the last C read into it finished
                ready = _when(slots.c_written.get(slots.c_key(slot)),
                              slots.events.get(host_key) if host_key else None, be)
            else:
                event = slots.events.get(host_key or (op, slot))
                ready = ((lambda: be.synchronize(event)) if event is not None
                         else (lambda: None))
            # pieces of whole chunk rows: a chunk read whole is decoded once (a source splits
            # a large raw chunk between its own threads in blocks of whole fault windows)
            chunks = None if op == "C" else src.panel_chunks or src.chunks
            rows = io_pieces(r0, r1, c1 - c0, src.dtype.itemsize, self.threads, chunks)
            # a part split between reader threads: each piece on its thread alone (a part in
            # one piece is split between the source's threads, if it has them)
            part.futures = [self.pool.submit(self._read, src, rr0, rr1, c0, c1, part,
                                             rr0 - r0, rr1 - r0, ready, len(rows) > 1)
                            for rr0, rr1 in rows]
            parts.append(part)
        return Load(parts, (op, slot), host_key)

    def _read(self, src, r0, r1, c0, c1, part: Part, q0: int, q1: int, ready,
              alone: bool) -> None:
        """Read rows [r0, r1) and columns [c0, c1) of ``src`` into rows [q0, q1) of the
        part's target, once ``ready`` returned (``alone``: on this thread only, not split
        again between the source's threads)."""
        if self.cancel.is_set():
            return
        ready()
        target = part.target()[q0:q1]
        with self.clock, on_caller_thread() if alone else contextlib.nullcontext():
            try:
                read_into(src, r0, r1, c0, c1, target)
            except BigmmError:
                raise
            except Exception as e:
                raise ReadError(f"Expected to read rows {r0}:{r1}, columns {c0}:{c1} of "
                                f"{src.label}. Got {type(e).__name__}: {e}") from e
        self.tally.add(bytes_read=target.size * src.dtype.itemsize)


def staged_view(be, buf, *, shape: tuple[int, int], axis: int | None,
                piece: tuple[int, int], region: tuple[int, int]):
    """The view of a host staging buffer ``buf`` that K piece ``piece`` of a panel of
    ``shape`` (stored; its K axis ``axis``, None for C) is staged in: a column range (axis 1)
    is a block of ``region``'s shape after the pieces before it, a row range the panel's
    rows."""
    if axis == 1:
        return be.view(buf[region[0] * piece[0]:], region)
    view = be.view(buf, shape)
    return view if axis is None else k_slice(view, axis, *piece)


def read_into(src, r0: int, r1: int, c0: int, c1: int, target: np.ndarray) -> None:
    """Read rows [r0, r1) and columns [c0, c1) of ``src`` into ``target``, converted where the
    target's dtype is not the source's: a source stored narrower is read into the end of the
    target's own bytes and widened there (:func:`widen`), a wider one through a temporary of
    the region in its dtype (reads stay raw, and NumPy's casts round as ``astype`` does)."""
    if target.dtype == src.dtype:
        src.read(r0, r1, c0, c1, target)
        return
    if src.dtype.itemsize < target.itemsize and target.flags.c_contiguous:
        stored = stored_view(target, src.dtype)
        src.read(r0, r1, c0, c1, stored)
        widen(stored, target)
        return
    tmp = np.empty(target.shape, src.dtype)
    src.read(r0, r1, c0, c1, tmp)
    np.copyto(target, tmp, casting="unsafe")


#: Elements that :func:`widen` converts through a copy at the end (at most), where what is
#: left to widen overlaps its own stored values.
WIDEN_TAIL = 1 << 16


def stored_view(target: np.ndarray, dtype) -> np.ndarray:
    """An array of ``target``'s shape in the narrower ``dtype`` over the last bytes of the
    C-contiguous ``target``: where a region is read before :func:`widen` widens it."""
    raw = target.reshape(-1).view(np.uint8)
    return raw[raw.size - target.size * np.dtype(dtype).itemsize:].view(dtype).reshape(
        target.shape)


def widen(stored: np.ndarray, target: np.ndarray) -> None:
    """Convert ``stored`` (:func:`stored_view` of ``target``) into ``target``, front to back:
    each block ends where the stored values not yet converted begin, so that no value is
    overwritten before it is read (a block is at least half of what is left, as an element
    of ``target`` is at least twice as wide); the last WIDEN_TAIL elements or fewer go
    through a copy."""
    x, y = stored.reshape(-1), target.reshape(-1)
    n, ws, wt = y.size, x.itemsize, y.itemsize
    i = 0
    while n - i > WIDEN_TAIL:
        j = (n * (wt - ws) + ws * i) // wt  # the bytes of y[:j] end where x[i] begins
        np.copyto(y[i:j], x[i:j], casting="unsafe")
        i = j
    np.copyto(y[i:], x[i:].copy(), casting="unsafe")


def _when(written: cf.Future | None, copied, be):
    """A wait for the write ``written`` and the copy's event ``copied`` (either None)."""
    def ready() -> None:
        if written is not None:
            written.result()
        if copied is not None:
            be.synchronize(copied)

    return ready


def region(p: Plan, st: Step, op: str, ks: tuple[int, int] | None = None
           ) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """(stored region (r0, r1, c0, c1), stored shape) of a step's operand "A", "B" or "C"
    (``ks``: over that K range instead of the step's)."""
    t, (k0, k1) = st.tile, ks or (st.k0, st.k1)
    if op == "A":
        reg = (k0, k1, t.r0, t.r1) if p.trans_a else (t.r0, t.r1, k0, k1)
    elif op == "B":
        reg = (t.c0, t.c1, k0, k1) if p.trans_b else (k0, k1, t.c0, t.c1)
    else:
        reg = (t.r0, t.r1, t.c0, t.c1)
    return reg, (reg[1] - reg[0], reg[3] - reg[2])


def k_axis(p: Plan, op: str) -> int | None:
    """The axis of an operand's stored panel that runs along K (None for C)."""
    if op == "A":
        return 0 if p.trans_a else 1
    return (1 if p.trans_b else 0) if op == "B" else None


def k_slice(x, axis: int, a: int, b: int):
    """Rows (``axis`` 0) or columns (1) [a, b) of a 2-D array or device view."""
    return x[a:b] if axis == 0 else x[:, a:b]


def _along(reg: tuple[int, int, int, int], axis: int, a: int, b: int) -> tuple:
    """The part [a, b) along ``axis`` (0: rows, 1: columns) of a region (r0, r1, c0, c1)."""
    r0, r1, c0, c1 = reg
    return (r0 + a, r0 + b, c0, c1) if axis == 0 else (r0, r1, c0 + a, c0 + b)
