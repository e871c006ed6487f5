"""The schedule: a frozen, printable Plan for C = alpha * op(A) @ op(B) + beta * C.

Pure and shape-only: no h5py, no cupy, no I/O, and no model of time (a plan's predicted time
comes from the rates it holds: see :mod:`bigmm.planner.model`). The executor runs a Plan step by
step; every step names the C tile, the K panel, and the device slots its A and B panels live
in, and whether each panel must be loaded or is already resident. Slot assignment is decided
here, so the executor never decides what fits: the bytes resident are those the Plan printed.

Loop orders (C is M x N, depth K):

* ``stream``: C tiles in row-major order; every tile streams its K panels of A and B through
  double-buffered slots. A is read ceil(N/bn) times, B ceil(M/bm) times.
* ``resident-a``: a whole row panel of A (bm x K) stays on the device while the tiles of that
  row sweep over B: A is read once, B ceil(M/bm) times.
* ``resident-b``: the mirror image, column-major tile order: B read once, A ceil(N/bn) times.
* ``resident-c``: every C tile (row strips the width of C) stays on the device while the K
  panels stream: for each of the first nk - tail K panels, its B panel is loaded once and every
  strip adds its A panel times it; then the strips are finished one by one over the last
  ``tail`` K panels, whose B panels stay, so that each finished strip is copied out while the
  next computes. A and B are each read once, and the gemms start as soon as the first panels
  land (the orders above read a whole row panel of A, or all of B, before their first tile is
  done): the order for runs bound by the copies, where C fits on the device. With ``a_span``
  > 1 a strip's A is loaded that many K panels at a time (within the rounds, and within the
  tail), in a slot as wide: A copied in place from the user's array is then copied in rows
  ``a_span`` times as long, which the copy engine moves markedly faster beside the gemms.
* ``whole-a``: all of A stays on the device, each panel kept from the first tile that uses
  it; tiles in column-major order, a column panel of B (K x bn) staying while the column's
  tiles sweep down A. A and B are read once, and the first tile waits only for one row panel
  of A and one column panel of B (resident-a with one row of tiles reads all of A first):
  C's writes start early, so runs bound by the writes end sooner.
* ``whole-b``: the mirror image, row-major: all of B stays, a row panel of A at a time.

The pipeline's slots and window are stated here once: the Plan sizes its memory by the slots,
the executor allocates and fills them, and the pipeline model simulates them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Iterator, Protocol

from ..units import DTYPES, accumulate_dtype
from . import decode, printing
from .derived import derived, made
from .traffic import Traffic
from .workspace import (direct_workspace_bytes, reads_as_stored, rounds_one_ahead,
                        split_workspace_bytes, splits_ahead)

ORDERS = ("stream", "resident-a", "resident-b", "resident-c", "whole-a", "whole-b")
#: The orders that keep one operand whole on the device (not for Gram plans).
WHOLE_ORDERS = ("whole-a", "whole-b")
#: The operands, as ``Plan.in_place`` and ``Plan.registered`` name them.
OPERANDS = "ABC"

#: Device C tiles: one accumulating while the previous one is copied out and written (every
#: tile of C in order resident-c).
C_SLOTS = 2
#: Host staging slots per operand (double buffering between the readers and the copy engine);
#: up to HOST_PANEL_SLOTS_MAX for small panels, so that IN_FLIGHT_BYTES of an operand's panels
#: may be read at once (a panel is read by one thread per PIECE_BYTES: 64 MiB keep 16 busy).
HOST_PANEL_SLOTS, HOST_PANEL_SLOTS_MAX = 2, 4
#: Host C buffers: one being filled from the device while the previous one is written to disk.
HOST_C_SLOTS = 2
#: Most steps whose loads may be in flight ahead of the compute (the executor's window, which
#: the pipeline model follows).
MAX_LOOKAHEAD = 64
#: The executor splits reads and writes of a region into pieces of at least this many bytes,
#: one per I/O thread, so that a smaller panel is read by fewer threads (tried for NumPy
#: arrays: 1 MiB pieces, whose hand-offs cost more than the threads they add gave; see
#: docs/benchmarks-history.md). The model counts it (``Rates.thread_bytes``).
PIECE_BYTES = 4 << 20
IN_FLIGHT_BYTES = 16 * PIECE_BYTES


class Timing(Protocol):
    """What a plan's predicted time comes from: :class:`bigmm.planner.model.Rates`."""

    def makespan(self, plan: Plan) -> float:
        """Seconds the pipeline takes to run ``plan``."""


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
    ``a_k``: the K range [k0, k1) of the load A's slot holds (:meth:`Plan.a_k_range`: the
    step's panel, or the ``a_span`` panels loaded with it).
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
    a_k: tuple[int, int]


@dataclass(frozen=True)
class Plan(Traffic):
    """A complete, checked schedule for C = alpha * op(A) @ op(B) + beta * C.

    ``dtype``: the operands' panels as they are moved and multiplied (``itemsize`` bytes an
    element); C tiles are in ``c_dtype``, the dtype the products accumulate in (float32 for
    half-precision panels, else ``dtype``), ``c_itemsize`` bytes an element. What it reads
    and writes: :class:`.traffic.Traffic`.
    """

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
    #: Order resident-c: the last K panels over which the strips are finished one by one.
    tail: int = 0
    #: Order resident-c: the K panels one load of a strip's A covers (its slot that wide).
    a_span: int = 1
    #: The operands ("A", "B", "C") whose copies use the user's arrays in place (page-locked
    #: arrays, or arrays ``registered`` for the run): no host staging slots, no reads or writes
    #: by the host. None: decided by the executor (arrays found page-locked), staging counted.
    in_place: str | None = None
    #: Of ``in_place``, the operands page-locked in place for the run (and released after).
    registered: str = ""
    #: A Gram plan (see the module docstring): only tiles i <= j; ``upper``: C's strictly
    #: lower triangle written as zeros, not mirrored.
    symmetric: bool = False
    upper: bool = False
    #: The gemm splits a step's panels ahead into this many parts an element (2: 3xTF32, 1:
    #: TF32; 0: it does not) in a workspace (:func:`split_workspace_bytes`), where the tiles are
    #: large enough (:func:`splits_ahead`); plain TF32 reads NN and TT panels as stored where
    #: their rows are aligned (:func:`reads_as_stored`), else rounds only the smaller panel
    #: ahead where it has few rows (:func:`rounds_one_ahead`); the device memory counts either.
    presplit: int = 0
    #: Compressed inputs: the buffers their chunks are decoded into beside the staging, within
    #: the host budget (:class:`.decode.Decoding`); None where none is.
    decoding: decode.Decoding | None = None
    #: C's dtype as the output stores it, where not ``c_dtype`` (a bfloat16 C of bfloat16
    #: operands, a float64 output of float32 ones): the bytes written. None: ``c_dtype``.
    out_dtype: str | None = field(default=None, compare=False)
    #: A's and B's dtypes as stored, where not ``dtype`` (float16 A of a float32 product):
    #: read at their widths, widened within their buffers as they load. None: ``dtype``.
    a_dtype: str | None = None
    b_dtype: str | None = None
    rates: Timing | None = field(default=None, compare=False)
    #: How the products are computed, as printed (e.g. "3xTF32 (float32 accuracy on tensor
    #: cores)"; the job sets it from the backend and the precision asked; "" not stated).
    arithmetic: str = field(default="", compare=False)
    #: What the predicted time takes the files to be, as printed (their shares in the page
    #: cache, the disks' rates; the job sets it: :mod:`bigmm.filerates`; "" not stated).
    files: str = field(default="", compare=False)

    # ----- grid ---------------------------------------------------------------------------
    @derived
    def itemsize(self) -> int:
        """Bytes per element of the A and B panels."""
        return DTYPES[self.dtype]

    @property
    def c_dtype(self) -> str:
        """The dtype of the C tiles on the compute side (and as copied out)."""
        return accumulate_dtype(self.dtype)

    @property
    def written_dtype(self) -> str:
        """The dtype of C as the output stores it (``out_dtype``, else ``c_dtype``)."""
        return self.out_dtype or self.c_dtype

    @derived
    def c_itemsize(self) -> int:
        """Bytes per element of the C tiles."""
        return DTYPES[accumulate_dtype(self.dtype)]  # (c_dtype's)

    @derived
    def ni(self) -> int:
        return -(-self.m // self.bm)

    @derived
    def nj(self) -> int:
        return -(-self.n // self.bn)

    @derived
    def nk(self) -> int:
        return -(-self.k // self.bk)

    @derived
    def n_tiles(self) -> int:
        """Tiles computed (a Gram plan's: those on and above the diagonal)."""
        if self.symmetric:
            return self.ni * (self.ni + 1) // 2
        return self.ni * self.nj

    def diagonal(self, t: Tile) -> bool:
        """Whether ``t`` is a diagonal tile of a Gram plan (computed by a rank-k update)."""
        return self.symmetric and t.i == t.j

    @derived
    def n_steps(self) -> int:
        """Gemm steps of the whole run: one per K panel of every tile."""
        return self.n_tiles * self.nk

    def tile(self, i: int, j: int) -> Tile:
        r0, c0 = i * self.bm, j * self.bn
        return _tile(i, j, r0, min(r0 + self.bm, self.m), c0, min(c0 + self.bn, self.n))

    def tiles(self) -> Iterator[Tile]:
        """C tiles in the order they are finished (a Gram plan's: i <= j only)."""
        sym, bm, bn, m, n = self.symmetric, self.bm, self.bn, self.m, self.n
        if not self.row_major:  # (self.tile(i, j), each)
            for j in range(self.nj):
                c0, c1 = j * bn, min(j * bn + bn, n)
                for i in range(j + 1 if sym else self.ni):
                    yield _tile(i, j, i * bm, min(i * bm + bm, m), c0, c1)
        else:
            for i in range(self.ni):
                r0, r1 = i * bm, min(i * bm + bm, m)
                for j in range(i if sym else 0, self.nj):
                    yield _tile(i, j, r0, r1, j * bn, min(j * bn + bn, n))

    def k_panels(self) -> list[tuple[int, int]]:
        return [(k0, min(k0 + self.bk, self.k)) for k0 in range(0, self.k, self.bk)]

    def a_k_range(self, kp: int, i: int = 0) -> tuple[int, int]:
        """The K range [k0, k1) of the load of strip ``i``'s A that K panel ``kp`` belongs
        to (``a_span`` panels a load; within the rounds, strip i's first load is a_span - i %
        a_span panels, so that each round loads a share of the strips' A, not all of it every
        a_span rounds; the tail's loads start at its first panel)."""
        span = self.a_span
        if span == 1:
            return kp * self.bk, min((kp + 1) * self.bk, self.k)
        head = self.nk - self.tail
        if kp < head:
            shift = i % span
            g = (kp + shift) // span
            first, last = max(0, g * span - shift), min(head, (g + 1) * span - shift)
        else:
            first = head + (kp - head) // span * span
            last = min(first + span, self.nk)
        return first * self.bk, min(last * self.bk, self.k)

    @property
    def a_loads(self) -> int:
        """A loads of all strips (ni times its K panels where ``a_span`` is 1)."""
        if self.a_span == 1:
            return self.ni * self.nk
        per = [len({self.a_k_range(kp, i) for kp in range(self.nk)})
               for i in range(min(self.ni, self.a_span))]  # strips alike by i % a_span
        return sum(per[i % self.a_span] for i in range(self.ni))

    def order_steps(self, done=frozenset(),
                    head_rounds: int | None = None) -> Iterator[tuple[Tile, int]]:
        """(tile, K panel) of every gemm in schedule order, skipping the tiles in ``done``.
        Resident-c: the first nk - tail panels of every tile, K panel by K panel (rounds),
        then each tile's last ``tail`` panels, tile by tile (``head_rounds``: only that many
        rounds, for the pipeline model); the other orders: tile by tile."""
        for t, kps in self._runs(done, head_rounds):
            for kp in kps:
                yield t, kp

    def _runs(self, done=frozenset(), head_rounds: int | None = None) -> Iterator[tuple]:
        """``order_steps`` a tile at a time: (tile, its K panels in a row)."""
        tiles = (t for t in self.tiles() if t.index not in done) if done else self.tiles()
        if self.order == "resident-c":
            tiles, head = list(tiles), self.nk - self.tail
            for kp in range(head if head_rounds is None else min(head, head_rounds)):
                for t in tiles:
                    yield t, (kp,)
            for t in tiles:
                yield t, range(head, self.nk)
            return
        for t in tiles:
            yield t, range(self.nk)

    # ----- slots --------------------------------------------------------------------------
    @property
    def a_slots(self) -> int:
        """A panel slots: a row panel and one more (resident-a, whole-b); one panel per strip
        and one more (resident-c: a round's A panels load while the round before computes,
        and with them the next B panel); every panel of A (whole-a); else two."""
        if self.order == "whole-a":
            return self.ni * self.nk
        if self.order == "whole-b":
            return self.nk + 1
        if self.order in ("resident-a", "resident-c"):
            return (self.nk if self.order == "resident-a" else self.ni) + 1
        return 2

    @derived
    def b_slots(self) -> int:
        """B panel slots (none in a Gram plan of one tile row: its only tiles are diagonal)."""
        if self.symmetric and self.ni == 1:
            return 0
        if self.order == "whole-b":
            return self.nj * self.nk
        if self.order in ("resident-b", "whole-a"):
            return self.nk + 1
        return self.tail + 1 if self.order == "resident-c" else 2

    @property
    def c_slots(self) -> int:
        """Device C tiles: C_SLOTS, or every tile of C in order resident-c."""
        return self.n_tiles if self.order == "resident-c" else C_SLOTS

    def staged(self, op: str) -> bool:
        """Whether operand ``op`` ("A", "B", "C") goes through host staging buffers (a staging
        plan, and not copied in place)."""
        return self.staging and (self.in_place is None or op not in self.in_place)

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
        for t, kp, a_slot, load_a, b_slot, load_b, c_slot, a_k in self._slot_schedule(done):
            k0, k1 = panels[kp]
            yield Step(t, kp, k0, k1, kp == 0, kp == last, a_slot, load_a, b_slot, load_b, c_slot,
                       a_k)

    def fresh_steps(self, tiles: list[Tile]) -> Iterator[Step]:
        """Every gemm of ``tiles`` in the order given, each loading both of its panels afresh
        into slots taken in turn: the steps that compute tiles again (nothing resident is
        trusted)."""
        panels, n = self.k_panels(), 0
        for ti, t in enumerate(tiles):
            for kp, (k0, k1) in enumerate(panels):
                yield Step(t, kp, k0, k1, kp == 0, kp == len(panels) - 1, n % self.a_slots, True,
                           n % self.b_slots, True, ti % self.c_slots, self.a_k_range(kp, t.i))
                n += 1

    def _slot_schedule(self, done=frozenset(), head_rounds: int | None = None) -> Iterator[tuple]:
        """``steps`` as plain tuples (tile, kp, a_slot, load_a, b_slot, load_b, c_slot, a_k): the one
        place the slots are assigned, shared by ``steps`` and the pipeline model
        (``head_rounds``: see ``order_steps``)."""
        a_cache: dict = {}  # key -> slot, the least recently used first
        b_cache: dict = {}
        c_cache: dict = {}  # tile -> C slot, taken in turn as tiles start
        a_slots, b_slots, c_slots = self.a_slots, self.b_slots, self.c_slots
        sym, span, a_k_range = self.symmetric, self.a_span, self.a_k_range
        nk, bk = self.nk, self.bk
        strips: dict = {}  # i % a_span -> A's K range of each K panel (and its first panel)
        for t, kps in self._runs(done, head_rounds):
            if not kps:
                continue
            i, j = t.i, t.j
            diagonal = sym and i == j  # op(B)'s panel is op(A)'s: nothing to load
            c_slot = c_cache.get((i, j))
            if c_slot is None:
                c_slot = c_cache[i, j] = len(c_cache) % c_slots
            a_ks = strips.get(i % span)
            if a_ks is None:
                ranges = self.k_panels() if span == 1 else [a_k_range(kp, i) for kp in range(nk)]
                a_ks = strips[i % span] = ranges, [k0 // bk for k0, _ in ranges]
            ranges, firsts = a_ks
            a0, b0 = i * nk, j * nk  # panels' keys: (i, first K panel), (j, K panel) as one int
            for kp in kps:
                # each panel's slot: the least recently used
                key = a0 + firsts[kp]
                a_slot = a_cache.pop(key, None)  # (back in last: the most recently used)
                load_a = a_slot is None
                if load_a:
                    a_slot = (len(a_cache) if len(a_cache) < a_slots
                              else a_cache.pop(next(iter(a_cache))))
                a_cache[key] = a_slot
                if diagonal:
                    b_slot, load_b = 0, False
                else:
                    key = b0 + kp
                    b_slot = b_cache.pop(key, None)
                    load_b = b_slot is None
                    if load_b:
                        b_slot = (len(b_cache) if len(b_cache) < b_slots
                                  else b_cache.pop(next(iter(b_cache))))
                    b_cache[key] = b_slot
                yield t, kp, a_slot, load_a, b_slot, load_b, c_slot, ranges[kp]

    # ----- memory -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> int:
        """Bytes the compute side holds: C tiles, the A and B panel slots and the gemm's
        workspace (:attr:`workspace_bytes`)."""
        w = self.itemsize
        return (self.c_itemsize * self.c_slots * self.bm * self.bn
                + w * (self.a_slots * self.bm * self.bk * self.a_span
                       + self.b_slots * self.bk * self.bn)
                + self.workspace_bytes)

    @property
    def workspace_bytes(self) -> int:
        """The gemm's workspace: where it splits its panels ahead, or (plain TF32) rounds the
        smaller one ahead; a gemm that rounds one panel ahead falls back to splitting both
        where a panel's rows are not 16-byte aligned, so that tiles large enough for a split
        count the larger of the two; none where plain TF32 reads both panels as stored."""
        if not self.presplit or self.reads_as_stored:
            return 0
        split = (split_workspace_bytes(self.bm, self.bn, self.bk, self.presplit)
                 if splits_ahead(self.bm, self.bn) else 0)
        one = direct_workspace_bytes(self.bm, self.bn, self.bk) if self.rounds_one_ahead else 0
        return max(split, one)

    @property
    def splits_ahead(self) -> bool:
        """The gemm splits this plan's panels ahead (``presplit``, tiles large enough, and not
        a plain TF32 gemm that reads both panels as stored or rounds one panel ahead)."""
        return (self.presplit > 0 and splits_ahead(self.bm, self.bn)
                and not self.rounds_one_ahead and not self.reads_as_stored)

    @property
    def reads_as_stored(self) -> bool:
        """The plain TF32 gemm (``presplit`` 1) reads both panels as stored, rounded on the way
        in, with no workspace (:func:`reads_as_stored`)."""
        return self.presplit == 1 and reads_as_stored(self.m, self.n, self.k, self.bm, self.bn,
                                                      self.bk, self.trans_a, self.trans_b)

    @property
    def rounds_one_ahead(self) -> bool:
        """The plain TF32 gemm (``presplit`` 1) rounds only the smaller panel ahead and reads
        the other as stored (:func:`rounds_one_ahead`)."""
        return (self.presplit == 1 and not self.reads_as_stored
                and rounds_one_ahead(self.bm, self.bn, self.trans_a, self.trans_b))

    @property
    def host_bytes(self) -> int:
        """Host bytes of the run's buffers: the staging buffers (pinned) of the operands that
        are staged, or without staging the compute buffers (host memory then), and those
        that convert C (:attr:`convert_bytes`). The decode buffers are apart (``decoding``)."""
        in_place = self.in_place or ""  # (operands not in it are staged)
        held = (self.device_bytes if not self.staging
                else 0 if "A" in in_place and "B" in in_place and "C" in in_place
                else sum(n * nbytes for op, n, nbytes in self._host_buffers
                     if op not in in_place))
        return held + self.convert_bytes

    @property
    def convert_bytes(self) -> int:
        """Host bytes converting C where the output stores another dtype than the tiles':
        old C stored wider is read as stored, then rounded (a tile per C buffer filled at
        once); finished tiles are converted a tile at a time as they are written. A panel
        (or old C) stored narrower is widened within its own buffer: nothing more."""
        if not self.out_dtype:  # C stored as its tiles are
            return 0
        stored, wc = self._stored_sizes["C"], self.c_itemsize
        if stored == wc:
            return 0
        loading = (HOST_C_SLOTS if self.staging else self.c_slots) if stored > wc else 0
        return (loading * self.reads_c + 1) * stored * self.bm * self.bn

    @derived
    def _host_buffers(self) -> tuple[tuple[str, int, int], ...]:
        """(operand, host staging buffers, bytes each) of A, B and C with staging."""
        w, wc, bm, bn, bk = self.itemsize, self.c_itemsize, self.bm, self.bn, self.bk
        return (("A", self.host_panel_slots("A"), w * bm * bk * self.a_span),
                ("B", self.host_panel_slots("B"), w * bk * bn), ("C", HOST_C_SLOTS, wc * bm * bn))

    def host_panel_slots(self, op: str) -> int:
        """Host staging slots of operand "A" or "B": HOST_PANEL_SLOTS, more for panels
        smaller than half IN_FLIGHT_BYTES (at most HOST_PANEL_SLOTS_MAX); none for B
        without B slots."""
        if op == "B" and not self.b_slots:
            return 0
        nbytes = self.itemsize * self.bk * (self.bm * self.a_span if op == "A" else self.bn)
        return max(HOST_PANEL_SLOTS, min(HOST_PANEL_SLOTS_MAX, -(-IN_FLIGHT_BYTES // nbytes)))

    def host_slots(self, ops: str | None = None) -> list[tuple[str, int, int, bool]]:
        """The host staging buffers of the operands that are staged (``ops``: of these
        instead, as a run that stages some after all has them), (operand, slot, bytes,
        first), in the order a run pins them: ``first`` for those the first step uses (the
        first A and B buffers, and C's when it is read), pinned before the run starts; then
        the others, pinned in the background while it runs (none without staging)."""
        if ops is None:
            return list(self._staged_slots)
        return self._slots_of(ops)

    @derived
    def _staged_slots(self) -> tuple[tuple[str, int, int, bool], ...]:
        return tuple(self._slots_of(None))

    def _slots_of(self, ops: str | None) -> list[tuple[str, int, int, bool]]:
        if not self.staging:
            return []
        first, rest, in_place = [], [], self.in_place
        for op, n, nbytes in self._host_buffers:
            if (in_place is None or op not in in_place) if ops is None else op in ops:  # staged
                i = 1 if n and (op != "C" or self.reads_c) else 0  # its first: the first step's
                if i:
                    first.append((op, 0, nbytes, True))
                for i in range(i, n):
                    rest.append((op, i, nbytes, False))
        return first + rest

    def host_c_slot(self, c_slot: int) -> int:
        """The host C buffer a device C slot's tiles pass through (staging plans)."""
        return c_slot % HOST_C_SLOTS

    # ----- traffic (more in :class:`.traffic.Traffic`) ------------------------------------
    @property
    def row_major(self) -> bool:
        return self.order not in ("resident-b", "whole-a")

    @property
    def predicted_seconds(self) -> float | None:
        """The makespan its ``rates`` predict (the pipeline model:
        :func:`bigmm.planner.model.predict_seconds`); None without rates."""
        if self.rates is None:
            return None
        if "_predicted" not in self.__dict__:  # frozen: cache beside the fields
            object.__setattr__(self, "_predicted", self.rates.makespan(self))
        return self.__dict__["_predicted"]

    def _replaced(self, **changes) -> Plan:
        """``dataclasses.replace(self, **changes)``, faster for the search's many candidates
        (:func:`.derived.made`): the fields alone, nothing derived from them."""
        values = self._field_values.copy()
        values.update(changes)
        return made(type(self), values)

    @derived
    def _field_values(self) -> dict:
        return {f.name: self.__dict__[f.name] for f in fields(self)}

    def key(self) -> dict:
        """What identifies the schedule (recorded in the resume journal; resident-c's tail
        too)."""
        fields = ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c", "bm", "bn", "bk",
                  "order") + (("tail",) if self.order == "resident-c" else ()) + (
                  ("symmetric", "upper") if self.symmetric else ())
        return {f: getattr(self, f) for f in fields}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ni=self.ni, nj=self.nj, nk=self.nk, n_tiles=self.n_tiles,
                 device_bytes=self.device_bytes, host_bytes=self.host_bytes,
                 convert_bytes=self.convert_bytes,
                 decode_bytes=decode.held(self), decoded_bytes=decode.decoded_bytes(self),
                 bytes_read=self.bytes_read, bytes_written=self.bytes_written,
                 bytes_h2d=self.bytes_h2d, flops=self.flops,
                 lower_bound_bytes=self.lower_bound_bytes, bound_ratio=self.bound_ratio,
                 predicted_seconds=self.predicted_seconds)
        return d

    def __str__(self) -> str:
        return printing.table(self)


def _tile(i: int, j: int, r0: int, r1: int, c0: int, c1: int) -> Tile:
    """``Tile(i, j, r0, r1, c0, c1)``, faster (:func:`.derived.made`): plans make many."""
    t = object.__new__(Tile)
    object.__setattr__(t, "__dict__", {"i": i, "j": j, "r0": r0, "r1": r1, "c0": c0, "c1": c1})
    return t
